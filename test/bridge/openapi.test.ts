/**
 * The API document (`GET /0/openapi.json`) against the routes it describes: every route the app registers is
 * in it; every route, driven through each of its outcomes, answers only statuses and tokens the document lists,
 * and answers every status the document lists for it; and the request schemas in it reject what the routes
 * reject.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { HasherBusyError, PasswordHasher } from '../../bridge/accounts/password.js';
import { buildApp } from '../../bridge/app.js';
import { ensureDefaultFrontend } from '../../bridge/cli.js';
import { BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import { createMailer } from '../../bridge/mail/mailer.js';
import { OPENAPI_PATH, buildOpenApi } from '../../bridge/openapi.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { type TestBridge, startTestBridge } from '../support/bridge.js';

type Json = Record<string, unknown>;
interface MediaType {
  schema: Json;
}
interface Response {
  description: string;
  headers?: Record<string, unknown>;
  content?: Record<string, MediaType>;
}
interface Operation {
  operationId: string;
  parameters: Json[];
  requestBody?: { content: Record<string, MediaType> };
  responses: Record<string, Response>;
}
interface Doc {
  openapi: string;
  info: Json;
  servers: Json[];
  paths: Record<string, Record<string, Operation>>;
  components: {
    schemas: Record<string, Json>;
    parameters: Record<string, Json>;
    headers: Record<string, Json>;
    securitySchemes: Record<string, Json>;
  };
}

/** Statuses every route documents that these tests cannot bring about on demand: a crash, and a shutdown. */
const NOT_PROVOKED = ['500', '503'];

/** A path as the router knows it: the document spells some with the specification's trailing slash. */
const routeKey = (method: string, path: string) => `${method.toUpperCase()} ${path.replace(/(.)\/$/, '$1')}`;

/** Every method and path the app serves, read from Fastify's own route tree. */
function registeredRoutes(app: FastifyInstance): string[] {
  const out: string[] = [];
  const stack: string[] = [];
  for (const line of app.printRoutes({ commonPrefix: false }).split('\n')) {
    const m = /^([│ ]*)[├└]── (\S+)(?: \(([^)]+)\))?$/.exec(line);
    if (!m) continue;
    stack.length = m[1]!.length / 4;
    stack.push(m[2]!);
    for (const method of m[3]?.split(', ') ?? []) out.push(routeKey(method, stack.join('')));
  }
  return out;
}

/**
 * A schema from the document as zod. zod resolves `$ref`s into `$defs` only, so the document's components go
 * there.
 */
function docSchema(doc: Doc, schema: Json): z.ZodType {
  const withDefs = JSON.stringify({ ...schema, $defs: doc.components.schemas }).replaceAll(
    '#/components/schemas/',
    '#/$defs/',
  );
  return z.fromJSONSchema(JSON.parse(withDefs) as Parameters<typeof z.fromJSONSchema>[0]);
}

function resolve(doc: Doc, schema: Json): Json {
  const ref = schema.$ref;
  if (typeof ref !== 'string') return schema;
  const name = ref.replace('#/components/schemas/', '');
  return doc.components.schemas[name]!;
}

interface Call {
  method?: 'GET' | 'POST';
  url: string;
  form?: Record<string, string>;
  json?: unknown;
  /** A body sent as is, with its content type. */
  raw?: { type: string; body: string | Buffer };
  cookie?: string;
}

interface Answer {
  status: number;
  body: string;
  type: string;
  headers: Record<string, unknown>;
  /** The `sid` value this answer set, if any. */
  sid: string | undefined;
}

async function call(app: FastifyInstance, c: Call): Promise<Answer> {
  const headers: Record<string, string> = {};
  let payload: string | Buffer | undefined;
  if (c.form) {
    headers['content-type'] = 'application/x-www-form-urlencoded';
    payload = new URLSearchParams(c.form).toString();
  } else if (c.json !== undefined) {
    headers['content-type'] = 'application/json';
    payload = JSON.stringify(c.json);
  } else if (c.raw) {
    headers['content-type'] = c.raw.type;
    payload = c.raw.body;
  }
  if (c.cookie) headers.cookie = `sid=${c.cookie}`;
  const res = await app.inject({
    method: c.method ?? 'POST',
    url: c.url,
    headers,
    ...(payload === undefined ? {} : { payload }),
  });
  const setCookie = res.headers['set-cookie'];
  const sid = typeof setCookie === 'string' ? /^sid=([^;]*)/.exec(setCookie)?.[1] : undefined;
  return {
    status: res.statusCode,
    body: res.body,
    type: String(res.headers['content-type'] ?? '').split(';')[0]!,
    headers: res.headers,
    sid,
  };
}

