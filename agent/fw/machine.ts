/**
 * The firmware update state machine of docs/decisions.md §7, as one table and a pure transition function. The I/O
 * of each state lives in the interpreter (`updater.ts`); this file decides only where an outcome leads.
 *
 *   downloading → verifying → installing → switching → restarting → committing → done
 *        │            │            │            │            │            │
 *        └─ failed, or cancelled ──┘            └──── rollingback → rolledback ┘
 *
 * Before the switch nothing that runs has changed, so a failure ends in `failed` and a cancel in `cancelled`.
 * From the switch on, the only way back is a rollback, and a cancel is refused.
 *
 * The states and the failure codes are part of the wire contract (`protocol/firmware.ts`): the agent reports them
 * as `meta` `fwstate` and `fwerrorcode`.
 */
import { type FwFailureCode, type FwFinalState, type FwState, isFwFinalState } from '../../protocol/firmware.js';

export { FW_STATES, type FwState, isFwState } from '../../protocol/firmware.js';

/** States in which the agent has work to do; each has one side effect in the interpreter. */
export type ActiveState = Exclude<FwState, 'idle' | FinalState>;
export type FinalState = FwFinalState;

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

export function isActive(state: FwState): state is ActiveState {
  return Object.hasOwn(TRANSITIONS, state);
}

export function isFinal(state: FwState): state is FinalState {
  return isFwFinalState(state);
}

/** Whether the slot that runs may be the new image (a cancel is refused from here on). */
export function afterSwitch(state: FwState): boolean {
  return isActive(state) && TRANSITIONS[state].afterSwitch;
}

export type FwEvent =
  /** The state's work succeeded. */
  | { type: 'ok' }
  /** The state's work failed; `error` is what `fwerror` reports, `code` what `fwerrorcode` reports. */
  | { type: 'fail'; error: string; code: FwFailureCode }
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

/** Why a transition happened, when something went wrong or the update was stopped: `fwerror` and `fwerrorcode`. */
export interface Failure {
  error: string;
  code: FwFailureCode;
}

export type Transition =
  /** Move to `to` (which may equal the current state: run its work again). `failure` replaces the job's. */
  | { kind: 'move'; to: FwState; failure?: Failure }
  /** Nothing to do now: the state waits for the next start or an engineer. */
  | { kind: 'stay'; failure?: Failure }
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
      const failure = { error: event.error, code: event.code };
      return to === 'stay' ? { kind: 'stay', failure } : { kind: 'move', to, failure };
    }
    case 'cancel': {
      if (!isActive(state)) return { kind: 'refused', why: `no update is running (state ${state})` };
      const to = TRANSITIONS[state].cancel;
      if (to === undefined) return { kind: 'refused', why: `the active slot has been switched (state ${state})` };
      return { kind: 'move', to, failure: { error: 'cancelled from the cloud', code: 'cancelled' } };
    }
    case 'resume': {
      if (!isActive(state)) return { kind: 'stay' };
      if (state === 'rollingback') return { kind: 'move', to: state };
      if (event.attempts > event.maxAttempts) {
        const error = `gave up after ${event.maxAttempts} starts of the agent in state ${state}`;
        const to = TRANSITIONS[state].afterSwitch ? 'rollingback' : 'failed';
        return { kind: 'move', to, failure: { error, code: 'crash-loop' } };
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
        return { kind: 'move', to: 'rollingback', failure: { error: event.reason, code: 'by-hand' } };
      }
      if (state === 'rollingback') return { kind: 'move', to: 'rollingback' };
      if (isActive(state)) return { kind: 'move', to: 'cancelled', failure: { error: event.reason, code: 'by-hand' } };
      return { kind: 'refused', why: `there is nothing to roll back (state ${state})` };
    }
  }
}
