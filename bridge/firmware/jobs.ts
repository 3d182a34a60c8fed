/**
 * Firmware jobs on the bridge (docs/decisions.md §7): one per update started through
 * `POST /0/devices/<id>/fw/<name>`, at most one open per device. A job carries the token its device downloads the
 * image with (kept as a hash, valid until `tokenExpires`), and ends when the device reports a final `fwstate`.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { Db, Migration } from '../../lib/sqlite.js';
import { type FwFinalState, isFwFinalState } from '../../protocol/index.js';

export const FIRMWARE_JOB_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE fw_jobs (
      id            TEXT    PRIMARY KEY,
      device_id     TEXT    NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
      name          TEXT    NOT NULL,
      sha256        TEXT    NOT NULL,
      size          INTEGER NOT NULL,
      token_hash    TEXT    NOT NULL,
      token_expires INTEGER NOT NULL,
      open          INTEGER NOT NULL DEFAULT 1,
      cancelled     INTEGER NOT NULL DEFAULT 0,
      created_at    INTEGER NOT NULL,
      ended_at      INTEGER,
      outcome       TEXT
    ) WITHOUT ROWID;
    -- At most one open job per device.
    CREATE UNIQUE INDEX fw_jobs_open ON fw_jobs (device_id) WHERE open = 1;
  `);
};

/**
 * The image URL sent with a job, so that the job can be sent again on the device's next hello; and the token it
 * replaced, which keeps working beside the new one (a download under way when the job is sent again goes on).
 */
export const FIRMWARE_JOB_URL_MIGRATION: Migration = (db) => {
  db.exec(`
    ALTER TABLE fw_jobs ADD COLUMN url TEXT;
    ALTER TABLE fw_jobs ADD COLUMN prev_token_hash TEXT;
  `);
};

/**
 * Why the bridge closed a job itself, without a final state from the device: the image left the catalog before
 * the device had it (`image-gone`, firmware/resend.ts), the job's token expired while the device reported nothing
 * running (`abandoned`), or the job could not be handed to the broker (`undelivered`).
 */
export const BRIDGE_JOB_OUTCOMES = ['image-gone', 'abandoned', 'undelivered'] as const;

/** How a job ended: the final `fwstate` the device reported (protocol/firmware.ts), or the bridge's reason. */
export type JobOutcome = FwFinalState | (typeof BRIDGE_JOB_OUTCOMES)[number];

const toOutcome = (s: string | null): JobOutcome | null => {
  if (s === null) return null;
  if (isFwFinalState(s)) return s;
  return BRIDGE_JOB_OUTCOMES.find((o) => o === s) ?? null;
};

export interface FirmwareJob {
  id: string;
  deviceId: string;
  name: string;
  sha256: string;
  size: number;
  tokenExpires: number;
  open: boolean;
  cancelled: boolean;
  createdAt: number;
  endedAt: number | null;
  outcome: JobOutcome | null;
  /** `null` for a job made before URLs were kept. */
  url: string | null;
}

/** A row of `fw_jobs` as either engine reads it: the flags are SQLite's 0/1 or PostgreSQL's BOOLEAN. */
export interface JobRow {
  id: string;
  device_id: string;
  name: string;
  sha256: string;
  size: number;
  token_hash: string;
  token_expires: number;
  open: number | boolean;
  cancelled: number | boolean;
  created_at: number;
  ended_at: number | null;
  outcome: string | null;
  url: string | null;
  prev_token_hash: string | null;
}

export const toJob = (r: JobRow): FirmwareJob => ({
  id: r.id,
  deviceId: r.device_id,
  name: r.name,
  sha256: r.sha256,
  size: r.size,
  tokenExpires: r.token_expires,
  open: r.open === true || r.open === 1,
  cancelled: r.cancelled === true || r.cancelled === 1,
  createdAt: r.created_at,
  endedAt: r.ended_at,
  outcome: toOutcome(r.outcome),
  url: r.url,
});

export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

export interface NewJob {
  id: string;
  deviceId: string;
  name: string;
  sha256: string;
  size: number;
  token: string;
  tokenExpires: number;
  createdAt: number;
  url: string;
}

export class FirmwareJobStore {
  private readonly s;

  constructor(db: Db) {
    this.s = {
      byId: db.prepare<[string], JobRow>('SELECT * FROM fw_jobs WHERE id = ?'),
      openOf: db.prepare<[string], JobRow>('SELECT * FROM fw_jobs WHERE device_id = ? AND open = 1'),
      openCount: db.prepare<[], number>('SELECT count(*) FROM fw_jobs WHERE open = 1').pluck(),
      insert: db.prepare(
        `INSERT INTO fw_jobs (id, device_id, name, sha256, size, token_hash, token_expires, created_at, url)
         VALUES (@id, @deviceId, @name, @sha256, @size, @tokenHash, @tokenExpires, @createdAt, @url)`,
      ),
      renew: db.prepare(
        'UPDATE fw_jobs SET prev_token_hash = token_hash, token_hash = ?, token_expires = ? WHERE id = ? AND open = 1',
      ),
      end: db.prepare('UPDATE fw_jobs SET open = 0, ended_at = ?, outcome = ? WHERE id = ? AND open = 1'),
      cancel: db.prepare('UPDATE fw_jobs SET cancelled = 1 WHERE id = ? AND open = 1'),
    };
  }

  get(id: string): FirmwareJob | undefined {
    const r = this.s.byId.get(id);
    return r && toJob(r);
  }

  /** How many jobs are open (metrics). */
  openCount(): number {
    return this.s.openCount.get() ?? 0;
  }

  /** The device's open job, if any. */
  openOf(deviceId: string): FirmwareJob | undefined {
    const r = this.s.openOf.get(deviceId);
    return r && toJob(r);
  }

  add(j: NewJob): void {
    this.s.insert.run({ ...j, tokenHash: hashToken(j.token) });
  }

  /** Ends a job with the device's final `fwstate` (or why the bridge gave up on it). */
  end(id: string, outcome: JobOutcome, now: number): boolean {
    return this.s.end.run(now, outcome, id).changes > 0;
  }

  /**
   * Gives an open job a new token: a job sent again carries a new one. The token it replaces keeps working (until
   * the same expiry); the one before that stops.
   */
  renewToken(id: string, token: string, expires: number): void {
    this.s.renew.run(hashToken(token), expires, id);
  }

  markCancelled(id: string): void {
    this.s.cancel.run(id);
  }

  /** Whether `token` opens the image of job `id` at `now`. */
  tokenValid(id: string, token: string, now: number): FirmwareJob | undefined {
    const r = this.s.byId.get(id);
    if (!r || r.open !== 1 || r.token_expires <= now) return undefined;
    const a = Buffer.from(hashToken(token), 'hex');
    const matches = (hash: string | null): boolean => {
      if (hash === null) return false;
      const b = Buffer.from(hash, 'hex');
      return a.length === b.length && timingSafeEqual(a, b);
    };
    return matches(r.token_hash) || matches(r.prev_token_hash) ? toJob(r) : undefined;
  }
}
