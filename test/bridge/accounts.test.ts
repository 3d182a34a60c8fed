/**
 * Account flows end to end against a listening bridge app: signup and the e-mailed confirmation link, resend,
 * password recovery, the outbox used when no SMTP server is configured, and the attempt limits. Mail goes
 * through a real SMTP server; time moves only through the injected clock.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { PasswordHasher } from '../../bridge/accounts/password.js';
import { buildApp } from '../../bridge/app.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import { type BridgeConfig, BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import { type Mailer, createMailer } from '../../bridge/mail/mailer.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { type Frontend, ProductConfig } from '../../bridge/store/types.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { type SmtpMessage, type TestSmtpServer, startSmtpServer } from '../support/smtp.js';

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const PASSWORD = 'correct horse battery';

interface Reply {
  status: number;
  body: string;
  headers: Headers;
}

/** A request with node's client from a chosen local address (`fetch` cannot pick one). */
function requestFrom(
  localAddress: string,
  url: string,
  init: { method: string; headers: Record<string, string>; body: string | undefined },
): Promise<Response> {
  return new Promise((resolve, reject) => {
    const r = http.request(url, { method: init.method, headers: init.headers, localAddress }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const headers = new Headers();
        for (const [k, v] of Object.entries(res.headers)) {
          for (const one of Array.isArray(v) ? v : v === undefined ? [] : [v]) headers.append(k, one);
        }
        resolve(new Response(Buffer.concat(chunks), { status: res.statusCode ?? 0, headers }));
      });
      res.on('error', reject);
    });
    r.on('error', reject);
    r.end(init.body);
  });
}

/**
 * An HTTP client with a cookie jar, as a browser would keep the session cookie; from `localAddress` when given
 * (Linux routes all of 127.0.0.0/8 to the loopback interface, so each 127.x.y.z is a client address of its own).
 */
class Client {
  readonly cookies = new Map<string, string>();
  constructor(
    private readonly base: string,
    private readonly localAddress?: string,
  ) {}

  get sid(): string | undefined {
    return this.cookies.get('sid');
  }

