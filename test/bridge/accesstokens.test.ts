/**
 * Access tokens (decision 30; docs/api.md, "Access tokens"), on each store engine: made, listed without their
 * secret, turned into a logged-in session by `POST /0/session/` with `token` (as the official client's
 * `init({token})` does), revoked with the sessions they started (each announced as `session.ended`), revoked all at
 * once by a password reset; stored only as sha256 (read from the database); at most
 * `accounts.accessTokensPerUser` per user; guesses limited per address; never logged.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { outboxDir } from '../../bridge/config.js';
import { type BusEvent, type DeliveredEvent, LocalBus } from '../../bridge/events/bus.js';
import type { SqliteStore } from '../../bridge/store/sqlite.js';
import {
  type HttpClient,
  type HttpResult,
  type StoreEngine,
  type TestBridge,
  type TestBridgeOptions,
  engines,
  startTestBridge,
} from '../support/bridge.js';

const PASSWORD = 'correct horse battery';
const TOKEN_SHAPE = /^[A-Za-z0-9_-]{43}$/;
const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

interface TokenInfo {
  id: number;
  prefix: string;
  created: number;
  lastUsed: number | null;
}

const running: TestBridge[] = [];
afterEach(async () => {
  for (const b of running.splice(0).reverse()) await b.close();
});

/** A bridge on `engine` whose event bus the test hears. */
async function bridge(
  engine: StoreEngine,
  opts: Omit<TestBridgeOptions, 'engine' | 'events'> = {},
): Promise<{ b: TestBridge; events: BusEvent[] }> {
  const bus = new LocalBus();
  const events: BusEvent[] = [];
  bus.subscribe((e: DeliveredEvent) => {
    if (e.type !== 'bus.resync') events.push(e);
  });
  const b = await startTestBridge({ ...opts, engine, events: bus });
  running.push(b);
  return { b, events };
}

function expectToken(res: HttpResult, status: number, token: string): void {
  expect({ status: res.status, body: res.body }).toEqual({ status, body: token });
}

async function signup(b: TestBridge, login: string): Promise<HttpClient> {
  const c = b.client();
  expectToken(await c.post('/0/session/signup', { form: { login, password: PASSWORD } }), 201, 'signup-ok');
  return c;
}

async function makeToken(c: HttpClient): Promise<string> {
  const r = await c.post('/0/user/accesstoken');
  expect(r.status, r.body).toBe(201);
  expect(r.contentType).toMatch(/^text\/plain/);
  expect(r.body).toMatch(TOKEN_SHAPE);
  return r.body;
}

async function list(c: HttpClient): Promise<TokenInfo[]> {
  const r = await c.get('/0/user/accesstoken');
  expect(r.status, r.body).toBe(200);
  return JSON.parse(r.body) as TokenInfo[];
}

async function login(c: HttpClient): Promise<string | undefined> {
  const r = await c.get('/0/user/');
  return r.status === 200 ? (JSON.parse(r.body) as { login: string }).login : undefined;
}

/** The rows of `access_tokens`, read from the database itself. */
async function tokenRows(b: TestBridge): Promise<Array<Record<string, unknown>>> {
  const sql = 'SELECT * FROM access_tokens ORDER BY id';
  if (b.engine === 'sqlite') return (b.store as SqliteStore).core.db.prepare<[], Record<string, unknown>>(sql).all();
  return (await b.database!.pool.query<Record<string, unknown>>(sql)).rows;
}

/** The link of the newest recovery mail in the outbox. */
function recoveryLink(b: TestBridge): URL {
  const dir = outboxDir(b.config);
  const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.includes('-recover-')) : [];
  return new URL(/https?:\/\/\S+/.exec(readFileSync(join(dir, files.sort().at(-1)!), 'utf8'))![0]);
}

