/**
 * The API document (`GET /0/openapi.json`) against the routes it describes. The server generates it from the routes
 * it registered, and every bridge of the test suite holds each answer to it (the answer checker,
 * `bridge/http/checker.ts`: an undocumented answer is a 500 `undocumented-answer`). So here: the structure of the
 * document (served, every registered route and nothing else, its `$ref`s, its limits from the config, its
 * parameters, answer schemas that refuse what routes never answer, request schemas that reject what routes reject),
 * and one drive, from a table of recipes, that brings about every status and token the document lists for every
 * route at least once. The device routes are driven against devices written into the store as the MQTT side writes
 * them; the firmware job routes against devices that report through the device side, with a link that records what
 * goes down to them.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync, readdirSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { HasherBusyError, PasswordHasher } from '../../bridge/accounts/password.js';
import { hasherFor } from '../../bridge/accounts/password.js';
import { outboxDir } from '../../bridge/config.js';
import { OPENAPI_PATH } from '../../bridge/openapi.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { StorageFullError } from '../../lib/sqlite.js';
import { type TestBridge, startTestBridge } from '../support/bridge.js';
import { type FirmwareWorld, startFirmwareWorld } from '../support/fw-bridge.js';
import { SseStream } from '../support/live.js';

type Json = Record<string, unknown>;
type Operation = { operationId: string; parameters: Json[]; responses: Record<string, Response>; security?: Json[] };
type Response = { content?: Record<string, { schema: Json }> };
type Components = { schemas: Record<string, Json>; parameters: Record<string, Json>; securitySchemes: Json };
type Doc = { servers: Json[]; paths: Record<string, Record<string, Operation>>; components: Components };

/** The routes that read no frontend: the image a device downloads, and the probes' and scrapers' routes. */
const NO_FRONTEND_OPS: ReadonlySet<string> = new Set(['downloadFirmwareImage', 'getHealth', 'getMetrics']);

/** The routes whose 507 `storage-full` is brought about here; every route that changes something documents it. */
const FULL_DISK_OPS: ReadonlySet<string> = new Set([
  'createSession',
  'login',
  'signup',
  'resendConfirmation',
  'recover',
  'recoverAlias',
]);

/**
 * A path as the router knows it: the document spells some with the specification's trailing slash, and its path
 * parameters as `{name}` where the router has `:name`.
 */
const routeKey = (method: string, path: string) =>
  `${method.toUpperCase()} ${path
    // `{image}` (an image name, slashes included) is the router's wildcard.
    .replace('{image}', '*')
    .replace(/\{(\w+)\}/g, ':$1')
    .replace(/(.)\/$/, '$1')}`;

/**
 * A route key with its path parameters unnamed. Fastify's route tree names a parameter that two routes share by
 * both their names (`:type|:command`), so the tree tells which paths are served, not under which names; the
 * router itself tells the names (`findRoute`).
 */
const routeShape = (key: string) =>
  key
    .replace(/:[^/]+/g, ':')
    // The route tree prints a wildcard as a child of the segment before it, without the slash between them.
    .replace(/([^/])\*$/, '$1/*');

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

/** A schema from the document as zod. zod resolves `$ref`s into `$defs` only, so the components go there. */
function docSchema(doc: Doc, schema: Json): z.ZodType {
  const withDefs = JSON.stringify({ ...schema, $defs: doc.components.schemas }).replaceAll(
    '#/components/schemas/',
    '#/$defs/',
  );
  return z.fromJSONSchema(JSON.parse(withDefs) as Parameters<typeof z.fromJSONSchema>[0]);
}

interface Call {
  method?: 'GET' | 'POST' | 'DELETE';
  url: string;
  form?: Record<string, string>;
  json?: unknown;
  /** A body sent as is, with its content type. */
  raw?: { type: string; body: string };
  cookie?: string | undefined;
  /** Further request headers (`Accept`, a device's `Authorization`, a `Range`, `Origin`). */
  headers?: Record<string, string>;
  /** The client's address as the socket would give it (default 127.0.0.1). */
  remoteAddress?: string;
}

interface Answer {
  status: number;
  body: string;
  /** The body as sent, for answers that are bytes. */
  bytes: Buffer;
  type: string;
  /** The `sid` value this answer set, if any. */
  sid: string | undefined;
}

async function call(app: FastifyInstance, c: Call): Promise<Answer> {
  const headers: Record<string, string> = {};
  let payload: string | undefined;
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
  Object.assign(headers, c.headers);
  const res = await app.inject({
    method: c.method ?? 'POST',
    url: c.url,
    headers,
    ...(payload === undefined ? {} : { payload }),
    ...(c.remoteAddress === undefined ? {} : { remoteAddress: c.remoteAddress }),
  });
  const setCookie = res.headers['set-cookie'];
  return {
    status: res.statusCode,
    body: res.body,
    bytes: res.rawPayload,
    type: String(res.headers['content-type'] ?? '').split(';')[0]!,
    sid: typeof setCookie === 'string' ? /^sid=([^;]*)/.exec(setCookie)?.[1] : undefined,
  };
}

/** The link of the newest message of a kind in the outbox. */
function outboxLink(dir: string, kind: 'confirm' | 'recover'): URL {
  const files = readdirSync(dir)
    .filter((f) => f.includes(`-${kind}-`))
    .sort();
  return new URL(/https?:\/\/\S+/.exec(readFileSync(join(dir, files.at(-1)!), 'utf8'))![0]);
}

/** A hasher whose queue is always full, and a store on a disk that is full, refusing every write as SQLite does. */
const refuse = (err: Error) => () => Promise.reject(err);
const fullHasher = () =>
  Object.assign(new PasswordHasher({ params: { logN: 10, r: 8, p: 1 }, maxConcurrent: 1, maxQueued: 1 }), {
    ...{ hash: refuse(new HasherBusyError()), verify: refuse(new HasherBusyError()) },
    verifyNothing: refuse(new HasherBusyError()),
  });
