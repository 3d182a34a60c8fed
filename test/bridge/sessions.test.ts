/**
 * The Session, User data and Errors tables of the REST specification through HTTP, with decisions 1-4,
 * 12, 15 and 17: every row through `inject()` and against a listening server with a cookie jar, the cookie's
 * attributes over plain HTTP and TLS, what the SQLite file holds, and time moved with an injected clock.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { outboxDir } from '../../bridge/config.js';
import { userOfAuthcode } from '../../bridge/users/authcode.js';
import {
  type HttpClient,
  type HttpResult,
  type TestBridge,
  type TestBridgeOptions,
  parseSetCookie,
  startTestBridge,
} from '../support/bridge.js';
import { missing } from '../support/system.js';

const PASSWORD = 'correct horse battery';
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const SID_SHAPE = /^[A-Za-z0-9_-]{43}$/;

const running: TestBridge[] = [];
afterEach(async () => {
  for (const b of running.splice(0).reverse()) await b.close();
});

async function bridge(opts: TestBridgeOptions = {}): Promise<TestBridge> {
  const b = await startTestBridge(opts);
  running.push(b);
  return b;
}

/** A plain-text token answer, as the Errors table writes it. */
function expectToken(res: HttpResult, status: number, token: string): void {
  expect({ status: res.status, body: res.body }).toEqual({ status, body: token });
  expect(res.contentType).toMatch(/^text\/plain/);
}

interface UserObject {
  login: string;
  confirmed: boolean;
  authcode: string;
  data: Record<string, string>;
}

async function readUser(c: HttpClient, query = '', opts: Parameters<HttpClient['get']>[1] = {}): Promise<UserObject> {
  const res = await c.get(`/0/user/${query}`, opts);
  expect(res.status, res.body).toBe(200);
  expect(res.contentType).toMatch(/^application\/json/);
  return JSON.parse(res.body) as UserObject;
}

async function signup(c: HttpClient, login: string, password = PASSWORD, query = ''): Promise<HttpResult> {
  const res = await c.post(`/0/session/signup${query}`, { form: { login, password } });
  expectToken(res, 201, 'signup-ok');
  return res;
}

function sha256(s: string): string {
  return createHash('sha256').update(s).digest('hex');
}

function outboxMails(b: TestBridge): string[] {
  const dir = outboxDir(b.config);
  return existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.eml')) : [];
}

