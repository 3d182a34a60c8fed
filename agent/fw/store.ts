/**
 * The firmware jobs the agent has been given, in SQLite (docs/decisions.md §7). The latest job's row is the state
 * machine's saved state: it is written, with `synchronous=FULL`, before every side effect, and read on start to
 * resume. `fw_steps` keeps each job's transitions for `devcloud-agent fw status`. `reported` makes the row the
 * outbox of the `meta` report: a state the broker has not acknowledged is reported again on the next connect.
 */
import type { Db, Migration } from '../../lib/sqlite.js';
import { type FwFailureCode, type FwState, isFwFailureCode, isFwState } from '../../protocol/firmware.js';
import type { SlotName } from './slots.js';

export const FIRMWARE_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE fw_jobs (
      seq             INTEGER PRIMARY KEY,
      id              TEXT    NOT NULL UNIQUE,
      name            TEXT    NOT NULL,
      version         INTEGER NOT NULL,
      platform        TEXT    NOT NULL,
      url             TEXT    NOT NULL,
      -- The job's download token: the agent must present it, so it cannot be hashed; cleared once not needed.
      token           TEXT,
      size            INTEGER NOT NULL,
      sha256          TEXT    NOT NULL,
      signature       TEXT    NOT NULL,
      state           TEXT    NOT NULL,
      state_at        INTEGER NOT NULL,
      error           TEXT    NOT NULL DEFAULT '',
      progress        INTEGER NOT NULL DEFAULT 0,
      attempts        INTEGER NOT NULL DEFAULT 1,
      from_slot       TEXT,
      to_slot         TEXT,
      switched_at     INTEGER,
      restart_pending INTEGER NOT NULL DEFAULT 0,
      cancel_asked    INTEGER NOT NULL DEFAULT 0,
      received_at     INTEGER NOT NULL,
      reported        INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE fw_steps (
      job   TEXT    NOT NULL,
      seq   INTEGER PRIMARY KEY,
      state TEXT    NOT NULL,
      at    INTEGER NOT NULL,
      error TEXT    NOT NULL DEFAULT ''
    );
    CREATE INDEX fw_steps_job ON fw_steps (job, seq);
  `);
};

/**
 * The code of a job's error (`fwerrorcode`, protocol/firmware.ts) beside its text, in the job and in each step.
 * Empty while there is no error, and for an error saved before codes were kept.
 */
export const FIRMWARE_ERROR_CODE_MIGRATION: Migration = (db) => {
  db.exec(`
    ALTER TABLE fw_jobs ADD COLUMN error_code TEXT NOT NULL DEFAULT '';
    ALTER TABLE fw_steps ADD COLUMN error_code TEXT NOT NULL DEFAULT '';
  `);
};

/** A job's or a step's error code: empty when there is no error (or it was saved without one). */
export type FwErrorCode = FwFailureCode | '';

const errorCode = (s: string): FwErrorCode => (isFwFailureCode(s) ? s : '');

export interface FwJob {
  seq: number;
  id: string;
  name: string;
  version: number;
  platform: string;
  url: string;
  token: string | null;
  size: number;
  sha256: string;
  signature: string;
  state: FwState;
  stateAt: number;
  error: string;
  errorCode: FwErrorCode;
  progress: number;
  attempts: number;
  fromSlot: SlotName | null;
  toSlot: SlotName | null;
  switchedAt: number | null;
  restartPending: boolean;
  cancelAsked: boolean;
  receivedAt: number;
  reported: boolean;
}

export type NewFwJob = Pick<
  FwJob,
  'id' | 'name' | 'version' | 'platform' | 'url' | 'token' | 'size' | 'sha256' | 'signature'
>;

export interface FwStep {
  state: FwState;
  at: number;
  error: string;
  errorCode: FwErrorCode;
}

interface Row {
  seq: number;
  id: string;
  name: string;
  version: number;
  platform: string;
  url: string;
  token: string | null;
  size: number;
  sha256: string;
  signature: string;
  state: string;
  state_at: number;
  error: string;
  error_code: string;
  progress: number;
  attempts: number;
  from_slot: string | null;
  to_slot: string | null;
  switched_at: number | null;
  restart_pending: number;
  cancel_asked: number;
  received_at: number;
  reported: number;
}

function slot(s: string | null): SlotName | null {
  return s === 'a' || s === 'b' ? s : null;
}

function fromRow(r: Row): FwJob {
  if (!isFwState(r.state)) throw new Error(`fw_jobs row ${r.id} has an unknown state ${JSON.stringify(r.state)}`);
  return {
    seq: r.seq,
    id: r.id,
    name: r.name,
    version: r.version,
    platform: r.platform,
    url: r.url,
    token: r.token,
    size: r.size,
    sha256: r.sha256,
    signature: r.signature,
    state: r.state,
    stateAt: r.state_at,
    error: r.error,
    errorCode: errorCode(r.error_code),
    progress: r.progress,
    attempts: r.attempts,
    fromSlot: slot(r.from_slot),
    toSlot: slot(r.to_slot),
    switchedAt: r.switched_at,
    restartPending: r.restart_pending === 1,
    cancelAsked: r.cancel_asked === 1,
    receivedAt: r.received_at,
    reported: r.reported === 1,
  };
}

/** What a transition changes besides the state; fields left out keep their value. */
export interface StatePatch {
  /** The error and its code go together: a new error replaces both. */
  failure?: { error: string; code: FwFailureCode };
  progress?: number;
  attempts?: number;
  fromSlot?: SlotName;
  toSlot?: SlotName;
  switchedAt?: number;
  restartPending?: boolean;
  token?: null;
}

export class FwJobStore {
  constructor(private readonly db: Db) {}

  /** The latest job: the one the state machine works on (or last worked on). */
  latest(): FwJob | undefined {
    const r = this.db.prepare('SELECT * FROM fw_jobs ORDER BY seq DESC LIMIT 1').get() as Row | undefined;
    return r && fromRow(r);
  }

  byId(id: string): FwJob | undefined {
    const r = this.db.prepare('SELECT * FROM fw_jobs WHERE id = ?').get(id) as Row | undefined;
    return r && fromRow(r);
  }

  /** The version of the latest committed image that is still in place, if any. */
  committedVersion(): number | undefined {
    const r = this.db.prepare(`SELECT version FROM fw_jobs WHERE state = 'done' ORDER BY seq DESC LIMIT 1`).get() as
      { version: number } | undefined;
    return r?.version;
  }

  add(job: NewFwJob, state: FwState, now: number): FwJob {
    this.db.transaction(() => {
      this.db
        .prepare(
          `INSERT INTO fw_jobs (id, name, version, platform, url, token, size, sha256, signature, state, state_at,
                                received_at)
           VALUES (@id, @name, @version, @platform, @url, @token, @size, @sha256, @signature, @state, @now, @now)`,
        )
        .run({ ...job, state, now });
      this.step(job.id, state, now);
    })();
    return this.byId(job.id)!;
  }

  /** Saves a transition (durably: this runs before the side effect of `state`). */
  move(id: string, state: FwState, now: number, patch: StatePatch = {}): FwJob {
    this.db.transaction(() => {
      this.db
        .prepare(
          `UPDATE fw_jobs SET state = @state, state_at = @now, reported = 0,
             error = coalesce(@error, error),
             error_code = coalesce(@errorCode, error_code),
             progress = coalesce(@progress, progress),
             attempts = coalesce(@attempts, attempts),
             from_slot = coalesce(@fromSlot, from_slot),
             to_slot = coalesce(@toSlot, to_slot),
             switched_at = coalesce(@switchedAt, switched_at),
             restart_pending = coalesce(@restartPending, restart_pending),
             token = CASE WHEN @clearToken = 1 THEN NULL ELSE token END
           WHERE id = @id`,
        )
        .run({
          id,
          state,
          now,
          error: patch.failure?.error ?? null,
          errorCode: patch.failure?.code ?? null,
          progress: patch.progress ?? null,
          attempts: patch.attempts ?? null,
          fromSlot: patch.fromSlot ?? null,
          toSlot: patch.toSlot ?? null,
          switchedAt: patch.switchedAt ?? null,
          restartPending: patch.restartPending === undefined ? null : patch.restartPending ? 1 : 0,
          clearToken: patch.token === null ? 1 : 0,
        });
      this.step(id, state, now, patch.failure);
    })();
    return this.byId(id)!;
  }

  /** Changes fields without a transition (progress, the loop counter, a pending restart done). */
  patch(id: string, patch: Pick<StatePatch, 'progress' | 'attempts' | 'restartPending' | 'failure'>): FwJob {
    this.db
      .prepare(
        `UPDATE fw_jobs SET
           progress = coalesce(@progress, progress),
           attempts = coalesce(@attempts, attempts),
           restart_pending = coalesce(@restartPending, restart_pending),
           error = coalesce(@error, error),
           error_code = coalesce(@errorCode, error_code),
           reported = CASE WHEN @error IS NULL THEN reported ELSE 0 END
         WHERE id = @id`,
      )
      .run({
        id,
        progress: patch.progress ?? null,
        attempts: patch.attempts ?? null,
        restartPending: patch.restartPending === undefined ? null : patch.restartPending ? 1 : 0,
        error: patch.failure?.error ?? null,
        errorCode: patch.failure?.code ?? null,
      });
    return this.byId(id)!;
  }

  /** A job sent again carries a new token (the bridge keeps only hashes); a download still to come needs it. */
  refreshToken(id: string, token: string, url: string): void {
    this.db.prepare('UPDATE fw_jobs SET token = ?, url = ? WHERE id = ? AND token IS NOT NULL').run(token, url, id);
  }

  /** A cancel from the cloud, kept so that a restart before it is acted on still honours it. */
  askCancel(id: string): void {
    this.db.prepare('UPDATE fw_jobs SET cancel_asked = 1 WHERE id = ?').run(id);
  }

  /** The broker acknowledged the report of `state`; a later transition has `reported = 0` again. */
  markReported(id: string, state: FwState, stateAt: number): void {
    this.db
      .prepare('UPDATE fw_jobs SET reported = 1 WHERE id = ? AND state = ? AND state_at = ?')
      .run(id, state, stateAt);
  }

  steps(id: string): FwStep[] {
    const rows = this.db
      .prepare('SELECT state, at, error, error_code FROM fw_steps WHERE job = ? ORDER BY seq')
      .all(id) as Array<{ state: string; at: number; error: string; error_code: string }>;
    return rows.map((r) => ({
      state: isFwState(r.state) ? r.state : 'idle',
      at: r.at,
      error: r.error,
      errorCode: errorCode(r.error_code),
    }));
  }

  /** Keeps the last `keep` jobs and their steps, and the latest committed one, whose version the agent reports. */
  prune(keep: number): void {
    const old = `SELECT id FROM fw_jobs
                 WHERE seq <= (SELECT max(seq) FROM fw_jobs) - @keep
                   AND seq IS NOT (SELECT max(seq) FROM fw_jobs WHERE state = 'done')`;
    this.db.transaction(() => {
      this.db.prepare(`DELETE FROM fw_steps WHERE job IN (${old})`).run({ keep });
      this.db.prepare(`DELETE FROM fw_jobs WHERE id IN (${old})`).run({ keep });
    })();
  }

  /** Records an event of a job that is not a transition (a failed rollback that waits to be tried again). */
  noteStep(job: string, state: FwState, at: number, failure: StatePatch['failure']): void {
    this.step(job, state, at, failure);
  }

  private step(job: string, state: FwState, at: number, failure?: StatePatch['failure']): void {
    this.db
      .prepare('INSERT INTO fw_steps (job, state, at, error, error_code) VALUES (?, ?, ?, ?, ?)')
      .run(job, state, at, failure?.error ?? '', failure?.code ?? '');
  }
}
