/**
 * The gateway's command queue in SQLite (docs/decisions.md §6): every command the cloud sends is stored here before
 * anything else happens to it, and its state moves forward only: `queued` → `running` → `done` or `failed`, or
 * `queued` → `expired`. The queue is also the outbox of status reports: `reported` says whether the latest state
 * reached the broker, and what has not is reported again on the next connect.
 *
 * Order: highest priority first, first in first out within a priority (`seq` is the arrival order).
 */
import type { Db, Migration } from '../../lib/sqlite.js';
import type { CommandState } from '../../protocol/index.js';

export const COMMAND_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE commands (
      seq         INTEGER PRIMARY KEY,
      id          TEXT    NOT NULL UNIQUE,
      command     BLOB    NOT NULL,
      priority    INTEGER NOT NULL,
      created     INTEGER NOT NULL,
      expires     INTEGER NOT NULL,
      received_at INTEGER NOT NULL,
      state       TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed', 'expired')),
      state_at    INTEGER NOT NULL,
      started_at  INTEGER,
      exit_code   INTEGER,
      signal      TEXT,
      output      TEXT,
      truncated   INTEGER NOT NULL DEFAULT 0,
      reason      TEXT,
      reported    INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX commands_next ON commands (priority DESC, seq) WHERE state = 'queued';
    CREATE INDEX commands_unreported ON commands (seq) WHERE reported = 0;
    CREATE INDEX commands_finished ON commands (state_at) WHERE state IN ('done', 'failed', 'expired');
  `);
};

/**
 * The process of a running executable handler: its pid (its process group's id) and start time, recorded before
 * the handler may start, so that after a crash the agent knows whether it started and can end what survived.
 */
export const COMMAND_PROCESS_MIGRATION: Migration = (db) => {
  db.exec(`
    ALTER TABLE commands ADD COLUMN pid INTEGER;
    ALTER TABLE commands ADD COLUMN pid_start INTEGER;
  `);
};

export interface QueuedCommand {
  seq: number;
  id: string;
  command: Buffer;
  priority: 0 | 1 | 2;
  created: number;
  expires: number;
  receivedAt: number;
  state: CommandState;
  stateAt: number;
  startedAt: number | null;
  exitCode: number | null;
  signal: string | null;
  output: string | null;
  truncated: boolean;
  reason: string | null;
  reported: boolean;
  /** The handler's process, once it was launched. */
  pid: number | null;
  pidStart: number | null;
}

interface Row {
  seq: number;
  id: string;
  command: Buffer;
  priority: 0 | 1 | 2;
  created: number;
  expires: number;
  received_at: number;
  state: CommandState;
  state_at: number;
  started_at: number | null;
  exit_code: number | null;
  signal: string | null;
  output: string | null;
  truncated: number;
  reason: string | null;
  reported: number;
  pid: number | null;
  pid_start: number | null;
}

const toCommand = (r: Row): QueuedCommand => ({
  seq: r.seq,
  id: r.id,
  command: r.command,
  priority: r.priority,
  created: r.created,
  expires: r.expires,
  receivedAt: r.received_at,
  state: r.state,
  stateAt: r.state_at,
  startedAt: r.started_at,
  exitCode: r.exit_code,
  signal: r.signal,
  output: r.output,
  truncated: r.truncated === 1,
  reason: r.reason,
  reported: r.reported === 1,
  pid: r.pid,
  pidStart: r.pid_start,
});

export interface NewCommand {
  id: string;
  command: Buffer;
  priority: 0 | 1 | 2;
  created: number;
  expires: number;
}

export interface Outcome {
  state: 'done' | 'failed' | 'expired';
  exitCode?: number | null;
  signal?: string | null;
  output?: string;
  truncated?: boolean;
  reason?: string;
}

const FINAL: ReadonlySet<CommandState> = new Set(['done', 'failed', 'expired']);

export function isFinal(state: CommandState): boolean {
  return FINAL.has(state);
}

export class CommandQueue {
  private readonly s;

  constructor(db: Db) {
    this.s = {
      byId: db.prepare<[string], Row>('SELECT * FROM commands WHERE id = ?'),
      insert: db.prepare(
        `INSERT INTO commands (id, command, priority, created, expires, received_at, state, state_at)
         VALUES (@id, @command, @priority, @created, @expires, @now, 'queued', @now)
         ON CONFLICT (id) DO NOTHING`,
      ),
      next: db.prepare<[], Row>("SELECT * FROM commands WHERE state = 'queued' ORDER BY priority DESC, seq LIMIT 1"),
      queued: db.prepare<[], Row>("SELECT * FROM commands WHERE state = 'queued' ORDER BY priority DESC, seq"),
      lapsed: db.prepare<[number, number], Row>(
        "SELECT * FROM commands WHERE state = 'queued' AND expires <= ? ORDER BY priority DESC, seq LIMIT ?",
      ),
      running: db.prepare<[], Row>("SELECT * FROM commands WHERE state = 'running' ORDER BY seq"),
      start: db.prepare(
        "UPDATE commands SET state = 'running', state_at = @now, started_at = @now, reported = 0 WHERE id = @id AND state = 'queued'",
      ),
      finish: db.prepare(
        `UPDATE commands SET state = @state, state_at = @now, exit_code = @exitCode, signal = @signal,
           output = @output, truncated = @truncated, reason = @reason, reported = 0
         WHERE id = @id AND state IN ('queued', 'running')`,
      ),
      launched: db.prepare(
        "UPDATE commands SET pid = @pid, pid_start = @pidStart WHERE id = @id AND state = 'running'",
      ),
      requeue: db.prepare(
        `UPDATE commands SET state = 'queued', state_at = @now, started_at = NULL, pid = NULL, pid_start = NULL,
           reported = 0 WHERE id = @id AND state = 'running'`,
      ),
      markReported: db.prepare('UPDATE commands SET reported = 1 WHERE id = ? AND state = ?'),
      unreported: db.prepare<[number, number], Row>(
        'SELECT * FROM commands WHERE reported = 0 AND seq > ? ORDER BY seq LIMIT ?',
      ),
      recent: db.prepare<[number], Row>('SELECT * FROM commands ORDER BY seq DESC LIMIT ?'),
      earliestExpiry: db.prepare<[], number | null>("SELECT min(expires) FROM commands WHERE state = 'queued'").pluck(),
      counts: db.prepare<[], { state: CommandState; n: number }>(
        'SELECT state, count(*) AS n FROM commands GROUP BY state',
      ),
      prune: db.prepare(
        `DELETE FROM commands WHERE seq IN (
           SELECT seq FROM commands WHERE state IN ('done', 'failed', 'expired') AND reported = 1 AND state_at < ?
           ORDER BY state_at LIMIT 1000)`,
      ),
    };
  }

  get(id: string): QueuedCommand | undefined {
    const r = this.s.byId.get(id);
    return r && toCommand(r);
  }

  /** Stores a command; `false` when a command with this id is already here (a repeated delivery). */
  add(c: NewCommand, now: number): boolean {
    return this.s.insert.run({ ...c, now }).changes > 0;
  }

  /** The command to run next, if any. */
  next(): QueuedCommand | undefined {
    const r = this.s.next.get();
    return r && toCommand(r);
  }

  queued(): QueuedCommand[] {
    return this.s.queued.all().map(toCommand);
  }

  /** Queued commands whose lifetime ended by `now`, wherever they are in the queue. */
  lapsed(now: number, limit: number): QueuedCommand[] {
    return this.s.lapsed.all(now, limit).map(toCommand);
  }

  running(): QueuedCommand[] {
    return this.s.running.all().map(toCommand);
  }

  start(id: string, now: number): boolean {
    return this.s.start.run({ id, now }).changes > 0;
  }

  /** Records the process a running handler was launched as (before it may start: see runner.ts). */
  launched(id: string, pid: number, pidStart: number | null): void {
    this.s.launched.run({ id, pid, pidStart });
  }

  /** A command taken to run whose handler was never launched goes back to the queue, in its place. */
  requeue(id: string, now: number): boolean {
    return this.s.requeue.run({ id, now }).changes > 0;
  }

  finish(id: string, outcome: Outcome, now: number): boolean {
    return (
      this.s.finish.run({
        id,
        now,
        state: outcome.state,
        exitCode: outcome.exitCode ?? null,
        signal: outcome.signal ?? null,
        output: outcome.output ?? null,
        truncated: outcome.truncated ? 1 : 0,
        reason: outcome.reason ?? null,
      }).changes > 0
    );
  }

  /** The report of `state` reached the broker; a later state stays unreported until its own report does. */
  markReported(id: string, state: CommandState): void {
    this.s.markReported.run(id, state);
  }

  unreported(afterSeq: number, limit: number): QueuedCommand[] {
    return this.s.unreported.all(afterSeq, limit).map(toCommand);
  }

  recent(limit: number): QueuedCommand[] {
    return this.s.recent.all(limit).map(toCommand);
  }

  /** The earliest expiry among queued commands. */
  earliestExpiry(): number | undefined {
    return this.s.earliestExpiry.get() ?? undefined;
  }

  counts(): Partial<Record<CommandState, number>> {
    const out: Partial<Record<CommandState, number>> = {};
    for (const r of this.s.counts.all()) out[r.state] = r.n;
    return out;
  }

  /** Removes up to 1000 finished and reported commands whose state is older than `before`. */
  prune(before: number): number {
    return this.s.prune.run(before).changes;
  }
}