  async request(method: string, pathOrUrl: string, form?: Record<string, string>): Promise<Reply> {
    const headers: Record<string, string> = {};
    if (this.cookies.size > 0) headers.cookie = [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
    let body: string | undefined;
    if (form) {
      headers['content-type'] = 'application/x-www-form-urlencoded';
      body = new URLSearchParams(form).toString();
    }
    const url = pathOrUrl.startsWith('http') ? pathOrUrl : `${this.base}${pathOrUrl}`;
    const res = this.localAddress
      ? await requestFrom(this.localAddress, url, { method, headers, body })
      : await fetch(url, { method, headers, body, redirect: 'manual' });
    for (const c of res.headers.getSetCookie()) {
      const [pair = '', ...attrs] = c.split(';');
      const eq = pair.indexOf('=');
      const name = pair.slice(0, eq).trim();
      const value = pair.slice(eq + 1).trim();
      if (attrs.some((a) => a.trim().toLowerCase() === 'max-age=0')) this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
    return { status: res.status, body: await res.text(), headers: res.headers };
  }

  post(path: string, form: Record<string, string> = {}): Promise<Reply> {
    return this.request('POST', path, form);
  }

  get(pathOrUrl: string): Promise<Reply> {
    return this.request('GET', pathOrUrl);
  }

  async user(): Promise<{ status: number; user?: { login: string; confirmed: boolean } }> {
    const r = await this.get('/0/user/');
    return r.status === 200
      ? { status: r.status, user: JSON.parse(r.body) as { login: string; confirmed: boolean } }
      : { status: r.status };
  }
}

interface Harness {
  url: string;
  app: FastifyInstance;
  store: SqliteStore;
  config: BridgeConfig;
  sink: LogSink;
  clock: { t: number };
  defaultFrontend: Frontend;
  dataDir: string;
  /** A client; from `localAddress` when given. */
  client(localAddress?: string): Client;
  /** A frontend with the given product configuration. */
  frontend(config: Partial<ProductConfig>): Promise<Frontend>;
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function smtpServer(): Promise<TestSmtpServer> {
  const server = await startSmtpServer();
  let closed = false;
  const close = server.close.bind(server);
  // Tests stop the server on purpose; closing twice must not hang the cleanup.
  server.close = async () => {
    if (closed) return;
    closed = true;
    await close();
  };
  cleanups.push(() => server.close());
  return server;
}

/**
 * A bridge app on a real port. `smtp` sends mail through that server; without it mail goes to the outbox.
 * `extra` is merged into the config (rate limits, for instance).
 */
async function startBridgeApp(smtp: TestSmtpServer | undefined, extra: Record<string, unknown> = {}): Promise<Harness> {
  const dataDir = tempDir('devcloud-accounts-');
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
  const config = BridgeConfigSchema.parse({
    dataDir,
    accounts: { scryptLogN: 10 },
    ...(smtp ? { mail: { smtp: { host: '127.0.0.1', port: smtp.port, secure: false, timeoutMs: 5000 } } } : {}),
    ...extra,
  });
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const store = new SqliteStore(dataDir);
  cleanups.push(() => store.close());
  const clock = { t: Date.UTC(2030, 0, 1) };
  const defaultFrontend = await ensureDefaultFrontend(store, clock.t);
  const a = config.accounts;
  const hasher = new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: a.hashConcurrency,
    maxQueued: a.hashQueue,
  });
  const mailer: Mailer = createMailer(
    { from: config.mail.from, outboxDir: outboxDir(config), smtp: config.mail.smtp },
    log,
    () => clock.t,
  );
  cleanups.push(() => mailer.close());
  const app = buildApp({ config, store, hasher, mailer, log, now: () => clock.t, checkAnswers: true });
  await app.listen({ host: '127.0.0.1', port: 0 });
  cleanups.push(() => app.close());
  const port = (app.server.address() as { port: number }).port;
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    app,
    store,
    config,
    sink,
    clock,
    defaultFrontend,
    dataDir,
    client: (localAddress?: string) => new Client(url, localAddress),
    async frontend(settings) {
      const f: Frontend = {
        id: randomUUID(),
        name: 'test',
        config: ProductConfig.parse(settings),
        isDefault: false,
        createdAt: clock.t,
      };
      await store.createFrontend(f);
      return f;
    },
  };
}

/** The mails a recipient got, in order. Delivery finishes before the bridge answers, so no waiting is needed. */
function mailsTo(smtp: TestSmtpServer, login: string): SmtpMessage[] {
  return smtp.messages.filter((m) => m.to.includes(login));
}

function onlyLink(m: SmtpMessage): string {
  expect(m.links).toHaveLength(1);
  return m.links[0]!;
}

async function signup(h: Harness, login: string, password = PASSWORD): Promise<Client> {
  const c = h.client();
  const r = await c.post('/0/session/signup', { login, password });
  expect(r).toMatchObject({ status: 201, body: 'signup-ok' });
  return c;
}

