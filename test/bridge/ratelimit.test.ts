import { describe, expect, it } from 'vitest';
import { RateLimiter } from '../../bridge/accounts/ratelimit.js';

/** A limiter on a clock the test moves by hand. */
function limiter(limit: number, windowMs: number, maxKeys?: number) {
  const clock = { t: 1_000_000 };
  const rl = new RateLimiter({ limit, windowMs, now: () => clock.t, ...(maxKeys ? { maxKeys } : {}) });
  return { rl, clock };
}

describe('rate limiter', () => {
  it('allows `limit` attempts, then refuses with the wait until the oldest leaves the window', () => {
    const { rl, clock } = limiter(3, 60_000);
    expect(rl.take('a@example.com')).toEqual({ ok: true, remaining: 2 });
    clock.t += 10_000;
    expect(rl.take('a@example.com')).toEqual({ ok: true, remaining: 1 });
    clock.t += 10_000;
    expect(rl.take('a@example.com')).toEqual({ ok: true, remaining: 0 });
    clock.t += 5_000;
    // First attempt was 25 s ago: it leaves the 60 s window in 35 s.
    expect(rl.take('a@example.com')).toEqual({ ok: false, retryAfterMs: 35_000 });
    clock.t += 34_999;
    expect(rl.take('a@example.com')).toEqual({ ok: false, retryAfterMs: 1 });
    clock.t += 1;
    expect(rl.take('a@example.com')).toEqual({ ok: true, remaining: 0 });
    // Now the second attempt (at +10 s) is the oldest.
    expect(rl.take('a@example.com')).toEqual({ ok: false, retryAfterMs: 10_000 });
  });

  it('never allows more than `limit` in any window, however the attempts are spread', () => {
    const { rl, clock } = limiter(5, 1_000);
    const allowed: number[] = [];
    for (let i = 0; i < 5_000; i++) {
      clock.t += (i * 7919) % 97; // an irregular but deterministic spacing
      if (rl.take('k').ok) allowed.push(clock.t);
    }
    for (let i = 5; i < allowed.length; i++) {
      expect(allowed[i]! - allowed[i - 5]!).toBeGreaterThanOrEqual(1_000);
    }
    expect(allowed.length).toBeGreaterThan(100);
  });

  it('does not count refused attempts, so hammering does not extend the lockout', () => {
    const { rl, clock } = limiter(2, 1_000);
    rl.take('k');
    clock.t += 100;
    rl.take('k');
    for (let i = 0; i < 89; i++) {
      clock.t += 10;
      expect(rl.take('k').ok).toBe(false);
    }
    clock.t += 10; // 1000 ms after the first attempt: only it has left the window
    expect(rl.take('k')).toEqual({ ok: true, remaining: 0 });
    expect(rl.take('k')).toEqual({ ok: false, retryAfterMs: 100 });
  });

  it('recovers completely after a full window', () => {
    const { rl, clock } = limiter(2, 15 * 60_000);
    rl.take('login:alice');
    rl.take('login:alice');
    expect(rl.take('login:alice').ok).toBe(false);
    clock.t += 15 * 60_000;
    expect(rl.take('login:alice')).toEqual({ ok: true, remaining: 1 });
  });

  it('keeps keys independent', () => {
    const { rl } = limiter(1, 60_000);
    expect(rl.take('ip:192.0.2.1').ok).toBe(true);
    expect(rl.take('ip:192.0.2.1').ok).toBe(false);
    expect(rl.take('ip:192.0.2.2').ok).toBe(true);
    expect(rl.take('login:alice').ok).toBe(true);
    expect(rl.take('ip:192.0.2.1').ok).toBe(false);
  });

  it('forgets a key on reset', () => {
    const { rl } = limiter(1, 60_000);
    rl.take('k');
    expect(rl.take('k').ok).toBe(false);
    rl.reset('k');
    expect(rl.take('k')).toEqual({ ok: true, remaining: 0 });
    rl.reset('never-seen');
  });

  it('keeps long keys apart and bounded', () => {
    const { rl } = limiter(1, 60_000);
    const long = 'x'.repeat(10_000);
    expect(rl.take(long).ok).toBe(true);
    expect(rl.take(long).ok).toBe(false);
    expect(rl.take(`${long}y`).ok).toBe(true);
    rl.reset(long);
    expect(rl.take(long).ok).toBe(true);
  });

  it('stays bounded under 200,000 distinct keys, evicting the least recently used', () => {
    const { rl, clock } = limiter(1, 60_000, 1_000);
    rl.take('victim');
    let refused = 0;
    let largest = 0;
    for (let i = 0; i < 200_000; i++) {
      clock.t += 0.001; // all inside one window, so nothing expires on its own
      if (!rl.take(`flood-${i}`).ok) refused++;
      largest = Math.max(largest, rl.size);
    }
    expect(refused).toBe(0);
    expect(largest).toBe(1_000);
    expect(rl.size).toBe(1_000);
    // The newest keys are still limited; the oldest were evicted.
    expect(rl.take('flood-199999').ok).toBe(false);
    expect(rl.take('victim').ok).toBe(true);
  });

  it('keeps the default bound of 100,000 keys', () => {
    const rl = new RateLimiter({ limit: 5, windowMs: 3_600_000, now: () => 0 });
    for (let i = 0; i < 200_000; i++) rl.take(`k${i}`);
    expect(rl.size).toBe(100_000);
  });

  it('forgets keys whose attempts have all expired without waiting to be full', () => {
    const { rl, clock } = limiter(3, 1_000);
    for (let i = 0; i < 500; i++) rl.take(`old-${i}`);
    expect(rl.size).toBe(500);
    clock.t += 1_000;
    rl.take('new');
    expect(rl.size).toBe(1);
  });

  it('refuses nonsensical options', () => {
    expect(() => new RateLimiter({ limit: 0, windowMs: 1_000 })).toThrow(RangeError);
    expect(() => new RateLimiter({ limit: 1, windowMs: 0 })).toThrow(RangeError);
    expect(() => new RateLimiter({ limit: 1, windowMs: 1_000, maxKeys: 0 })).toThrow(RangeError);
  });

  it('uses a monotonic clock by default', () => {
    const rl = new RateLimiter({ limit: 1, windowMs: 60_000 });
    expect(rl.take('k').ok).toBe(true);
    const refused = rl.take('k');
    expect(refused.ok).toBe(false);
    if (!refused.ok) {
      expect(refused.retryAfterMs).toBeGreaterThan(59_000);
      expect(refused.retryAfterMs).toBeLessThanOrEqual(60_000);
    }
  });
});
