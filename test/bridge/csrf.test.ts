/**
 * Cross-site request forgery, over real HTTP: a state-changing request that a browser marks as coming from a
 * page of another site (`Origin`, else `Referer`) is refused with 403 `origin-fail` even with a valid session
 * cookie, and changes nothing; the bridge's own pages, allow-listed origins and clients that send neither header
 * pass (docs/api.md, Cross-site requests).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { type ConfigOverrides, type HttpClient, type TestBridge, startTestBridge } from '../support/bridge.js';

const PASSWORD = 'correct horse battery';
const EVIL = 'https://evil.example';

const bridges: TestBridge[] = [];
afterEach(async () => {
  for (const b of bridges.splice(0)) await b.close();
});

async function start(config: ConfigOverrides = {}): Promise<TestBridge> {
  const b = await startTestBridge({ transport: 'http', config });
  bridges.push(b);
  return b;
}

/** A logged-in user's client: its jar holds a valid session cookie. */
async function loggedIn(b: TestBridge, login: string): Promise<HttpClient> {
  const c = b.client();
  const r = await c.post('/0/session/signup', { form: { login, password: PASSWORD } });
  expect(r.status).toBe(201);
  return c;
}

async function userData(c: HttpClient): Promise<Record<string, string>> {
  const r = await c.get('/0/user/');
  expect(r.status).toBe(200);
  return (JSON.parse(r.body) as { data: Record<string, string> }).data;
}