describe('signup and confirmation', () => {
  it('mails a confirmation link that confirms the account once', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    const c = await signup(h, 'alice@example.com');
    expect(await c.user()).toMatchObject({ status: 200, user: { login: 'alice@example.com', confirmed: false } });

    const mails = mailsTo(smtp, 'alice@example.com');
    expect(mails).toHaveLength(1);
    const link = onlyLink(mails[0]!);
    const u = new URL(link);
    // The link leads back to this server and to the frontend the account lives in.
    expect(`${u.protocol}//${u.host}`).toBe(h.url);
    expect(u.pathname).toBe('/0/session/confirm');
    expect(u.searchParams.get('app')).toBe(h.defaultFrontend.id);
    expect(u.searchParams.get('token')).toMatch(/^[A-Za-z0-9_-]{43}$/);

    // Opened in another browser, without the signup session: the token alone confirms.
    const browser = h.client();
    expect(await browser.get(link)).toMatchObject({ status: 200, body: 'confirm-ok' });
    expect(await c.user()).toMatchObject({ status: 200, user: { confirmed: true } });
    expect(await browser.get(link)).toMatchObject({ status: 400, body: 'confirm-fail' });
    // The token never reaches a log in SMTP mode.
    expect(h.sink.text()).not.toContain(u.searchParams.get('token'));
  });

  it('accepts the link until seven days have passed, not after', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    const start = h.clock.t;
    const early = await signup(h, 'early@example.com');
    const late = await signup(h, 'late@example.com');
    const earlyLink = onlyLink(mailsTo(smtp, 'early@example.com')[0]!);
    const lateLink = onlyLink(mailsTo(smtp, 'late@example.com')[0]!);

    h.clock.t = start + 7 * DAY - 60_000;
    expect(await early.get(earlyLink)).toMatchObject({ status: 200, body: 'confirm-ok' });
    h.clock.t = start + 7 * DAY + 1;
    expect(await late.get(lateLink)).toMatchObject({ status: 400, body: 'confirm-fail' });
    expect(await late.user()).toMatchObject({ status: 200, user: { confirmed: false } });
  });

  it('refuses a made-up or missing token', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    await signup(h, 'bob@example.com');
    const c = h.client();
    expect(await c.get(`/0/session/confirm?token=${'A'.repeat(43)}`)).toMatchObject({
      status: 400,
      body: 'confirm-fail',
    });
    expect(await c.get('/0/session/confirm')).toMatchObject({ status: 400, body: 'confirm-fail' });
  });

  it('sends no mail for a frontend without confirmation e-mails', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    const quiet = await h.frontend({ confirmationEmail: false });
    const c = h.client();
    expect(
      await c.post('/0/session/signup', { login: 'quiet@example.com', password: PASSWORD, app: quiet.id }),
    ).toEqual(expect.objectContaining({ status: 201, body: 'signup-ok' }));
    // The same signup on the default frontend does mail, so the server was there to receive one.
    await signup(h, 'loud@example.com');
    expect(mailsTo(smtp, 'loud@example.com')).toHaveLength(1);
    expect(mailsTo(smtp, 'quiet@example.com')).toHaveLength(0);
    expect(smtp.messages).toHaveLength(1);
  });

  it('keeps the account when the confirmation mail cannot be sent', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    await smtp.close();
    const c = await signup(h, 'offline@example.com');
    expect(await c.user()).toMatchObject({ status: 200, user: { login: 'offline@example.com', confirmed: false } });
    expect(h.sink.events('mail.failed').length).toBeGreaterThan(0);
  });
});

describe('resend', () => {
  it('sends a new link that works while the previous one no longer does', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    const c = await signup(h, 'carol@example.com');
    const first = onlyLink(mailsTo(smtp, 'carol@example.com')[0]!);

    // Anyone may ask for the mail again: no session is needed.
    expect(await h.client().post('/0/session/resend', { login: 'Carol@Example.com' })).toMatchObject({
      status: 200,
      body: 'resend-ok',
    });
    const mails = mailsTo(smtp, 'carol@example.com');
    expect(mails).toHaveLength(2);
    const second = onlyLink(mails[1]!);
    expect(second).not.toBe(first);

    expect(await c.get(first)).toMatchObject({ status: 400, body: 'confirm-fail' });
    expect(await c.get(second)).toMatchObject({ status: 200, body: 'confirm-ok' });
    expect(await c.user()).toMatchObject({ user: { confirmed: true } });
  });

  it('fails for an unknown login, a confirmed user, and when the SMTP server is down', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp);
    const c = h.client();
    await signup(h, 'dave@example.com');
    await signup(h, 'erin@example.com');

    expect(await c.post('/0/session/resend', { login: 'nobody@example.com' })).toMatchObject({
      status: 400,
      body: 'resend-fail',
    });

    expect(await c.get(onlyLink(mailsTo(smtp, 'dave@example.com')[0]!))).toMatchObject({ body: 'confirm-ok' });
    expect(await c.post('/0/session/resend', { login: 'dave@example.com' })).toMatchObject({
      status: 400,
      body: 'resend-fail',
    });
    expect(mailsTo(smtp, 'dave@example.com')).toHaveLength(1);

    await smtp.close();
    expect(await c.post('/0/session/resend', { login: 'erin@example.com' })).toMatchObject({
      status: 400,
      body: 'resend-fail',
    });
    const failed = h.sink.events('mail.failed');
    expect(failed.length).toBeGreaterThan(0);
    // The log says what failed without naming the recipient.
    expect(JSON.stringify(failed)).not.toContain('erin@');
  });
});