const diskFull = new StorageFullError(Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' }));
/** A store whose disk filled up after the bridge's first start: its default frontend exists, no write succeeds. */
const fullStore = async (dataDir: string) => {
  const store = new SqliteStore(dataDir);
  await ensureDefaultFrontend(store, Date.now());
  return Object.assign(store, { write: refuse(diskFull) });
};

let main: TestBridge;
let doc: Doc;

beforeAll(async () => {
  main = await startTestBridge();
  doc = JSON.parse((await call(main.app, { method: 'GET', url: OPENAPI_PATH })).body) as Doc;
});

afterAll(async () => {
  await main?.close();
});

const operations = () =>
  Object.entries(doc.paths).flatMap(([path, ops]) => Object.entries(ops).map(([method, op]) => ({ path, method, op })));

/** Whether an operation reads the frontend (the `app` parameter); the routes devices call do not. */
const takesFrontend = (op: Operation) => op.parameters.some((p) => p.$ref === '#/components/parameters/app');

describe('the document', () => {
  it('is OpenAPI 3.1 JSON, served over HTTP without a session, the same for every caller', async () => {
    const b = await startTestBridge({ transport: 'http' });
    try {
      const res = await fetch(new URL(OPENAPI_PATH, b.url));
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(res.headers.get('set-cookie')).toBeNull();
      const served = (await res.json()) as Doc & { openapi: string };
      expect(served.openapi).toBe('3.1.0');
      expect(served).toEqual(doc);
    } finally {
      await b.close();
    }
  });

  it('lists every route the app registers, and nothing else', () => {
    // Fastify answers HEAD for every GET by itself; the document says so once instead of per route.
    const registered = registeredRoutes(main.app).filter((r) => !r.startsWith('HEAD '));
    const documented = operations().map(({ method, path }) => routeKey(method, path));
    expect(registered.length).toBeGreaterThanOrEqual(12);
    const shapes = (keys: string[]) => [...new Set(keys.map(routeShape))].sort();
    expect(shapes(documented)).toEqual(shapes(registered));
    // Each documented path reaches the route it describes, under the parameter names it declares: the router
    // takes `:name` in a URL as a value, and answers with the names of the route it matched.
    for (const { path, method } of operations()) {
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => (m[1] === 'image' ? '*' : m[1]));
      const found = main.app.findRoute({ method: method.toUpperCase(), url: routeKey(method, path).split(' ')[1]! });
      expect(found, `${method} ${path} is served`).not.toBeNull();
      expect(Object.keys(found?.params ?? {}), `${method} ${path}: parameter names`).toEqual(names);
    }
    const ids = operations().map(({ op }) => op.operationId);
    expect(new Set(ids).size).toBe(ids.length);
  });

  it('resolves every $ref and has the sid cookie and bearer schemes and the frontend parameter', () => {
    for (const [, ref] of JSON.stringify(doc).matchAll(/"\$ref":"#\/([^"]+)"/g)) {
      let node: unknown = doc;
      for (const part of ref!.split('/')) node = (node as Json | undefined)?.[part];
      expect(node, ref).toBeDefined();
    }
    expect(doc.components.securitySchemes.sid).toMatchObject({ type: 'apiKey', in: 'cookie', name: 'sid' });
    expect(doc.components.securitySchemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' });
    // The live channel's SSE route takes a bearer access token instead of the cookie.
    expect(doc.paths['/0/events']!.get!.security).toEqual([{ sid: [] }, { bearer: [] }]);
    expect(doc.components.parameters.app).toMatchObject({ name: 'app', in: 'query' });
    expect(JSON.stringify(doc.servers)).toContain('{frontend}');
    // Every route but the image a device downloads, and health and metrics, which read no frontend.
    for (const { op } of operations())
      expect(takesFrontend(op), op.operationId).toBe(!NO_FRONTEND_OPS.has(op.operationId));
    // 507 `storage-full` is documented for every route that changes something, and only for those.
    for (const { path, method, op } of operations()) {
      expect(op.responses['507'] !== undefined, `${method} ${path}: 507`).toBe(method !== 'get');
    }
  });

  it('takes its limits from the config', async () => {
    const b = await startTestBridge({
      config: {
        accounts: { passwordMin: 12, passwordMax: 100, loginMax: 64 },
        devices: { maxValueBytes: 1234, nearbyWindowMs: 60_000 },
        commands: { maxBytes: 100, maxLifetimeMs: 5000, defaultLifetimeMs: 1000, maxOpen: 7 },
      },
    });
    const built = JSON.parse((await call(b.app, { method: 'GET', url: OPENAPI_PATH })).body) as Doc;
    await b.close();
    const props = (name: string) => (built.components.schemas[name] as { properties: Record<string, Json> }).properties;
    expect(props('SignupForm').password).toMatchObject({ minLength: 12, maxLength: 100 });
    expect(props('SignupForm').login).toMatchObject({ maxLength: 64, format: 'email' });
    expect(props('VariableForm').value!.description).toContain('1234 bytes');
    expect(JSON.stringify(built.paths['/0/network/'])).toContain('60000 ms');
    expect(props('CommandForm').command).toMatchObject({ maxLength: 100 });
    expect(props('CommandForm').command64).toMatchObject({ maxLength: 136 });
    expect(props('CommandForm').lifetime).toMatchObject({ anyOf: [{ type: 'string' }, { maximum: 5000 }] });
    expect(props('CommandForm').lifetime!.description).toContain('default 1000');
    expect(JSON.stringify(built.paths['/0/devices/{id}']!.post)).toContain('`commands.maxOpen` (7)');
  });

  it('declares every path parameter, and the history query of a variable', () => {
    for (const { path, op } of operations()) {
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
      const declared = op.parameters.filter((p) => p.in === 'path');
      expect(
        declared.map((p) => p.name),
        op.operationId,
      ).toEqual(names);
      for (const p of declared) expect(p.required).toBe(true);
    }
    const params = doc.paths['/0/devices/{id}/{type}/{name}']!.get!.parameters;
    expect(params).toContainEqual(expect.objectContaining({ name: 'latest', in: 'query', required: false }));
    expect(params).toContainEqual(expect.objectContaining({ name: 'from', in: 'query', required: false }));
    expect(params.find((p) => p.name === 'type')!.schema).toMatchObject({ enum: ['d', 's', 'meta'] });
  });

  it('has answer schemas that refuse what the routes never answer', () => {
    const check = (schema: string, value: unknown) =>
      docSchema(doc, doc.components.schemas[schema]!).safeParse(value).success;
    const record = { value: 'on', time: 1, acked: 0, synced: 0, syncacked: 0 };
    expect(check('VariableRecord', record)).toBe(true);
    expect(check('VariableRecord', { value: 1, time: 1 })).toBe(false);
    expect(check('DeviceObject', { d: { led: record }, s: {}, meta: {} })).toBe(true);
    expect(check('DeviceObject', { d: { led: record }, s: {} })).toBe(false);
    expect(check('DeviceCollection', { x: { d: {}, s: {}, meta: { state: { value: 1 } } } })).toBe(false);
    const entry = { key: 'led', by: 'user', type: 'd', timestamp: 1, id: 1 };
    expect(check('HistoryList', [{ ...entry, value: '', deleted: true }])).toBe(true);
    expect(check('HistoryList', [{ ...entry, value: '\ufffd', value64: '/w==' }])).toBe(true);
    // Every entry carries `value`, as the specification's entry does.
    expect(check('HistoryList', [{ ...entry, deleted: true }])).toBe(false);
    expect(check('HistoryList', [{ ...entry, value64: '/w==' }])).toBe(false);
    expect(check('HistoryList', [{ ...entry, value: 'on', by: 'someone' }])).toBe(false);
    expect(check('VariableAnswer', 'connected')).toBe(true);
    expect(check('VariableAnswer', 5)).toBe(false);
    expect(check('ClaimResponse', { id: randomUUID() })).toBe(true);
    expect(check('ClaimResponse', { id: 'nope' })).toBe(false);
    const command = {
      ...{ id: randomUUID(), command: 'ping', priority: 0, state: 'sent', created: 1, expires: 2, sent: 1 },
      ...{ delivered: null, started: null, finished: null, exitCode: null, signal: null, output: null },
      ...{ truncated: false, reason: null },
    };
    expect(check('Command', command)).toBe(true);
    expect(check('CommandList', [command, { ...command, state: 'done', exitCode: 0, output: 'pong' }])).toBe(true);
    expect(check('Command', { ...command, state: 'delivered' })).toBe(false);
    expect(check('Command', { ...command, finished: undefined })).toBe(false);
    const to = { platform: 'p', name: 'a/b' };
    const image = { name: 'a/b', platform: 'p', version: 1, info: { platforms: { from: ['p'], to } } };
    expect(check('FirmwareList', [image])).toBe(true);
    expect(check('FirmwareImage', { ...image, sha256: '0'.repeat(64) })).toBe(false);
    expect(check('FirmwareImage', { ...image, version: -1 })).toBe(false);
  });
});

/** What the drive brought about: `operationId status token` for plain text, `operationId status type` for the rest. */
const provoked = new Set<string>();

/** A recipe: the status and token (null: not a token) a request is expected to answer, why, and what else to check. */
type Recipe = [status: number, token: string | null, why: string, run: () => Promise<Answer>, check?: Check];
type Check = (a: Answer) => unknown;