describe('cross-site requests', () => {
  it('refuses a cross-site form POST with a valid cookie, and changes nothing', async () => {
    const b = await start();
    const c = await loggedIn(b, 'alice@example.com');
    const sid = c.sid;
    const r = await c.post('/0/user/', { form: { colour: 'red' }, headers: { origin: EVIL } });
    expect([r.status, r.body, r.contentType]).toEqual([403, 'origin-fail', 'text/plain; charset=utf-8']);
    expect(await userData(c)).toEqual({});
    // Nor a logout, a login or a delete: every state-changing method.
    expect((await c.post('/0/session/logout', { headers: { origin: EVIL } })).body).toBe('origin-fail');
    expect(c.sid).toBe(sid);
    expect(
      (
        await c.post('/0/session/login', {
          form: { login: 'alice@example.com', password: PASSWORD },
          headers: { origin: EVIL },
        })
      ).body,
    ).toBe('origin-fail');
    expect((await c.request('DELETE', '/0/devices/dev1', { headers: { origin: EVIL } })).body).toBe('origin-fail');
    expect((await c.request('PUT', '/0/user/', { headers: { origin: EVIL } })).status).toBe(403);
    expect(c.sid).toBe(sid);
    const refused = b.sink.events('http.origin_refused');
    expect(refused).toHaveLength(5);
    expect(refused[0]).toMatchObject({
      level: 'info',
      method: 'POST',
      route: '/0/user',
      reason: 'cross',
      origin: EVIL,
    });
    // A GET from another site changes nothing and is not refused.
    expect((await c.get('/0/user/', { headers: { origin: EVIL } })).status).toBe(200);
  });

  it('lets the same origin, and requests with neither header, through', async () => {
    const b = await start();
    const c = await loggedIn(b, 'bob@example.com');
    expect(await c.post('/0/user/', { form: { a: '1' }, headers: { origin: b.url! } })).toMatchObject({
      status: 200,
      body: 'user-data-ok',
    });
    // Scheme and host are compared case-insensitively, as URLs are.
    expect((await c.post('/0/user/', { form: { b: '2' }, headers: { origin: b.url!.toUpperCase() } })).status).toBe(
      200,
    );
    // curl, native apps and the official client under Node send neither header.
    expect((await c.post('/0/user/', { form: { c: '3' } })).status).toBe(200);
    expect(await userData(c)).toEqual({ a: '1', b: '2', c: '3' });
    // The same host on another port is another origin.
    const port = Number(new URL(b.url!).port);
    const r = await c.post('/0/user/', { form: { d: '4' }, headers: { origin: `http://127.0.0.1:${port + 1}` } });
    expect(r).toMatchObject({ status: 403, body: 'origin-fail' });
  });

  it('judges by the Referer when there is no Origin, and never logs more of it than its origin', async () => {
    const b = await start();
    const c = await loggedIn(b, 'carol@example.com');
    const secretPath = '/page?token=s3cr3t-value';
    const cross = await c.post('/0/user/', { form: { x: '1' }, headers: { referer: `${EVIL}${secretPath}` } });
    expect([cross.status, cross.body]).toEqual([403, 'origin-fail']);
    expect((await c.post('/0/user/', { form: { y: '2' }, headers: { referer: `${b.url}/app/settings` } })).status).toBe(
      200,
    );
    // An Origin, when there is one, decides; the Referer is not read.
    expect(
      (await c.post('/0/user/', { form: { z: '3' }, headers: { origin: b.url!, referer: `${EVIL}/x` } })).status,
    ).toBe(200);
    const malformed = await c.post('/0/user/', { form: { w: '4' }, headers: { referer: 'not a url' } });
    expect(malformed).toMatchObject({ status: 403, body: 'origin-fail' });
    expect(await userData(c)).toEqual({ y: '2', z: '3' });
    expect(b.sink.events('http.origin_refused').map((e) => e.reason)).toEqual(['cross', 'malformed']);
    expect(b.sink.text()).not.toContain('s3cr3t-value');
  });

  it('refuses Origin: null, which a sandboxed frame or a file can send, even with an allow-list', async () => {
    const b = await start({ http: { allowedOrigins: ['https://app.example.com'] } });
    const c = await loggedIn(b, 'dave@example.com');
    const r = await c.post('/0/user/', { form: { x: '1' }, headers: { origin: 'null' } });
    expect([r.status, r.body]).toEqual([403, 'origin-fail']);
    expect(b.sink.events('http.origin_refused')[0]).toMatchObject({ reason: 'null' });
    expect(await userData(c)).toEqual({});
  });

  it('lets the origins of http.allowedOrigins and http.publicUrl through, and only those', async () => {
    const b = await start({
      http: {
        allowedOrigins: ['https://app.example.com', 'http://localhost:3000/'],
        publicUrl: 'https://cloud.example.com/base',
      },
    });
    const c = await loggedIn(b, 'erin@example.com');
    const attempt = async (origin: string) =>
      (await c.post('/0/user/', { form: { [origin]: '1' }, headers: { origin } })).status;
    expect(await attempt('https://app.example.com')).toBe(200);
    expect(await attempt('https://APP.example.com:443')).toBe(200);
    expect(await attempt('http://localhost:3000')).toBe(200);
    expect(await attempt('https://cloud.example.com')).toBe(200);
    // Lookalikes are other sites.
    for (const origin of [
      'http://app.example.com',
      'https://app.example.com:8443',
      'https://app.example.com.evil.example',
      'https://evilapp.example.com',
      'http://localhost:3001',
    ]) {
      expect(await attempt(origin), origin).toBe(403);
    }
    expect(Object.keys(await userData(c)).sort()).toEqual([
      'http://localhost:3000',
      'https://APP.example.com:443',
      'https://app.example.com',
      'https://cloud.example.com',
    ]);
  });

  it('compares with the Host the request was addressed to, a frontend host included', async () => {
    const b = await start();
    const f = await b.addFrontend();
    const host = `${f.id}.devcloud.example.com`;
    const c = b.client();
    const signup = await c.post('/0/session/signup', {
      form: { login: 'fay@example.com', password: PASSWORD },
      headers: { host, origin: `https://${host}` },
    });
    expect([signup.status, signup.body]).toEqual([201, 'signup-ok']);
    expect(await b.store.userByLogin(f.id, 'fay@example.com')).toBeDefined();
    // The bridge's main host is another origin for a page on the frontend's.
    const r = await c.post('/0/user/', {
      form: { x: '1' },
      headers: { host, origin: 'https://devcloud.example.com' },
    });
    expect([r.status, r.body]).toEqual([403, 'origin-fail']);
  });

  it('takes the host from X-Forwarded-Host only from a proxy it trusts', async () => {
    const proxied = await start({ http: { trustProxy: ['127.0.0.1'] } });
    const c = await loggedIn(proxied, 'gus@example.com');
    const headers = {
      'x-forwarded-host': 'devcloud.example.com',
      'x-forwarded-proto': 'https',
      origin: 'https://devcloud.example.com',
    };
    expect((await c.post('/0/user/', { form: { x: '1' }, headers })).status).toBe(200);
    const direct = await start();
    const d = await loggedIn(direct, 'hal@example.com');
    expect(await d.post('/0/user/', { form: { x: '1' }, headers })).toMatchObject({ status: 403, body: 'origin-fail' });
  });

  it("lets the recovery page's own form through: its referrer policy keeps the page's origin in the post", async () => {
    const b = await start();
    const page = `${b.url}/0/session/recover?login=ivy%40example.com&token=abc`;
    const r = await b.client().get(page.slice(b.url!.length));
    expect(r.status).toBe(200);
    // Not `no-referrer`: with it a browser sends the form with `Origin: null`, which is refused.
    const policy = await fetch(page).then((res) => res.headers.get('referrer-policy'));
    expect(policy).toBe('same-origin');
    // What a browser sends for the form under that policy: the page's origin, and the page as Referer.
    const post = await b.client().post('/0/session/recover', {
      form: { login: 'ivy@example.com', token: 'abc', password: 'new password 1' },
      headers: { origin: b.url!, referer: page },
    });
    // Past the origin check: the token is wrong, so the route's own failure.
    expect([post.status, post.body]).toEqual([400, 'recover-fail']);
    expect(b.sink.events('http.origin_refused')).toEqual([]);
  });

  it('refuses an allowed origin that is not an origin, with the key at fault', () => {
    for (const bad of ['https://app.example.com/path', 'ftp://app.example.com', 'app.example.com', 'null', '*']) {
      const r = BridgeConfigSchema.safeParse({ dataDir: '/x', http: { allowedOrigins: [bad] } });
      expect(r.success, bad).toBe(false);
      expect(r.error!.issues[0]!.path).toEqual(['http', 'allowedOrigins', 0]);
    }
    expect(
      BridgeConfigSchema.parse({ dataDir: '/x', http: { allowedOrigins: ['https://app.example.com/'] } }).http
        .allowedOrigins,
    ).toEqual(['https://app.example.com/']);
  });
});
