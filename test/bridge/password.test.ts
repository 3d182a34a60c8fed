import { describe, expect, it } from 'vitest';
import { DEFAULT_SCRYPT, HasherBusyError, PasswordHasher } from '../../bridge/accounts/password.js';

/** Cheap parameters so that the functional tests run in milliseconds. */
const FAST = { logN: 10, r: 8, p: 1 };

function hasher(opts: { logN?: number; maxConcurrent?: number; maxQueued?: number } = {}): PasswordHasher {
  return new PasswordHasher({
    params: { ...FAST, logN: opts.logN ?? FAST.logN },
    maxConcurrent: opts.maxConcurrent ?? 1,
    maxQueued: opts.maxQueued ?? 100,
  });
}

describe('password hasher: hashing and verifying', () => {
  it('verifies the password it hashed and refuses others', async () => {
    const h = hasher();
    const encoded = await h.hash('correct horse battery staple');
    expect(await h.verify('correct horse battery staple', encoded)).toBe(true);
    expect(await h.verify('correct horse battery stapler', encoded)).toBe(false);
    expect(await h.verify('Correct horse battery staple', encoded)).toBe(false);
    expect(await h.verify('', encoded)).toBe(false);
  });

  it('stores the parameters, a 16-byte salt and a 32-byte key; salts differ between hashes', async () => {
    const h = hasher();
    const a = await h.hash('secret');
    const b = await h.hash('secret');
    const m = /^scrypt\$10\$8\$1\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)$/.exec(a);
    expect(m).not.toBeNull();
    expect(Buffer.from(m![1]!, 'base64')).toHaveLength(16);
    expect(Buffer.from(m![2]!, 'base64')).toHaveLength(32);
    expect(a).not.toBe(b);
    expect(await h.verify('secret', b)).toBe(true);
  });

  it('verifies with the parameters stored in the hash, and asks for a rehash when they differ', async () => {
    const old = hasher({ logN: 10 });
    const current = hasher({ logN: 11 });
    const encoded = await old.hash('pa55word');
    expect(await current.verify('pa55word', encoded)).toBe(true);
    expect(await current.verify('pa55worD', encoded)).toBe(false);
    expect(current.needsRehash(encoded)).toBe(true);
    expect(old.needsRehash(encoded)).toBe(false);
    const fresh = await current.hash('pa55word');
    expect(fresh.startsWith('scrypt$11$8$1$')).toBe(true);
    expect(current.needsRehash(fresh)).toBe(false);
  });

  it('answers false, never throws, for malformed encodings', async () => {
    const h = hasher();
    const good = await h.hash('pw');
    const [, , , , salt, key] = good.split('$') as [string, string, string, string, string, string];
    const malformed = [
      '',
      'scrypt',
      'pw',
      `bcrypt$10$8$1$${salt}$${key}`,
      `scrypt$10$8$1$${salt}`,
      `scrypt$10$8$1$${salt}$${key}$extra`,
      `scrypt$x$8$1$${salt}$${key}`,
      `scrypt$010$8$1$${salt}$${key}`,
      `scrypt$0$8$1$${salt}$${key}`,
      `scrypt$-1$8$1$${salt}$${key}`,
      `scrypt$10.5$8$1$${salt}$${key}`,
      // Out of range: would ask for far more memory than any real hash.
      `scrypt$40$8$1$${salt}$${key}`,
      `scrypt$20$999$1$${salt}$${key}`,
      `scrypt$10$0$1$${salt}$${key}`,
      `scrypt$10$8$0$${salt}$${key}`,
      `scrypt$10$8$1$$${key}`,
      `scrypt$10$8$1$${salt}$`,
      `scrypt$10$8$1$${salt}$not*base64!`,
      `scrypt$10$8$1$${salt}$${key}==`,
      `scrypt$10$8$1$${salt}$${key.slice(0, 8)}`,
      `scrypt$10$8$1$${salt}$${'A'.repeat(10_000)}`,
      good.replace(/\$/g, ':'),
    ];
    for (const encoded of malformed) {
      await expect(h.verify('pw', encoded), encoded.slice(0, 80)).resolves.toBe(false);
      expect(h.needsRehash(encoded)).toBe(true);
    }
    // Not a string at all, as a careless database read might hand over.
    await expect(h.verify('pw', null as unknown as string)).resolves.toBe(false);
    // Well-formed but a different key.
    const tampered = good.slice(0, -2) + (good.endsWith('AA') ? 'BA' : 'AA');
    await expect(h.verify('pw', tampered)).resolves.toBe(false);
  });

  it('compares passwords as UTF-8 after NFC normalisation', async () => {
    const h = hasher();
    const composed = 'caf\u00e9';
    const decomposed = 'cafe\u0301';
    expect(composed).not.toBe(decomposed);
    const encoded = await h.hash(decomposed);
    expect(await h.verify(composed, encoded)).toBe(true);
    expect(await h.verify('cafe', encoded)).toBe(false);

    const unicode = 'пароль 密码 🔑 Ωmega';
    const u = await h.hash(unicode);
    expect(await h.verify(unicode, u)).toBe(true);
    expect(await h.verify('пароль 密码 🔒 Ωmega', u)).toBe(false);
  });

  it('verifyNothing does the work of a verify and resolves false', async () => {
    const h = hasher();
    const before = h.stats.done;
    await expect(h.verifyNothing('anything')).resolves.toBe(false);
    expect(h.stats.done).toBe(before + 1);
  });

  it('refuses parameters and limits out of range', () => {
    expect(() => new PasswordHasher({ params: { logN: 0, r: 8, p: 1 }, maxConcurrent: 1, maxQueued: 1 })).toThrow(
      RangeError,
    );
    expect(() => new PasswordHasher({ params: FAST, maxConcurrent: 0, maxQueued: 1 })).toThrow(RangeError);
    expect(() => new PasswordHasher({ params: FAST, maxConcurrent: 1, maxQueued: -1 })).toThrow(RangeError);
    expect(DEFAULT_SCRYPT).toEqual({ logN: 17, r: 8, p: 1 });
  });
});

