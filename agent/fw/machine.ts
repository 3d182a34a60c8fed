/**
 * The firmware update state machine of DESIGN section 7, as one table and a pure transition function. The I/O
 * of each state lives in the interpreter (`updater.ts`); this file decides only where an outcome leads.
 *
 *   downloading → verifying → installing → switching → restarting → committing → done
 *        │            │            │            │            │            │
 *        └─ failed, or cancelled ──┘            └──── rollingback → rolledback ┘
 *
 * Before the switch nothing that runs has changed, so a failure ends in `failed` and a cancel in `cancelled`.
 * From the switch on, the only way back is a rollback, and a cancel is refused.
 */

export const FW_STATES = [
  'idle',
  'downloading',
  'verifying',
  'installing',
  'switching',
  'restarting',
  'committing',
  'done',
  'rollingback',
  'rolledback',
  'failed',
  'cancelled',
] as const;
export type FwState = (typeof FW_STATES)[number];

/** States in which the agent has work to do; each has one side effect in the interpreter. */
export type ActiveState =
  'downloading' | 'verifying' | 'installing' | 'switching' | 'restarting' | 'committing' | 'rollingback';
export type FinalState = 'done' | 'rolledback' | 'failed' | 'cancelled';

interface Row {
  /** Where the state's work leads when it succeeds. */
  ok: FwState;
  /** Where it leads when it fails; `stay` keeps the state for the next start (or a rollback by hand). */
  fail: FwState | 'stay';
  /** Where a cancel leads; missing: refused, the switch has happened. */
  cancel?: FwState;
  /** Whether the active slot may already be the new one. */
  afterSwitch: boolean;
}

/** The whole update flow. Read a row as "in this state, on this outcome, go there". */
export const TRANSITIONS: { readonly [S in ActiveState]: Row } = {
  downloading: { ok: 'verifying', fail: 'failed', cancel: 'cancelled', afterSwitch: false },
  verifying: { ok: 'installing', fail: 'failed', cancel: 'cancelled', afterSwitch: false },
  installing: { ok: 'switching', fail: 'failed', cancel: 'cancelled', afterSwitch: false },
  switching: { ok: 'restarting', fail: 'rollingback', afterSwitch: true },
  restarting: { ok: 'committing', fail: 'rollingback', afterSwitch: true },
  committing: { ok: 'done', fail: 'rollingback', afterSwitch: true },
  // Rolling back is the safe direction: when it fails, it is tried again at the next start, never abandoned.
  rollingback: { ok: 'rolledback', fail: 'stay', afterSwitch: true },
};

const FINAL: ReadonlySet<FwState> = new Set<FwState>(['done', 'rolledback', 'failed', 'cancelled']);

export function isActive(state: FwState): state is ActiveState {
  return Object.hasOwn(TRANSITIONS, state);
}

export function isFinal(state: FwState): state is FinalState {
  return FINAL.has(state);
}

export function isFwState(s: string): s is FwState {
  return (FW_STATES as readonly string[]).includes(s);
}

/** Whether the slot that runs may be the new image (a cancel is refused from here on). */
export function afterSwitch(state: FwState): boolean {
  return isActive(state) && TRANSITIONS[state].afterSwitch;
}

export type FwEvent =
  /** The state's work succeeded. */
  | { type: 'ok' }
  /** The state's work failed; `error` is what `fwerror` reports. */
  | { type: 'fail'; error: string }
  /** `DELETE …/fw` from the cloud. */
  | { type: 'cancel' }
  /**
   * The agent started and found this state saved. `attempts` counts the starts in this state's stretch of the
   * flow (the first run included); past `maxAttempts` the loop counter stops a crash loop. `restarted` is true
   * when a new process is itself the restart the `restarting` state asked for (the agent's own restart, or a
   * reboot).
   */
  | { type: 'resume'; attempts: number; maxAttempts: number; restarted: boolean }
  /** `devcloud-agent fw commit`: accept the switched image without (more) health checks. */
  | { type: 'commit' }
  /** `devcloud-agent fw rollback`: go back to the slot that ran before the update. */
  | { type: 'rollback'; reason: string };

export type Transition =
  /** Move to `to` (which may equal the current state: run its work again). `error` replaces `fwerror`. */
  | { kind: 'move'; to: FwState; error?: string }
  /** Nothing to do now: the state waits for the next start or an engineer. */
  | { kind: 'stay'; error?: string }
  /** The event does not apply in this state; `why` is said to whoever asked. */
  | { kind: 'refused'; why: string };

/** An event that cannot happen in a state is a bug in the interpreter, not bad input. */
export class ImpossibleTransition extends Error {
  override name = 'ImpossibleTransition';
  constructor(state: FwState, event: FwEvent['type']) {
    super(`firmware state machine: no transition from ${state} on ${event}`);
  }
}

export function transition(state: FwState, event: FwEvent): Transition {
  switch (event.type) {
    case 'ok': {
      if (!isActive(state)) throw new ImpossibleTransition(state, event.type);
      return { kind: 'move', to: TRANSITIONS[state].ok };
    }
    case 'fail': {
      if (!isActive(state)) throw new ImpossibleTransition(state, event.type);
      const to = TRANSITIONS[state].fail;
      return to === 'stay' ? { kind: 'stay', error: event.error } : { kind: 'move', to, error: event.error };
    }
    case 'cancel': {
      if (!isActive(state)) return { kind: 'refused', why: `no update is running (state ${state})` };
      const to = TRANSITIONS[state].cancel;
      if (to === undefined) return { kind: 'refused', why: `the active slot has been switched (state ${state})` };
      return { kind: 'move', to, error: 'cancelled from the cloud' };
    }
    case 'resume': {
      if (!isActive(state)) return { kind: 'stay' };
      if (state === 'rollingback') return { kind: 'move', to: state };
      if (event.attempts > event.maxAttempts) {
        const error = `gave up after ${event.maxAttempts} starts of the agent in state ${state}`;
        return { kind: 'move', to: TRANSITIONS[state].afterSwitch ? 'rollingback' : 'failed', error };
      }
      // The new process is the restart: what `restarting` waited for has happened.
      if (state === 'restarting' && event.restarted) return { kind: 'move', to: 'committing' };
      return { kind: 'move', to: state };
    }
    case 'commit': {
      if (state === 'restarting' || state === 'committing') return { kind: 'move', to: 'done' };
      return { kind: 'refused', why: `there is no switched image waiting for a commit (state ${state})` };
    }
    case 'rollback': {
      if (state === 'switching' || state === 'restarting' || state === 'committing' || state === 'done') {
        return { kind: 'move', to: 'rollingback', error: event.reason };
      }
      if (state === 'rollingback') return { kind: 'move', to: 'rollingback' };
      if (isActive(state)) return { kind: 'move', to: 'cancelled', error: event.reason };
      return { kind: 'refused', why: `there is nothing to roll back (state ${state})` };
    }
  }
}