/** Asks for a recovery mail over `path` and returns the link it carries. */
async function askRecovery(h: Harness, smtp: TestSmtpServer, path: string, login: string): Promise<string> {
  const before = mailsTo(smtp, login).length;
  expect(await h.client().post(path, { login })).toMatchObject({ status: 200, body: 'recover-ok' });
  const mails = mailsTo(smtp, login);
  expect(mails).toHaveLength(before + 1);
  const m = mails[mails.length - 1]!;
  expect(m.subject).toBe('Set a new password');
  return onlyLink(m);
}

/** The fields the recovery form posts back, from the e-mailed link. */
function formOf(link: string, password: string): Record<string, string> {
  const q = new URL(link).searchParams;
  return { login: q.get('login')!, token: q.get('token')!, app: q.get('app')!, password };
}

describe('password recovery', () => {
  // Recovery attempts per login are limited; these tests make more than the default allows.
  const limits = { rateLimits: { recover: { limit: 100, windowMs: HOUR } } };

  it('mails a link to a form, sets the new password once and logs every old session out', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp, limits);
    const signedUp = await signup(h, 'frank@example.com', 'old password 1');
    const loggedIn = h.client();
    expect(
      await loggedIn.post('/0/session/login', { login: 'frank@example.com', password: 'old password 1' }),
    ).toMatchObject({ status: 201, body: 'login-ok' });
    const bystander = await signup(h, 'grace@example.com');

    // Both spellings send a mail; only the newest link works.
    const viaRecovery = await askRecovery(h, smtp, '/0/session/recovery', 'frank@example.com');
    const link = await askRecovery(h, smtp, '/0/session/recover', 'frank@example.com');
    const u = new URL(link);
    expect(`${u.protocol}//${u.host}${u.pathname}`).toBe(`${h.url}/0/session/recover`);
    expect(u.searchParams.get('login')).toBe('frank@example.com');
    expect(u.searchParams.get('token')).toMatch(/^[A-Za-z0-9_-]{43}$/);

    const form = await h.client().get(link);
    expect(form.status).toBe(200);
    expect(form.headers.get('content-type')).toMatch(/^text\/html/);
    expect(form.body).toContain('<form method="post" action="/0/session/recover">');
    expect(form.body).toContain(`name="token" value="${u.searchParams.get('token')}"`);
    expect(form.body).toContain('name="login" value="frank@example.com"');
    expect(form.body).toContain('type="password" name="password"');
    // The page may run no script, load nothing, post only back to the bridge, and not be framed: it carries the
    // token. It needs nothing else: no script or style of its own.
    expect(form.headers.get('content-security-policy')).toBe(
      "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    expect(form.headers.get('x-frame-options')).toBe('DENY');
    expect(form.headers.get('x-content-type-options')).toBe('nosniff');
    expect(form.body).not.toMatch(/<script|<style|style=|<link|<img|<iframe|\son\w+=/i);

    const browser = h.client();
    expect(await browser.post('/0/session/recover', formOf(viaRecovery, 'new password 2'))).toMatchObject({
      status: 400,
      body: 'recover-fail',
    });
    expect(await browser.post('/0/session/recover', formOf(link, 'new password 2'))).toMatchObject({
      status: 200,
      body: 'recover-ok',
    });
    // Single use.
    expect(await browser.post('/0/session/recover', formOf(link, 'new password 3'))).toMatchObject({
      status: 400,
      body: 'recover-fail',
    });

    expect((await signedUp.user()).status).toBe(404);
    expect((await loggedIn.user()).status).toBe(404);
    expect(await loggedIn.post('/0/session/logout')).toMatchObject({ status: 400, body: 'logout-fail' });
    // Other users keep their sessions.
    expect(await bystander.user()).toMatchObject({ status: 200, user: { login: 'grace@example.com' } });

    const c = h.client();
    expect(await c.post('/0/session/login', { login: 'frank@example.com', password: 'old password 1' })).toMatchObject({
      status: 403,
      body: 'login-fail',
    });
    expect(await c.post('/0/session/login', { login: 'frank@example.com', password: 'new password 3' })).toMatchObject({
      status: 403,
      body: 'login-fail',
    });
    expect(await c.post('/0/session/login', { login: 'frank@example.com', password: 'new password 2' })).toMatchObject({
      status: 201,
      body: 'login-ok',
    });
    expect(await c.user()).toMatchObject({ status: 200, user: { login: 'frank@example.com' } });
  });

  it('refuses a wrong token, an expired token and the token of another user', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp, limits);
    await signup(h, 'heidi@example.com');
    await signup(h, 'ivan@example.com');
    const c = h.client();

    const heidi = await askRecovery(h, smtp, '/0/session/recover', 'heidi@example.com');
    expect(
      await c.post('/0/session/recover', { ...formOf(heidi, 'new password'), token: 'A'.repeat(43) }),
    ).toMatchObject({ status: 400, body: 'recover-fail' });
    expect(await c.post('/0/session/recover', { ...formOf(heidi, 'new password'), token: '' })).toMatchObject({
      status: 400,
      body: 'recover-fail',
    });

    // Ivan's token with Heidi's login changes nobody's password.
    const ivan = await askRecovery(h, smtp, '/0/session/recover', 'ivan@example.com');
    expect(
      await c.post('/0/session/recover', { ...formOf(heidi, 'stolen password'), token: formOf(ivan, '').token! }),
    ).toMatchObject({ status: 400, body: 'recover-fail' });
    expect(await c.post('/0/session/login', { login: 'heidi@example.com', password: 'stolen password' })).toMatchObject(
      { status: 403 },
    );
    expect(await c.post('/0/session/login', { login: 'heidi@example.com', password: PASSWORD })).toMatchObject({
      status: 201,
    });

    // A token is good for an hour.
    const start = h.clock.t;
    const fresh = await askRecovery(h, smtp, '/0/session/recover', 'heidi@example.com');
    h.clock.t = start + HOUR + 1;
    expect(await c.post('/0/session/recover', formOf(fresh, 'late password'))).toMatchObject({
      status: 400,
      body: 'recover-fail',
    });
    const again = await askRecovery(h, smtp, '/0/session/recover', 'heidi@example.com');
    h.clock.t += HOUR - 60_000;
    expect(await c.post('/0/session/recover', formOf(again, 'in time password'))).toMatchObject({
      status: 200,
      body: 'recover-ok',
    });
  });

  it('refuses an unknown login, a too short password and an unreachable SMTP server', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp, limits);
    await signup(h, 'judy@example.com');
    const c = h.client();
    for (const path of ['/0/session/recovery', '/0/session/recover']) {
      expect(await c.post(path, { login: 'nobody@example.com' })).toMatchObject({ status: 400, body: 'recover-fail' });
    }
    expect(
      await c.post('/0/session/recover', { login: 'nobody@example.com', token: 'A'.repeat(43), password: 'whatever1' }),
    ).toMatchObject({ status: 400, body: 'recover-fail' });

    const link = await askRecovery(h, smtp, '/0/session/recover', 'judy@example.com');
    expect(await c.post('/0/session/recover', formOf(link, 'short'))).toMatchObject({
      status: 400,
      body: 'recover-fail',
    });
    // The refused password did not use the token up.
    expect(await c.post('/0/session/recover', formOf(link, 'long enough now'))).toMatchObject({
      status: 200,
      body: 'recover-ok',
    });

    await smtp.close();
    expect(await c.post('/0/session/recovery', { login: 'judy@example.com' })).toMatchObject({
      status: 400,
      body: 'recover-fail',
    });
  });
});

