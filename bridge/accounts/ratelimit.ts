/**
 * Attempt limits for login, signup, resend and recovery, per address and per login (docs/decisions.md §9).
 *
 * A sliding window log: each key keeps the times of its attempts inside the last `windowMs`, at most `limit`
 * of them, so no window of that length ever holds more than `limit` allowed attempts and the wait announced
 * with a refusal is exact. A refused attempt is not recorded, so a client that retries too early is still
 * let in once its oldest attempt leaves the window.
 *
 * At most `maxKeys` keys are remembered, in least-recently-used order: a flood of fresh keys evicts the keys
 * touched longest ago instead of growing memory, and keys whose attempts have all expired are dropped as soon
 * as they reach the old end. Memory per key is the key (long keys are kept as a digest) and at most `limit`
 * numbers, usually one.
 */
import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';

export interface RateLimitOptions {
  /** Attempts allowed per key within any window of `windowMs`. */
  limit: number;
  windowMs: number;
  /** Clock in milliseconds; monotonic by default, so a wall-clock step neither frees nor locks anyone. */
  now?: () => number;
  /** Keys remembered at most; default 100,000. */
  maxKeys?: number;
}

export type RateLimitResult = { ok: true; remaining: number } | { ok: false; retryAfterMs: number };

/**
 * What the account routes count their attempts with: the in-memory {@link RateLimiter} of one bridge
 * ({@link memoryLimiter}), or the limiter shared by every bridge on one PostgreSQL database
 * (`shared-ratelimit.ts`; docs/api.md, Rate limits).
 */
export interface AttemptLimiter {
  /** Counts one attempt for `key`; `ok: false` with the milliseconds until the next attempt would be allowed. */
  take(key: string): Promise<RateLimitResult>;
  /** Forgets the attempts of `key`. */
  reset(key: string): Promise<void>;
}

/** Keys up to this length are kept as given; longer ones as a fixed-size digest. */
const MAX_PLAIN_KEY = 64;

/** One remembered key, linked from least to most recently used. */
interface Entry {
  key: string;
  /** Attempt times inside the window, oldest first; never empty while the entry is linked. */
  times: number[];
  older: Entry | undefined;
  newer: Entry | undefined;
}

export class RateLimiter {
  private readonly limit: number;
  private readonly windowMs: number;
  private readonly now: () => number;
  private readonly maxKeys: number;
  private readonly entries = new Map<string, Entry>();
  /**
   * Recency order is kept in a linked list rather than in the map's insertion order: finding the oldest
   * entry of a map whose front has just been deleted walks over the deleted slots, which turns a flood into
   * quadratic work.
   */
  private oldest: Entry | undefined;
  private newest: Entry | undefined;

  constructor(opts: RateLimitOptions) {
    if (!Number.isInteger(opts.limit) || opts.limit < 1) {
      throw new RangeError(`limit must be a positive integer, got ${opts.limit}`);
    }
    if (!Number.isFinite(opts.windowMs) || opts.windowMs <= 0) {
      throw new RangeError(`windowMs must be a positive number, got ${opts.windowMs}`);
    }
    const maxKeys = opts.maxKeys ?? 100_000;
    if (!Number.isInteger(maxKeys) || maxKeys < 1) {
      throw new RangeError(`maxKeys must be a positive integer, got ${maxKeys}`);
    }
    this.limit = opts.limit;
    this.windowMs = opts.windowMs;
    this.now = opts.now ?? (() => performance.now());
    this.maxKeys = maxKeys;
  }

  /** Keys currently remembered. */
  get size(): number {
    return this.entries.size;
  }

  /** Counts one attempt for `key`; `ok: false` with the milliseconds until the next attempt would be allowed. */
  take(key: string): RateLimitResult {
    const now = this.now();
    const horizon = now - this.windowMs;
    this.dropExpired(horizon);
    const k = storedKey(key);
    let entry = this.entries.get(k);
    if (entry) {
      this.unlink(entry);
      const times = entry.times;
      while (times.length > 0 && (times[0] as number) <= horizon) times.shift();
    } else {
      entry = { key: k, times: [], older: undefined, newer: undefined };
      this.entries.set(k, entry);
    }
    this.append(entry);
    const times = entry.times;
    if (times.length >= this.limit) {
      const first = times[0] as number;
      return { ok: false, retryAfterMs: Math.max(1, Math.ceil(first + this.windowMs - now)) };
    }
    times.push(now);
    while (this.entries.size > this.maxKeys && this.oldest) this.remove(this.oldest);
    return { ok: true, remaining: this.limit - times.length };
  }

  reset(key: string): void {
    const entry = this.entries.get(storedKey(key));
    if (entry) this.remove(entry);
  }

  /**
   * Forgets entries at the least recently used end whose newest attempt has left the window; they carry
   * nothing. Each entry is dropped once, so this costs O(1) per take over time.
   */
  private dropExpired(horizon: number): void {
    while (this.oldest) {
      const newestTime = this.oldest.times[this.oldest.times.length - 1];
      if (newestTime !== undefined && newestTime > horizon) return;
      this.remove(this.oldest);
    }
  }

  private remove(entry: Entry): void {
    this.unlink(entry);
    this.entries.delete(entry.key);
  }

  private unlink(entry: Entry): void {
    if (entry.older) entry.older.newer = entry.newer;
    else this.oldest = entry.newer;
    if (entry.newer) entry.newer.older = entry.older;
    else this.newest = entry.older;
    entry.older = undefined;
    entry.newer = undefined;
  }

  private append(entry: Entry): void {
    entry.older = this.newest;
    if (this.newest) this.newest.newer = entry;
    else this.oldest = entry;
    this.newest = entry;
  }
}

/** A {@link RateLimiter} behind the {@link AttemptLimiter} interface: each call answers at once. */
export function memoryLimiter(limiter: RateLimiter): AttemptLimiter {
  return {
    take: (key) => Promise.resolve(limiter.take(key)),
    reset: (key) => {
      limiter.reset(key);
      return Promise.resolve();
    },
  };
}

/**
 * The key a limiter remembers for `key`: short keys as they are, long ones as a fixed-size digest. Prefixes keep
 * a digest from ever equalling a plain key.
 */
export function storedKey(key: string): string {
  if (key.length <= MAX_PLAIN_KEY) return `=${key}`;
  return digestKey(key);
}

/** The digest form of {@link storedKey}, for any key. */
export function digestKey(key: string): string {
  return `#${createHash('sha256').update(key, 'utf8').digest('base64')}`;
}