/** The link of the newest message of a kind in the outbox. */
function outboxLink(dir: string, kind: 'confirm' | 'recover'): URL {
  const files = readdirSync(dir)
    .filter((f) => f.includes(`-${kind}-`))
    .sort();
  const text = readFileSync(join(dir, files[files.length - 1]!), 'utf8');
  return new URL(/https?:\/\/\S+/.exec(text)![0]);
}

/** A hasher whose queue is always full. */
class FullHasher extends PasswordHasher {
  override hash(): Promise<string> {
    return Promise.reject(new HasherBusyError());
  }
  override verify(): Promise<boolean> {
    return Promise.reject(new HasherBusyError());
  }
  override verifyNothing(): Promise<false> {
    return Promise.reject(new HasherBusyError());
  }
}

interface BusyApp {
  app: FastifyInstance;
  store: SqliteStore;
  close(): Promise<void>;
}

async function startBusyApp(): Promise<BusyApp> {
  const dataDir = tempDir('devcloud-openapi-');
  const config = BridgeConfigSchema.parse({ dataDir, accounts: { scryptLogN: 10 } });
  const log = createLogger({ level: 'silent', pretty: 'never', base: {}, destination: new LogSink() });
  const store = new SqliteStore(dataDir);
  const frontend = ensureDefaultFrontend(store, Date.now());
  // A user to reset, made directly: signing up needs the hasher this app refuses.
  store.createUser({
    frontendId: frontend.id,
    login: 'busy@example.com',
    passwordHash: 'x',
    authcode: randomUUID().replace(/-/g, ''),
    now: Date.now(),
  });
  const hasher = new FullHasher({ params: { logN: 10, r: 8, p: 1 }, maxConcurrent: 1, maxQueued: 1 });
  const mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log);
  const app = buildApp({ config, store, hasher, mailer, log });
  await app.ready();
  return {
    app,
    store,
    close: async () => {
      await app.close();
      await mailer.close();
      store.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

let main: TestBridge;
let limited: TestBridge;
let busy: BusyApp;
let doc: Doc;

beforeAll(async () => {
  main = await startTestBridge();
  // One attempt per window, so that the second answers 429.
  limited = await startTestBridge({
    config: {
      rateLimits: { login: { limit: 1 }, signup: { limit: 1 }, resend: { limit: 1 }, recover: { limit: 1 } },
    },
  });
  busy = await startBusyApp();
  const r = await call(main.app, { method: 'GET', url: OPENAPI_PATH });
  doc = JSON.parse(r.body) as Doc;
});

afterAll(async () => {
  await main?.close();
  await limited?.close();
  await busy?.close();
});

function operation(method: string, path: string): Operation {
  const op = doc.paths[path]?.[method.toLowerCase()];
  expect(op, `${method} ${path} is in the document`).toBeDefined();
  return op!;
}

/** Checks one answer against the document: its status, content type, and token or JSON shape. */
function expectDocumented(op: Operation, answer: Answer, label: string): void {
  const documented = op.responses[String(answer.status)];
  expect(documented, `${label}: status ${answer.status} (${answer.body.slice(0, 60)}) is documented`).toBeDefined();
  const media = documented!.content?.[answer.type];
  expect(media, `${label}: ${answer.type} is documented for ${answer.status}`).toBeDefined();
  if (answer.type === 'text/plain') {
    expect(media!.schema.enum, `${label}: token`).toContain(answer.body);
  } else if (answer.type === 'application/json') {
    const parsed = docSchema(doc, resolve(doc, media!.schema)).safeParse(JSON.parse(answer.body));
    expect(parsed.success, `${label}: JSON body matches the document`).toBe(true);
  }
  if (answer.status === 429 || (answer.status === 503 && answer.body === 'busy')) {
    expect(documented!.headers?.['Retry-After'], `${label}: Retry-After is documented`).toBeDefined();
    expect(Number(answer.headers['retry-after'])).toBeGreaterThanOrEqual(1);
  }
  if (answer.sid !== undefined) {
    expect(documented!.headers?.['Set-Cookie'], `${label}: Set-Cookie is documented`).toBeDefined();
  }
}

interface Case {
  name: string;
  status: number;
  /** The body, when it is a token. */
  token?: string;
  run: () => Promise<Answer>;
}

/** Runs a route's cases, checks each against the document, then that the document lists no status they missed. */
async function driveRoute(method: 'GET' | 'POST', path: string, cases: Case[]): Promise<void> {
  const op = operation(method, path);
  const unknownFrontend = `${path}${path.includes('?') ? '&' : '?'}app=${randomUUID()}`;
  const all: Case[] = [
    ...cases,
    {
      name: 'an unknown frontend',
      status: 404,
      token: 'not found',
      run: () => call(main.app, { method, url: unknownFrontend }),
    },
  ];
  const seen = new Set<string>();
  for (const c of all) {
    const answer = await c.run();
    const label = `${method} ${path}, ${c.name}`;
    expect(answer.status, `${label}: ${answer.body.slice(0, 80)}`).toBe(c.status);
    if (c.token !== undefined) expect(answer.body, label).toBe(c.token);
    expectDocumented(op, answer, label);
    seen.add(String(answer.status));
  }
  const expected = [...new Set([...seen, ...NOT_PROVOKED])].sort();
  expect(Object.keys(op.responses).sort(), `${method} ${path}: documented statuses`).toEqual(expected);
}

let users = 0;
/** A new user of the main bridge, logged in. */
async function newUser(): Promise<{ login: string; password: string; sid: string }> {
  const login = `user${++users}@example.com`;
  const password = 'correct horse battery';
  const r = await call(main.app, { url: '/0/session/signup', form: { login, password } });
  expect(r.status).toBe(201);
  return { login, password, sid: r.sid! };
}

const MALFORMED_JSON = { type: 'application/json', body: '{"login":' };

describe('the document', () => {
  it('is OpenAPI 3.1 JSON, served over HTTP without a session, the same as built from the config', async () => {
    const b = await startTestBridge({ transport: 'http' });
    try {
      const res = await fetch(new URL(OPENAPI_PATH, b.url));
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(res.headers.get('set-cookie')).toBeNull();
      const served = (await res.json()) as Doc;
      expect(served.openapi).toBe('3.1.0');
      expect(served).toEqual(JSON.parse(JSON.stringify(buildOpenApi(b.config))));
    } finally {
      await b.close();
    }
  });

  it('lists every route the app registers, and nothing else', () => {
    // Fastify answers HEAD for every GET by itself; the document says so once instead of per route.
    const registered = registeredRoutes(main.app).filter((r) => !r.startsWith('HEAD '));
    const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((method) => routeKey(method, path)),
    );
    expect(registered.length).toBeGreaterThanOrEqual(12);
    expect([...new Set(documented)].sort()).toEqual([...new Set(registered)].sort());
    const ids = Object.values(doc.paths).flatMap((ops) => Object.values(ops).map((o) => o.operationId));
    expect(new Set(ids).size).toBe(ids.length);
  });

  it('resolves every $ref and has the sid cookie scheme and the frontend parameter', () => {
    const text = JSON.stringify(doc);
    for (const [, ref] of text.matchAll(/"\$ref":"#\/([^"]+)"/g)) {
      let node: unknown = doc;
      for (const part of ref!.split('/')) node = (node as Json | undefined)?.[part];
      expect(node, ref).toBeDefined();
    }
    expect(doc.components.securitySchemes.sid).toMatchObject({ type: 'apiKey', in: 'cookie', name: 'sid' });
    expect(doc.components.parameters.app).toMatchObject({ name: 'app', in: 'query' });
    expect(JSON.stringify(doc.servers)).toContain('{frontend}');
    for (const ops of Object.values(doc.paths)) {
      for (const op of Object.values(ops))
        expect(op.parameters).toContainEqual({ $ref: '#/components/parameters/app' });
    }
  });

  it('takes its limits from the config', () => {
    const config = BridgeConfigSchema.parse({
      dataDir: '/nowhere',
      accounts: { passwordMin: 12, passwordMax: 100, loginMax: 64 },
    });
    const built = buildOpenApi(config) as unknown as Doc;
    const signup = built.components.schemas.SignupForm as { properties: Record<string, Json> };
    expect(signup.properties.password).toMatchObject({ minLength: 12, maxLength: 100 });
    expect(signup.properties.login).toMatchObject({ maxLength: 64, format: 'email' });
  });
});

