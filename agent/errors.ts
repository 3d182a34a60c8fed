/**
 * The agent's error catalog (docs/decisions.md, principle 5): every failure the local interface reports has one of these
 * codes, and clients branch on the code, never on the message.
 */
export const AGENT_ERROR_CODES = {
  'bad-request': 'the request is malformed',
  'bad-name': 'not a valid variable name',
  'not-found': 'no such variable',
  'too-large': 'the value is larger than allowed',
  unavailable: 'the agent is shutting down or not ready',
  refused: 'the operation does not apply in the current state (for example, no update to commit)',
  'storage-full':
    'the disk of the state directory is full: nothing was changed; reads work, and writes work again once space is freed',
  internal: 'an unexpected failure; the agent log has the details',
} as const;

export type AgentErrorCode = keyof typeof AGENT_ERROR_CODES;

export class AgentError extends Error {
  override name = 'AgentError';
  constructor(
    readonly code: AgentErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export function isAgentError(err: unknown): err is AgentError {
  return err instanceof AgentError;
}
