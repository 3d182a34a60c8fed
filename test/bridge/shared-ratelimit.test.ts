/**
 * The attempt limiter that the bridges share in PostgreSQL (bridge/accounts/shared-ratelimit.ts; docs/api.md, Rate
 * limits), on a real database: its window rule and the wait it announces, one budget for two "bridges" (two pools),
 * atomicity under concurrent takes, pruning, and two apps on one database whose login limits add up.
 */
import { rmSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { hasherFor } from '../../bridge/accounts/password.js';
import { SharedRateLimiter } from '../../bridge/accounts/shared-ratelimit.js';
import { buildApp } from '../../bridge/app.js';
import { BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import { createMailer } from '../../bridge/mail/mailer.js';
import { migratePostgres } from '../../bridge/store/postgres/migrate.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';

const MINUTE = 60_000;

describe.skipIf(await missingPostgres())('the rate limits shared in PostgreSQL', () => {
  const db = usePostgres();
  /** Two bridges' pools on the test's database. */
  let poolA: pg.Pool;
  let poolB: pg.Pool;
  const clock = { t: Date.UTC(2030, 0, 1) };
  const now = () => clock.t;

  beforeAll(async () => {
    await migratePostgres(db.pool);
    poolA = new pg.Pool({ connectionString: db.url, max: 5 });
    poolB = new pg.Pool({ connectionString: db.url, max: 5 });
    // As the bridge does (bridge/store/postgres/pool.ts): an idle connection the server ends is dropped, not thrown.
    for (const pool of [poolA, poolB]) pool.on('error', () => undefined);
  });
  afterAll(async () => {
    await poolA?.end();
    await poolB?.end();
  });
  beforeEach(async () => {
    await db.pool.query('TRUNCATE rate_limits');
    clock.t = Date.UTC(2030, 0, 1);
  });

  const limiter = (
    pool: pg.Pool,
    limit: number,
    windowMs = MINUTE,
    extra: { name?: string; pruneEvery?: number } = {},
  ) => new SharedRateLimiter({ pool, name: extra.name ?? 'test', limit, windowMs, now, ...extra });

  const rows = async () =>
    (
      await db.pool.query<{ limiter: string; key: string; count: number; prev_count: number }>(
        'SELECT limiter, key, count, prev_count FROM rate_limits ORDER BY limiter, key',
      )
    ).rows;

  it('allows `limit` attempts, then refuses with the wait, and does not count the refusals', async () => {
    const rl = limiter(poolA, 3);
    expect(await rl.take('a@example.com')).toEqual({ ok: true, remaining: 2 });
    clock.t += 10_000;
    expect(await rl.take('a@example.com')).toEqual({ ok: true, remaining: 1 });
    clock.t += 10_000;
    expect(await rl.take('a@example.com')).toEqual({ ok: true, remaining: 0 });
    clock.t += 5_000;
    // The window (from the first attempt) ends in 35 s; in the next one its 3 attempts count for the part of the
    // window still over them, so one more is allowed once a third of it has passed: 35 s + 20 s.
    expect(await rl.take('a@example.com')).toEqual({ ok: false, retryAfterMs: 55_000 });
    for (let i = 0; i < 5; i++) expect((await rl.take('a@example.com')).ok).toBe(false);
    expect(await rows()).toEqual([{ limiter: 'test', key: '=a@example.com', count: 3, prev_count: 0 }]);
    clock.t += 55_000 - 1;
    expect(await rl.take('a@example.com')).toEqual({ ok: false, retryAfterMs: 1 });
    clock.t += 1;
    expect(await rl.take('a@example.com')).toEqual({ ok: true, remaining: 0 });
    expect(await rows()).toEqual([{ limiter: 'test', key: '=a@example.com', count: 1, prev_count: 3 }]);
  });

  it('weighs the previous window by the part of it the last `windowMs` still cover', async () => {
    const rl = limiter(poolA, 4);
    for (let i = 0; i < 4; i++) expect((await rl.take('k')).ok).toBe(true);
    // At the start of the next window all 4 still count: a quarter of a window until one has faded.
    clock.t += MINUTE;
    expect(await rl.take('k')).toEqual({ ok: false, retryAfterMs: 15_000 });
    clock.t += 15_000;
    expect(await rl.take('k')).toEqual({ ok: true, remaining: 0 });
    expect(await rl.take('k')).toEqual({ ok: false, retryAfterMs: 15_000 });
    clock.t += 15_000;
    // 4 × 1/2 of the previous window and 1 of this one: one more fits.
    expect(await rl.take('k')).toEqual({ ok: true, remaining: 0 });
  });

  it('starts afresh after two quiet windows, and keeps keys and limiters apart', async () => {
    const rl = limiter(poolA, 2);
    const other = limiter(poolA, 2, MINUTE, { name: 'other' });
    await rl.take('k');
    await rl.take('k');
    expect((await rl.take('k')).ok).toBe(false);
    expect(await rl.take('j')).toEqual({ ok: true, remaining: 1 });
    expect(await other.take('k')).toEqual({ ok: true, remaining: 1 });
    clock.t += 2 * MINUTE;
    expect(await rl.take('k')).toEqual({ ok: true, remaining: 1 });
    expect(await rows()).toContainEqual({ limiter: 'test', key: '=k', count: 1, prev_count: 0 });
  });

  it('two bridges share one budget per key', async () => {
    const a = limiter(poolA, 3);
    const b = limiter(poolB, 3);
    expect(await a.take('k')).toEqual({ ok: true, remaining: 2 });
    expect(await b.take('k')).toEqual({ ok: true, remaining: 1 });
    expect(await a.take('k')).toEqual({ ok: true, remaining: 0 });
    expect((await b.take('k')).ok).toBe(false);
    expect((await a.take('k')).ok).toBe(false);
    // A reset on one bridge frees the key on the other.
    await a.reset('k');
    expect(await b.take('k')).toEqual({ ok: true, remaining: 2 });
  });

  it('forgets a key on reset', async () => {
    const rl = limiter(poolA, 1);
    await rl.take('k');
    expect((await rl.take('k')).ok).toBe(false);
    await rl.reset('k');
    expect(await rows()).toEqual([]);
    expect(await rl.take('k')).toEqual({ ok: true, remaining: 0 });
    await rl.reset('never seen');
  });

  it('keeps long keys as digests, each on its own, and takes keys PostgreSQL text cannot hold', async () => {
    const rl = limiter(poolA, 1);
    const long = 'x'.repeat(10_000);
    expect((await rl.take(`${long}a`)).ok).toBe(true);
    expect((await rl.take(`${long}b`)).ok).toBe(true);
    expect((await rl.take(`${long}a`)).ok).toBe(false);
    const nul = 'a\u0000b';
    expect((await rl.take(nul)).ok).toBe(true);
    expect((await rl.take(nul)).ok).toBe(false);
    const keys = (await rows()).map((r) => r.key);
    expect(keys).toHaveLength(3);
    for (const k of keys) expect(k).toMatch(/^#[A-Za-z0-9+/]{43}=$/);
    await rl.reset(`${long}a`);
    expect((await rl.take(`${long}a`)).ok).toBe(true);
  });

  it('grants exactly `limit` of many concurrent takes from two bridges', async () => {
    const a = limiter(poolA, 10);
    const b = limiter(poolB, 10);
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => (i % 2 ? a : b).take('hot')));
    expect(results.filter((r) => r.ok)).toHaveLength(10);
    expect(new Set(results.filter((r) => r.ok).map((r) => (r.ok ? r.remaining : -1)))).toEqual(
      new Set([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
    );
    expect(await rows()).toEqual([{ limiter: 'test', key: '=hot', count: 10, prev_count: 0 }]);
  });

  it('prunes the rows of its own limiter whose windows are over, a batch at a time, and every so many takes', async () => {
    const rl = new SharedRateLimiter({ pool: poolA, name: 'test', limit: 5, windowMs: MINUTE, now, pruneBatch: 3 });
    const other = limiter(poolA, 5, MINUTE, { name: 'other' });
    for (let i = 0; i < 5; i++) await rl.take(`old ${i}`);
    await other.take('old');
    clock.t += MINUTE;
    await rl.take('recent');
    // One window later the old rows still count, as the previous window.
    expect(await rl.prune()).toBe(0);
    clock.t += MINUTE;
    expect(await rl.prune()).toBe(3);
    expect(await rl.prune()).toBe(2);
    expect(await rl.prune()).toBe(0);
    expect((await rows()).map((r) => `${r.limiter} ${r.key}`)).toEqual(['other =old', 'test =recent']);

    const auto = limiter(poolA, 5, MINUTE, { name: 'auto', pruneEvery: 4 });
    for (let i = 0; i < 3; i++) await auto.take(`old ${i}`);
    clock.t += 2 * MINUTE;
    await auto.take('new');
    await auto.settled();
    expect((await rows()).filter((r) => r.limiter === 'auto').map((r) => r.key)).toEqual(['=new']);
  });

  it('two apps on one database: login guesses on one count on the other', async () => {
    const dataDir = tempDir('devcloud-shared-rl-');
    const config = BridgeConfigSchema.parse({
      dataDir,
      accounts: { scryptLogN: 10 },
      rateLimits: { login: { limit: 3, windowMs: MINUTE } },
    });
    const sink = new LogSink();
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
    // One store for both apps, in this process: what is shared here is the limiter's database.
    const store = new SqliteStore(dataDir);
    const mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log, now);
    const hasher = hasherFor(config);
    const apps = [poolA, poolB].map((rateLimitPool) =>
      buildApp({ config, store, hasher, mailer, log, now, rateLimitPool, checkAnswers: true }),
    );
    const [a, b] = apps as [(typeof apps)[0], (typeof apps)[0]];
    try {
      await ensureDefaultFrontend(store, now());
      const post = (app: typeof a, path: string, form: Record<string, string>) =>
        app.inject({
          method: 'POST',
          url: path,
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          payload: new URLSearchParams(form).toString(),
        });
      const password = 'correct horse battery';
      expect((await post(a, '/0/session/signup', { login: 'leo@example.com', password })).statusCode).toBe(201);
      const guess = (app: typeof a, i: number) =>
        post(app, '/0/session/login', { login: 'leo@example.com', password: `guess ${i} wrong` });
      expect((await guess(a, 1)).body).toBe('login-fail');
      expect((await guess(b, 2)).body).toBe('login-fail');
      expect((await guess(a, 3)).body).toBe('login-fail');
      // The fourth attempt, even with the right password and on the other app, is one too many.
      const limited = await post(b, '/0/session/login', { login: 'leo@example.com', password });
      expect(limited.statusCode).toBe(429);
      expect(limited.body).toBe('too-many-requests');
      // A full window, then a third of the next while the three guesses fade (docs/api.md, Rate limits).
      expect(limited.headers['retry-after']).toBe('80');
      expect((await post(a, '/0/session/login', { login: 'leo@example.com', password })).statusCode).toBe(429);
      clock.t += 80_000;
      const ok = await post(b, '/0/session/login', { login: 'leo@example.com', password });
      expect(ok.statusCode).toBe(201);
      // The success cleared the count of the login at this address, on both apps.
      expect((await db.pool.query("SELECT 1 FROM rate_limits WHERE limiter = 'loginByLoginAndAddress'")).rowCount).toBe(
        0,
      );
      expect(sink.events('http.undocumented_answer')).toEqual([]);
    } finally {
      for (const app of apps) await app.close();
      await mailer.close();
      await store.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