describe('password hasher: bounded concurrency', () => {
  /** Runs `jobs` while sampling `stats` on every turn of the event loop; returns the largest values seen. */
  async function watch(h: PasswordHasher, jobs: Promise<unknown>[]): Promise<{ running: number; queued: number }> {
    const max = { running: 0, queued: 0 };
    let settled = false;
    const sample = (): void => {
      max.running = Math.max(max.running, h.stats.running);
      max.queued = Math.max(max.queued, h.stats.queued);
      if (!settled) setImmediate(sample);
    };
    sample();
    const all = Promise.all(
      jobs.map((j) =>
        j.then((v) => {
          sample();
          return v;
        }),
      ),
    );
    try {
      return await all.then(() => max);
    } finally {
      settled = true;
    }
  }

  it('runs one hash at a time with maxConcurrent 1, the rest wait in order', async () => {
    const h = hasher({ maxConcurrent: 1, maxQueued: 10 });
    const order: number[] = [];
    const jobs = [0, 1, 2, 3, 4].map((i) =>
      h.hash(`pw${i}`).then((encoded) => {
        order.push(i);
        return encoded;
      }),
    );
    expect(h.stats).toEqual({ running: 1, queued: 4, done: 0 });
    const max = await watch(h, jobs);
    expect(max.running).toBe(1);
    expect(order).toEqual([0, 1, 2, 3, 4]);
    expect(h.stats).toEqual({ running: 0, queued: 0, done: 5 });
  });

  it('lets maxConcurrent hashes run together', async () => {
    const h = hasher({ maxConcurrent: 2, maxQueued: 10 });
    const jobs = [0, 1, 2, 3, 4].map((i) => h.hash(`pw${i}`));
    expect(h.stats).toEqual({ running: 2, queued: 3, done: 0 });
    const max = await watch(h, jobs);
    expect(max.running).toBe(2);
    expect(h.stats.done).toBe(5);
  });

  it('refuses with HasherBusyError once the queue is full, and accepts again when it drains', async () => {
    const h = hasher({ maxConcurrent: 1, maxQueued: 2 });
    const encoded = await h.hash('pw');
    const accepted = [h.hash('a'), h.verify('pw', encoded), h.verifyNothing('c')];
    expect(h.stats).toMatchObject({ running: 1, queued: 2 });
    await expect(h.hash('d')).rejects.toBeInstanceOf(HasherBusyError);
    await expect(h.verify('pw', encoded)).rejects.toBeInstanceOf(HasherBusyError);
    await expect(h.verifyNothing('e')).rejects.toBeInstanceOf(HasherBusyError);
    const [hashed, verified, nothing] = await Promise.all(accepted);
    expect(typeof hashed).toBe('string');
    expect(verified).toBe(true);
    expect(nothing).toBe(false);
    expect(h.stats).toEqual({ running: 0, queued: 0, done: 4 });
    await expect(h.verify('pw', encoded)).resolves.toBe(true);
  });

  it('keeps the event loop responsive while a production-cost hash runs', async () => {
    const h = new PasswordHasher({ params: DEFAULT_SCRYPT, maxConcurrent: 1, maxQueued: 0 });
    let last = performance.now();
    let largestGap = 0;
    let ticks = 0;
    const timer = setInterval(() => {
      const now = performance.now();
      largestGap = Math.max(largestGap, now - last);
      last = now;
      ticks++;
    }, 5);
    const started = performance.now();
    try {
      const encoded = await h.hash('production');
      expect(encoded.startsWith('scrypt$17$8$1$')).toBe(true);
    } finally {
      clearInterval(timer);
    }
    const elapsed = performance.now() - started;
    // The timer kept firing throughout the hash: many ticks, none held back long. A hash on the event loop would
    // hold one tick back for the whole hash; a loaded machine (the other test worker) may delay a tick by some
    // tens of ms, so the bound grows with the hash's time, and stays well under it.
    expect(ticks).toBeGreaterThan(Math.floor(elapsed / 50));
    expect(largestGap).toBeLessThan(Math.max(100, elapsed / 3));
  });
});
