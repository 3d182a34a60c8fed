/**
 * An attempt limiter that every bridge on one PostgreSQL database shares (docs/api.md, Rate limits): the counts
 * live in the table `rate_limits` (bridge/store/postgres/schema.ts, migration 2), so N bridges behind a load
 * balancer grant one budget per key, not N.
 *
 * A sliding window, approximated from two fixed windows per key. A key's window starts at its first attempt and
 * rolls forward `windowMs` at a time; the row keeps the allowed attempts of the current window (`count`) and of
 * the one before (`prev_count`). An attempt at `e` ms into the current window is allowed when
 *
 *     prev_count × (windowMs − e) / windowMs + count + 1 ≤ limit
 *
 * that is, when the attempts of the last `windowMs` would stay within the limit had the previous window's been
 * spread evenly over it. After a quiet gap of two windows the key starts afresh. A refused attempt is not counted,
 * as in the in-memory `RateLimiter`. The wait announced with a refusal is exact for this rule.
 *
 * Each take is one statement, an `INSERT … ON CONFLICT DO UPDATE`: the row lock taken on the conflict makes the
 * read, the decision and the write atomic between bridges, and the statement records its own decision in the row
 * (`allowed`), which `RETURNING` hands back.
 *
 * Times come from the bridge's clock (`now`, the wall clock): the bridges' clocks are assumed synchronised (NTP); a
 * skew shifts a window's edges by the skew, and a time before the window's start counts as its start.
 *
 * Rows whose last window ended a window ago carry nothing; every {@link SharedRateLimitOptions.pruneEvery} takes a
 * limiter deletes up to {@link SharedRateLimitOptions.pruneBatch} of its own, in the background, so the table stays
 * the size of the keys in use.
 */
import type { Pool } from 'pg';
import { type AttemptLimiter, type RateLimitResult, digestKey, storedKey } from './ratelimit.js';

export interface SharedRateLimitOptions {
  pool: Pool;
  /** The limiter's name, its part of each row's key: one name per kind of limit, the same on every bridge. */
  name: string;
  /** Attempts allowed per key within a window of `windowMs` (approximately: see above). */
  limit: number;
  /** Whole milliseconds. */
  windowMs: number;
  /** The bridge's wall clock in milliseconds since the epoch. */
  now: () => number;
  /** Takes between two rounds of deleting expired rows; default 100. */
  pruneEvery?: number;
  /** Rows deleted at most per round; default 1000, more than the takes of a round can add. */
  pruneBatch?: number;
}

/** One take: the row as the statement left it (`window_start` and the counts) and its decision. */
const TAKE = `
  INSERT INTO rate_limits AS r (limiter, key, window_start, count, prev_count, allowed)
  VALUES ($1, $2, $3, 1, 0, true)
  ON CONFLICT (limiter, key) DO UPDATE SET (window_start, prev_count, count, allowed) = (
    SELECT w.start, w.prev, w.count + CASE WHEN w.ok THEN 1 ELSE 0 END, w.ok
      FROM (SELECT s.start, s.prev, s.count,
                   s.prev::bigint * ($4 - LEAST($4, GREATEST(0, $3 - s.start))) + (s.count + 1)::bigint * $4
                     <= $5::bigint * $4 AS ok
              FROM (SELECT CASE WHEN $3 - r.window_start < $4 THEN r.window_start
                                WHEN $3 - r.window_start < 2 * $4 THEN r.window_start + $4
                                ELSE $3 END AS start,
                           CASE WHEN $3 - r.window_start < $4 THEN r.prev_count
                                WHEN $3 - r.window_start < 2 * $4 THEN r.count
                                ELSE 0 END AS prev,
                           CASE WHEN $3 - r.window_start < $4 THEN r.count ELSE 0 END AS count) s) w)
  RETURNING window_start::text AS start, count, prev_count AS prev, allowed`;