describe.each(['inject', 'http'] as const)('sessions and user data over %s', (transport) => {
  const start = (opts: Omit<TestBridgeOptions, 'transport'> = {}) => bridge({ ...opts, transport });

  describe('POST /0/session/', () => {
    it('answers 201 user-ok with a new cookie without a session, then 200 user-ok while the session exists', async () => {
      const b = await start();
      const c = b.client();

      const first = await c.post('/0/session/');
      expectToken(first, 201, 'user-ok');
      expect(first.sid?.value).toMatch(SID_SHAPE);
      expect(c.sid).toBe(first.sid?.value);

      const again = await c.post('/0/session/');
      expectToken(again, 200, 'user-ok');
      expect(again.sid).toBeUndefined();
      // Without the trailing slash it is the same endpoint.
      expectToken(await c.post('/0/session'), 200, 'user-ok');

      // Another client without the cookie gets a session of its own.
      const other = await b.client().post('/0/session/');
      expectToken(other, 201, 'user-ok');
      expect(other.sid?.value).not.toBe(first.sid?.value);
    });

    it('an anonymous session has no user: GET /0/user/ 404 not found, POST /0/user/ 401 no-session', async () => {
      const b = await start();
      const c = b.client();
      await c.post('/0/session/');
      expectToken(await c.get('/0/user/'), 404, 'not found');
      expectToken(await c.post('/0/user/', { form: { a: 'b' } }), 401, 'no-session');
    });
  });

  describe('POST /0/session/login', () => {
    it('answers 201 login-ok with a new cookie for valid credentials, from no session and from an anonymous one', async () => {
      const b = await start();
      await signup(b.client(), 'alice@example.com');

      const fresh = b.client();
      const res = await fresh.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } });
      expectToken(res, 201, 'login-ok');
      expect(res.sid?.value).toMatch(SID_SHAPE);
      expect((await readUser(fresh)).login).toBe('alice@example.com');

      const anon = b.client();
      const anonSid = (await anon.post('/0/session/')).sid!.value;
      const login = await anon.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } });
      expectToken(login, 201, 'login-ok');
      expect(login.sid!.value).not.toBe(anonSid);
      expect((await readUser(anon)).login).toBe('alice@example.com');
    });

    it('accepts the login in any letter case and a JSON body (decision 12)', async () => {
      const b = await start();
      await signup(b.client(), 'alice@example.com');
      const c = b.client();
      expectToken(
        await c.post('/0/session/login', { form: { login: '  ALICE@Example.COM ', password: PASSWORD } }),
        201,
        'login-ok',
      );
      const j = b.client();
      expectToken(
        await j.post('/0/session/login', { json: { login: 'alice@example.com', password: PASSWORD } }),
        201,
        'login-ok',
      );
      expect((await readUser(j)).login).toBe('alice@example.com');
    });

    it('answers 403 login-fail for a wrong password, an unknown login and missing or malformed fields (decision 4)', async () => {
      const b = await start();
      await signup(b.client(), 'alice@example.com');
      const c = b.client();
      const attempts: Array<Parameters<HttpClient['post']>[1]> = [
        { form: { login: 'alice@example.com', password: 'wrong password' } },
        { form: { login: 'alice@example.com', password: PASSWORD.toUpperCase() } },
        { form: { login: 'bob@example.com', password: PASSWORD } },
        { form: { login: 'alice@example.com' } },
        { form: { password: PASSWORD } },
        { form: { login: 'not-an-address', password: PASSWORD } },
        { form: {} },
        {},
        { json: { login: 'alice@example.com', password: 12345678 } },
        { json: { login: ['alice@example.com'], password: PASSWORD } },
        { body: '{"login":', headers: { 'content-type': 'application/json' } },
        {
          body: 'login=alice%40example.com&password=',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
        },
      ];
      for (const opts of attempts) {
        const res = await c.post('/0/session/login', opts);
        expectToken(res, 403, 'login-fail');
        expect(res.sid).toBeUndefined();
      }
      expect(c.sid).toBeUndefined();
    });

    it('a failed login leaves the current session as it was', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const sid = c.sid;
      expectToken(
        await c.post('/0/session/login', { form: { login: 'alice@example.com', password: 'wrong password' } }),
        403,
        'login-fail',
      );
      expect(c.sid).toBe(sid);
      expect((await readUser(c)).login).toBe('alice@example.com');
    });
  });

  describe('POST /0/session/logout', () => {
    it('answers 201 logout-ok with a new anonymous session, and the old cookie is then useless', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const old = `sid=${c.sid}`;

      const out = await c.post('/0/session/logout');
      expectToken(out, 201, 'logout-ok');
      // Decision 1: a new id on logout, for a fresh anonymous session with the same attributes.
      expect(out.sid?.value).toMatch(SID_SHAPE);
      expect(`sid=${out.sid?.value}`).not.toBe(old);
      expect(out.sid?.attrs.get('path')).toBe('/');
      expect(out.sid?.attrs.has('httponly')).toBe(true);
      // The new session is anonymous: no user behind it.
      expectToken(await c.get('/0/user/'), 404, 'not found');
      expectToken(await c.post('/0/session/'), 200, 'user-ok');

      // A client that kept the old value gets nothing from it.
      expectToken(await c.get('/0/user/', { cookie: old }), 404, 'not found');
      expectToken(await c.post('/0/user/', { cookie: old, form: { a: 'b' } }), 401, 'no-session');
      expectToken(await c.post('/0/session/logout', { cookie: old }), 400, 'logout-fail');
      // The state table: for the old cookie there is no session, so POST /0/session/ makes a new one.
      expectToken(await c.post('/0/session/', { cookie: old }), 201, 'user-ok');
    });

    it('ends an anonymous session too, and answers 400 logout-fail without a registered session', async () => {
      const b = await start();
      const c = b.client();
      expectToken(await c.post('/0/session/logout'), 400, 'logout-fail');
      await c.post('/0/session/');
      const anon = `sid=${c.sid}`;
      expectToken(await c.post('/0/session/logout'), 201, 'logout-ok');
      expectToken(await c.post('/0/session/logout', { cookie: anon }), 400, 'logout-fail');
      expectToken(
        await c.post('/0/session/logout', { cookie: `sid=${randomBytes(32).toString('base64url')}` }),
        400,
        'logout-fail',
      );
    });
  });

  describe('POST /0/session/signup', () => {
    it('answers 201 signup-ok, creates the user and a logged-in session, and mails a confirmation', async () => {
      const b = await start();
      const c = b.client();
      const res = await signup(c, 'Alice@Example.com');
      expect(res.sid?.value).toMatch(SID_SHAPE);

      const user = await readUser(c);
      expect(user).toEqual({ login: 'alice@example.com', confirmed: false, authcode: user.authcode, data: {} });
      // The default product configuration sends a confirmation e-mail.
      expect(outboxMails(b)).toHaveLength(1);
      // The new session is logged in: the password is not needed again.
      expectToken(await c.post('/0/user/', { form: { k: 'v' } }), 200, 'user-data-ok');
    });

    it('sends no confirmation when the frontend does not want one', async () => {
      const b = await start();
      const f = await b.addFrontend({ confirmationEmail: false });
      await signup(b.client(), 'alice@example.com', PASSWORD, `?app=${f.id}`);
      expect(outboxMails(b)).toHaveLength(0);
    });

    it('answers 400 signup-fail-no-email when the login is not an e-mail address', async () => {
      const b = await start();
      const c = b.client();
      const logins = ['not-an-address', 'alice@', '@example.com', 'alice example@example.com', '', ' '];
      // Decision 12: at most 254 characters.
      logins.push(`${'a'.repeat(64)}@${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(60)}.com`);
      for (const login of logins) {
        const res = await c.post('/0/session/signup', { form: { login, password: PASSWORD } });
        expectToken(res, 400, 'signup-fail-no-email');
        expect(res.sid).toBeUndefined();
      }
      expectToken(await c.post('/0/session/signup', { form: { password: PASSWORD } }), 400, 'signup-fail-no-email');
      expectToken(await c.post('/0/session/signup'), 400, 'signup-fail-no-email');
      expect(c.sid).toBeUndefined();
    });

    it('answers 400 signup-fail-already-exists for a taken login in any letter case, and keeps the first password', async () => {
      const b = await start();
      await signup(b.client(), 'alice@example.com');
      const c = b.client();
      for (const login of ['alice@example.com', 'ALICE@EXAMPLE.COM', 'Alice@example.Com']) {
        const res = await c.post('/0/session/signup', { form: { login, password: 'another password' } });
        expectToken(res, 400, 'signup-fail-already-exists');
        expect(res.sid).toBeUndefined();
      }
      expectToken(
        await c.post('/0/session/login', { form: { login: 'alice@example.com', password: 'another password' } }),
        403,
        'login-fail',
      );
      expectToken(
        await c.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } }),
        201,
        'login-ok',
      );
    });

    it('answers 400 signup-fail for a password shorter than 8 or missing, and takes exactly 8', async () => {
      const b = await start();
      const c = b.client();
      const forms: Array<Record<string, string>> = [
        { login: 'alice@example.com', password: '1234567' },
        { login: 'alice@example.com', password: '' },
        { login: 'alice@example.com' },
        { login: 'alice@example.com', password: 'x'.repeat(1025) },
      ];
      for (const form of forms) {
        const res = await c.post('/0/session/signup', { form });
        expectToken(res, 400, 'signup-fail');
        expect(res.sid).toBeUndefined();
      }
      // Nothing was created by the failures.
      expect(await b.store.userByLogin(b.defaultFrontend.id, 'alice@example.com')).toBeUndefined();
      await signup(c, 'alice@example.com', '12345678');
    });
  });

  describe('the session cookie (decision 1)', () => {
    it('is sid, HttpOnly, SameSite=Lax, Path=/, without Secure over plain HTTP, on every kind of new session', async () => {
      const b = await start();
      await signup(b.client(), 'bob@example.com');
      const c = b.client();
      const set = [
        await c.post('/0/session/'),
        await c.post('/0/session/login', { form: { login: 'bob@example.com', password: PASSWORD } }),
        await b.client().post('/0/session/signup', { form: { login: 'carol@example.com', password: PASSWORD } }),
      ];
      for (const res of set) {
        expect(res.setCookies).toHaveLength(1);
        const sid = parseSetCookie(res.setCookies[0]!);
        expect(sid.name).toBe('sid');
        expect(sid.value).toMatch(SID_SHAPE);
        expect(sid.attrs.has('httponly')).toBe(true);
        expect(sid.attrs.get('samesite')).toBe('Lax');
        expect(sid.attrs.get('path')).toBe('/');
        expect(sid.attrs.has('secure')).toBe(false);
        // It lives as long as the absolute lifetime of a session (decision 2: 365 days).
        expect(sid.attrs.get('max-age')).toBe(String(365 * 86_400));
      }
      const logout = await c.post('/0/session/logout');
      expect(logout.sid?.attrs.has('httponly')).toBe(true);
      expect(logout.sid?.attrs.has('secure')).toBe(false);
    });

    it('gets a new id on login, signup and logout, and the old one stops working', async () => {
      const b = await start();
      await signup(b.client(), 'alice@example.com');
      const c = b.client();

      // Anonymous, then login: the anonymous id is gone.
      const anon = (await c.post('/0/session/')).sid!.value;
      const first = (await c.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } }))
        .sid!.value;
      expect(first).not.toBe(anon);
      expectToken(await c.post('/0/session/logout', { cookie: `sid=${anon}` }), 400, 'logout-fail');

      // Logged in, then login again: the first logged-in id is gone.
      const second = (await c.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } }))
        .sid!.value;
      expect(second).not.toBe(first);
      expectToken(await c.get('/0/user/', { cookie: `sid=${first}` }), 404, 'not found');
      expect((await readUser(c)).login).toBe('alice@example.com');

      // Anonymous, then signup: the anonymous id is gone.
      const d = b.client();
      const anon2 = (await d.post('/0/session/')).sid!.value;
      const signed = (await signup(d, 'dave@example.com')).sid!.value;
      expect(signed).not.toBe(anon2);
      expectToken(await d.post('/0/session/logout', { cookie: `sid=${anon2}` }), 400, 'logout-fail');

      // Logout: the id is gone and a new anonymous one takes its place.
      expectToken(await d.post('/0/session/logout'), 201, 'logout-ok');
      expectToken(await d.get('/0/user/', { cookie: `sid=${signed}` }), 404, 'not found');
      expect(d.sid).toMatch(SID_SHAPE);
      expect(d.sid).not.toBe(signed);
    });

    it('is stored only as its hash: the raw value is nowhere in the SQLite files nor in the log', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const sid = c.sid!;
      const anon = (await b.client().post('/0/session/')).sid!.value;

      const dbFile = join(b.dataDir, 'bridge.db');
      const db = new Database(dbFile, { readonly: true });
      try {
        const hashes = db
          .prepare<[], { id_hash: string }>('SELECT id_hash FROM sessions')
          .all()
          .map((r) => r.id_hash);
        expect(hashes.sort()).toEqual([sha256(sid), sha256(anon)].sort());
      } finally {
        db.close();
      }
      for (const file of [dbFile, `${dbFile}-wal`, `${dbFile}-shm`]) {
        if (!existsSync(file)) continue;
        const bytes = readFileSync(file);
        expect(bytes.includes(sid), file).toBe(false);
        expect(bytes.includes(anon), file).toBe(false);
        expect(bytes.includes(PASSWORD), file).toBe(false);
      }
      // What is stored cannot be replayed as a cookie.
      expectToken(await c.get('/0/user/', { cookie: `sid=${sha256(sid)}` }), 404, 'not found');
      // docs/decisions.md §9: logs never hold session ids or passwords.
      expect(b.sink.lines.length).toBeGreaterThan(0);
      expect(b.sink.text()).not.toContain(sid);
      expect(b.sink.text()).not.toContain(PASSWORD);
    });
  });

  describe('session expiry (decision 2)', () => {
    it('slides: a session used within the idle time lives on, one idle for longer is gone', async () => {
      const b = await start({ config: { sessions: { idleDays: 30, absoluteDays: 365 } } });
      const c = b.client();
      await signup(c, 'alice@example.com');
      const sid = c.sid;

      b.clock.advance(29 * DAY);
      expect((await readUser(c)).login).toBe('alice@example.com');
      // 58 days after it was made, 29 after it was last used.
      b.clock.advance(29 * DAY);
      expect((await readUser(c)).login).toBe('alice@example.com');
      b.clock.advance(30 * DAY - 1);
      expectToken(await c.post('/0/user/', { form: { still: 'here' } }), 200, 'user-data-ok');

      b.clock.advance(30 * DAY + 1);
      expect(c.sid).toBe(sid);
      expectToken(await c.get('/0/user/'), 404, 'not found');
      expectToken(await c.post('/0/user/', { form: { a: 'b' } }), 401, 'no-session');
      expectToken(await c.post('/0/session/logout'), 400, 'logout-fail');
      // The user is still there: logging in again works and the data survived.
      expectToken(
        await c.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } }),
        201,
        'login-ok',
      );
      expect((await readUser(c)).data).toEqual({ still: 'here' });
    });

    it('ends a session at its absolute lifetime however often it is used', async () => {
      const b = await start({ config: { sessions: { idleDays: 1, absoluteDays: 3 } } });
      const c = b.client();
      await signup(c, 'alice@example.com');
      const anon = b.client();
      await anon.post('/0/session/');

      for (let used = 0; used < 3 * 24 - 20; used += 20) {
        b.clock.advance(20 * HOUR);
        expect((await readUser(c)).login).toBe('alice@example.com');
        expectToken(await anon.post('/0/session/'), 200, 'user-ok');
      }
      // Now 60 hours old and used an hour ago at most: at 72 hours it ends.
      b.clock.advance(12 * HOUR - 1);
      expect((await readUser(c)).login).toBe('alice@example.com');
      b.clock.advance(2);
      expectToken(await c.get('/0/user/'), 404, 'not found');
      expectToken(await c.post('/0/user/', { form: { a: 'b' } }), 401, 'no-session');
      expectToken(await anon.post('/0/session/'), 201, 'user-ok');
    });
  });

  describe('missing, invalid and forged cookies (decision 3)', () => {
    it('GET /0/user/ answers 404 not found and POST /0/user/ 401 no-session', async () => {
      const b = await start();
      const real = b.client();
      await signup(real, 'alice@example.com');
      const sid = real.sid!;
      const flipped = sid.slice(0, -1) + (sid.endsWith('A') ? 'B' : 'A');
      const cookies: Array<string | null> = [
        null,
        '',
        'sid=',
        'sid=short',
        `sid=${sid}x`,
        `sid=${flipped}`,
        `sid=${randomBytes(32).toString('base64url')}`,
        `sid=${sid.slice(0, 20)}!${sid.slice(21)}`,
        `other=${sid}`,
        `SID=${sid}`,
        'garbage without an equals sign',
      ];
      const c = b.client();
      for (const cookie of cookies) {
        expectToken(await c.get('/0/user/', { cookie }), 404, 'not found');
        expectToken(await c.post('/0/user/', { cookie, form: { a: 'b' } }), 401, 'no-session');
      }
      // Nothing reached the real user's data, and its own cookie still works among others.
      expect((await readUser(real, '', { cookie: `theme=dark; sid=${sid}; lang=en` })).data).toEqual({});
    });
  });

  describe('user data', () => {
    it('GET /0/user/ returns exactly login, confirmed, authcode and data', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const res = await c.get('/0/user/');
      expect(res.status).toBe(200);
      const body = JSON.parse(res.body) as Record<string, unknown>;
      expect(Object.keys(body).sort()).toEqual(['authcode', 'confirmed', 'data', 'login']);
      expect(body).toMatchObject({ login: 'alice@example.com', confirmed: false, data: {} });
    });

    it('POST /0/user/ merges string fields: fields not supplied are kept and a later read returns them all', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      expectToken(await c.post('/0/user/', { form: { a: '1', b: '2' } }), 200, 'user-data-ok');
      expectToken(
        await c.post('/0/user/', { form: { b: 'three', c: 'grüße 👋', 'odd key': '' } }),
        200,
        'user-data-ok',
      );
      expectToken(await c.post('/0/user/', { json: { d: '{"nested":"as text"}' } }), 200, 'user-data-ok');
      expectToken(await c.post('/0/user/'), 200, 'user-data-ok');
      expect((await readUser(c)).data).toEqual({
        a: '1',
        b: 'three',
        c: 'grüße 👋',
        'odd key': '',
        d: '{"nested":"as text"}',
      });
      // The session of a second login sees the same data.
      const other = b.client();
      await other.post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } });
      expect((await readUser(other)).data.b).toBe('three');
    });

    it('stores app as user data (decision 25): the frontend comes from the query, else the session, else Host', async () => {
      const b = await start();
      const other = await b.addFrontend();
      const c = b.client();
      await signup(c, 'alice@example.com', PASSWORD, `?app=${other.id}`);
      // The official client sends its frontend as `app` in every form: in the body it is data, and the session
      // the cookie names tells the frontend.
      expectToken(await c.post('/0/user/', { form: { app: other.id, x: '1' } }), 200, 'user-data-ok');
      expectToken(await c.post('/0/user/', { form: { app: 'my-app-name' } }), 200, 'user-data-ok');
      expectToken(await c.post('/0/user/', { json: { app: 'from JSON', y: '2' } }), 200, 'user-data-ok');
      // `app` in the query still names the frontend, and is not data.
      expectToken(await c.post(`/0/user/?app=${other.id}`, { form: { z: '3' } }), 200, 'user-data-ok');
      expect((await readUser(c, `?app=${other.id}`)).data).toEqual({ x: '1', app: 'from JSON', y: '2', z: '3' });
      expect(await b.store.userByLogin(b.defaultFrontend.id, 'alice@example.com')).toBeUndefined();
      // A query naming another frontend than the session's: no session there.
      expectToken(await c.post(`/0/user/?app=${b.defaultFrontend.id}`, { form: { w: '4' } }), 401, 'no-session');
      // An unknown frontend in the query is 404, whatever the body holds.
      expectToken(await c.post(`/0/user/?app=${randomUUID()}`, { form: { app: other.id } }), 404, 'not found');
      // The Host header names the frontend before the session does.
      const host = { host: `${b.defaultFrontend.id}.example.com` };
      expectToken(await c.post('/0/user/', { headers: host, form: { w: '4' } }), 401, 'no-session');
      // Without a session the default frontend is the one asked; an `app` field does not name one.
      expectToken(await b.client().post('/0/user/', { form: { app: other.id } }), 401, 'no-session');
      expect((await readUser(c, `?app=${other.id}`)).data).toEqual({ x: '1', app: 'from JSON', y: '2', z: '3' });
    });

    it('stores __proto__, constructor and prototype as ordinary fields, from forms and JSON', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      expectToken(
        // A computed key: `__proto__:` in an object literal would set the literal's prototype instead.
        await c.post('/0/user/', { form: { ['__proto__']: 'form proto', constructor: 'c', prototype: 'p' } }),
        200,
        'user-data-ok',
      );
      let raw = await c.get('/0/user/');
      // The stored data as text: a later GET returns the field as it was sent.
      expect(raw.body).toContain('"data":{"__proto__":"form proto","constructor":"c","prototype":"p"}');
      // JSON bodies, written as text: an object literal would not carry a `__proto__` member.
      const json = { 'content-type': 'application/json' };
      expectToken(
        await c.post('/0/user/', { body: '{"__proto__":"json proto","constructor":"C2"}', headers: json }),
        200,
        'user-data-ok',
      );
      raw = await c.get('/0/user/');
      expect(raw.body).toContain('"data":{"__proto__":"json proto","constructor":"C2","prototype":"p"}');
      const data = (JSON.parse(raw.body) as UserObject).data;
      expect(Object.getOwnPropertyDescriptor(data, '__proto__')?.value).toBe('json proto');
      expect([data.constructor, data.prototype]).toEqual(['C2', 'p']);
      // A `__proto__` whose value is an object is not a string field: refused, nothing stored.
      expectToken(
        await c.post('/0/user/', { body: '{"__proto__":{"admin":"yes"},"n":"1"}', headers: json }),
        400,
        'user-data-failed',
      );
      expect((await c.get('/0/user/')).body).toContain(
        '"data":{"__proto__":"json proto","constructor":"C2","prototype":"p"}',
      );
      expect(({} as Record<string, unknown>).admin).toBeUndefined();
    });

    it('answers 413 user-data-failed over the size limit and keeps the data as it was', async () => {
      const b = await start({ config: { accounts: { userDataBytes: 64 }, http: { bodyLimit: 1024 } } });
      const c = b.client();
      await signup(c, 'alice@example.com');
      expectToken(await c.post('/0/user/', { form: { a: 'x'.repeat(20) } }), 200, 'user-data-ok');
      // {"a":"x…x"} is 28 bytes; this field alone fits, the merged object does not.
      expectToken(await c.post('/0/user/', { form: { b: 'y'.repeat(40) } }), 413, 'user-data-failed');
      // The limit counts UTF-8 bytes: with 16 two-byte letters the object is 67 bytes, with 16 ASCII ones 51.
      expectToken(await c.post('/0/user/', { form: { b: 'é'.repeat(16) } }), 413, 'user-data-failed');
      expectToken(await c.post('/0/user/', { form: { b: 'e'.repeat(16) } }), 200, 'user-data-ok');
      // A body larger than the HTTP limit is the same failure, not a generic error.
      expectToken(await c.post('/0/user/', { form: { big: 'z'.repeat(2000) } }), 413, 'user-data-failed');
      expect((await readUser(c)).data).toEqual({ a: 'x'.repeat(20), b: 'e'.repeat(16) });
      // Overwriting a field with a shorter value is always possible.
      expectToken(await c.post('/0/user/', { form: { a: '' } }), 200, 'user-data-ok');
    });

    it('answers 400 user-data-failed (decision 29) for values that are not strings, and stores none of them', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const bodies: unknown[] = [
        { n: 1 },
        { ok: 'fine', n: 2 },
        { o: { x: 'y' } },
        { a: ['x'] },
        { t: true },
        { z: null },
      ];
      for (const json of bodies) expectToken(await c.post('/0/user/', { json }), 400, 'user-data-failed');
      expectToken(
        await c.post('/0/user/', { body: '{"a":', headers: { 'content-type': 'application/json' } }),
        400,
        'user-data-failed',
      );
      expect((await readUser(c)).data).toEqual({});
    });

    it('answers 401 no-session to POST /0/user/ and 404 to GET without a logged-in session', async () => {
      const b = await start();
      const c = b.client();
      expectToken(await c.post('/0/user/', { form: { a: 'b' } }), 401, 'no-session');
      expectToken(await c.get('/0/user/'), 404, 'not found');
    });

    it('merges 20 concurrent posts of different fields without losing one', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) => c.post('/0/user/', { form: { [`f${i}`]: `v${i}` } })),
      );
      for (const r of results) expectToken(r, 200, 'user-data-ok');
      const expected = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`f${i}`, `v${i}`]));
      expect((await readUser(c)).data).toEqual(expected);
    });
  });

  describe('authcode (decision 17)', () => {
    it('is 32 lowercase hex digits, different for every user, and stable within a day', async () => {
      const b = await start();
      const codes = new Set<string>();
      for (let i = 0; i < 6; i++) {
        const c = b.client();
        await signup(c, `user${i}@example.com`);
        const { authcode } = await readUser(c);
        expect(authcode).toMatch(/^[0-9a-f]{32}$/);
        codes.add(authcode);
        b.clock.advance(HOUR);
        expect((await readUser(c)).authcode).toBe(authcode);
      }
      expect(codes.size).toBe(6);
    });

    it('rotates after 24 hours; the previous code still finds the user for one hour', async () => {
      const b = await start();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const userId = (await b.store.userByLogin(b.defaultFrontend.id, 'alice@example.com'))!.id;
      const first = (await readUser(c)).authcode;

      b.clock.advance(DAY - 1);
      expect((await readUser(c)).authcode).toBe(first);
      b.clock.advance(1);
      const second = (await readUser(c)).authcode;
      expect(second).toMatch(/^[0-9a-f]{32}$/);
      expect(second).not.toBe(first);
      const rotatedAt = b.clock.now();
      // The rotation is stored: the next read gives the same new code.
      expect((await readUser(c)).authcode).toBe(second);

      expect((await userOfAuthcode(b.store, second, rotatedAt))?.id).toBe(userId);
      expect((await userOfAuthcode(b.store, first, rotatedAt))?.id).toBe(userId);
      expect((await userOfAuthcode(b.store, first, rotatedAt + HOUR - 1))?.id).toBe(userId);
      expect(await userOfAuthcode(b.store, first, rotatedAt + HOUR)).toBeUndefined();
      expect((await userOfAuthcode(b.store, second, rotatedAt + HOUR))?.id).toBe(userId);
      expect(await userOfAuthcode(b.store, 'ab'.repeat(16), rotatedAt)).toBeUndefined();

      // A day later it rotates again, and the first code is forgotten altogether.
      b.clock.advance(DAY);
      const third = (await readUser(c)).authcode;
      expect(new Set([first, second, third]).size).toBe(3);
      expect((await userOfAuthcode(b.store, second, b.clock.now()))?.id).toBe(userId);
      expect(await userOfAuthcode(b.store, first, b.clock.now())).toBeUndefined();
    });
  });

  describe('frontends (decision 15)', () => {
    it('keeps the users of two frontends apart', async () => {
      const b = await start();
      const other = await b.addFrontend();
      const inOther = `?app=${other.id}`;

      const a = b.client();
      await signup(a, 'alice@example.com', 'default password');
      const o = b.client();
      await signup(o, 'alice@example.com', 'other password', inOther);

      expect(await b.store.userByLogin(b.defaultFrontend.id, 'alice@example.com')).toBeDefined();
      expect(await b.store.userByLogin(other.id, 'alice@example.com')).toBeDefined();

      // Each password works only where it was set.
      const x = b.client();
      const login = (password: string, query = '') =>
        x.post(`/0/session/login${query}`, { form: { login: 'alice@example.com', password } });
      expectToken(await login('other password'), 403, 'login-fail');
      expectToken(await login('default password', inOther), 403, 'login-fail');
      expectToken(await login('other password', inOther), 201, 'login-ok');

      // Data and authcodes are their own.
      await a.post('/0/user/', { form: { where: 'default' } });
      await o.post(`/0/user/${inOther}`, { form: { where: 'other' } });
      const ua = await readUser(a);
      const uo = await readUser(o, inOther);
      expect(ua.data).toEqual({ where: 'default' });
      expect(uo.data).toEqual({ where: 'other' });
      expect(ua.authcode).not.toBe(uo.authcode);
    });

    it('a session of one frontend is no session in another', async () => {
      const b = await start();
      const other = await b.addFrontend();
      const c = b.client();
      await signup(c, 'alice@example.com');
      const sid = c.sid;

      expectToken(await c.get(`/0/user/?app=${other.id}`), 404, 'not found');
      expectToken(await c.post(`/0/user/?app=${other.id}`, { form: { a: 'b' } }), 401, 'no-session');
      expectToken(await c.post(`/0/session/logout?app=${other.id}`), 400, 'logout-fail');
      expectToken(await c.post(`/0/session/?app=${other.id}`, { cookie: `sid=${sid}` }), 201, 'user-ok');
      // None of that touched the session in its own frontend.
      expect((await readUser(c, '', { cookie: `sid=${sid}` })).login).toBe('alice@example.com');
    });

    it('takes the frontend from the Host header, then from app in the query or form, else the default', async () => {
      const b = await start();
      const f = await b.addFrontend();
      const host = { host: `${f.id}.example.com` };

      // Host: the uuid label names the frontend, in any letter case and with a port.
      const h = b.client();
      expectToken(
        await h.post('/0/session/signup', { headers: host, form: { login: 'host@example.com', password: PASSWORD } }),
        201,
        'signup-ok',
      );
      expect(await b.store.userByLogin(f.id, 'host@example.com')).toBeDefined();
      expect(await b.store.userByLogin(b.defaultFrontend.id, 'host@example.com')).toBeUndefined();
      expect((await readUser(h, '', { headers: { host: `${f.id.toUpperCase()}.Example.COM:8443` } })).login).toBe(
        'host@example.com',
      );
      // The Host header wins over an app parameter.
      expect((await readUser(h, `?app=${b.defaultFrontend.id}`, { headers: host })).login).toBe('host@example.com');
      expect((await readUser(h, `?app=${f.id}`)).login).toBe('host@example.com');

      // The app form field.
      const form = b.client();
      expectToken(
        await form.post('/0/session/signup', { form: { app: f.id, login: 'form@example.com', password: PASSWORD } }),
        201,
        'signup-ok',
      );
      expect(await b.store.userByLogin(f.id, 'form@example.com')).toBeDefined();
      // On POST /0/user/ the form's `app` is data; the session names the frontend (decision 25).
      expectToken(await form.post('/0/user/', { form: { app: f.id, k: 'v' } }), 200, 'user-data-ok');
      expect((await readUser(form, `?app=${f.id}`)).data).toEqual({ app: f.id, k: 'v' });

      // Neither: the default frontend, also for a Host that is not a frontend's.
      const d = b.client();
      await signup(d, 'default@example.com', PASSWORD);
      expect(await b.store.userByLogin(b.defaultFrontend.id, 'default@example.com')).toBeDefined();
      expect((await readUser(d, '', { headers: { host: 'devcloud.example.com' } })).login).toBe('default@example.com');
    });

    it('answers 404 not found for an unknown frontend', async () => {
      const b = await start();
      const c = b.client();
      const unknown = randomUUID();
      const named: Array<[string, Parameters<HttpClient['post']>[1]]> = [
        ['', { headers: { host: `${unknown}.example.com` } }],
        [`?app=${unknown}`, {}],
        ['?app=not-a-uuid', {}],
        ['?app=', {}],
      ];
      for (const [query, opts] of named) {
        expectToken(await c.post(`/0/session/${query}`, opts), 404, 'not found');
        expectToken(await c.get(`/0/user/${query}`, opts), 404, 'not found');
        expectToken(
          await c.post(`/0/session/signup${query}`, { ...opts, form: { login: 'a@example.com', password: PASSWORD } }),
          404,
          'not found',
        );
        expectToken(
          await c.post(`/0/session/login${query}`, { ...opts, form: { login: 'a@example.com', password: PASSWORD } }),
          404,
          'not found',
        );
      }
      expectToken(await c.post('/0/session/', { form: { app: unknown } }), 404, 'not found');
      expect(c.sid).toBeUndefined();
      expect(await b.store.userByLogin(b.defaultFrontend.id, 'a@example.com')).toBeUndefined();
    });

    it('with allowDefault off, a request that names no frontend gets 404 not found', async () => {
      const b = await start({ config: { frontends: { allowDefault: false } } });
      const f = await b.addFrontend();
      const c = b.client();
      expectToken(await c.post('/0/session/'), 404, 'not found');
      expectToken(await c.get('/0/user/'), 404, 'not found');
      expectToken(
        await c.post('/0/session/signup', { form: { login: 'a@example.com', password: PASSWORD } }),
        404,
        'not found',
      );
      expect(c.sid).toBeUndefined();
      // Named, the default frontend and any other still answer.
      expectToken(await c.post(`/0/session/?app=${b.defaultFrontend.id}`), 201, 'user-ok');
      expectToken(await b.client().post('/0/session/', { headers: { host: `${f.id}.example.com` } }), 201, 'user-ok');
    });
  });
});