/** Runs the recipes of each route in turn. */
async function drive(recipes: Record<string, Recipe[]>): Promise<void> {
  for (const [op, list] of Object.entries(recipes)) {
    for (const [status, token, why, run, check] of list) {
      const a = await run();
      expect(a.status, `${op}, ${why}: ${a.body.slice(0, 80)}`).toBe(status);
      if (token !== null) expect(a.body, `${op}, ${why}`).toBe(token);
      await check?.(a);
      provoked.add(`${op} ${a.status} ${a.type}`);
      if (a.type === 'text/plain') provoked.add(`${op} ${a.status} ${a.body}`);
      if (a.body === '') provoked.add(`${op} ${a.status}`);
    }
  }
}

/** Requests to an app, as a user (`sid`) or without a session. */
function client(app: () => FastifyInstance) {
  const as = (sid?: string | null) => (sid ? { cookie: sid } : {});
  return {
    get:
      (url: string, sid?: string | null, headers: Record<string, string> = {}) =>
      () =>
        call(app(), { method: 'GET', url, headers, ...as(sid) }),
    post: (url: string, form?: Record<string, string>, sid?: string | null) => () =>
      call(app(), { url, ...(form ? { form } : {}), ...as(sid) }),
    json: (url: string, json: unknown, sid?: string | null) => () => call(app(), { url, json, ...as(sid) }),
    del: (url: string, sid?: string | null) => () => call(app(), { method: 'DELETE', url, ...as(sid) }),
    /** A body that says it is JSON and is not. */
    broken:
      (url: string, sid?: string | null, method: 'POST' | 'DELETE' = 'POST') =>
      () =>
        call(app(), { method, url, raw: { type: 'application/json', body: '{"login":' }, ...as(sid) }),
  };
}

interface SeededDevice {
  id: string;
  authcode: string;
}

/**
 * A device as the bridge keeps it after its hello: an auth code, `meta` `state` and `unique`, a `d` variable
 * `led` with two versions (the device's, then a user's) and a binary `s` variable `blob`.
 */
async function seedDevice(opts: { owner?: number; heardBy?: number[]; on?: TestBridge } = {}): Promise<SeededDevice> {
  const id = randomUUID();
  const authcode = randomBytes(16).toString('hex');
  const b = opts.on ?? main;
  const now = b.clock.now();
  await b.store.write(async ({ devices }) => {
    await devices.touch(id, now);
    await devices.setAuthcode(id, authcode);
    await devices.setMeta(id, 'unique', id, now, 'device');
    await devices.setMeta(id, 'state', 'connected', now, 'server');
    const led = { type: 'd', name: 'led' } as const;
    await devices.putVersion(id, { ...led, value: Buffer.from('off'), time: now - 2, origin: 'device' }, now, 'device');
    await devices.putVersion(id, { ...led, value: Buffer.from('on'), time: now - 1, origin: 'cloud' }, 0, 'user');
    const blob = Buffer.from([0xff, 0x00, 0x80]);
    await devices.putVersion(id, { type: 's', name: 'blob', value: blob, time: now, origin: 'cloud' }, now, 'user');
    if (opts.owner !== undefined) await devices.claim(id, opts.owner, now);
    for (const user of opts.heardBy ?? []) await devices.heard(id, user, now);
  });
  return { id, authcode };
}

let users = 0;
/** A new user of the main bridge, logged in, in the default frontend or `app`. */
async function newUser(app?: string): Promise<{ login: string; password: string; sid: string; id: number }> {
  const login = `user${++users}@example.com`;
  const password = 'correct horse battery';
  const r = await call(main.app, { url: `/0/session/signup${app ? `?app=${app}` : ''}`, form: { login, password } });
  expect(r.status).toBe(201);
  return {
    login,
    password,
    sid: r.sid!,
    id: (await main.store.userByLogin(app ?? main.defaultFrontend.id, login))!.id,
  };
}