describe('outbox mode', () => {
  it('writes mails to <dataDir>/outbox, logs their links and never a password or session id', async () => {
    const h = await startBridgeApp(undefined);
    const c = h.client();
    const signupPassword = 'Signup-Secret-8x1';
    const wrongPassword = 'Wrong-Secret-7y2';
    const newPassword = 'Reset-Secret-6z3';
    expect(await c.post('/0/session/signup', { login: 'kim@example.com', password: signupPassword })).toMatchObject({
      status: 201,
    });
    expect(
      await h.client().post('/0/session/login', { login: 'kim@example.com', password: wrongPassword }),
    ).toMatchObject({ status: 403 });

    const dir = join(h.dataDir, 'outbox');
    const files = readdirSync(dir).filter((f) => f.endsWith('.eml'));
    expect(files).toHaveLength(1);
    const logged = h.sink.events('mail.outbox');
    expect(logged).toHaveLength(1);
    const link = logged[0]!.link as string;
    expect(link).toMatch(new RegExp(`^${h.url}/0/session/confirm\\?token=`));
    expect(readFileSync(join(dir, files[0]!), 'utf8')).toContain(link);
    expect(await h.client().get(link)).toMatchObject({ status: 200, body: 'confirm-ok' });
    expect(await c.user()).toMatchObject({ user: { confirmed: true } });

    expect(await h.client().post('/0/session/recovery', { login: 'kim@example.com' })).toMatchObject({
      status: 200,
      body: 'recover-ok',
    });
    expect(readdirSync(dir).filter((f) => f.endsWith('.eml'))).toHaveLength(2);
    const recoverLink = h.sink.events('mail.outbox')[1]!.link as string;
    expect(new URL(recoverLink).pathname).toBe('/0/session/recover');
    expect(await h.client().post('/0/session/recover', formOf(recoverLink, newPassword))).toMatchObject({
      status: 200,
      body: 'recover-ok',
    });
    const s = h.client();
    expect(await s.post('/0/session/login', { login: 'kim@example.com', password: newPassword })).toMatchObject({
      status: 201,
    });

    const text = h.sink.text();
    for (const secret of [signupPassword, wrongPassword, newPassword, c.sid!, s.sid!]) {
      expect(text).not.toContain(secret);
    }
    // The log did record the flow, so the absence above means something.
    expect(h.sink.events('session.login_failed')).toHaveLength(1);
    expect(h.sink.events('account.password_reset')).toHaveLength(1);
  });
});