describe('every route answers what the document lists', () => {
  it('POST /0/session/', async () => {
    let sid = '';
    await driveRoute('POST', '/0/session/', [
      {
        name: 'no session',
        status: 201,
        token: 'user-ok',
        run: async () => {
          const r = await call(main.app, { url: '/0/session/' });
          sid = r.sid!;
          return r;
        },
      },
      {
        name: 'a session',
        status: 200,
        token: 'user-ok',
        run: () => call(main.app, { url: '/0/session/', cookie: sid }),
      },
      { name: 'malformed JSON', status: 400, run: () => call(main.app, { url: '/0/session/', raw: MALFORMED_JSON }) },
    ]);
  });

  it('POST /0/session/login', async () => {
    const u = await newUser();
    await driveRoute('POST', '/0/session/login', [
      {
        name: 'right password',
        status: 201,
        token: 'login-ok',
        run: () => call(main.app, { url: '/0/session/login', form: { login: u.login, password: u.password } }),
      },
      {
        name: 'wrong password',
        status: 403,
        token: 'login-fail',
        run: () => call(main.app, { url: '/0/session/login', form: { login: u.login, password: 'wrong password' } }),
      },
      {
        name: 'malformed JSON',
        status: 403,
        token: 'login-fail',
        run: () => call(main.app, { url: '/0/session/login', raw: MALFORMED_JSON }),
      },
      {
        name: 'a second attempt for the same login within the window',
        status: 429,
        token: 'too-many-requests',
        run: async () => {
          const form = { login: 'limited@example.com', password: 'whatever1' };
          await call(limited.app, { url: '/0/session/login', form });
          return call(limited.app, { url: '/0/session/login', form });
        },
      },
      {
        name: 'a full hashing queue',
        status: 503,
        token: 'busy',
        run: () => call(busy.app, { url: '/0/session/login', form: { login: 'a@example.com', password: 'whatever1' } }),
      },
    ]);
  });

  it('POST /0/session/logout', async () => {
    const u = await newUser();
    await driveRoute('POST', '/0/session/logout', [
      {
        name: 'a session',
        status: 201,
        token: 'logout-ok',
        run: () => call(main.app, { url: '/0/session/logout', cookie: u.sid }),
      },
      {
        name: 'no session',
        status: 400,
        token: 'logout-fail',
        run: () => call(main.app, { url: '/0/session/logout' }),
      },
      {
        name: 'malformed JSON',
        status: 400,
        run: () => call(main.app, { url: '/0/session/logout', raw: MALFORMED_JSON }),
      },
    ]);
  });

  it('POST /0/session/signup', async () => {
    const u = await newUser();
    const signup = (form: Record<string, string>) => () => call(main.app, { url: '/0/session/signup', form });
    await driveRoute('POST', '/0/session/signup', [
      {
        name: 'a new login',
        status: 201,
        token: 'signup-ok',
        run: signup({ login: 'fresh@example.com', password: 'long enough' }),
      },
      {
        name: 'not an e-mail address',
        status: 400,
        token: 'signup-fail-no-email',
        run: signup({ login: 'fresh', password: 'long enough' }),
      },
      {
        name: 'a taken login',
        status: 400,
        token: 'signup-fail-already-exists',
        run: signup({ login: u.login, password: 'long enough' }),
      },
      {
        name: 'a short password',
        status: 400,
        token: 'signup-fail',
        run: signup({ login: 'other@example.com', password: 'short' }),
      },
      {
        name: 'a second signup from the same address',
        status: 429,
        token: 'too-many-requests',
        run: async () => {
          await call(limited.app, {
            url: '/0/session/signup',
            form: { login: 'l1@example.com', password: 'long enough' },
          });
          return call(limited.app, {
            url: '/0/session/signup',
            form: { login: 'l2@example.com', password: 'long enough' },
          });
        },
      },
      {
        name: 'a full hashing queue',
        status: 503,
        token: 'busy',
        run: () =>
          call(busy.app, { url: '/0/session/signup', form: { login: 'b@example.com', password: 'long enough' } }),
      },
    ]);
  });

  it('POST /0/session/resend', async () => {
    const u = await newUser();
    await driveRoute('POST', '/0/session/resend', [
      {
        name: 'an unconfirmed user',
        status: 200,
        token: 'resend-ok',
        run: () => call(main.app, { url: '/0/session/resend', form: { login: u.login } }),
      },
      {
        name: 'an unknown login',
        status: 400,
        token: 'resend-fail',
        run: () => call(main.app, { url: '/0/session/resend', form: { login: 'nobody@example.com' } }),
      },
      {
        name: 'a second attempt for the same login',
        status: 429,
        token: 'too-many-requests',
        run: async () => {
          await call(limited.app, { url: '/0/session/resend', form: { login: 'r@example.com' } });
          return call(limited.app, { url: '/0/session/resend', form: { login: 'r@example.com' } });
        },
      },
    ]);
  });

  for (const path of ['/0/session/recovery', '/0/session/recover']) {
    it(`POST ${path}`, async () => {
      const u = await newUser();
      await driveRoute('POST', path, [
        {
          name: 'a known login',
          status: 200,
          token: 'recover-ok',
          run: () => call(main.app, { url: path, form: { login: u.login } }),
        },
        {
          name: 'the e-mailed token and a new password',
          status: 200,
          token: 'recover-ok',
          run: () => {
            const link = outboxLink(outboxDir(main.config), 'recover');
            const token = link.searchParams.get('token')!;
            return call(main.app, { url: path, form: { login: u.login, token, password: 'a new password' } });
          },
        },
        {
          name: 'an unknown login',
          status: 400,
          token: 'recover-fail',
          run: () => call(main.app, { url: path, form: { login: 'nobody@example.com' } }),
        },
        {
          name: 'a wrong token',
          status: 400,
          token: 'recover-fail',
          run: () =>
            call(main.app, { url: path, form: { login: u.login, token: 'wrong', password: 'a new password' } }),
        },
        {
          name: 'a second attempt for the same login',
          status: 429,
          token: 'too-many-requests',
          run: async () => {
            await call(limited.app, { url: path, form: { login: `r${path.length}@example.com` } });
            return call(limited.app, { url: path, form: { login: `r${path.length}@example.com` } });
          },
        },
        {
          name: 'a full hashing queue',
          status: 503,
          token: 'busy',
          run: () =>
            call(busy.app, { url: path, form: { login: 'busy@example.com', token: 't', password: 'a new password' } }),
        },
      ]);
    });
  }

  it('GET /0/session/recover', async () => {
    await driveRoute('GET', '/0/session/recover', [
      {
        name: 'the link',
        status: 200,
        run: () => call(main.app, { method: 'GET', url: '/0/session/recover?login=a%40example.com&token=abc' }),
      },
    ]);
  });

  it('GET /0/session/confirm', async () => {
    const u = await newUser();
    await driveRoute('GET', '/0/session/confirm', [
      {
        name: 'the e-mailed link',
        status: 200,
        token: 'confirm-ok',
        run: () => {
          const link = outboxLink(outboxDir(main.config), 'confirm');
          expect(link.pathname).toBe('/0/session/confirm');
          return call(main.app, { method: 'GET', url: `${link.pathname}${link.search}` });
        },
      },
      {
        name: 'no token',
        status: 400,
        token: 'confirm-fail',
        run: () => call(main.app, { method: 'GET', url: '/0/session/confirm' }),
      },
    ]);
    const user = await call(main.app, { method: 'GET', url: '/0/user/', cookie: u.sid });
    expect(JSON.parse(user.body)).toMatchObject({ login: u.login, confirmed: true });
  });

  it('GET /0/user/', async () => {
    const u = await newUser();
    await call(main.app, { url: '/0/user/', form: { colour: 'blue' }, cookie: u.sid });
    await driveRoute('GET', '/0/user/', [
      { name: 'logged in', status: 200, run: () => call(main.app, { method: 'GET', url: '/0/user/', cookie: u.sid }) },
      {
        name: 'no session',
        status: 404,
        token: 'not found',
        run: () => call(main.app, { method: 'GET', url: '/0/user/' }),
      },
    ]);
  });

  it('POST /0/user/', async () => {
    const u = await newUser();
    const big = 'x'.repeat(main.config.accounts.userDataBytes);
    await driveRoute('POST', '/0/user/', [
      {
        name: 'string fields',
        status: 200,
        token: 'user-data-ok',
        run: () => call(main.app, { url: '/0/user/', form: { a: '1' }, cookie: u.sid }),
      },
      {
        name: 'a value that is not a string',
        status: 400,
        token: 'user-data-fail',
        run: () => call(main.app, { url: '/0/user/', json: { a: 1 }, cookie: u.sid }),
      },
      {
        name: 'no session',
        status: 401,
        token: 'no-session',
        run: () => call(main.app, { url: '/0/user/', form: { a: '1' } }),
      },
      {
        name: 'too much data',
        status: 413,
        token: 'user-data-failed',
        run: () => call(main.app, { url: '/0/user/', form: { big }, cookie: u.sid }),
      },
    ]);
  });

  it(`GET ${OPENAPI_PATH}`, async () => {
    await driveRoute('GET', OPENAPI_PATH, [
      { name: 'no session', status: 200, run: () => call(main.app, { method: 'GET', url: OPENAPI_PATH }) },
    ]);
  });
});

