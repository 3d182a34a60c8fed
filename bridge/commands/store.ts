/**
 * Commands on the bridge (docs/decisions.md §6 and decision 13): each one stored with its expiry before the caller
 * gets its uuid, handed to the device when it is connected and again on each of its hellos until the device
 * reports an outcome, and never handed over after it expires.
 *
 * States as the API shows them: `queued` (on the bridge, not yet handed over), `sent` (handed to the broker; the
 * device may have it queued: `delivered` says when it said so), `running`, `done`, `failed`, `expired`. A state
 * only moves forward.
 */
import type { Db, Migration } from '../../lib/sqlite.js';
import type { CmdStatusMessage } from '../../protocol/index.js';

export const COMMAND_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE commands (
      seq         INTEGER PRIMARY KEY,
      id          TEXT    NOT NULL UNIQUE,
      device_id   TEXT    NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
      user_id     INTEGER,
      command     BLOB    NOT NULL,
      priority    INTEGER NOT NULL,
      created_at  INTEGER NOT NULL,
      expires_at  INTEGER NOT NULL,
      state       TEXT    NOT NULL CHECK (state IN ('queued', 'sent', 'running', 'done', 'failed', 'expired')),
      state_at    INTEGER NOT NULL,
      sent_at     INTEGER,
      delivered_at INTEGER,
      started_at  INTEGER,
      finished_at INTEGER,
      exit_code   INTEGER,
      signal      TEXT,
      output      TEXT,
      truncated   INTEGER NOT NULL DEFAULT 0,
      reason      TEXT
    );
    CREATE INDEX commands_device ON commands (device_id, seq);
    CREATE INDEX commands_open ON commands (device_id, seq) WHERE state IN ('queued', 'sent', 'running');
    CREATE INDEX commands_expiry ON commands (expires_at) WHERE state IN ('queued', 'sent') AND delivered_at IS NULL;
    CREATE INDEX commands_finished ON commands (state_at) WHERE state IN ('done', 'failed', 'expired');
  `);
};

export type BridgeCommandState = 'queued' | 'sent' | 'running' | 'done' | 'failed' | 'expired';

export interface StoredCommand {
  seq: number;
  id: string;
  deviceId: string;
  command: Buffer;
  priority: 0 | 1 | 2;
  createdAt: number;
  expiresAt: number;
  state: BridgeCommandState;
  stateAt: number;
  sentAt: number | null;
  deliveredAt: number | null;
  startedAt: number | null;
  finishedAt: number | null;
  exitCode: number | null;
  signal: string | null;
  output: string | null;
  truncated: boolean;
  reason: string | null;
}

/** A row of `commands` as either engine reads it: `truncated` is SQLite's 0/1 or PostgreSQL's BOOLEAN. */
export interface CommandRow {
  seq: number;
  id: string;
  device_id: string;
  command: Buffer;
  priority: 0 | 1 | 2;
  created_at: number;
  expires_at: number;
  state: BridgeCommandState;
  state_at: number;
  sent_at: number | null;
  delivered_at: number | null;
  started_at: number | null;
  finished_at: number | null;
  exit_code: number | null;
  signal: string | null;
  output: string | null;
  truncated: number | boolean;
  reason: string | null;
}

export const toCommand = (r: CommandRow): StoredCommand => ({
  seq: r.seq,
  id: r.id,
  deviceId: r.device_id,
  command: r.command,
  priority: r.priority,
  createdAt: r.created_at,
  expiresAt: r.expires_at,
  state: r.state,
  stateAt: r.state_at,
  sentAt: r.sent_at,
  deliveredAt: r.delivered_at,
  startedAt: r.started_at,
  finishedAt: r.finished_at,
  exitCode: r.exit_code,
  signal: r.signal,
  output: r.output,
  truncated: r.truncated === true || r.truncated === 1,
  reason: r.reason,
});

/** The order of the states: `done`, `failed` and `expired` are all final. */
export const RANK: Record<BridgeCommandState, number> = {
  queued: 0,
  sent: 1,
  running: 2,
  done: 3,
  failed: 3,
  expired: 3,
};

export interface NewBridgeCommand {
  id: string;
  deviceId: string;
  userId: number | null;
  command: Buffer;
  priority: 0 | 1 | 2;
  createdAt: number;
  expiresAt: number;
}

export class CommandStore {
  private readonly s;

  constructor(db: Db) {
    this.s = {
      insert: db.prepare(
        `INSERT INTO commands (id, device_id, user_id, command, priority, created_at, expires_at, state, state_at, sent_at)
         VALUES (@id, @deviceId, @userId, @command, @priority, @createdAt, @expiresAt,
                 CASE WHEN @sentAt IS NULL THEN 'queued' ELSE 'sent' END, @createdAt, @sentAt)`,
      ),
      byId: db.prepare<[string], CommandRow>('SELECT * FROM commands WHERE id = ?'),
      byState: db.prepare<[], { state: BridgeCommandState; n: number }>(
        'SELECT state, count(*) AS n FROM commands GROUP BY state',
      ),
      openCount: db
        .prepare<[string], number>(
          "SELECT count(*) FROM commands WHERE device_id = ? AND state IN ('queued', 'sent', 'running')",
        )
        .pluck(),
      open: db.prepare<[string, number, number], CommandRow>(
        `SELECT * FROM commands WHERE device_id = ? AND state IN ('queued', 'sent', 'running') AND seq > ?
         ORDER BY seq LIMIT ?`,
      ),
      ofDevice: db.prepare<[string, number, number], CommandRow>(
        'SELECT * FROM commands WHERE device_id = ? AND seq < ? ORDER BY seq DESC LIMIT ?',
      ),
      markSent: db.prepare(
        "UPDATE commands SET state = 'sent', state_at = @now, sent_at = @now WHERE id = @id AND state = 'queued'",
      ),
      touchSent: db.prepare('UPDATE commands SET sent_at = @now WHERE id = @id'),
      update: db.prepare(
        `UPDATE commands SET state = @state, state_at = @at, delivered_at = coalesce(delivered_at, @at),
           started_at = coalesce(@startedAt, started_at), finished_at = @finishedAt, exit_code = @exitCode,
           signal = @signal, output = @output, truncated = @truncated, reason = @reason
         WHERE id = @id`,
      ),
      delivered: db.prepare('UPDATE commands SET delivered_at = coalesce(delivered_at, @at) WHERE id = @id'),
      expire: db.prepare(
        `UPDATE commands SET state = 'expired', state_at = expires_at, finished_at = expires_at,
           reason = 'its lifetime ended before the device received it'
         WHERE state IN ('queued', 'sent') AND delivered_at IS NULL AND expires_at <= ?`,
      ),
      deleteOfDevice: db.prepare('DELETE FROM commands WHERE device_id = ?'),
      prune: db.prepare(
        `DELETE FROM commands WHERE seq IN (
           SELECT seq FROM commands WHERE state IN ('done', 'failed', 'expired') AND state_at < ? ORDER BY state_at LIMIT ?)`,
      ),
    };
  }

  /** Stores a new command: `queued`, or `sent` at `sentAt` when it is handed over right after the commit. */
  add(c: NewBridgeCommand, sentAt?: number): void {
    this.s.insert.run({ ...c, sentAt: sentAt ?? null });
  }

  /** How many commands the bridge holds in each state (metrics). */
  countByState(): Partial<Record<BridgeCommandState, number>> {
    const out: Partial<Record<BridgeCommandState, number>> = {};
    for (const r of this.s.byState.all()) out[r.state] = r.n;
    return out;
  }

  get(id: string): StoredCommand | undefined {
    const r = this.s.byId.get(id);
    return r && toCommand(r);
  }

  /** Commands not finished: queued, sent or running. */
  openCount(deviceId: string): number {
    return this.s.openCount.get(deviceId) ?? 0;
  }

  /** A page of the device's open commands, oldest first. */
  open(deviceId: string, afterSeq: number, limit: number): StoredCommand[] {
    return this.s.open.all(deviceId, afterSeq, limit).map(toCommand);
  }

  /** The device's commands, newest first, older than `beforeSeq`. */
  ofDevice(deviceId: string, limit: number, beforeSeq = Number.MAX_SAFE_INTEGER): StoredCommand[] {
    return this.s.ofDevice.all(deviceId, beforeSeq, limit).map(toCommand);
  }

  /** Handed to the broker: `queued` becomes `sent`; a later state keeps itself, with a new `sent_at`. */
  markSent(id: string, now: number): void {
    if (this.s.markSent.run({ id, now }).changes === 0) this.s.touchSent.run({ id, now });
  }

  /** A status report from the device. Returns `false` when it does not move the command forward. */
  report(deviceId: string, msg: CmdStatusMessage): boolean {
    const cur = this.get(msg.cmd);
    if (!cur || cur.deviceId !== deviceId) return false;
    if (msg.state === 'queued') {
      // Delivered: the device has it queued. The bridge's state stays `sent`.
      this.s.delivered.run({ id: msg.cmd, at: msg.at });
      if (cur.state === 'queued') this.markSent(msg.cmd, msg.at);
      return cur.deliveredAt === null;
    }
    if (RANK[msg.state] <= RANK[cur.state]) return false;
    const final = RANK[msg.state] === 3;
    this.s.update.run({
      id: msg.cmd,
      state: msg.state,
      at: msg.at,
      startedAt: msg.state === 'running' ? msg.at : null,
      finishedAt: final ? msg.at : null,
      exitCode: final ? (msg.exitCode ?? null) : null,
      signal: final ? (msg.signal ?? null) : null,
      output: final ? (msg.output ?? null) : null,
      truncated: final && msg.truncated ? 1 : 0,
      reason: msg.reason ?? null,
    });
    return true;
  }

  /** Commands the device never received whose lifetime ended: `expired`. Returns how many. */
  expire(now: number): number {
    return this.s.expire.run(now).changes;
  }

  /** Removes up to `max` finished commands whose state is older than `before`; returns how many. */
  prune(before: number, max: number): number {
    return this.s.prune.run(before, max).changes;
  }

  /** Unregistering a device drops its commands. */
  deleteOfDevice(deviceId: string): void {
    this.s.deleteOfDevice.run(deviceId);
  }
}