describe.each(await engines())('access tokens on %s', (engine) => {
  it('are made, listed without their secret, stored as sha256, and log a kiosk in (201 user-ok, a new cookie)', async () => {
    const { b } = await bridge(engine);
    const alice = await signup(b, 'alice@example.com');
    const made = b.clock.now();
    const token = await makeToken(alice);

    // Stored: its hash and prefix, never the token.
    const rows = await tokenRows(b);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ hash: sha256(token), prefix: token.slice(0, 6) });
    expect(JSON.stringify(rows)).not.toContain(token);

    const [info] = await list(alice);
    expect(info).toEqual({ id: info!.id, prefix: token.slice(0, 6), created: made, lastUsed: null });

    // A kiosk that has an anonymous session already: the token replaces it with a new one of alice's.
    b.clock.advance(5000);
    const kiosk = b.client();
    expectToken(await kiosk.post('/0/session/'), 201, 'user-ok');
    const anonymous = kiosk.sid;
    const r = await kiosk.post('/0/session/', { form: { token } });
    expectToken(r, 201, 'user-ok');
    expect(r.sid?.value).toMatch(TOKEN_SHAPE);
    expect(r.sid?.value).not.toBe(anonymous);
    expect(await login(kiosk)).toBe('alice@example.com');
    // The anonymous session is gone.
    expectToken(await b.client().post('/0/session/', { cookie: `sid=${anonymous}` }), 201, 'user-ok');
    expect((await list(alice))[0]!.lastUsed).toBe(made + 5000);

    // A JSON body works too; the token, in any session, gives alice's again.
    const script = b.client();
    expectToken(await script.post('/0/session/', { json: { token } }), 201, 'user-ok');
    expect(await login(script)).toBe('alice@example.com');
    expect(b.sink.text()).not.toContain(token);
    expect(b.sink.events('session.token_login')).toHaveLength(2);
  });

  it('a session started with a token may list and revoke, but not make more tokens (403)', async () => {
    const { b } = await bridge(engine);
    const alice = await signup(b, 'alice@example.com');
    const token = await makeToken(alice);
    const kiosk = b.client();
    expectToken(await kiosk.post('/0/session/', { form: { token } }), 201, 'user-ok');
    expectToken(await kiosk.post('/0/user/accesstoken'), 403, 'accesstoken-fail-token-session');
    expect(await list(kiosk)).toHaveLength(1);
    expect(await tokenRows(b)).toHaveLength(1);
    // A password login in that client is a session of its own again.
    expectToken(
      await kiosk.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } }),
      201,
      'login-ok',
    );
    await makeToken(kiosk);
  });

  it('revoking ends the token and every session it started, each announced as session.ended, and its live channels', async () => {
    const { b, events } = await bridge(engine);
    const alice = await signup(b, 'alice@example.com');
    const [token, other] = [await makeToken(alice), await makeToken(alice)];
    const [k1, k2, k3] = [b.client(), b.client(), b.client()];
    for (const k of [k1, k2]) expectToken(await k.post('/0/session/', { form: { token } }), 201, 'user-ok');
    expectToken(await k3.post('/0/session/', { form: { token: other } }), 201, 'user-ok');
    const ended = (await b.store.session(sha256(k1.sid!)))!;
    expect(ended.accessTokenId).toBe((await list(alice))[0]!.id);

    events.length = 0;
    expectToken(await alice.request('DELETE', `/0/user/accesstoken/${token}`), 200, 'accesstoken-ok');
    expect(events).toEqual(
      expect.arrayContaining([
        { type: 'session.ended', idHash: sha256(k1.sid!), userId: ended.userId },
        { type: 'session.ended', idHash: sha256(k2.sid!), userId: ended.userId },
        // The live channels opened with it as a bearer token (decision 31).
        { type: 'session.ended', userId: ended.userId, tokenId: ended.accessTokenId },
      ]),
    );
    expect(events).toHaveLength(3);
    // Its sessions are over; the other token's session and alice's own are not.
    for (const k of [k1, k2]) expectToken(await k.get('/0/user/'), 404, 'not found');
    expect(await login(k3)).toBe('alice@example.com');
    expect(await login(alice)).toBe('alice@example.com');
    expect(b.sink.events('accesstoken.revoked')).toEqual([
      expect.objectContaining({ userId: ended.userId, sessions: 2 }),
    ]);

    // It no longer logs in: 401 token-fail, and the client carries on in a new anonymous session.
    const after = b.client();
    const r = await after.post('/0/session/', { form: { token } });
    expectToken(r, 401, 'token-fail');
    expect(r.sid?.value).toMatch(TOKEN_SHAPE);
    expectToken(await after.get('/0/user/'), 404, 'not found');
    expectToken(await after.post('/0/session/'), 200, 'user-ok');

    // The same again, and by number: the number of the other token revokes it.
    expectToken(await alice.request('DELETE', `/0/user/accesstoken/${token}`), 400, 'accesstoken-fail');
    const [left] = await list(alice);
    expect(left!.prefix).toBe(other.slice(0, 6));
    expectToken(await alice.request('DELETE', `/0/user/accesstoken/${left!.id}`), 200, 'accesstoken-ok');
    expectToken(await k3.get('/0/user/'), 404, 'not found');
    expect(await list(alice)).toEqual([]);
    expect(await tokenRows(b)).toEqual([]);
    expect(b.sink.text()).not.toContain(token);
  });

  it("another user's token cannot be revoked, by text or by number; nonsense is 400 accesstoken-fail", async () => {
    const { b } = await bridge(engine);
    const alice = await signup(b, 'alice@example.com');
    const mallory = await signup(b, 'mallory@example.com');
    const token = await makeToken(alice);
    const [{ id }] = (await list(alice)) as [TokenInfo];
    for (const path of [token, String(id), 'nonsense', '0', 'A'.repeat(43)]) {
      expectToken(await mallory.request('DELETE', `/0/user/accesstoken/${path}`), 400, 'accesstoken-fail');
    }
    expect(await list(mallory)).toEqual([]);
    expect(await list(alice)).toHaveLength(1);
    const kiosk = b.client();
    expectToken(await kiosk.post('/0/session/', { form: { token } }), 201, 'user-ok');
    expectToken(await b.client().request('DELETE', `/0/user/accesstoken/${token}`), 401, 'no-session');
    expectToken(await b.client().post('/0/user/accesstoken'), 401, 'no-session');
  });

  it('at most accounts.accessTokensPerUser per user: 400 accesstoken-fail-limit, until one is revoked', async () => {
    const { b } = await bridge(engine, { config: { accounts: { accessTokensPerUser: 2 } } });
    const alice = await signup(b, 'alice@example.com');
    const bob = await signup(b, 'bob@example.com');
    const first = await makeToken(alice);
    await makeToken(alice);
    expectToken(await alice.post('/0/user/accesstoken'), 400, 'accesstoken-fail-limit');
    // Two at once when one is left: one of them gets it.
    expectToken(await alice.request('DELETE', `/0/user/accesstoken/${first}`), 200, 'accesstoken-ok');
    const both = await Promise.all([alice.post('/0/user/accesstoken'), alice.post('/0/user/accesstoken')]);
    expect(both.map((r) => r.status).sort()).toEqual([201, 400]);
    expect(await list(alice)).toHaveLength(2);
    // The limit is per user.
    await makeToken(bob);
  });

  it('a password reset revokes every token of the user, and ends the sessions they started', async () => {
    const { b } = await bridge(engine);
    const alice = await signup(b, 'alice@example.com');
    const bob = await signup(b, 'bob@example.com');
    const tokens = [await makeToken(alice), await makeToken(alice)];
    const bobs = await makeToken(bob);
    const kiosk = b.client();
    expectToken(await kiosk.post('/0/session/', { form: { token: tokens[0]! } }), 201, 'user-ok');

    expectToken(
      await b.client().post('/0/session/recover', { form: { login: 'alice@example.com' } }),
      200,
      'recover-ok',
    );
    const link = recoveryLink(b);
    const form = { login: 'alice@example.com', token: link.searchParams.get('token')!, password: 'a new password' };
    expectToken(await b.client().post('/0/session/recover', { form }), 200, 'recover-ok');

    expectToken(await kiosk.get('/0/user/'), 404, 'not found');
    for (const token of tokens) {
      expectToken(await b.client().post('/0/session/', { form: { token } }), 401, 'token-fail');
    }
    expect((await tokenRows(b)).map((r) => r.hash)).toEqual([sha256(bobs)]);
    expectToken(await b.client().post('/0/session/', { form: { token: bobs } }), 201, 'user-ok');
  });

  it('a malformed, unknown or foreign token is 401 token-fail with a new anonymous session; an empty one is no token', async () => {
    const { b } = await bridge(engine);
    const product = await b.addFrontend();
    const alice = await signup(b, 'alice@example.com');
    const token = await makeToken(alice);
    // Logged in with a password: a bad token replaces that session too (the client asked to become another).
    for (const bad of ['short', 'A'.repeat(43), `${token}x`, 'x'.repeat(2000)]) {
      const c = await signup(b, `c${bad.length}@example.com`);
      const r = await c.post('/0/session/', { form: { token: bad } });
      expectToken(r, 401, 'token-fail');
      expect(r.sid).toBeDefined();
      expectToken(await c.get('/0/user/'), 404, 'not found');
    }
    // A token that is not a string (JSON).
    expectToken(await b.client().post('/0/session/', { json: { token: 42 } }), 401, 'token-fail');
    // The token of a user of another frontend does not log into this one.
    const there = b.client();
    const r = await there.post('/0/session/', { form: { token }, headers: { host: `${product.id}.devcloud.test` } });
    expectToken(r, 401, 'token-fail');
    expect(b.sink.events('session.token_failed')).toHaveLength(6);
    // Empty: as without it (the web client sends `token` with no value when it has none).
    expectToken(await alice.post('/0/session/', { form: { token: '' } }), 200, 'user-ok');
    expect(await login(alice)).toBe('alice@example.com');
    expectToken(await b.client().post('/0/session/', { form: { token: '' } }), 201, 'user-ok');
    expect(b.sink.text()).not.toContain(token);
  });

  it('token attempts are limited per address (rateLimits.accessToken): 429 with Retry-After, a valid one too', async () => {
    const { b } = await bridge(engine, { config: { rateLimits: { accessToken: { limit: 3, windowMs: 60_000 } } } });
    const alice = await signup(b, 'alice@example.com');
    const token = await makeToken(alice);
    for (let i = 0; i < 3; i++) {
      expectToken(
        await b.client().post('/0/session/', { form: { token: `${'g'.repeat(42)}${i}` } }),
        401,
        'token-fail',
      );
    }
    const limited = await b.client().post('/0/session/', { form: { token } });
    expectToken(limited, 429, 'too-many-requests');
    expect(limited.sid).toBeUndefined();
    // Without a token, the route is not limited.
    expectToken(await b.client().post('/0/session/'), 201, 'user-ok');
    b.clock.advance(60_000);
    const kiosk = b.client();
    expectToken(await kiosk.post('/0/session/', { form: { token } }), 201, 'user-ok');
    expect(await login(kiosk)).toBe('alice@example.com');
  });
});