describe('every status and token the document lists is brought about', () => {
  const { get, post, json, del, broken } = client(() => main.app);
  const body = (a: Answer) => JSON.parse(a.body) as unknown;
  const keys = (a: Answer) => Object.keys(body(a) as Json);
  /** The JSON answered matches. */
  const matches = (expected: unknown) => (a: Answer) => expect(body(a)).toMatchObject(expected as Json);

  it('on the session, account and user data routes', async () => {
    // One attempt per window, so that the second answers 429.
    const one = { limit: 1 };
    const rateLimits = { login: one, signup: one, resend: one, recover: one, accessToken: one };
    const limited = await startTestBridge({ config: { rateLimits } });
    // One access token per user, so that the second is refused.
    const few = await startTestBridge({ config: { accounts: { accessTokensPerUser: 1 } } });
    const busy = await startTestBridge({ hasher: fullHasher() });
    const full = await startTestBridge({ openStore: fullStore });
    // Their users, made directly: these apps can neither hash nor write.
    for (const [b, login] of [
      [busy, 'busy@example.com'],
      [full, 'full@example.com'],
    ] as const) {
      const passwordHash = await hasherFor(b.config).hash('pw-odd-1234');
      const user = { frontendId: b.defaultFrontend.id, login, passwordHash, authcode: randomBytes(16).toString('hex') };
      await b.store.createUser({ ...user, now: b.clock.now() });
    }
    /** The second of two identical requests to the limited bridge. */
    const twice = (url: string, form: Record<string, string>) => async () => {
      await call(limited.app, { url, form });
      return call(limited.app, { url, form });
    };
    const odd = (b: TestBridge, url: string, form?: Record<string, string>) => () =>
      call(b.app, { url, ...(form ? { form } : {}) });
    const pw = 'pw-odd-1234';
    const [a1, a2, a3] = ['a', 'busy', 'full'].map((l) => ({ login: `${l}@example.com`, password: pw }));
    const signup = (login: string, password = 'long enough') => post('/0/session/signup', { login, password });
    const login = (login: string, password: string) => post('/0/session/login', { login, password });
    const [u, v] = [await newUser(), await newUser()];
    const kiosk = await main.addFrontend({ nearby: false, registration: false });
    const big = { big: 'x'.repeat(main.config.accounts.userDataBytes) };
    let sid = '';
    // An access token of u's, and the session it starts (decision 30).
    const tokens = '/0/user/accesstoken';
    const accessToken = (await call(main.app, { url: tokens, cookie: u.sid })).body;
    let tokenSid = '';
    const fewSid = (await call(few.app, { url: '/0/session/signup', form: { login: 'f@example.com', password: pw } }))
      .sid!;
    await call(few.app, { url: tokens, cookie: fewSid });
    let spare = '';
    const confirmLink = () => {
      const link = outboxLink(outboxDir(main.config), 'confirm');
      expect(link.pathname).toBe('/0/session/confirm');
      return get(`${link.pathname}${link.search}`)();
    };
    const confirmed = async () => matches({ login: u.login, confirmed: true })(await get('/0/user/', u.sid)());
    const recover = async (path: string): Promise<Recipe[]> => {
      const w = await newUser();
      const form = { login: w.login, token: 't', password: 'a new password' };
      const withToken = () => {
        const token = outboxLink(outboxDir(main.config), 'recover').searchParams.get('token')!;
        return post(path, { ...form, token })();
      };
      return [
        [200, 'recover-ok', 'a known login', post(path, { login: w.login })],
        [200, 'recover-ok', 'the e-mailed token and a new password', withToken],
        [400, 'recover-fail', 'an unknown login', post(path, { login: 'nobody@example.com' })],
        [400, 'recover-fail', 'a wrong token', post(path, { ...form, token: 'wrong' })],
        [429, 'too-many-requests', 'twice', twice(path, { login: `${path.length}@example.com` })],
        [503, 'busy', 'a full hashing queue', odd(busy, path, { ...form, login: 'busy@example.com' })],
        // The recovery link's token could not be stored: the disk, not the mail, failed.
        [507, 'storage-full', 'a full disk', odd(full, path, { login: 'full@example.com' })],
      ];
    };
    try {
      await drive({
        createSession: [
          [201, 'user-ok', 'no session', post('/0/session/'), (a) => (sid = a.sid!)],
          [200, 'user-ok', 'a session', () => call(main.app, { url: '/0/session/', cookie: sid })],
          [400, 'bad-request', 'malformed JSON', broken('/0/session/')],
          [201, 'user-ok', 'an access token', post('/0/session/', { token: accessToken }), (a) => (tokenSid = a.sid!)],
          [401, 'token-fail', 'an unknown access token', post('/0/session/', { token: 'x'.repeat(43) })],
          [429, 'too-many-requests', 'two tokens', twice('/0/session/', { token: 'y'.repeat(43) })],
          // Nothing is written before the write refused: no old session, no user.
          [507, 'storage-full', 'a full disk', odd(full, '/0/session/')],
        ],
        login: [
          [201, 'login-ok', 'the right password', login(u.login, u.password)],
          [403, 'login-fail', 'a wrong password', login(u.login, 'wrong password')],
          [403, 'login-fail', 'malformed JSON', broken('/0/session/login')],
          [429, 'too-many-requests', 'twice', twice('/0/session/login', { login: 'l@example.com', password: pw })],
          [503, 'busy', 'a full hashing queue', odd(busy, '/0/session/login', a2)],
          [507, 'storage-full', 'a full disk', odd(full, '/0/session/login', a3)],
        ],
        logout: [
          [201, 'logout-ok', 'a session', post('/0/session/logout', undefined, v.sid)],
          [400, 'logout-fail', 'no session', post('/0/session/logout')],
          [400, 'logout-fail', 'malformed JSON', broken('/0/session/logout')],
        ],
        signup: [
          [201, 'signup-ok', 'a new login', signup('fresh@example.com')],
          [400, 'signup-fail-no-email', 'not an e-mail address', signup('fresh')],
          [400, 'signup-fail-already-exists', 'a taken login', signup(u.login)],
          [400, 'signup-fail', 'a short password', signup('other@example.com', 'short')],
          [429, 'too-many-requests', 'twice', twice('/0/session/signup', { login: 'l@example.com', password: pw })],
          [503, 'busy', 'a full hashing queue', odd(busy, '/0/session/signup', a1)],
          [507, 'storage-full', 'a full disk', odd(full, '/0/session/signup', a1)],
        ],
        resendConfirmation: [
          [200, 'resend-ok', 'an unconfirmed user', post('/0/session/resend', { login: u.login })],
          [400, 'resend-fail', 'an unknown login', post('/0/session/resend', { login: 'no@example.com' })],
          [429, 'too-many-requests', 'twice', twice('/0/session/resend', { login: 'r@example.com' })],
          [507, 'storage-full', 'a full disk', odd(full, '/0/session/resend', { login: 'full@example.com' })],
        ],
        recover: await recover('/0/session/recovery'),
        recoverAlias: await recover('/0/session/recover'),
        recoverPage: [[200, null, 'the link', get('/0/session/recover?login=a%40example.com&token=abc')]],
        confirm: [
          [400, 'confirm-fail', 'no token', get('/0/session/confirm')],
          [200, 'confirm-ok', 'the e-mailed link', confirmLink, confirmed],
        ],
        getUser: [
          [200, null, 'logged in', get('/0/user/', u.sid)],
          [404, 'not found', 'no session', get('/0/user/')],
        ],
        setUserData: [
          [200, 'user-data-ok', 'string fields', post('/0/user/', { a: '1' }, u.sid)],
          [400, 'user-data-failed', 'a value that is not a string', json('/0/user/', { a: 1 }, u.sid)],
          [401, 'no-session', 'no session', post('/0/user/', { a: '1' })],
          [413, 'user-data-failed', 'too much data', post('/0/user/', big, u.sid)],
        ],
        getOpenApi: [[200, null, 'no session', get(OPENAPI_PATH)]],
        getFrontend: [
          [200, null, 'no session', get('/0/frontend'), matches({ nearby: true, registration: true })],
          [200, null, 'switches off', get(`/0/frontend?app=${kiosk.id}`), matches({ id: kiosk.id, nearby: false })],
        ],
        createAccessToken: [
          [201, null, 'a logged-in session', post(tokens, undefined, u.sid), (a) => (spare = a.body)],
          [400, 'accesstoken-fail-limit', 'one token too many', () => call(few.app, { url: tokens, cookie: fewSid })],
          [400, 'accesstoken-fail', 'malformed JSON', broken(tokens, u.sid)],
          [401, 'no-session', 'no session', post(tokens)],
          [403, 'accesstoken-fail-token-session', 'a session of a token', () => post(tokens, undefined, tokenSid)()],
        ],
        listAccessTokens: [
          [200, null, "the user's", get(tokens, u.sid), (a) => expect(body(a)).toHaveLength(2)],
          [401, 'no-session', 'no session', get(tokens)],
        ],
        revokeAccessToken: [
          [200, 'accesstoken-ok', 'a token', () => del(`/0/user/accesstoken/${spare}`, u.sid)()],
          [400, 'accesstoken-fail', 'the same again', () => del(`/0/user/accesstoken/${spare}`, u.sid)()],
          [400, 'accesstoken-fail', 'malformed JSON', broken('/0/user/accesstoken/1', u.sid, 'DELETE')],
          [401, 'no-session', 'no session', del('/0/user/accesstoken/1')],
        ],
      });
    } finally {
      await few.close();
      await limited.close();
      await busy.close();
      await full.close();
    }
  });

  it('on the device and network routes', async () => {
    const [owner, stranger, friend] = [await newUser(), await newUser(), await newUser()];
    const farFrontend = await main.addFrontend({ nearby: false });
    const far = await newUser(farFrontend.id);
    const own = await seedDevice({ owner: owner.id });
    const spare = await seedDevice({ owner: owner.id });
    const nearby = await seedDevice({ heardBy: [owner.id, far.id] });
    const foreign = await seedDevice({ owner: stranger.id, heardBy: [owner.id] });
    const unclaimed = await seedDevice();
    const [o, x] = [owner.sid, stranger.sid];
    const [base, near] = [`/0/devices/${own.id}`, `/0/devices/${nearby.authcode}`];
    // A deleted `s` variable with a history (a value, then its tombstone), and a `d` variable to delete.
    await post(`${base}/s/gone`, { value: 'x' }, o)();
    expect((await del(`${base}/s/gone`, o)()).body).toBe('device-ok');
    await post(`${base}/d/temp`, { value: '21' }, o)();
    const claim = (auth: string, sid?: string) => post('/0/devices/', { auth }, sid);
    const share = (sid: string) => post('/0/devices/', { auth: own.id, user: friend.login }, sid);
    const claimJson = () => {
      const form = { auth: unclaimed.authcode.toUpperCase() };
      return call(main.app, { url: '/0/devices/', form, cookie: o, headers: { accept: 'application/json' } });
    };
    const ownedBy = (a: Answer) => expect(keys(a).sort()).toEqual([own.id, spare.id].sort());
    const inNetwork = (a: Answer) =>
      expect([nearby.authcode, foreign.authcode].map((k) => keys(a).includes(k))).toEqual([true, false]);
    const older = matches([{ value: 'off', by: 'device' }]);
    const deleted = matches([{ value: '', deleted: true, by: 'user' }, { value: 'x' }]);
    let newest = 0;
    const latest = (a: Answer) => {
      matches([{ key: 'led', value: 'on', by: 'user', type: 'd' }])(a);
      newest = (body(a) as Array<{ id: number }>)[0]!.id;
    };
    const tooLong = { value: 'x'.repeat(main.config.devices.maxValueBytes + 1) };
    const both = { value: 'lost', value64: '/wCA' };
    const stamped = (ago: number) => ({ value: 'v', timestamp: String(main.clock.now() + ago) });
    const rawWins = async () => matches({ value64: '/wCA' })(await get(`${base}/s/raw`, o)());
    await drive({
      listDevices: [
        [200, null, "the owner's", get('/0/devices/', o), ownedBy],
        [200, '{}', 'none', get(`/0/devices/?app=${farFrontend.id}`, far.sid)],
        [401, 'no-session', 'no session', get('/0/devices/')],
      ],
      claimDevice: [
        [201, unclaimed.id, 'an unclaimed device', claim(unclaimed.authcode, o)],
        [201, `{"id":"${unclaimed.id}"}`, 'the same again, in upper case, asking for JSON', claimJson],
        [400, 'claim-fail', "another user's device", claim(own.authcode, x)],
        [400, 'claim-fail', 'an unknown auth code', claim(randomBytes(16).toString('hex'), o)],
        [400, 'claim-fail', 'a malformed auth code', claim('not hex', o)],
        [400, 'claim-fail', 'malformed JSON', broken('/0/devices/', o)],
        [401, 'no-session', 'no session', claim(unclaimed.authcode)],
        [200, 'share-ok', 'with user: a share', post('/0/devices/', { auth: own.id, user: friend.login }, o)],
        [400, 'share-fail', 'a share of a device the user does not own', share(x)],
      ],
      listDeviceShares: [
        [200, null, 'the owner', get(`${base}/users/`, o), matches([{ login: friend.login }])],
        [403, 'share-fail', 'a user it is shared with', get(`${base}/users/`, friend.sid)],
        [404, 'device-fail', "another user's device", get(`${base}/users/`, x)],
        [401, 'no-session', 'no session', get(`${base}/users/`)],
      ],
      revokeDeviceShare: [
        [200, 'share-ok', 'the owner', del(`${base}/users/${friend.login}`, o)],
        [400, 'share-fail', 'the same again', del(`${base}/users/${friend.login}`, o)],
        [400, 'share-fail', 'malformed JSON', broken(`${base}/users/${friend.login}`, o, 'DELETE')],
        [401, 'no-session', 'no session', del(`${base}/users/${friend.login}`)],
      ],
      getDevice: [
        [200, null, 'by uuid', get(base, o)],
        [200, null, 'by auth code', get(`/0/devices/${own.authcode}`, o)],
        [200, null, 'a nearby unowned device', get(near, o)],
        [404, 'device-fail', 'a nearby device another user owns', get(`/0/devices/${foreign.authcode}`, o)],
        [404, 'device-fail', "another user's device", get(base, x)],
        [404, 'device-fail', 'an unknown device', get(`/0/devices/${randomUUID()}`, o)],
        [404, 'device-fail', 'a malformed id', get('/0/devices/nope', o)],
        [401, 'no-session', 'no session', get(base)],
      ],
      unregisterDevice: [
        [200, 'device-ok', 'an own device', del(`/0/devices/${spare.id}`, o)],
        [400, 'device-fail', 'the same again, now unregistered', del(`/0/devices/${spare.id}`, o)],
        [400, 'device-fail', 'a nearby device the user does not own', del(near, o)],
        [400, 'device-fail', "another user's device", del(base, x)],
        [401, 'no-session', 'no session', del(base)],
      ],
      listVariables: [
        [200, null, 'd', get(`${base}/d`, o)],
        [200, null, 's, with a binary value', get(`${base}/s`, o)],
        [200, null, 'meta of a nearby device', get(`${near}/meta`, o)],
        [404, 'device-fail', 'an unknown type', get(`${base}/x`, o)],
        [404, 'device-fail', "another user's device", get(`${base}/d`, x)],
        [401, 'no-session', 'no session', get(`${base}/d`)],
      ],
      getVariable: [
        [200, null, 'a d record', get(`${base}/d/led`, o), matches({ value: 'on', acked: 0, synced: 0, syncacked: 0 })],
        [200, `{"value64":"/wCA","time":${main.clock.now()}}`, 'a binary s record', get(`${base}/s/blob`, o)],
        [200, '"connected"', 'a meta variable, bare', get(`${base}/meta/state`, o)],
        [200, null, 'history, latest=1', get(`${base}/d/led?latest=1`, o), latest],
        [200, null, 'history, from the newest back', () => get(`${base}/d/led?from=${newest}`, o)(), older],
        [200, null, 'history, forwards from startid', () => get(`${base}/d/led?startid=${newest}`, o)(), latest],
        [400, 'device-fail', 'from and startid together', get(`${base}/d/led?from=9&startid=1`, o)],
        [200, null, 'the history of a deleted variable', get(`${base}/s/gone?latest=0`, o), deleted],
        [400, 'device-fail', 'latest not a number', get(`${base}/d/led?latest=ten`, o)],
        [400, 'device-fail', 'a negative from', get(`${base}/d/led?from=-1`, o)],
        [404, 'device-fail', 'a deleted variable', get(`${base}/s/gone`, o)],
        [404, 'device-fail', 'an unknown variable', get(`${base}/d/none`, o)],
        [404, 'device-fail', "another user's device", get(`${base}/d/led`, x)],
        [401, 'no-session', 'no session', get(`${base}/d/led`)],
      ],
      setVariable: [
        [200, 'device-ok', 'a d value', post(`${base}/d/led`, { value: 'blink' }, o)],
        [200, 'device-ok', 'value64 wins over value', post(`${base}/s/raw`, both, o), rawWins],
        [200, 'device-ok', 'a d sync', post(`${base}/d/led`, undefined, o)],
        [200, 'device-ok', 'a value with a timestamp', post(`${base}/s/stamped`, stamped(-1000), o)],
        [400, 'device-fail', 'a timestamp over an hour old', post(`${base}/s/stamped`, stamped(-3_600_001), o)],
        [409, 'device-fail-older', 'a timestamp before the held one', post(`${base}/s/stamped`, stamped(-2000), o)],
        [200, 'device-ok', 'a nearby unowned device', post(`${near}/d/led`, { value: 'near' }, o)],
        [400, 'device-fail', 'a meta variable', post(`${base}/meta/state`, { value: 'x' }, o)],
        [400, 'device-fail', 'an s variable with no value', post(`${base}/s/raw`, undefined, o)],
        [400, 'device-fail', 'a sync of no variable', post(`${base}/d/none`, undefined, o)],
        [400, 'device-fail', 'value64 not base64', post(`${base}/s/raw`, { value64: 'abc' }, o)],
        [400, 'device-fail', 'a value over devices.maxValueBytes', post(`${base}/s/raw`, tooLong, o)],
        [400, 'device-fail', "another user's device", post(`${base}/d/led`, { value: 'x' }, x)],
        [400, 'device-fail', 'malformed JSON', broken(`${base}/d/led`, o)],
        [400, 'device-fail', 'a JSON array: not fields, so not a sync', json(`${base}/d/led`, ['on'], o)],
        [401, 'no-session', 'no session', post(`${base}/d/led`, { value: 'x' })],
      ],
      deleteVariable: [
        [200, 'device-ok', 'a d variable', del(`${base}/d/temp`, o)],
        [400, 'device-fail', 'the same again', del(`${base}/d/temp`, o)],
        [400, 'device-fail', 'a meta variable', del(`${base}/meta/state`, o)],
        [400, 'device-fail', "another user's device", del(`${base}/d/led`, x)],
        [401, 'no-session', 'no session', del(`${base}/d/led`)],
      ],
      getNetwork: [
        [200, null, 'the unowned nearby device, not the owned one', get('/0/network/', o), inNetwork],
        [200, '{}', 'a frontend whose nearby is off', get(`/0/network/?app=${farFrontend.id}`, far.sid)],
        [401, 'no-session', 'no session', get('/0/network/')],
      ],
    });
  });

  it('on the command routes', async () => {
    // What a command is stored as, the list's order and `latest`, and a full queue: test/commands/routes.test.ts.
    const [owner, stranger] = [await newUser(), await newUser()];
    const [o, x] = [owner.sid, stranger.sid];
    const own = await seedDevice({ owner: owner.id });
    const nearby = await seedDevice({ heardBy: [owner.id] });
    const url = `/0/devices/${own.id}`;
    const ping = { command: 'ping' };
    const inPath = (command: string, sid: string | null = o) => post(`${url}/${command}`, undefined, sid);
    const tooLate = { command: 'ping', lifetime: String(main.config.commands.maxLifetimeMs + 1) };
    const tooLong = { command64: Buffer.alloc(main.config.commands.maxBytes + 1).toString('base64') };
    let cmd = '';
    const one =
      (id: () => string, sid: string | null = o) =>
      () =>
        get(`${url}/commands/${id()}`, sid)();
    await drive({
      sendCommand: [
        [200, null, 'a command', post(url, ping, o), (a) => (cmd = a.body)],
        [
          200,
          null,
          'command64 and JSON numbers, by auth code',
          json(`/0/devices/${own.authcode}/`, { command64: 'YgD/', priority: 2 }, o),
        ],
        [200, null, 'a nearby unowned device', post(`/0/devices/${nearby.authcode}`, ping, o)],
        [400, 'device-fail', 'priority 3', post(url, { ...ping, priority: '3' }, o)],
        [400, 'device-fail', 'lifetime 0', post(url, { ...ping, lifetime: '0' }, o)],
        [400, 'device-fail', 'a lifetime over commands.maxLifetimeMs', post(url, tooLate, o)],
        [400, 'device-fail', 'not printable ASCII', post(url, { command: 'café' }, o)],
        [400, 'device-fail', 'command64 not base64', post(url, { command64: 'abc' }, o)],
        [400, 'device-fail', 'command64 over commands.maxBytes', post(url, tooLong, o)],
        [400, 'device-fail', 'no command', post(url, { priority: '1' }, o)],
        [400, 'device-fail', "another user's device", post(url, ping, x)],
        [400, 'device-fail', 'malformed JSON', broken(url, o)],
        [400, 'device-fail', 'a JSON array', json(url, ['ping'], o)],
        [401, 'no-session', 'no session', post(url, ping)],
      ],
      sendCommandInPath: [
        [200, null, 'a command', inPath('ping')],
        [400, 'device-fail', 'a reserved segment', inPath('meta')],
        [400, 'device-fail', 'not printable ASCII', inPath('caf%C3%A9')],
        // Refused by the router before any route (`routingFailed`), with the route's own answer.
        [400, 'device-fail', 'longer than the router takes', inPath('x'.repeat(300))],
        [400, 'device-fail', "another user's device", inPath('ping', x)],
        [400, 'device-fail', 'malformed JSON', broken(`${url}/ping`, o)],
        [401, 'no-session', 'no session', inPath('ping', null)],
      ],
      listCommands: [
        [200, null, 'the commands', get(`${url}/commands/`, o)],
        [200, null, 'a nearby device, by auth code', get(`/0/devices/${nearby.authcode}/commands`, o)],
        [400, 'device-fail', 'latest not a number', get(`${url}/commands/?latest=ten`, o)],
        [404, 'device-fail', "another user's device", get(`${url}/commands/`, x)],
        [404, 'device-fail', 'an unknown device', get(`/0/devices/${randomUUID()}/commands/`, o)],
        [401, 'no-session', 'no session', get(`${url}/commands/`)],
      ],
      getCommand: [
        [200, null, 'a command', one(() => cmd), matches({ command: 'ping', state: 'queued', sent: null })],
        [200, null, 'its uuid in upper case', one(() => cmd.toUpperCase())],
        [404, 'device-fail', 'an unknown command', one(() => randomUUID())],
        [404, 'device-fail', 'not a uuid', one(() => 'latest')],
        [404, 'device-fail', "another user's device", one(() => cmd, x)],
        [401, 'no-session', 'no session', one(() => cmd, null)],
      ],
    });
  });

  it('on the firmware routes', async () => {
    // Each case, and each reason a start or a cancel is refused, is driven in test/bridge/firmware-routes.test.ts.
    const u = await newUser();
    // A record as `devcloud-bridge firmware add` writes it; the listing does not read the image file.
    const entry = { name: 'acme/sensor/3', platform: 'linux-x64', version: 3, from: ['linux-x64'], size: 1 };
    await main.store.firmware.add({
      ...entry,
      toPlatform: 'linux-x64',
      sha256: '0'.repeat(64),
      signature: 'AA==',
      addedAt: 1,
    });
    const fw: FirmwareWorld = await startFirmwareWorld(main);
    try {
      const { get: fwGet, post: fwPost, del: fwDel, broken: fwBroken } = client(() => fw.app);
      const [o, x] = [fw.owner.sid, fw.stranger.sid];
      const [dev, idle, other] = [await fw.device(), await fw.device(), await fw.device()];
      const ended = () => fw.reportMeta(dev.id, { fwstate: 'failed' });
      const start = (prefix: string): Recipe[] => {
        const at = (image: string, sid?: string) => fwPost(`/0/devices/${dev.id}/${prefix}/${image}`, undefined, sid);
        return [
          [200, 'device-ok', 'an image in the catalog', at(fw.NAME, o), ended],
          [400, 'device-fwup-name-fail', 'an unknown name', at('no/such/image', o)],
          [400, 'device-fwup-start-fail', 'a platform it does not update from', at(fw.ARM, o)],
          [400, 'device-fwup-start-fail', 'malformed JSON', fwBroken(`/0/devices/${dev.id}/${prefix}/${fw.NAME}`, o)],
          [400, 'device-fail', "another user's device", at(fw.NAME, x)],
          [401, 'no-session', 'no session', at(fw.NAME)],
        ];
      };
      const cancel = async (prefix: string): Promise<Recipe[]> => {
        const running = await fw.device();
        await fw.startJob(running.id);
        const at = (id: string, sid?: string) => fwDel(`/0/devices/${id}/${prefix}`, sid);
        return [
          [200, 'firmware-ok', 'before the switch', at(running.id, o)],
          [400, 'firmware-fail', 'nothing running', at(idle.id, o)],
          [400, 'firmware-fail', 'malformed JSON', fwBroken(`/0/devices/${idle.id}/${prefix}`, o, 'DELETE')],
          [401, 'no-session', 'no session', at(idle.id)],
        ];
      };
      const job = await fw.startJob(other.id);
      const image = new URL(job.url).pathname;
      const token = { authorization: `Bearer ${job.token}` };
      const listed = (a: Answer) =>
        expect(body(a)).toContainEqual(expect.objectContaining({ name: entry.name, version: 3 }));
      const whole = (a: Answer) => expect(a.bytes.equals(fw.IMAGE)).toBe(true);
      /** The request, while the image's file is away (as on a bridge that never got it). */
      const withoutFile = (run: () => Promise<Answer>) => async () => {
        const file = main.store.firmware.imagePath({ sha256: fw.sha256 });
        renameSync(file, `${file}.away`);
        try {
          return await run();
        } finally {
          renameSync(`${file}.away`, file);
        }
      };
      const part = (a: Answer) => expect(a.bytes.equals(fw.IMAGE.subarray(10, 20))).toBe(true);
      await drive({
        listFirmware: [
          [200, null, 'the catalog', get('/0/firmware/', u.sid), listed],
          [401, 'no-session', 'no session', get('/0/firmware/')],
        ],
        startFirmwareUpdate: start('fw'),
        startFirmwareUpdateAlias: start('firmware'),
        cancelFirmwareUpdate: await cancel('fw'),
        cancelFirmwareUpdateAlias: await cancel('firmware'),
        downloadFirmwareImage: [
          [200, null, 'the whole image', fwGet(image, null, token), whole],
          [206, null, 'Range: bytes=10-19', fwGet(image, null, { ...token, range: 'bytes=10-19' }), part],
          [416, '', 'Range: bytes=20-10', fwGet(image, null, { ...token, range: 'bytes=20-10' })],
          [401, 'unauthorized', 'no token', fwGet(image)],
          [404, 'not found', "the image's file gone from this bridge", withoutFile(fwGet(image, null, token))],
        ],
      });
    } finally {
      await fw.close();
    }
  });

  it('on the event stream of the live channel', async () => {
    // A stream never ends, so it is read over a real socket: its head is the answer.
    const live = await startTestBridge({ transport: 'http', config: { live: { maxPerUser: 1 } } });
    try {
      const user = live.client();
      const signup = await user.post('/0/session/signup', {
        form: { login: 'sse@example.com', password: 'pw-odd-1234' },
      });
      expect(signup.status).toBe(201);
      const streams: SseStream[] = [];
      const open = (cookie?: string) => async (): Promise<Answer> => {
        const s = await SseStream.open(live.url!, cookie ? { cookie } : {});
        streams.push(s);
        if (s.status !== 200) await s.ended;
        const type = s.contentType.split(';')[0]!.trim();
        return { status: s.status, body: s.status === 200 ? '' : s.body, bytes: Buffer.alloc(0), type, sid: undefined };
      };
      await drive({
        getEvents: [
          [200, null, 'a logged-in user', open(`sid=${user.sid!}`)],
          [429, 'too-many-requests', 'a second stream over live.maxPerUser', open(`sid=${user.sid!}`)],
          [401, 'no-session', 'no session', open()],
        ],
      });
      for (const s of streams) s.close();
    } finally {
      await live.close();
    }
  });

  it('on the health and metrics routes', async () => {
    // Their 503 (the database or the link failing) is brought about in test/ops/health-metrics.test.ts.
    const counted = (a: Answer) => expect(a.body).toContain('devcloud_http_requests_total');
    const elsewhere = () => call(main.app, { method: 'GET', url: '/metrics', remoteAddress: '192.0.2.7' });
    await drive({
      getHealth: [
        [200, null, 'healthy', get('/healthz')],
        [200, null, 'an app that names no frontend: the route reads none', get(`/healthz?app=${randomUUID()}`)],
      ],
      getMetrics: [
        [200, null, 'no token set', get('/metrics'), counted],
        [200, null, 'an app that names no frontend: the route reads none', get(`/metrics?app=${randomUUID()}`)],
        [403, 'metrics-local-only', 'no token set, a client on another machine', elsewhere],
      ],
    });
  });

  it('on the notification routes', async () => {
    // What each field does, and every refusal, is driven in test/bridge/rules-routes.test.ts. A bridge of its own:
    // two rules per user, so that a third is refused, and one event per user per window, so that a second test is.
    const nb = await startTestBridge({ config: { notifications: { rulesPerUser: 2, userEventsLimit: 1 } } });
    try {
      const { get: nGet, post: nPost, json: nJson, del: nDel, broken: nBroken } = client(() => nb.app);
      const person = async (login: string) => {
        const r = await call(nb.app, { url: '/0/session/signup', form: { login, password: 'pw-odd-1234' } });
        expect(r.status).toBe(201);
        return { sid: r.sid!, id: (await nb.store.userByLogin(nb.defaultFrontend.id, login))!.id };
      };
      const [owner, stranger, full] = [
        await person('rules-o@example.com'),
        await person('rules-x@example.com'),
        await person('rules-f@example.com'),
      ];
      const [o, x] = [owner.sid, stranger.sid];
      const own = await seedDevice({ owner: owner.id, on: nb });
      const foreign = await seedDevice({ owner: stranger.id, on: nb });
      const rule = (more: Record<string, string> = {}) => ({
        name: 'Hot',
        trigger: 'D.Temp>30 FOR 600s',
        deviceid: own.id,
        ...more,
      });
      // The third user holds the most rules already.
      const ownFull = await seedDevice({ owner: full.id, on: nb });
      for (const _ of [1, 2]) {
        const r = await nPost('/0/user/event/', rule({ deviceid: ownFull.id }), full.sid)();
        expect(r.status, r.body).toBe(201);
      }
      let id = '';
      const at = (sid: string | null, form?: Record<string, string>) => () => nPost(`/0/user/event/${id}`, form, sid)();
      const one = (sid: string | null) => () => nGet(`/0/user/event/${id}`, sid)();
      const canonical = matches({ name: 'Hot', trigger: 'd.Temp > 30 for 10m', deviceid: own.id, state: 'armed' });
      const app = { app: nb.defaultFrontend.id };
      const badTrigger = matches({ error: 'event-fail-trigger', position: 7, line: 1, column: 8 });
      await drive({
        createRule: [
          [201, null, 'a form', nPost('/0/user/event/', rule(), o), (a) => (id = a.body)],
          [201, null, 'a JSON body', nJson('/0/user/event/', { ...rule(), email: true }, o)],
          [400, null, 'a trigger that does not parse', nPost('/0/user/event/', rule({ trigger: 'd.temp =>' }), o)],
          [400, 'event-fail', 'no name', nPost('/0/user/event/', rule({ name: '' }), o)],
          [400, 'event-fail', 'malformed JSON', nBroken('/0/user/event/', o)],
          [
            400,
            'event-fail-device',
            "another user's device",
            nPost('/0/user/event/', rule({ deviceid: foreign.id }), o),
          ],
          [
            400,
            'event-fail-webhook',
            'a plain http webhook',
            nPost('/0/user/event/', rule({ webhook: 'http://a.b/' }), o),
          ],
          [400, 'event-fail-limit', 'a third rule', nPost('/0/user/event/', rule({ deviceid: ownFull.id }), full.sid)],
          [401, 'no-session', 'no session', nPost('/0/user/event/', rule())],
        ],
        listRules: [
          [
            200,
            null,
            "the user's, oldest first",
            nGet('/0/user/event/', o),
            matches([{ email: false }, { email: true }]),
          ],
          [200, '[]', 'none', nGet('/0/user/event/', x)],
          [401, 'no-session', 'no session', nGet('/0/user/event/')],
        ],
        getRule: [
          [200, null, 'a rule, its trigger canonical', one(o), canonical],
          [404, 'event-fail', "another user's rule", one(x)],
          [404, 'event-fail', 'an unknown number', nGet('/0/user/event/999999', o)],
          [401, 'no-session', 'no session', one(null)],
        ],
        updateOrTestRule: [
          [200, 'event-ok', 'a new name', at(o, { name: 'Very hot', ...app })],
          [400, null, 'a trigger that does not parse', at(o, { trigger: 'd.temp =>' }), badTrigger],
          [400, 'event-fail', "another user's rule", at(x, { name: 'Mine' })],
          [400, 'event-fail', 'a name too long', at(o, { name: 'n'.repeat(101) })],
          [400, 'event-fail-device', "another user's device", at(o, { deviceid: foreign.id })],
          [400, 'event-fail-webhook', 'a plain http webhook', at(o, { webhook: 'http://a.b/' })],
          [201, null, 'only app: a test', at(o, app)],
          [429, 'too-many-requests', 'a second test over notifications.userEventsLimit', at(o, app)],
          [401, 'no-session', 'no session', at(null, { name: 'x' })],
        ],
        listEvents: [
          [200, null, 'the test', nGet('/0/user/events/?latest=1', o), matches([{ name: 'Very hot', test: true }])],
          [400, 'event-fail', 'latest not a number', nGet('/0/user/events/?latest=abc', o)],
          [401, 'no-session', 'no session', nGet('/0/user/events/')],
        ],
        removeRule: [
          [200, 'event-ok', 'a rule', () => nDel(`/0/user/event/${id}`, o)()],
          [400, 'event-fail', 'the same again', () => nDel(`/0/user/event/${id}`, o)()],
          [401, 'no-session', 'no session', () => nDel(`/0/user/event/${id}`)()],
        ],
      });
    } finally {
      await nb.close();
    }
  });

  it('on every route, to an unknown frontend and to a request from a page of another site', async () => {
    const values: Record<string, string> = { type: 'd', name: 'led', command: 'ping', image: 'a/b' };
    const recipes: Record<string, Recipe[]> = {};
    for (const { path, method, op } of operations()) {
      // A path the route serves, its parameters filled in.
      const url = path.replace(/\{(\w+)\}/g, (_, name: string) => values[name] ?? randomUUID());
      const m = method.toUpperCase() as 'GET' | 'POST' | 'DELETE';
      const unknown = () => call(main.app, { method: m, url: `${url}?app=${randomUUID()}` });
      const crossSite = () => call(main.app, { method: m, url, headers: { origin: 'https://evil.example' } });
      recipes[op.operationId] = [
        ...(takesFrontend(op) ? [[404, 'not found', 'an unknown frontend', unknown] satisfies Recipe] : []),
        ...(m === 'GET' ? [] : [[403, 'origin-fail', 'another site', crossSite] satisfies Recipe]),
      ];
    }
    await drive(recipes);
  });

  it('leaves no status, token or kind of body the document lists unprovoked', () => {
    // A crash (500) and a bridge that shuts down (503 with Fastify's JSON) cannot be brought about on demand; a full
    // disk (507) is brought about for FULL_DISK_OPS.
    const missed: string[] = [];
    for (const { op } of operations()) {
      const id = op.operationId;
      const want = (key: string) => provoked.has(`${id} ${key}`) || missed.push(`${id} ${key}`);
      for (const [status, r] of Object.entries(op.responses)) {
        if (status === '500' || (status === '507' && !FULL_DISK_OPS.has(id))) continue;
        if (!r.content) want(status);
        for (const [type, { schema }] of Object.entries(r.content ?? {})) {
          if (status === '503' && type === 'application/json') continue;
          const tokens = type === 'text/plain' ? (schema.enum as string[] | undefined) : undefined;
          for (const key of tokens?.map((t) => `${status} ${t}`) ?? [`${status} ${type}`]) want(key);
        }
      }
    }
    expect(missed).toEqual([]);
  });
});

