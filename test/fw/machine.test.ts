/**
 * The transition function of the firmware update (`agent/fw/machine.ts`) against a table written out here by
 * hand: every state against every event, so that a change to the flow of docs/decisions.md §7 shows up as a changed
 * cell. Read a row as "in this state, on this event, the machine does that".
 */
import { describe, expect, it } from 'vitest';
import { FW_AFTER_SWITCH_LIST, FW_FINAL_STATE_LIST } from '../../protocol/firmware.js';
import {
  FW_STATES,
  type Failure,
  type FwEvent,
  type FwState,
  ImpossibleTransition,
  TRANSITIONS,
  type Transition,
  afterSwitch,
  isActive,
  isFinal,
  isFwState,
  transition,
} from '../../agent/fw/machine.js';

const MAX = 3;
/** What a state's work reports when it fails: the text of `fwerror` and the code of `fwerrorcode`. */
const ERROR: Failure = { error: 'the work of the state failed', code: 'install' };
const REASON = 'rolled back by hand';
const BY_HAND: Failure = { error: REASON, code: 'by-hand' };
const CANCELLED: Failure = { error: 'cancelled from the cloud', code: 'cancelled' };
const GAVE_UP = `gave up after ${MAX} starts of the agent in state`;

/** The events of the table's columns. */
const EVENTS = {
  ok: { type: 'ok' },
  fail: { type: 'fail', error: ERROR.error, code: ERROR.code },
  cancel: { type: 'cancel' },
  /** The first start in this stretch of the flow, in a new process that is not a restart it asked for. */
  resume: { type: 'resume', attempts: 1, maxAttempts: MAX, restarted: false },
  /** The last start the loop counter allows. */
  resumeAtMax: { type: 'resume', attempts: MAX, maxAttempts: MAX, restarted: false },
  /** One start too many: a crash loop. */
  resumePastMax: { type: 'resume', attempts: MAX + 1, maxAttempts: MAX, restarted: false },
  /** The new process is the restart `restarting` asked for (the agent's own restart, a reboot). */
  resumeRestarted: { type: 'resume', attempts: 1, maxAttempts: MAX, restarted: true },
  /** A crash loop of restarts: the loop counter wins over `restarted`. */
  resumeRestartedPastMax: { type: 'resume', attempts: MAX + 1, maxAttempts: MAX, restarted: true },
  commit: { type: 'commit' },
  rollback: { type: 'rollback', reason: REASON },
} as const satisfies Record<string, FwEvent>;
type EventName = keyof typeof EVENTS;

type Cell = Transition | 'refused' | 'throws';
const go = (to: FwState, failure?: Failure): Cell =>
  failure === undefined ? { kind: 'move', to } : { kind: 'move', to, failure };
const stay = (failure?: Failure): Cell => (failure === undefined ? { kind: 'stay' } : { kind: 'stay', failure });
const R = 'refused';
const X = 'throws';
const gaveUp = (to: FwState, state: FwState): Cell => go(to, { error: `${GAVE_UP} ${state}`, code: 'crash-loop' });

/** Before the switch: a failure or a crash loop ends in `failed`, a cancel or a rollback by hand in `cancelled`. */
const beforeSwitch = (state: FwState, next: FwState): Record<EventName, Cell> => ({
  ok: go(next),
  fail: go('failed', ERROR),
  cancel: go('cancelled', CANCELLED),
  resume: go(state),
  resumeAtMax: go(state),
  resumePastMax: gaveUp('failed', state),
  resumeRestarted: go(state),
  resumeRestartedPastMax: gaveUp('failed', state),
  commit: R,
  rollback: go('cancelled', BY_HAND),
});

/** After the switch: the only way back is a rollback, and a cancel is refused. */
const afterTheSwitch = (state: FwState, next: FwState): Record<EventName, Cell> => ({
  ok: go(next),
  fail: go('rollingback', ERROR),
  cancel: R,
  resume: go(state),
  resumeAtMax: go(state),
  resumePastMax: gaveUp('rollingback', state),
  resumeRestarted: go(state),
  resumeRestartedPastMax: gaveUp('rollingback', state),
  commit: R,
  rollback: go('rollingback', BY_HAND),
});

/** A state with nothing left to do: work outcomes cannot happen, the rest is refused or ignored. */
const settled = (overrides: Partial<Record<EventName, Cell>> = {}): Record<EventName, Cell> => ({
  ok: X,
  fail: X,
  cancel: R,
  resume: stay(),
  resumeAtMax: stay(),
  resumePastMax: stay(),
  resumeRestarted: stay(),
  resumeRestartedPastMax: stay(),
  commit: R,
  rollback: R,
  ...overrides,
});