describe('the Secure cookie attribute over TLS (decision 1)', () => {
  it.skipIf(missing('openssl'))('is set over HTTPS, and the session works there', async () => {
    const b = await bridge({ transport: 'https' });
    expect(b.url).toMatch(/^https:/);
    const c = b.client();
    const anon = await c.post('/0/session/');
    expectToken(anon, 201, 'user-ok');
    expect(anon.sid?.attrs.has('secure')).toBe(true);
    const up = await signup(c, 'alice@example.com');
    expect(up.sid?.attrs.has('secure')).toBe(true);
    expect(up.sid?.attrs.has('httponly')).toBe(true);
    expect(up.sid?.attrs.get('samesite')).toBe('Lax');
    expect((await readUser(c)).login).toBe('alice@example.com');
    const login = await b
      .client()
      .post('/0/session/login', { form: { login: 'alice@example.com', password: PASSWORD } });
    expect(login.sid?.attrs.has('secure')).toBe(true);
    const out = await c.post('/0/session/logout');
    expectToken(out, 201, 'logout-ok');
    expect(out.sid?.attrs.has('secure')).toBe(true);
  });

  it('is set behind a trusted proxy that says https, and only then', async () => {
    const trusted = await bridge({ config: { http: { trustProxy: true } } });
    const viaTls = await trusted.client().post('/0/session/', { headers: { 'x-forwarded-proto': 'https' } });
    expectToken(viaTls, 201, 'user-ok');
    expect(viaTls.sid?.attrs.has('secure')).toBe(true);
    const viaPlain = await trusted.client().post('/0/session/', { headers: { 'x-forwarded-proto': 'http' } });
    expect(viaPlain.sid?.attrs.has('secure')).toBe(false);

    // Without trustProxy a client cannot claim TLS it does not have.
    const direct = await bridge();
    const forged = await direct.client().post('/0/session/', { headers: { 'x-forwarded-proto': 'https' } });
    expectToken(forged, 201, 'user-ok');
    expect(forged.sid?.attrs.has('secure')).toBe(false);
  });
});