describe('the request schemas in the document', () => {
  /** Whether the document's schema accepts a body, checked against whether the route does. */
  async function agree(path: string, schema: string, body: unknown, cookie?: string): Promise<boolean> {
    const r = await call(main.app, { url: path, json: body, cookie });
    const accepted = docSchema(doc, doc.components.schemas[schema]!).safeParse(body).success;
    expect(accepted, `${path} ${JSON.stringify(body)}: route answered ${r.status} ${r.body}`).toBe(r.status < 300);
    return accepted;
  }

  it('reject what the routes reject, and accept what they accept', async () => {
    const u = await newUser();
    const device = await seedDevice({ owner: u.id });
    const [v, c] = [`/0/devices/${device.id}/s/raw`, `/0/devices/${device.id}`];
    const max = main.config.commands.maxLifetimeMs;
    const ping = { command: 'ping' };
    const anonymous: Array<[string, string, Json, boolean]> = [
      ['/0/session/login', 'LoginForm', { login: u.login }, false],
      ['/0/session/login', 'LoginForm', { login: 'not-mail', password: u.password }, false],
      ['/0/session/login', 'LoginForm', { login: u.login, password: 5 }, false],
      ['/0/session/login', 'LoginForm', { login: u.login, password: u.password }, true],
      ['/0/session/signup', 'SignupForm', { login: 'x@example', password: 'long enough' }, false],
      ['/0/session/signup', 'SignupForm', { login: 'x@example.com', password: 'short' }, false],
      ['/0/session/signup', 'SignupForm', { login: 'x@example.com', password: 'long enough' }, true],
      ['/0/session/resend', 'ResendForm', { login: ['x@example.com'] }, false],
    ];
    for (const [path, schema, body, ok] of anonymous) expect(await agree(path, schema, body)).toBe(ok);
    const session: Array<[string, string, Json | unknown[], boolean]> = [
      ['/0/user/', 'UserDataForm', { a: 'b', c: 1 }, false],
      ['/0/user/', 'UserDataForm', { a: 'b', app: main.defaultFrontend.id }, true],
      ['/0/devices/', 'ClaimForm', { auth: 'not hex' }, false],
      ['/0/devices/', 'ClaimForm', { auth: 12345678 }, false],
      ['/0/devices/', 'ClaimForm', {}, false],
      ['/0/devices/', 'ClaimForm', { auth: device.authcode }, true],
      [v, 'VariableForm', { value64: 'abc' }, false],
      [v, 'VariableForm', { value64: 'ab=c' }, false],
      [v, 'VariableForm', { value: 5 }, false],
      [v, 'VariableForm', { value64: '/wCA' }, true],
      [v, 'VariableForm', { value: 'x', value64: 'AA==' }, true],
      ...(
        [
          [ping, true],
          [{ ...ping, priority: 2 }, true],
          [{ ...ping, priority: '01' }, true],
          [{ ...ping, priority: 3 }, false],
          [{ ...ping, priority: '3' }, false],
          [{ ...ping, priority: 1.5 }, false],
          [{ ...ping, lifetime: '60000' }, true],
          [{ ...ping, lifetime: max }, true],
          [{ ...ping, lifetime: max + 1 }, false],
          [{ ...ping, lifetime: 0 }, false],
          [{ ...ping, lifetime: '000' }, false],
          [{ ...ping, lifetime: '-5' }, false],
          [{ command: 'café' }, false],
          [{ command: '' }, false],
          [{ command: 5 }, false],
          [{ command64: 'abc' }, false],
          [{ command64: '/wCA' }, true],
          [{ ...ping, command64: 'ab=c' }, false],
        ] as const
      ).map(([body, ok]): [string, string, Json, boolean] => [c, 'CommandForm', body, ok]),
    ];
    for (const [path, schema, body, ok] of session) expect(await agree(path, schema, body, u.sid)).toBe(ok);
    // zod cannot read this `anyOf` back, so the keyword itself is checked; the route refuses a body with neither.
    expect(doc.components.schemas.CommandForm).toMatchObject({
      anyOf: [{ required: ['command'] }, { required: ['command64'] }],
    });
    const none = await call(main.app, { url: c, json: { priority: 1 }, cookie: u.sid });
    expect([none.status, none.body]).toEqual([400, 'device-fail']);
  });

  it('says that a password reset needs the password, and that the confirmation link needs its token', async () => {
    const u = await newUser();
    const r = await call(main.app, { url: '/0/session/recover', form: { login: u.login, token: 'abc' } });
    expect(r.body).toBe('recover-fail');
    // zod cannot read `dependentRequired` back, so the keyword itself is checked.
    expect(doc.components.schemas.RecoverForm).toMatchObject({ dependentRequired: { token: ['password'] } });
    expect((await call(main.app, { method: 'GET', url: '/0/session/confirm' })).body).toBe('confirm-fail');
    expect(doc.paths['/0/session/confirm']!.get!.parameters).toContainEqual(
      expect.objectContaining({ name: 'token', in: 'query', required: true }),
    );
  });
});