const TABLE: Record<FwState, Record<EventName, Cell>> = {
  idle: settled(),
  downloading: beforeSwitch('downloading', 'verifying'),
  verifying: beforeSwitch('verifying', 'installing'),
  installing: beforeSwitch('installing', 'switching'),
  switching: afterTheSwitch('switching', 'restarting'),
  restarting: {
    ...afterTheSwitch('restarting', 'committing'),
    // The new process is the restart: on to the health check.
    resumeRestarted: go('committing'),
    // An engineer may accept the image before the health check has run.
    commit: go('done'),
  },
  committing: { ...afterTheSwitch('committing', 'done'), commit: go('done') },
  // A committed image may still be rolled back by hand.
  done: settled({ rollback: go('rollingback', BY_HAND) }),
  rollingback: {
    ok: go('rolledback'),
    // A failed rollback is kept, with its error, for the next start or the engineer; never abandoned.
    fail: stay(ERROR),
    cancel: R,
    // The loop counter never gives up on a rollback: it is the safe direction.
    resume: go('rollingback'),
    resumeAtMax: go('rollingback'),
    resumePastMax: go('rollingback'),
    resumeRestarted: go('rollingback'),
    resumeRestartedPastMax: go('rollingback'),
    commit: R,
    // By hand: try again, keeping the error that says why the last try failed.
    rollback: go('rollingback'),
  },
  rolledback: settled(),
  failed: settled(),
  cancelled: settled(),
};

const CASES = FW_STATES.flatMap((state) =>
  (Object.keys(EVENTS) as EventName[]).map((event) => ({ state, event, expected: TABLE[state][event] })),
);

describe('the firmware state machine', () => {
  it('the table names every state and every event', () => {
    expect(Object.keys(TABLE).sort()).toEqual([...FW_STATES].sort());
    expect(CASES).toHaveLength(FW_STATES.length * Object.keys(EVENTS).length);
  });

  it.each(CASES)('$state on $event', ({ state, event, expected }) => {
    const e = EVENTS[event];
    if (expected === 'throws') {
      expect(() => transition(state, e)).toThrow(ImpossibleTransition);
      expect(() => transition(state, e)).toThrow(`no transition from ${state} on ${e.type}`);
      return;
    }
    const got = transition(state, e);
    if (expected === 'refused') {
      expect(got.kind).toBe('refused');
      // The reason goes back to whoever asked, so it says where the job is.
      if (got.kind === 'refused') expect(got.why).toContain(`state ${state}`);
      return;
    }
    expect(got).toEqual(expected);
  });

  it('a cancel after the switch says why it is refused', () => {
    for (const state of ['switching', 'restarting', 'committing', 'rollingback'] as const) {
      expect(transition(state, { type: 'cancel' })).toEqual({
        kind: 'refused',
        why: `the active slot has been switched (state ${state})`,
      });
    }
    expect(transition('done', { type: 'cancel' })).toEqual({
      kind: 'refused',
      why: 'no update is running (state done)',
    });
  });

  it('the transition table and its helpers agree with the states', () => {
    const active = FW_STATES.filter((s) => isActive(s));
    expect(active).toEqual(Object.keys(TRANSITIONS));
    expect(active).toEqual([
      'downloading',
      'verifying',
      'installing',
      'switching',
      'restarting',
      'committing',
      'rollingback',
    ]);
    expect(FW_STATES.filter((s) => isFinal(s))).toEqual(['done', 'rolledback', 'failed', 'cancelled']);
    // The bridge reads the same sets from the contract (protocol/firmware.ts): the machine agrees with them.
    expect([...FW_FINAL_STATE_LIST].sort()).toEqual(FW_STATES.filter((s) => isFinal(s)).sort());
    expect(FW_STATES.filter((s) => afterSwitch(s))).toEqual([...FW_AFTER_SWITCH_LIST]);
    // idle is neither: nothing has started.
    expect(isActive('idle') || isFinal('idle')).toBe(false);
    expect(FW_STATES.filter((s) => afterSwitch(s))).toEqual(['switching', 'restarting', 'committing', 'rollingback']);
    expect(FW_STATES.every((s) => isFwState(s))).toBe(true);
    expect(isFwState('rebooting')).toBe(false);
    expect(isFwState('')).toBe(false);
  });

  it('follows ok from downloading to done, and fail after the switch to rolledback', () => {
    const walk = (from: FwState, events: FwEvent[]): FwState[] => {
      const seen: FwState[] = [from];
      let state = from;
      for (const e of events) {
        const t = transition(state, e);
        if (t.kind !== 'move') throw new Error(`stopped in ${state}`);
        state = t.to;
        seen.push(state);
      }
      return seen;
    };
    const ok: FwEvent = { type: 'ok' };
    const fail: FwEvent = { type: 'fail', ...ERROR };
    expect(walk('downloading', [ok, ok, ok, ok, ok, ok])).toEqual([
      'downloading',
      'verifying',
      'installing',
      'switching',
      'restarting',
      'committing',
      'done',
    ]);
    expect(walk('switching', [ok, ok, fail, ok])).toEqual([
      'switching',
      'restarting',
      'committing',
      'rollingback',
      'rolledback',
    ]);
  });
});