describe('rate limits', () => {
  it('stops guessing one login with 429 and Retry-After, leaves other logins alone, and lets up after the window', async () => {
    const h = await startBridgeApp(undefined, { rateLimits: { login: { limit: 3, windowMs: 60_000 } } });
    await signup(h, 'leo@example.com');
    await signup(h, 'mia@example.com');
    const c = h.client();
    const start = h.clock.t;
    for (let i = 0; i < 3; i++) {
      expect(await c.post('/0/session/login', { login: 'leo@example.com', password: `guess ${i}xx` })).toMatchObject({
        status: 403,
        body: 'login-fail',
      });
    }
    // Even the right password is refused now, and the case of the login does not open a new count.
    const limited = await c.post('/0/session/login', { login: 'LEO@example.com', password: PASSWORD });
    expect(limited).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(limited.headers.get('retry-after')).toBe('60');

    expect(await c.post('/0/session/login', { login: 'mia@example.com', password: PASSWORD })).toMatchObject({
      status: 201,
      body: 'login-ok',
    });

    h.clock.t = start + 45_000;
    const still = await c.post('/0/session/login', { login: 'leo@example.com', password: PASSWORD });
    expect(still).toMatchObject({ status: 429 });
    expect(still.headers.get('retry-after')).toBe('15');

    h.clock.t = start + 60_001;
    expect(await c.post('/0/session/login', { login: 'leo@example.com', password: PASSWORD })).toMatchObject({
      status: 201,
      body: 'login-ok',
    });
  });

  it('limits login attempts per address across logins', async () => {
    // Per address the bridge allows five times the per-login limit.
    const h = await startBridgeApp(undefined, { rateLimits: { login: { limit: 1, windowMs: 60_000 } } });
    const c = h.client();
    for (let i = 0; i < 5; i++) {
      expect(await c.post('/0/session/login', { login: `user${i}@example.com`, password: PASSWORD })).toMatchObject({
        status: 403,
      });
    }
    const r = await c.post('/0/session/login', { login: 'fresh@example.com', password: PASSWORD });
    expect(r).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(r.headers.get('retry-after')).toBe('60');
    h.clock.t += 60_001;
    expect(await c.post('/0/session/login', { login: 'fresh@example.com', password: PASSWORD })).toMatchObject({
      status: 403,
      body: 'login-fail',
    });
  });

  it('locks out the guessing address, not the login: the owner still logs in from another address', async () => {
    // The default limits: 10 guesses a minute per login and address, 100 per login from all addresses.
    const h = await startBridgeApp(undefined);
    await signup(h, 'vera@example.com');
    const attacker = h.client('127.0.0.2');
    const victim = h.client('127.0.0.3');
    for (let i = 0; i < 10; i++) {
      expect(
        await attacker.post('/0/session/login', { login: 'vera@example.com', password: `guess ${i}xx` }),
      ).toMatchObject({ status: 403, body: 'login-fail' });
    }
    // The attacker's address is still stopped, even with the right password and another spelling of the login.
    const stopped = await attacker.post('/0/session/login', { login: 'VERA@example.com', password: PASSWORD });
    expect(stopped).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(stopped.headers.get('retry-after')).toBe('60');
    // The owner, from another address, logs in at once.
    expect(await victim.post('/0/session/login', { login: 'vera@example.com', password: PASSWORD })).toMatchObject({
      status: 201,
      body: 'login-ok',
    });
    expect(await victim.user()).toMatchObject({ status: 200, user: { login: 'vera@example.com' } });
    // Her success does not free the attacker's address.
    h.clock.t += 30_000;
    expect(
      await attacker.post('/0/session/login', { login: 'vera@example.com', password: 'guess 11xx' }),
    ).toMatchObject({ status: 429 });
    h.clock.t += 30_001;
    expect(
      await attacker.post('/0/session/login', { login: 'vera@example.com', password: 'guess 12xx' }),
    ).toMatchObject({ status: 403, body: 'login-fail' });
  });

  it('still stops guessing spread over many addresses, with the shared limit of ten times the per-address one', async () => {
    // 2 per login and address, so 20 per login from all addresses together.
    const h = await startBridgeApp(undefined, { rateLimits: { login: { limit: 2, windowMs: 60_000 } } });
    await signup(h, 'wanda@example.com');
    for (let a = 10; a < 20; a++) {
      const bot = h.client(`127.0.1.${a}`);
      for (let i = 0; i < 2; i++) {
        expect(
          await bot.post('/0/session/login', { login: 'wanda@example.com', password: `guess ${a} ${i}` }),
        ).toMatchObject({ status: 403, body: 'login-fail' });
      }
    }
    // A fresh address gets no further guess at this login; other logins are not affected.
    const fresh = h.client('127.0.1.99');
    const r = await fresh.post('/0/session/login', { login: 'wanda@example.com', password: 'guess 99xx' });
    expect(r).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(r.headers.get('retry-after')).toBe('60');
    expect(await fresh.post('/0/session/login', { login: 'other@example.com', password: PASSWORD })).toMatchObject({
      status: 403,
      body: 'login-fail',
    });
    h.clock.t += 60_001;
    expect(await fresh.post('/0/session/login', { login: 'wanda@example.com', password: PASSWORD })).toMatchObject({
      status: 201,
      body: 'login-ok',
    });
  });

  it('limits signups per address, and creates no account when refusing', async () => {
    const h = await startBridgeApp(undefined, { rateLimits: { signup: { limit: 2, windowMs: HOUR } } });
    await signup(h, 'n1@example.com');
    await signup(h, 'n2@example.com');
    const c = h.client();
    const r = await c.post('/0/session/signup', { login: 'n3@example.com', password: PASSWORD });
    expect(r).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(r.headers.get('retry-after')).toBe('3600');
    expect(await h.store.userByLogin(h.defaultFrontend.id, 'n3@example.com')).toBeUndefined();
    h.clock.t += HOUR + 1;
    expect(await c.post('/0/session/signup', { login: 'n3@example.com', password: PASSWORD })).toMatchObject({
      status: 201,
      body: 'signup-ok',
    });
  });

  it('limits resend per login', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp, { rateLimits: { resend: { limit: 2, windowMs: HOUR } } });
    await signup(h, 'olga@example.com');
    await signup(h, 'paul@example.com');
    const c = h.client();
    for (let i = 0; i < 2; i++) {
      expect(await c.post('/0/session/resend', { login: 'olga@example.com' })).toMatchObject({ body: 'resend-ok' });
    }
    const r = await c.post('/0/session/resend', { login: 'olga@example.com' });
    expect(r).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(Number(r.headers.get('retry-after'))).toBe(3600);
    // Signup's mail plus two resends; the refused one sent nothing.
    expect(mailsTo(smtp, 'olga@example.com')).toHaveLength(3);
    expect(await c.post('/0/session/resend', { login: 'paul@example.com' })).toMatchObject({ body: 'resend-ok' });
    h.clock.t += HOUR + 1;
    expect(await c.post('/0/session/resend', { login: 'olga@example.com' })).toMatchObject({
      status: 200,
      body: 'resend-ok',
    });
  });

  it('limits recovery per login, over both spellings and the password form', async () => {
    const smtp = await smtpServer();
    const h = await startBridgeApp(smtp, { rateLimits: { recover: { limit: 3, windowMs: HOUR } } });
    await signup(h, 'quinn@example.com');
    await signup(h, 'rita@example.com');
    const c = h.client();
    expect(await c.post('/0/session/recovery', { login: 'quinn@example.com' })).toMatchObject({ status: 200 });
    expect(await c.post('/0/session/recover', { login: 'quinn@example.com' })).toMatchObject({ status: 200 });
    // Guessing tokens counts too.
    expect(
      await c.post('/0/session/recover', { login: 'quinn@example.com', token: 'A'.repeat(43), password: 'guessing1' }),
    ).toMatchObject({ status: 400, body: 'recover-fail' });
    const r = await c.post('/0/session/recover', { login: 'quinn@example.com' });
    expect(r).toMatchObject({ status: 429, body: 'too-many-requests' });
    expect(r.headers.get('retry-after')).toBe('3600');
    expect(mailsTo(smtp, 'quinn@example.com').filter((m) => m.subject === 'Set a new password')).toHaveLength(2);

    expect(await c.post('/0/session/recovery', { login: 'rita@example.com' })).toMatchObject({ status: 200 });
    h.clock.t += HOUR + 1;
    expect(await c.post('/0/session/recovery', { login: 'quinn@example.com' })).toMatchObject({
      status: 200,
      body: 'recover-ok',
    });
  });
});