describe('the request schemas in the document', () => {
  /** The route's answer and the document's verdict on the same body agree. */
  async function agree(path: string, schema: string, body: Json, cookie?: string): Promise<boolean> {
    const r = await call(main.app, { url: path, json: body, ...(cookie ? { cookie } : {}) });
    const accepted = docSchema(doc, doc.components.schemas[schema]!).safeParse(body).success;
    const routeAccepted = r.status < 300;
    expect(accepted, `${path} ${JSON.stringify(body)}: route answered ${r.status} ${r.body}`).toBe(routeAccepted);
    return accepted;
  }

  it('reject what the routes reject, and accept what they accept', async () => {
    const u = await newUser();
    expect(await agree('/0/session/login', 'LoginForm', { login: u.login })).toBe(false);
    expect(await agree('/0/session/login', 'LoginForm', { login: 'not-mail', password: u.password })).toBe(false);
    expect(await agree('/0/session/login', 'LoginForm', { login: u.login, password: 5 })).toBe(false);
    expect(await agree('/0/session/login', 'LoginForm', { login: u.login, password: u.password })).toBe(true);
    expect(await agree('/0/session/signup', 'SignupForm', { login: 'x@example', password: 'long enough' })).toBe(false);
    expect(await agree('/0/session/signup', 'SignupForm', { login: 'x@example.com', password: 'short' })).toBe(false);
    expect(await agree('/0/session/signup', 'SignupForm', { login: 'x@example.com', password: 'long enough' })).toBe(
      true,
    );
    expect(await agree('/0/session/resend', 'ResendForm', { login: ['x@example.com'] })).toBe(false);
    expect(await agree('/0/user/', 'UserDataForm', { a: 'b', c: 1 }, u.sid)).toBe(false);
    expect(await agree('/0/user/', 'UserDataForm', { a: 'b', app: main.defaultFrontend.id }, u.sid)).toBe(true);
  });

  it('says that a password reset needs the password, and that the confirmation link needs its token', async () => {
    const u = await newUser();
    const r = await call(main.app, { url: '/0/session/recover', form: { login: u.login, token: 'abc' } });
    expect(r.body).toBe('recover-fail');
    // zod cannot read `dependentRequired` back, so the keyword itself is checked.
    expect(doc.components.schemas.RecoverForm).toMatchObject({ dependentRequired: { token: ['password'] } });
    const confirm = await call(main.app, { method: 'GET', url: '/0/session/confirm' });
    expect(confirm.body).toBe('confirm-fail');
    expect(operation('GET', '/0/session/confirm').parameters).toContainEqual(
      expect.objectContaining({ name: 'token', in: 'query', required: true }),
    );
  });
});