/**
 * Deletes up to $3 rows of limiter $1 that started before $2. The condition on `window_start` is checked again on
 * a row that a take changed meanwhile, which is then kept.
 */
const PRUNE = `
  DELETE FROM rate_limits
   WHERE limiter = $1 AND window_start <= $2
     AND key IN (SELECT key FROM rate_limits WHERE limiter = $1 AND window_start <= $2 LIMIT $3)`;

export class SharedRateLimiter implements AttemptLimiter {
  private readonly pool: Pool;
  private readonly name: string;
  private readonly limit: number;
  private readonly windowMs: number;
  private readonly now: () => number;
  private readonly pruneEvery: number;
  private readonly pruneBatch: number;
  private takes = 0;
  private pruning: Promise<number> | undefined;

  constructor(opts: SharedRateLimitOptions) {
    if (!Number.isInteger(opts.limit) || opts.limit < 1) {
      throw new RangeError(`limit must be a positive integer, got ${opts.limit}`);
    }
    if (!Number.isSafeInteger(opts.windowMs) || opts.windowMs <= 0) {
      throw new RangeError(`windowMs must be a positive integer, got ${opts.windowMs}`);
    }
    this.pool = opts.pool;
    this.name = opts.name;
    this.limit = opts.limit;
    this.windowMs = opts.windowMs;
    this.now = opts.now;
    this.pruneEvery = opts.pruneEvery ?? 100;
    this.pruneBatch = opts.pruneBatch ?? 1000;
  }

  async take(key: string): Promise<RateLimitResult> {
    const now = Math.floor(this.now());
    if (++this.takes >= this.pruneEvery) {
      this.takes = 0;
      // In the background: a request does not wait for the clean-up, and a failed round is retried by the next.
      if (!this.pruning) {
        this.pruning = this.prune(now)
          .catch(() => 0)
          .finally(() => (this.pruning = undefined));
      }
    }
    const r = await this.pool.query<{ start: string; count: number; prev: number; allowed: boolean }>(TAKE, [
      this.name,
      rowKey(key),
      now,
      this.windowMs,
      this.limit,
    ]);
    const row = r.rows[0]!;
    const w = this.windowMs;
    const e = Math.min(w, Math.max(0, now - Number(row.start)));
    if (row.allowed) {
      const estimate = (row.prev * (w - e)) / w + row.count;
      return { ok: true, remaining: Math.max(0, Math.floor(this.limit - estimate)) };
    }
    let wait: number;
    if (row.count + 1 <= this.limit) {
      // The current window has room; the previous window's share has to fade (prev > 0, or it would be allowed).
      wait = w - e - ((this.limit - 1 - row.count) * w) / row.prev;
    } else {
      // The current window is full: into the next one, until this window's count, as its previous, has faded.
      wait = w - e + w - ((this.limit - 1) * w) / row.count;
    }
    return { ok: false, retryAfterMs: Math.max(1, Math.ceil(wait)) };
  }

  async reset(key: string): Promise<void> {
    await this.pool.query('DELETE FROM rate_limits WHERE limiter = $1 AND key = $2', [this.name, rowKey(key)]);
  }

  /**
   * Deletes up to `pruneBatch` rows of this limiter whose windows ended at least a window before `now` (they
   * count nothing any more), and says how many. Also run every `pruneEvery` takes.
   */
  async prune(now = Math.floor(this.now())): Promise<number> {
    const r = await this.pool.query(PRUNE, [this.name, now - 2 * this.windowMs, this.pruneBatch]);
    return r.rowCount ?? 0;
  }

  /** Waits for a round of pruning started by a take, if one is running. */
  async settled(): Promise<void> {
    await this.pruning;
  }
}

/** The key of the row: as the in-memory limiter keeps it, and a digest for a key PostgreSQL's text cannot hold. */
function rowKey(key: string): string {
  return key.includes('\u0000') ? digestKey(key) : storedKey(key);
}
