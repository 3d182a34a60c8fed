/**
 * The API document (`GET /0/openapi.json`) against the routes it describes: every route the app registers is
 * in it; every route, driven through each of its outcomes, answers only statuses and tokens the document lists,
 * and answers every status the document lists for it, with each token listed under it; and the request schemas
 * in it reject what the routes reject. The device routes are driven against devices written into the bridge's
 * store, as the MQTT side would write them; the firmware job routes against devices that report through the
 * bridge's device side, with a link that records what goes down to them.
 */
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { HasherBusyError, PasswordHasher } from '../../bridge/accounts/password.js';
import { buildApp } from '../../bridge/app.js';
import { ensureDefaultFrontend } from '../../bridge/cli.js';
import { BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import type { UpMessage } from '../../bridge/devices/link.js';
import { DeviceService } from '../../bridge/devices/service.js';
import { importImage } from '../../bridge/firmware/catalog.js';
import { createMailer } from '../../bridge/mail/mailer.js';
import { OPENAPI_PATH } from '../../bridge/openapi.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { StorageFullError } from '../../lib/sqlite.js';
import {
  type DownTopic,
  type FwMessage,
  type Payloads,
  decode,
  encode,
  messageId,
  signFirmware,
  verifyFirmware,
} from '../../protocol/index.js';
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

/** The route devices download a firmware image from: no frontend, no session. */
const IMAGE_OP = 'downloadFirmwareImage';
/** The routes that read no frontend: the image, and the probes' and scrapers' routes. */
const NO_FRONTEND_OPS: ReadonlySet<string> = new Set([IMAGE_OP, 'getHealth', 'getMetrics']);

/** Statuses every route documents that these tests cannot bring about on demand: a crash, and a shutdown. */
const NOT_PROVOKED = ['500', '503'];

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

type Method = 'GET' | 'POST' | 'DELETE';

interface Call {
  method?: Method;
  url: string;
  form?: Record<string, string>;
  json?: unknown;
  /** A body sent as is, with its content type. */
  raw?: { type: string; body: string | Buffer };
  cookie?: string;
  accept?: string;
  /** Further request headers (a device's `Authorization`, a `Range`). */
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
  if (c.accept) headers.accept = c.accept;
  Object.assign(headers, c.headers);
  const res = await app.inject({
    method: c.method ?? 'POST',
    url: c.url,
    headers,
    ...(payload === undefined ? {} : { payload }),
    ...(c.remoteAddress === undefined ? {} : { remoteAddress: c.remoteAddress }),
  });
  const setCookie = res.headers['set-cookie'];
  const sid = typeof setCookie === 'string' ? /^sid=([^;]*)/.exec(setCookie)?.[1] : undefined;
  return {
    status: res.statusCode,
    body: res.body,
    bytes: res.rawPayload,
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
  const app = buildApp({ config, store, hasher, mailer, log, checkAnswers: true });
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

/** A store on a disk that is full: every write is refused as SQLite refuses it. */
class FullStore extends SqliteStore {
  override write<T>(): Promise<T> {
    return Promise.reject(
      new StorageFullError(Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' })),
    );
  }
}

async function startFullApp(): Promise<BusyApp> {
  const dataDir = tempDir('devcloud-openapi-');
  const config = BridgeConfigSchema.parse({ dataDir, accounts: { scryptLogN: 10 } });
  const log = createLogger({ level: 'silent', pretty: 'never', base: {}, destination: new LogSink() });
  const store = new FullStore(dataDir);
  ensureDefaultFrontend(store, Date.now());
  const hasher = new PasswordHasher({ params: { logN: 10, r: 8, p: 1 }, maxConcurrent: 1, maxQueued: 10 });
  const mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log);
  const app = buildApp({ config, store, hasher, mailer, log, checkAnswers: true });
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
  if (documented!.content === undefined) {
    // A status the document gives no body to: the answer has none.
    expect(answer.body, `${label}: no body`).toBe('');
    return;
  }
  const media = documented!.content[answer.type];
  expect(media, `${label}: ${answer.type} is documented for ${answer.status}`).toBeDefined();
  if (answer.type === 'text/plain' && media!.schema.enum) {
    expect(media!.schema.enum, `${label}: token`).toContain(answer.body);
  } else if (answer.type === 'text/plain') {
    expect(docSchema(doc, media!.schema).safeParse(answer.body).success, `${label}: text matches the document`).toBe(
      true,
    );
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
  if (answer.headers['content-range'] !== undefined) {
    expect(documented!.headers?.['Content-Range'], `${label}: Content-Range is documented`).toBeDefined();
  }
}

interface Case {
  name: string;
  status: number;
  /** The body, when it is a token. */
  token?: string;
  run: () => Promise<Answer>;
}

/** Whether an operation reads the frontend (the `app` parameter); the routes devices call do not. */
const takesFrontend = (op: Operation) => op.parameters.some((p) => p.$ref === '#/components/parameters/app');

/**
 * Runs a route's cases, checks each against the document, then that the document lists no status they missed,
 * nor a plain-text token under a status they brought about. `url` is a path the route serves, for a path with
 * parameters.
 */
async function driveRoute(method: Method, path: string, cases: Case[], url = path): Promise<void> {
  const op = operation(method, path);
  const unknownFrontend = `${url}${url.includes('?') ? '&' : '?'}app=${randomUUID()}`;
  const all: Case[] = [
    ...cases,
    ...(takesFrontend(op)
      ? [
          {
            name: 'an unknown frontend',
            status: 404,
            token: 'not found',
            run: () => call(main.app, { method, url: unknownFrontend }),
          },
        ]
      : []),
    ...(method === 'GET'
      ? []
      : [
          {
            name: 'a request from a page of another site',
            status: 403,
            token: 'origin-fail',
            run: () => call(main.app, { method, url, headers: { origin: 'https://evil.example' } }),
          },
        ]),
  ];
  const seen = new Set<string>();
  const tokens = new Set<string>();
  for (const c of all) {
    const answer = await c.run();
    const label = `${method} ${path}, ${c.name}`;
    expect(answer.status, `${label}: ${answer.body.slice(0, 80)}`).toBe(c.status);
    if (c.token !== undefined) expect(answer.body, label).toBe(c.token);
    expectDocumented(op, answer, label);
    seen.add(String(answer.status));
    if (answer.type === 'text/plain') tokens.add(`${answer.status} ${answer.body}`);
  }
  // 507 `storage-full`, documented for every route that changes something, is brought about in its own test below.
  const expected = [...new Set([...seen, ...NOT_PROVOKED, ...(method === 'GET' ? [] : ['507'])])].sort();
  expect(Object.keys(op.responses).sort(), `${method} ${path}: documented statuses`).toEqual(expected);
  // Nor a token under a status they brought about.
  const missed = Object.entries(op.responses)
    .filter(([status]) => seen.has(status))
    .flatMap(([status, r]) => ((r.content?.['text/plain']?.schema.enum ?? []) as string[]).map((t) => `${status} ${t}`))
    .filter((t) => !tokens.has(t));
  expect(missed, `${method} ${path}: documented tokens never answered`).toEqual([]);
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
      expect(served).toEqual(doc);
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
    const shapes = (keys: string[]) => [...new Set(keys.map(routeShape))].sort();
    expect(shapes(documented)).toEqual(shapes(registered));
    // Each documented path reaches the route it describes, under the parameter names it declares: the router
    // takes `:name` in a URL as a value, and answers with the names of the route it matched.
    for (const [path, ops] of Object.entries(doc.paths)) {
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => (m[1] === 'image' ? '*' : m[1]));
      for (const method of Object.keys(ops)) {
        const url = routeKey(method, path).split(' ')[1]!;
        const found = main.app.findRoute({ method: method.toUpperCase(), url });
        expect(found, `${method} ${path} is served`).not.toBeNull();
        expect(Object.keys(found?.params ?? {}), `${method} ${path}: parameter names`).toEqual(names);
      }
    }
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
      // Every route but the image a device downloads, and health and metrics, which read no frontend.
      for (const op of Object.values(ops))
        expect(takesFrontend(op), op.operationId).toBe(!NO_FRONTEND_OPS.has(op.operationId));
    }
  });

  const served = async (config: Parameters<typeof startTestBridge>[0]): Promise<Doc> => {
    const b = await startTestBridge(config);
    try {
      return JSON.parse((await call(b.app, { method: 'GET', url: OPENAPI_PATH })).body) as Doc;
    } finally {
      await b.close();
    }
  };

  it('takes its limits from the config', async () => {
    const built = await served({
      config: {
        accounts: { passwordMin: 12, passwordMax: 100, loginMax: 64 },
        devices: { maxValueBytes: 1234, nearbyWindowMs: 60_000 },
      },
    });
    const signup = built.components.schemas.SignupForm as { properties: Record<string, Json> };
    expect(signup.properties.password).toMatchObject({ minLength: 12, maxLength: 100 });
    expect(signup.properties.login).toMatchObject({ maxLength: 64, format: 'email' });
    const variable = built.components.schemas.VariableForm as { properties: Record<string, Json> };
    expect(variable.properties.value!.description).toContain('1234 bytes');
    expect(JSON.stringify(built.paths['/0/network/'])).toContain('60000 ms');
  });

  it('takes the command limits from the config', async () => {
    const built = await served({
      config: { commands: { maxBytes: 100, maxLifetimeMs: 5000, defaultLifetimeMs: 1000, maxOpen: 7 } },
    });
    const form = built.components.schemas.CommandForm as { properties: Record<string, Json> };
    expect(form.properties.command).toMatchObject({ maxLength: 100 });
    expect(form.properties.command64).toMatchObject({ maxLength: 136 });
    expect(form.properties.lifetime).toMatchObject({ anyOf: [{ type: 'string' }, { maximum: 5000 }] });
    expect(form.properties.lifetime!.description).toContain('default 1000');
    const send = JSON.stringify(built.paths['/0/devices/{id}']!.post);
    expect(send).toContain('`commands.maxOpen` (7)');
  });

  it('declares every path parameter, and the history query of a variable', () => {
    for (const [path, ops] of Object.entries(doc.paths)) {
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
      for (const op of Object.values(ops)) {
        const declared = op.parameters.filter((p) => p.in === 'path').map((p) => p.name);
        expect(declared, `${op.operationId}: path parameters`).toEqual(names);
        for (const p of op.parameters.filter((q) => q.in === 'path')) expect(p.required).toBe(true);
      }
    }
    const params = operation('GET', '/0/devices/{id}/{type}/{name}').parameters;
    expect(params).toContainEqual(expect.objectContaining({ name: 'latest', in: 'query', required: false }));
    expect(params).toContainEqual(expect.objectContaining({ name: 'from', in: 'query', required: false }));
    const type = params.find((p) => p.name === 'type')!;
    expect(type.schema).toMatchObject({ enum: ['d', 's', 'meta'] });
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
    expect(check('HistoryList', [{ ...entry, deleted: true }])).toBe(true);
    expect(check('HistoryList', [{ ...entry, by: 'someone' }])).toBe(false);
    expect(check('VariableAnswer', 'connected')).toBe(true);
    expect(check('VariableAnswer', 5)).toBe(false);
    expect(check('ClaimResponse', { id: randomUUID() })).toBe(true);
    expect(check('ClaimResponse', { id: 'nope' })).toBe(false);
    const command = {
      id: randomUUID(),
      command: 'ping',
      priority: 0,
      state: 'sent',
      created: 1,
      expires: 2,
      sent: 1,
      delivered: null,
      started: null,
      finished: null,
      exitCode: null,
      signal: null,
      output: null,
      truncated: false,
      reason: null,
    };
    expect(check('Command', command)).toBe(true);
    expect(check('CommandList', [command, { ...command, state: 'done', exitCode: 0, output: 'pong' }])).toBe(true);
    expect(check('Command', { ...command, state: 'delivered' })).toBe(false);
    expect(check('Command', { ...command, finished: undefined })).toBe(false);
    const image = {
      name: 'a/b',
      platform: 'p',
      version: 1,
      info: { platforms: { from: ['p'], to: { platform: 'p', name: 'a/b' } } },
    };
    expect(check('FirmwareList', [image])).toBe(true);
    expect(check('FirmwareImage', { ...image, sha256: '0'.repeat(64) })).toBe(false);
    expect(check('FirmwareImage', { ...image, version: -1 })).toBe(false);
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

/** Who the device routes are driven as, and the devices they are driven against. */
interface DeviceWorld {
  /** Owns `own` and `spare`, and is near `nearby` and `foreign`. */
  owner: { sid: string; id: number };
  /** Owns `foreign`; sees nothing of the owner's. */
  stranger: { sid: string; id: number };
  /** A user of a frontend whose `nearby` is off, near `nearby` too. */
  far: { sid: string; app: string };
  own: SeededDevice;
  spare: SeededDevice;
  nearby: SeededDevice;
  foreign: SeededDevice;
  unclaimed: SeededDevice;
}

interface SeededDevice {
  id: string;
  authcode: string;
}

/**
 * A device as the bridge keeps it after its hello: an auth code, `meta` `state` and `unique`, a `d` variable
 * `led` with two versions (the device's, then a user's) and a binary `s` variable `blob`.
 */
async function seedDevice(opts: { owner?: number; heardBy?: number[] } = {}): Promise<SeededDevice> {
  const id = randomUUID();
  const authcode = randomBytes(16).toString('hex');
  const now = main.clock.now();
  const devices = main.store.devices;
  await main.store.write(() => {
    devices.touch(id, now);
    devices.setAuthcode(id, authcode);
    devices.setMeta(id, 'unique', id, now, 'device');
    devices.setMeta(id, 'state', 'connected', now, 'server');
    devices.putVersion(
      id,
      { type: 'd', name: 'led', value: Buffer.from('off'), time: now - 2, origin: 'device' },
      now,
      'device',
    );
    devices.putVersion(
      id,
      { type: 'd', name: 'led', value: Buffer.from('on'), time: now - 1, origin: 'cloud' },
      0,
      'user',
    );
    devices.putVersion(
      id,
      { type: 's', name: 'blob', value: Buffer.from([0xff, 0x00, 0x80]), time: now, origin: 'cloud' },
      now,
      'user',
    );
    if (opts.owner !== undefined) devices.claim(id, opts.owner, now);
    for (const user of opts.heardBy ?? []) devices.heard(id, user, now);
  });
  return { id, authcode };
}

async function deviceUser(app?: string): Promise<{ sid: string; id: number }> {
  const login = `device-user${++users}@example.com`;
  const r = await call(main.app, {
    url: `/0/session/signup${app ? `?app=${app}` : ''}`,
    form: { login, password: 'correct horse battery' },
  });
  expect(r.status).toBe(201);
  const user = main.store.userByLogin(app ?? main.defaultFrontend.id, login)!;
  return { sid: r.sid!, id: user.id };
}

let world: DeviceWorld;

async function makeWorld(): Promise<DeviceWorld> {
  const owner = await deviceUser();
  const stranger = await deviceUser();
  const farFrontend = main.addFrontend({ nearby: false });
  const far = await deviceUser(farFrontend.id);
  return {
    owner,
    stranger,
    far: { sid: far.sid, app: farFrontend.id },
    own: await seedDevice({ owner: owner.id }),
    spare: await seedDevice({ owner: owner.id }),
    nearby: await seedDevice({ heardBy: [owner.id, far.id] }),
    foreign: await seedDevice({ owner: stranger.id, heardBy: [owner.id] }),
    unclaimed: await seedDevice(),
  };
}

describe('a full disk', () => {
  it('answers 507 storage-full, as documented for every route that changes something', async () => {
    for (const [path, ops] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(ops)) {
        const has = op.responses['507'] !== undefined;
        expect(has, `${method} ${path}: 507 documented only for changes`).toBe(method !== 'get');
      }
    }
    const full = await startFullApp();
    try {
      // No write happens before the refused one: the signup's user, the login's session.
      full.store.createUser({
        frontendId: full.store.defaultFrontend()!.id,
        login: 'full@example.com',
        passwordHash: await new PasswordHasher({
          params: { logN: 10, r: 8, p: 1 },
          maxConcurrent: 1,
          maxQueued: 1,
        }).hash('pw-full-1234'),
        authcode: randomUUID().replace(/-/g, ''),
        now: Date.now(),
      });
      const cases: Array<[string, Call]> = [
        [
          '/0/session/signup',
          { url: '/0/session/signup', form: { login: 'new@example.com', password: 'pw-new-1234' } },
        ],
        [
          '/0/session/login',
          { url: '/0/session/login', form: { login: 'full@example.com', password: 'pw-full-1234' } },
        ],
      ];
      for (const [path, c] of cases) {
        const answer = await call(full.app, c);
        expect(answer.status, `POST ${path}: ${answer.body}`).toBe(507);
        expect(answer.body).toBe('storage-full');
        expectDocumented(operation('POST', path), answer, `POST ${path} on a full disk`);
      }
    } finally {
      await full.close();
    }
  });
});

describe('every device and network route answers what the document lists', () => {
  beforeAll(async () => {
    world = await makeWorld();
  });

  const get = (url: string, sid?: string) => () =>
    call(main.app, { method: 'GET', url, ...(sid ? { cookie: sid } : {}) });
  const del = (url: string, sid?: string) => () =>
    call(main.app, { method: 'DELETE', url, ...(sid ? { cookie: sid } : {}) });
  const post = (url: string, form: Record<string, string> | undefined, sid?: string) => () =>
    call(main.app, { url, ...(form ? { form } : {}), ...(sid ? { cookie: sid } : {}) });

  it('GET /0/devices/', async () => {
    await driveRoute('GET', '/0/devices/', [
      {
        name: "the owner's devices",
        status: 200,
        run: async () => {
          const r = await get('/0/devices/', world.owner.sid)();
          expect(Object.keys(JSON.parse(r.body) as Json).sort()).toEqual([world.own.id, world.spare.id].sort());
          return r;
        },
      },
      { name: 'no devices', status: 200, run: get(`/0/devices/?app=${world.far.app}`, world.far.sid) },
      { name: 'no session', status: 401, token: 'no-session', run: get('/0/devices/') },
    ]);
  });

  it('POST /0/devices/', async () => {
    const claim = (auth: string, sid?: string, accept?: string) => () =>
      call(main.app, {
        url: '/0/devices/',
        form: { auth },
        ...(sid ? { cookie: sid } : {}),
        ...(accept ? { accept } : {}),
      });
    await driveRoute('POST', '/0/devices/', [
      {
        name: 'an unclaimed device',
        status: 201,
        token: world.unclaimed.id,
        run: claim(world.unclaimed.authcode, world.owner.sid),
      },
      {
        name: 'the same claim again, asking for JSON',
        status: 201,
        run: async () => {
          const r = await claim(world.unclaimed.authcode.toUpperCase(), world.owner.sid, 'application/json')();
          expect(r.type).toBe('application/json');
          expect(JSON.parse(r.body)).toEqual({ id: world.unclaimed.id });
          return r;
        },
      },
      {
        name: "another user's device",
        status: 400,
        token: 'claim-fail',
        run: claim(world.own.authcode, world.stranger.sid),
      },
      {
        name: 'an unknown auth code',
        status: 400,
        token: 'claim-fail',
        run: claim(randomBytes(16).toString('hex'), world.owner.sid),
      },
      { name: 'a malformed auth code', status: 400, token: 'claim-fail', run: claim('not hex', world.owner.sid) },
      {
        name: 'malformed JSON',
        status: 400,
        token: 'claim-fail',
        run: () => call(main.app, { url: '/0/devices/', raw: MALFORMED_JSON, cookie: world.owner.sid }),
      },
      { name: 'no session', status: 401, token: 'no-session', run: claim(world.unclaimed.authcode) },
    ]);
  });

  it('GET /0/devices/{id}', async () => {
    const { own, nearby, foreign, owner, stranger } = world;
    await driveRoute(
      'GET',
      '/0/devices/{id}',
      [
        { name: 'an own device by uuid', status: 200, run: get(`/0/devices/${own.id}`, owner.sid) },
        { name: 'an own device by auth code', status: 200, run: get(`/0/devices/${own.authcode}`, owner.sid) },
        { name: 'a nearby unowned device', status: 200, run: get(`/0/devices/${nearby.authcode}`, owner.sid) },
        {
          name: 'a nearby device owned by another user',
          status: 404,
          token: 'device-fail',
          run: get(`/0/devices/${foreign.authcode}`, owner.sid),
        },
        {
          name: "another user's device",
          status: 404,
          token: 'device-fail',
          run: get(`/0/devices/${own.id}`, stranger.sid),
        },
        {
          name: 'an unknown device',
          status: 404,
          token: 'device-fail',
          run: get(`/0/devices/${randomUUID()}`, owner.sid),
        },
        { name: 'a malformed id', status: 404, token: 'device-fail', run: get('/0/devices/nope', owner.sid) },
        { name: 'no session', status: 401, token: 'no-session', run: get(`/0/devices/${own.id}`) },
      ],
      `/0/devices/${own.id}`,
    );
  });

  it('DELETE /0/devices/{id}', async () => {
    const { spare, nearby, own, owner, stranger } = world;
    await driveRoute(
      'DELETE',
      '/0/devices/{id}',
      [
        { name: 'an own device', status: 200, token: 'device-ok', run: del(`/0/devices/${spare.id}`, owner.sid) },
        {
          name: 'the same device again, now unregistered',
          status: 400,
          token: 'device-fail',
          run: del(`/0/devices/${spare.id}`, owner.sid),
        },
        {
          name: 'a nearby device the user does not own',
          status: 400,
          token: 'device-fail',
          run: del(`/0/devices/${nearby.authcode}`, owner.sid),
        },
        {
          name: "another user's device",
          status: 400,
          token: 'device-fail',
          run: del(`/0/devices/${own.id}`, stranger.sid),
        },
        { name: 'no session', status: 401, token: 'no-session', run: del(`/0/devices/${own.id}`) },
      ],
      `/0/devices/${own.id}`,
    );
  });

  it('GET /0/devices/{id}/{type}', async () => {
    const { own, nearby, owner, stranger } = world;
    await driveRoute(
      'GET',
      '/0/devices/{id}/{type}',
      [
        { name: 'd', status: 200, run: get(`/0/devices/${own.id}/d`, owner.sid) },
        { name: 's, with a binary value', status: 200, run: get(`/0/devices/${own.id}/s`, owner.sid) },
        { name: 'meta of a nearby device', status: 200, run: get(`/0/devices/${nearby.authcode}/meta`, owner.sid) },
        { name: 'an unknown type', status: 404, token: 'device-fail', run: get(`/0/devices/${own.id}/x`, owner.sid) },
        {
          name: "another user's device",
          status: 404,
          token: 'device-fail',
          run: get(`/0/devices/${own.id}/d`, stranger.sid),
        },
        { name: 'no session', status: 401, token: 'no-session', run: get(`/0/devices/${own.id}/d`) },
      ],
      `/0/devices/${own.id}/d`,
    );
  });

  it('GET /0/devices/{id}/{type}/{name}', async () => {
    const { own, owner, stranger } = world;
    const base = `/0/devices/${own.id}`;
    await call(main.app, { method: 'DELETE', url: `${base}/s/gone`, cookie: owner.sid });
    await call(main.app, { url: `${base}/s/gone`, form: { value: 'x' }, cookie: owner.sid });
    expect((await del(`${base}/s/gone`, owner.sid)()).body).toBe('device-ok');
    let newest = 0;
    await driveRoute(
      'GET',
      '/0/devices/{id}/{type}/{name}',
      [
        {
          name: 'a d variable',
          status: 200,
          run: async () => {
            const r = await get(`${base}/d/led`, owner.sid)();
            expect(JSON.parse(r.body)).toMatchObject({ value: 'on', acked: 0, synced: 0, syncacked: 0 });
            return r;
          },
        },
        {
          name: 'a binary s variable',
          status: 200,
          run: async () => {
            const r = await get(`${base}/s/blob`, owner.sid)();
            expect(JSON.parse(r.body)).toEqual({ value64: '/wCA', time: main.clock.now() });
            return r;
          },
        },
        {
          name: 'a meta variable, bare',
          status: 200,
          run: async () => {
            const r = await get(`${base}/meta/state`, owner.sid)();
            expect(JSON.parse(r.body)).toBe('connected');
            return r;
          },
        },
        {
          name: 'history, latest=1',
          status: 200,
          run: async () => {
            const r = await get(`${base}/d/led?latest=1`, owner.sid)();
            const entries = JSON.parse(r.body) as Array<{ id: number; value: string; by: string }>;
            expect(entries).toMatchObject([{ key: 'led', value: 'on', by: 'user', type: 'd' }]);
            newest = entries[0]!.id;
            return r;
          },
        },
        {
          name: 'history, from the newest entry back',
          status: 200,
          run: async () => {
            const r = await get(`${base}/d/led?from=${newest}`, owner.sid)();
            expect(JSON.parse(r.body)).toMatchObject([{ value: 'off', by: 'device' }]);
            return r;
          },
        },
        {
          name: 'history of a deleted variable',
          status: 200,
          run: async () => {
            const r = await get(`${base}/s/gone?latest=0`, owner.sid)();
            expect(JSON.parse(r.body)).toMatchObject([{ deleted: true, by: 'user' }, { value: 'x' }]);
            return r;
          },
        },
        {
          name: 'latest not a number',
          status: 400,
          token: 'device-fail',
          run: get(`${base}/d/led?latest=ten`, owner.sid),
        },
        { name: 'a negative from', status: 400, token: 'device-fail', run: get(`${base}/d/led?from=-1`, owner.sid) },
        { name: 'a deleted variable', status: 404, token: 'device-fail', run: get(`${base}/s/gone`, owner.sid) },
        { name: 'an unknown variable', status: 404, token: 'device-fail', run: get(`${base}/d/none`, owner.sid) },
        {
          name: "another user's device",
          status: 404,
          token: 'device-fail',
          run: get(`${base}/d/led`, stranger.sid),
        },
        { name: 'no session', status: 401, token: 'no-session', run: get(`${base}/d/led`) },
      ],
      `${base}/d/led`,
    );
  });

  it('POST /0/devices/{id}/{type}/{name}', async () => {
    const { own, nearby, owner, stranger } = world;
    const base = `/0/devices/${own.id}`;
    await driveRoute(
      'POST',
      '/0/devices/{id}/{type}/{name}',
      [
        {
          name: 'a d value',
          status: 200,
          token: 'device-ok',
          run: post(`${base}/d/led`, { value: 'blink' }, owner.sid),
        },
        {
          name: 'an s value in base64, with a value that loses',
          status: 200,
          token: 'device-ok',
          run: async () => {
            const r = await post(`${base}/s/raw`, { value: 'ignored', value64: '/wCA' }, owner.sid)();
            const rec = JSON.parse((await get(`${base}/s/raw`, owner.sid)()).body) as Json;
            expect(rec).toMatchObject({ value64: '/wCA' });
            return r;
          },
        },
        { name: 'a d sync', status: 200, token: 'device-ok', run: post(`${base}/d/led`, undefined, owner.sid) },
        {
          name: 'a d value on a nearby unowned device',
          status: 200,
          token: 'device-ok',
          run: post(`/0/devices/${nearby.authcode}/d/led`, { value: 'near' }, owner.sid),
        },
        {
          name: 'a meta variable',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/meta/state`, { value: 'x' }, owner.sid),
        },
        {
          name: 'an s variable with no value',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/s/raw`, undefined, owner.sid),
        },
        {
          name: 'a sync of no variable',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/d/none`, undefined, owner.sid),
        },
        {
          name: 'value64 not base64',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/s/raw`, { value64: 'abc' }, owner.sid),
        },
        {
          name: 'a value over devices.maxValueBytes',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/s/raw`, { value: 'x'.repeat(main.config.devices.maxValueBytes + 1) }, owner.sid),
        },
        {
          name: "another user's device",
          status: 400,
          token: 'device-fail',
          run: post(`${base}/d/led`, { value: 'x' }, stranger.sid),
        },
        {
          name: 'malformed JSON',
          status: 400,
          token: 'device-fail',
          run: () => call(main.app, { url: `${base}/d/led`, raw: MALFORMED_JSON, cookie: owner.sid }),
        },
        {
          name: 'a JSON array, which is not fields and so not a sync',
          status: 400,
          token: 'device-fail',
          run: () => call(main.app, { url: `${base}/d/led`, json: ['on'], cookie: owner.sid }),
        },
        { name: 'no session', status: 401, token: 'no-session', run: post(`${base}/d/led`, { value: 'x' }) },
      ],
      `${base}/d/led`,
    );
  });

  it('DELETE /0/devices/{id}/{type}/{name}', async () => {
    const { own, owner, stranger } = world;
    const base = `/0/devices/${own.id}`;
    await post(`${base}/d/temp`, { value: '21' }, owner.sid)();
    await driveRoute(
      'DELETE',
      '/0/devices/{id}/{type}/{name}',
      [
        { name: 'a d variable', status: 200, token: 'device-ok', run: del(`${base}/d/temp`, owner.sid) },
        { name: 'the same again', status: 400, token: 'device-fail', run: del(`${base}/d/temp`, owner.sid) },
        { name: 'a meta variable', status: 400, token: 'device-fail', run: del(`${base}/meta/state`, owner.sid) },
        { name: "another user's device", status: 400, token: 'device-fail', run: del(`${base}/d/led`, stranger.sid) },
        { name: 'no session', status: 401, token: 'no-session', run: del(`${base}/d/led`) },
      ],
      `${base}/d/led`,
    );
  });

  it('GET /0/network/', async () => {
    const { owner, nearby, foreign, far } = world;
    await driveRoute('GET', '/0/network/', [
      {
        name: 'nearby devices: the unowned one, not the one another user owns',
        status: 200,
        run: async () => {
          const r = await get('/0/network/', owner.sid)();
          const keys = Object.keys(JSON.parse(r.body) as Json);
          expect(keys).toContain(nearby.authcode);
          expect(keys).not.toContain(foreign.authcode);
          return r;
        },
      },
      {
        name: 'a frontend whose nearby is off',
        status: 200,
        run: async () => {
          const r = await get(`/0/network/?app=${far.app}`, far.sid)();
          expect(r.body).toBe('{}');
          return r;
        },
      },
      { name: 'no session', status: 401, token: 'no-session', run: get('/0/network/') },
    ]);
  });
});

describe('the firmware route answers what the document lists', () => {
  it('GET /0/firmware/', async () => {
    const user = await newUser();
    // A record as `devcloud-bridge firmware add` writes it; the listing does not read the image file.
    main.store.firmware.add({
      name: 'acme/sensor/3',
      platform: 'linux-x64',
      version: 3,
      from: ['linux-x64', 'linux-arm64'],
      toPlatform: 'linux-x64',
      size: 1,
      sha256: '0'.repeat(64),
      signature: 'AA==',
      addedAt: 1,
    });
    const get = (sid?: string) => () =>
      call(main.app, { method: 'GET', url: '/0/firmware/', ...(sid ? { cookie: sid } : {}) });
    await driveRoute('GET', '/0/firmware/', [
      {
        name: 'the catalog',
        status: 200,
        run: async () => {
          const r = await get(user.sid)();
          expect(JSON.parse(r.body)).toMatchObject([{ name: 'acme/sensor/3', version: 3 }]);
          return r;
        },
      },
      { name: 'no session', status: 401, token: 'no-session', run: get() },
    ]);
  });
});

/** A message the bridge hands its link for a device, as the device decodes it. */
type DownMessage = { [K in DownTopic]: { deviceId: string; name: K; payload: Payloads[K] } }[DownTopic];

/**
 * The main bridge (its store, config and clock) served by a second app whose device side has a link, as
 * `devcloud-bridge run` attaches one: the main app has none, so it could start no update. What goes down is
 * encoded and decoded as on the wire and recorded, and refused while `link.up` is false. `report` hands the
 * device side a message a device published, as the link does.
 */
interface LinkedApp {
  app: FastifyInstance;
  sent: DownMessage[];
  link: { up: boolean };
  report(msg: UpMessage): Promise<void>;
  close(): Promise<void>;
}

async function startLinkedApp(): Promise<LinkedApp> {
  const log = createLogger({ level: 'silent', pretty: 'never', base: {}, destination: new LogSink() });
  const devices = new DeviceService({
    store: main.store,
    log,
    now: main.clock.now,
    nearbyWindowMs: main.config.devices.nearbyWindowMs,
    lastActivityMs: main.config.devices.lastActivityMs,
  });
  const sent: DownMessage[] = [];
  const link = { up: true };
  devices.attach((deviceId, name, payload) => {
    if (!link.up) return false;
    const decoded = decode(name, encode(name, payload));
    if (!decoded.ok) throw new Error(`${name} to ${deviceId} is not what the topic carries: ${decoded.reason}`);
    sent.push({ deviceId, name, payload: decoded.value } as DownMessage);
    return true;
  });
  const hasher = new PasswordHasher({ params: { logN: 10, r: 8, p: 1 }, maxConcurrent: 1, maxQueued: 1 });
  const app = buildApp({
    config: main.config,
    store: main.store,
    hasher,
    mailer: main.mailer,
    log,
    now: main.clock.now,
    devices,
    checkAnswers: true,
  });
  await app.ready();
  return {
    app,
    sent,
    link,
    async report(msg) {
      await devices.handle(msg);
      // `handle` never throws: a failure shows as a count.
      expect(devices.counters.failed, `${msg.name} from ${msg.deviceId} was handled`).toBe(0);
    },
    close: () => app.close(),
  };
}

describe('every firmware job route answers what the document lists', () => {
  const NAME = 'gateways/linux-x64/rootfs-7';
  /** For devices that run another platform. */
  const ARM = 'gateways/linux-arm64/rootfs-7';
  /** A name `devcloud-bridge firmware add` refuses, recorded here anyway: only the name check can refuse it. */
  const DOTTED = 'gateways/../rootfs-7';
  const IMAGE = randomBytes(64 * 1024);
  let sha256 = '';
  /** The key the catalog's images are signed with, as a device holds it. */
  let publicKey = '';
  let linked: LinkedApp;
  let owner: { sid: string; id: number };
  let stranger: { sid: string; id: number };
  /** The time of the next `d` `mode` a device reports: newer than any before. */
  let modeTime = 0;

  type FwStart = Extract<FwMessage, { action: 'start' }>;
  /** The `down/fw` messages sent to a device, oldest first. */
  const fwSent = (deviceId: string): FwMessage[] =>
    linked.sent.flatMap((m) => (m.deviceId === deviceId && m.name === 'down/fw' ? [m.payload] : []));
  const lastStart = (deviceId: string): FwStart => {
    const m = fwSent(deviceId).at(-1);
    if (m?.action !== 'start') throw new Error(`no start went to ${deviceId}`);
    return m;
  };
  const openJob = (deviceId: string) => main.store.fwJobs.openOf(deviceId);

  const reportMeta = (deviceId: string, meta: Record<string, string>) =>
    linked.report({ deviceId, name: 'up/meta', payload: { id: messageId(), ts: main.clock.now(), meta } });
  const reportState = (deviceId: string, state: 'online' | 'offline') =>
    linked.report({ deviceId, name: 'state', payload: state });
  const reportMode = (deviceId: string, mode: 'connected' | 'master') =>
    linked.report({
      deviceId,
      name: 'up/vars',
      payload: {
        id: messageId(),
        items: [{ kind: 'push', type: 'd', name: 'mode', value: mode, time: ++modeTime, origin: 'device' }],
      },
    });

  /**
   * A device on linux-x64 as its hello leaves it, online and in mode connected, claimed by `owner` (through the
   * API) unless `claim` is false.
   */
  async function fwDevice(opts: { claim?: boolean } = {}): Promise<SeededDevice> {
    const id = randomUUID();
    const authcode = randomBytes(16).toString('hex');
    const t = main.clock.now();
    await reportState(id, 'online');
    await linked.report({
      deviceId: id,
      name: 'up/hello',
      payload: {
        id: messageId(),
        protocol: 1,
        deviceId: id,
        authcode,
        platform: 'linux-x64',
        agentVersion: '0.1.0',
        fwVersion: '6',
        mode: 'connected',
        bootTime: t,
        ts: t,
      },
    });
    await reportMode(id, 'connected');
    if (opts.claim !== false) {
      const r = await call(main.app, { url: '/0/devices/', form: { auth: authcode }, cookie: owner.sid });
      expect(r.status).toBe(201);
    }
    return { id, authcode };
  }

  /** Starts an update of `NAME` on a device; the start message it sent. */
  async function startJob(deviceId: string): Promise<FwStart> {
    const r = await call(linked.app, { url: `/0/devices/${deviceId}/fw/${NAME}`, cookie: owner.sid });
    expect([r.status, r.body]).toEqual([200, 'device-ok']);
    return lastStart(deviceId);
  }

  /** Past the token lifetime of every job started so far. */
  const expireTokens = () => main.clock.advance(main.config.firmware.tokenHours * 3_600_000 + 1);

  beforeAll(async () => {
    linked = await startLinkedApp();
    modeTime = main.clock.now();
    owner = await deviceUser();
    stranger = await deviceUser();
    // The catalog: the image's file as `devcloud-bridge firmware add` imports it, under three records.
    const dir = tempDir('devcloud-openapi-fw-');
    const file = join(dir, 'image.bin');
    writeFileSync(file, IMAGE);
    const imported = await importImage(main.store.firmware.imageDir, file);
    rmSync(dir, { recursive: true, force: true });
    sha256 = imported.sha256;
    const keys = generateKeyPairSync('ed25519');
    const key = keys.privateKey.export({ type: 'pkcs8', format: 'pem' });
    publicKey = keys.publicKey.export({ type: 'spki', format: 'pem' }).toString();
    for (const [name, platform] of [
      [NAME, 'linux-x64'],
      [DOTTED, 'linux-x64'],
      [ARM, 'linux-arm64'],
    ] as const) {
      const identity = { name, platform, version: 7, size: imported.size, sha256 };
      main.store.firmware.add({
        ...identity,
        from: [platform],
        // Another platform afterwards: the one the image is built for is what its signature covers.
        toPlatform: `${platform}-r7`,
        signature: signFirmware(identity, key),
        addedAt: main.clock.now(),
      });
    }
  });

  afterAll(async () => {
    await linked?.close();
  });

  for (const prefix of ['fw', 'firmware']) {
    it(`POST /0/devices/{id}/${prefix}/{image}`, async () => {
      const dev = await fwDevice();
      const nearby = await fwDevice({ claim: false });
      await main.store.write(() => main.store.devices.heard(nearby.id, owner.id, main.clock.now()));
      const base = `/0/devices/${dev.id}/${prefix}`;
      const post =
        (url: string, sid: string | null = owner.sid) =>
        () =>
          call(linked.app, { url, ...(sid ? { cookie: sid } : {}) });
      /**
       * A start refused for one reason: nothing went to the device and no job is open; once `undo` takes the
       * reason away, the start (or `retry`, the same but for the reason) answers 200, and that job is ended.
       */
      const refusedFor = async (
        start: () => Promise<Answer>,
        undo: () => Promise<void> | void,
        retry = start,
      ): Promise<Answer> => {
        const sent = fwSent(dev.id).length;
        const r = await start();
        expect(fwSent(dev.id), 'nothing went to the device').toHaveLength(sent);
        expect(openJob(dev.id), 'no job is open').toBeUndefined();
        await undo();
        expect((await retry()).body, 'the start once the reason is gone').toBe('device-ok');
        await reportMeta(dev.id, { fwstate: 'failed' });
        expect(openJob(dev.id)).toBeUndefined();
        return r;
      };
      const startIt = post(`${base}/${NAME}`);
      let expired = '';
      await driveRoute(
        `POST`,
        `/0/devices/{id}/${prefix}/{image}`,
        [
          {
            name: 'an image in the catalog, its name with slashes',
            status: 200,
            token: 'device-ok',
            run: async () => {
              const r = await post(`${base}/${NAME}`)();
              const start = lastStart(dev.id);
              expect(start).toMatchObject({
                name: NAME,
                version: 7,
                platform: 'linux-x64',
                size: IMAGE.length,
                sha256,
              });
              // What the agent checks before it downloads: the signature over the fields the start names.
              expect(verifyFirmware(start, start.signature, [publicKey])).toBe(0);
              expect(new URL(start.url).pathname).toBe(`/0/firmware/jobs/${start.job}/image`);
              expect(openJob(dev.id)).toMatchObject({ id: start.job, name: NAME, cancelled: false });
              return r;
            },
          },
          {
            name: 'an update running: the open job',
            status: 400,
            token: 'device-fwup-start-fail',
            run: async () => {
              const sent = fwSent(dev.id).length;
              const r = await post(`${base}/${NAME}`)();
              expect(fwSent(dev.id)).toHaveLength(sent);
              return r;
            },
          },
          {
            name: 'an update running: the device reports one, with no job open',
            status: 400,
            token: 'device-fwup-start-fail',
            run: async () => {
              await reportMeta(dev.id, { fwstate: 'cancelled' });
              expect(openJob(dev.id)).toBeUndefined();
              await reportMeta(dev.id, { fwstate: 'downloading' });
              return refusedFor(startIt, () => reportMeta(dev.id, { fwstate: 'failed' }));
            },
          },
          {
            name: 'the job cannot be handed to the link',
            status: 400,
            token: 'device-fwup-start-fail',
            run: async () => {
              linked.link.up = false;
              // The job ends at once: nothing is running.
              return refusedFor(startIt, () => {
                linked.link.up = true;
              });
            },
          },
          {
            name: 'not connected in d mode',
            status: 400,
            token: 'device-fwup-start-fail',
            run: async () => {
              await reportMode(dev.id, 'master');
              return refusedFor(startIt, () => reportMode(dev.id, 'connected'));
            },
          },
          {
            name: 'not connected in meta state',
            status: 400,
            token: 'device-fwup-start-fail',
            run: async () => {
              await reportState(dev.id, 'offline');
              expect(main.store.devices.getVar(dev.id, 'meta', 'state')?.value?.toString()).toBe('disconnected');
              return refusedFor(startIt, () => reportState(dev.id, 'online'));
            },
          },
          {
            name: 'a platform the image does not update from',
            status: 400,
            token: 'device-fwup-start-fail',
            run: () => refusedFor(post(`${base}/${ARM}`), () => undefined, startIt),
          },
          {
            name: 'a nearby device with no owner, by auth code',
            status: 200,
            token: 'device-ok',
            run: async () => {
              const r = await post(`/0/devices/${nearby.authcode}/${prefix}/${NAME}`)();
              expect(lastStart(nearby.id).name).toBe(NAME);
              return r;
            },
          },
          {
            name: 'an unknown name',
            status: 400,
            token: 'device-fwup-name-fail',
            run: post(`${base}/gateways/linux-x64/rootfs-8`),
          },
          {
            // Its slashes encoded, so that no client resolves the `..` away before the route reads it.
            name: 'a name with .. in it, though in the catalog',
            status: 400,
            token: 'device-fwup-name-fail',
            run: post(`${base}/${DOTTED.replaceAll('/', '%2F')}`),
          },
          {
            name: 'a path with a .. segment, which the client resolves: an unknown name',
            status: 400,
            token: 'device-fwup-name-fail',
            run: post(`${base}/${DOTTED}`),
          },
          {
            name: 'with all in order again',
            status: 200,
            token: 'device-ok',
            run: async () => {
              const r = await startIt();
              expired = lastStart(dev.id).job;
              return r;
            },
          },
          {
            name: 'a job whose token expired while the device reports nothing running',
            status: 200,
            token: 'device-ok',
            run: async () => {
              expireTokens();
              const r = await post(`${base}/${NAME}`)();
              expect(main.store.fwJobs.get(expired)).toMatchObject({ open: false, outcome: 'abandoned' });
              expect(openJob(dev.id)?.id).toBe(lastStart(dev.id).job);
              return r;
            },
          },
          {
            name: "another user's device",
            status: 400,
            token: 'device-fail',
            run: post(`${base}/${NAME}`, stranger.sid),
          },
          {
            name: 'an unknown device',
            status: 400,
            token: 'device-fail',
            run: post(`/0/devices/${randomUUID()}/${prefix}/${NAME}`),
          },
          {
            name: 'malformed JSON',
            status: 400,
            token: 'device-fwup-start-fail',
            run: () => call(linked.app, { url: `${base}/${NAME}`, raw: MALFORMED_JSON, cookie: owner.sid }),
          },
          { name: 'no session', status: 401, token: 'no-session', run: post(`${base}/${NAME}`, null) },
        ],
        `${base}/${NAME}`,
      );
    });

    it(`DELETE /0/devices/{id}/${prefix}`, async () => {
      const before = await fwDevice();
      const after = await fwDevice();
      const idle = await fwDevice();
      const job = (await startJob(before.id)).job;
      await startJob(after.id);
      await reportMeta(before.id, { fwstate: 'downloading', fwprogress: '40' });
      const del =
        (id: string, sid: string | null = owner.sid) =>
        () =>
          call(linked.app, { method: 'DELETE', url: `/0/devices/${id}/${prefix}`, ...(sid ? { cookie: sid } : {}) });
      const afterSwitch = (fwstate: string): Case => ({
        name: `after the switch: ${fwstate}`,
        status: 400,
        token: 'firmware-fail',
        run: async () => {
          await reportMeta(after.id, { fwstate });
          const sent = fwSent(after.id).length;
          const r = await del(after.id)();
          expect(fwSent(after.id)).toHaveLength(sent);
          return r;
        },
      });
      await driveRoute(
        'DELETE',
        `/0/devices/{id}/${prefix}`,
        [
          {
            name: 'the cancel cannot be handed to the link',
            status: 400,
            token: 'firmware-fail',
            run: async () => {
              linked.link.up = false;
              const r = await del(before.id)();
              linked.link.up = true;
              expect(main.store.fwJobs.get(job)).toMatchObject({ open: true, cancelled: false });
              return r;
            },
          },
          {
            name: 'before the switch',
            status: 200,
            token: 'firmware-ok',
            run: async () => {
              const r = await del(before.id)();
              expect(fwSent(before.id).at(-1)).toMatchObject({ action: 'cancel', job });
              expect(main.store.fwJobs.get(job)).toMatchObject({ open: true, cancelled: true });
              return r;
            },
          },
          afterSwitch('switching'),
          afterSwitch('restarting'),
          afterSwitch('committing'),
          afterSwitch('rollingback'),
          { name: 'nothing running', status: 400, token: 'firmware-fail', run: del(idle.id) },
          {
            name: 'the device confirmed the cancel: nothing running',
            status: 400,
            token: 'firmware-fail',
            run: async () => {
              await reportMeta(before.id, { fwstate: 'cancelled' });
              expect(main.store.fwJobs.get(job)).toMatchObject({ open: false, outcome: 'cancelled' });
              return del(before.id)();
            },
          },
          { name: "another user's device", status: 400, token: 'firmware-fail', run: del(after.id, stranger.sid) },
          {
            name: 'malformed JSON',
            status: 400,
            token: 'firmware-fail',
            run: () =>
              call(linked.app, {
                method: 'DELETE',
                url: `/0/devices/${before.id}/${prefix}`,
                raw: MALFORMED_JSON,
                cookie: owner.sid,
              }),
          },
          { name: 'no session', status: 401, token: 'no-session', run: del(before.id, null) },
        ],
        `/0/devices/${before.id}/${prefix}`,
      );
    });
  }

  it('GET /0/firmware/jobs/{job}/image', async () => {
    const dev = await fwDevice();
    const other = await fwDevice();
    const ended = await fwDevice();
    const start = await startJob(dev.id);
    const otherStart = await startJob(other.id);
    const endedStart = await startJob(ended.id);
    await reportMeta(ended.id, { fwstate: 'failed' });
    const path = new URL(start.url).pathname;
    const auth = `Bearer ${start.token}`;
    const get =
      (headers: Record<string, string>, url = path) =>
      () =>
        call(linked.app, { method: 'GET', url, headers });
    const size = IMAGE.length;
    /** A 200 or 206 with these bytes of the image. */
    const bytes = (from: number, to: number, run: () => Promise<Answer>) => async () => {
      const r = await run();
      expect(r.bytes.equals(IMAGE.subarray(from, to + 1)), 'the bytes of the image').toBe(true);
      expect(r.headers['accept-ranges']).toBe('bytes');
      expect(r.headers['cache-control']).toBe('no-store');
      expect(Number(r.headers['content-length'])).toBe(to - from + 1);
      if (r.status === 206) expect(r.headers['content-range']).toBe(`bytes ${from}-${to}/${size}`);
      return r;
    };
    const unsatisfiable = (range: string): Case => ({
      name: `Range: ${range}`,
      status: 416,
      run: async () => {
        const r = await get({ authorization: auth, range })();
        expect(r.headers['content-range']).toBe(`bytes */${size}`);
        return r;
      },
    });
    const refused = (name: string, run: () => Promise<Answer>): Case => ({
      name,
      status: 401,
      token: 'unauthorized',
      run,
    });
    await driveRoute(
      'GET',
      '/0/firmware/jobs/{job}/image',
      [
        { name: 'the whole image', status: 200, run: bytes(0, size - 1, get({ authorization: auth })) },
        {
          name: 'the job uuid in upper case, and an app that names no frontend: the route reads none',
          status: 200,
          run: bytes(
            0,
            size - 1,
            get({ authorization: auth }, `/0/firmware/jobs/${start.job.toUpperCase()}/image?app=${randomUUID()}`),
          ),
        },
        {
          name: 'Range: bytes=1000-',
          status: 206,
          run: bytes(1000, size - 1, get({ authorization: auth, range: 'bytes=1000-' })),
        },
        {
          name: 'Range: bytes=10-19',
          status: 206,
          run: bytes(10, 19, get({ authorization: auth, range: 'bytes=10-19' })),
        },
        {
          name: 'a range past the end, cut at it',
          status: 206,
          run: bytes(size - 5, size - 1, get({ authorization: auth, range: `bytes=${size - 5}-${size + 100}` })),
        },
        {
          name: 'Range: bytes=-100, the last 100 bytes',
          status: 206,
          run: bytes(size - 100, size - 1, get({ authorization: auth, range: 'bytes=-100' })),
        },
        {
          name: 'a Range in another unit is ignored: the whole image',
          status: 200,
          run: bytes(0, size - 1, get({ authorization: auth, range: 'items=0-1' })),
        },
        unsatisfiable('bytes=-0'),
        unsatisfiable(`bytes=${size}-`),
        unsatisfiable('bytes=20-10'),
        unsatisfiable('bytes=0-1,5-6'),
        refused('a wrong token', get({ authorization: `Bearer ${randomBytes(32).toString('base64url')}` })),
        refused('no token', get({})),
        refused('another scheme', get({ authorization: `Basic ${start.token}` })),
        refused("another open job's token", get({ authorization: `Bearer ${otherStart.token}` })),
        refused('an unknown job', get({ authorization: auth }, `/0/firmware/jobs/${randomUUID()}/image`)),
        refused('a job that is not a uuid', get({ authorization: auth }, '/0/firmware/jobs/latest/image')),
        refused(
          'a job that ended',
          get({ authorization: `Bearer ${endedStart.token}` }, new URL(endedStart.url).pathname),
        ),
        refused('an expired token', () => {
          expireTokens();
          return get({ authorization: auth })();
        }),
      ],
      path,
    );
  });
});

describe('every command route answers what the document lists', () => {
  const maxOpen = () => main.config.commands.maxOpen;
  let owner: { sid: string; id: number };
  let stranger: { sid: string; id: number };
  /** Owned by `owner`, connected (there is no broker here: commands stay `queued`). */
  let own: SeededDevice;
  /** Heard `owner` nearby and has no owner. */
  let nearby: SeededDevice;
  /** Owned by `owner`, with `commands.maxOpen` commands not finished. */
  let full: SeededDevice;
  /** A command `own` ran, and one of bytes that are not printable ASCII. */
  let ran: string;
  let binary: string;

  const get = (url: string, sid?: string) => () =>
    call(main.app, { method: 'GET', url, ...(sid ? { cookie: sid } : {}) });
  const post = (url: string, form: Record<string, string> | undefined, sid?: string) => () =>
    call(main.app, { url, ...(form ? { form } : {}), ...(sid ? { cookie: sid } : {}) });
  const postJson = (url: string, json: unknown, sid: string) => () => call(main.app, { url, json, cookie: sid });

  /** The command a 200 answered, as the bridge stored it. */
  function stored(answer: Answer) {
    expect(answer.body).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    const c = main.store.commands.get(answer.body);
    expect(c, 'stored before the answer').toBeDefined();
    return c!;
  }

  beforeAll(async () => {
    owner = await deviceUser();
    stranger = await deviceUser();
    own = await seedDevice({ owner: owner.id });
    nearby = await seedDevice({ heardBy: [owner.id] });
    full = await seedDevice({ owner: owner.id });
    ran = randomUUID();
    binary = randomUUID();
    const t = main.clock.now();
    const commands = main.store.commands;
    const add = (id: string, deviceId: string, command: Buffer) =>
      commands.add({ id, deviceId, userId: owner.id, command, priority: 1, createdAt: t, expiresAt: t + 60_000 });
    await main.store.write(() => {
      // As the device's reports leave a command it ran: delivered, running, done.
      add(ran, own.id, Buffer.from('greet the team'));
      commands.markSent(ran, t);
      commands.report(own.id, { id: 'r1', cmd: ran, state: 'queued', at: t + 1 });
      commands.report(own.id, { id: 'r2', cmd: ran, state: 'running', at: t + 2 });
      commands.report(own.id, {
        id: 'r3',
        cmd: ran,
        state: 'done',
        at: t + 3,
        exitCode: 0,
        signal: null,
        output: 'hello, the team\n',
      });
      add(binary, own.id, Buffer.from([0x62, 0x00, 0xff]));
      for (let i = 0; i < maxOpen(); i++) add(randomUUID(), full.id, Buffer.from(`ping ${i}`));
    });
  });

  it('POST /0/devices/{id}', async () => {
    const url = `/0/devices/${own.id}`;
    const limits = main.config.commands;
    await driveRoute(
      'POST',
      '/0/devices/{id}',
      [
        {
          name: 'a command, with the default priority and lifetime',
          status: 200,
          run: async () => {
            const r = await post(url, { command: 'ping' }, owner.sid)();
            const c = stored(r);
            expect(c).toMatchObject({ deviceId: own.id, priority: 0, state: 'queued' });
            expect(c.command.toString()).toBe('ping');
            expect(c.expiresAt - c.createdAt).toBe(limits.defaultLifetimeMs);
            return r;
          },
        },
        {
          name: 'command64, priority and lifetime as JSON numbers, by auth code with a trailing slash',
          status: 200,
          run: async () => {
            const r = await postJson(
              `/0/devices/${own.authcode}/`,
              { command64: 'YgD/', priority: 2, lifetime: 5000 },
              owner.sid,
            )();
            const c = stored(r);
            expect(c.command).toEqual(Buffer.from([0x62, 0x00, 0xff]));
            expect(c.priority).toBe(2);
            expect(c.expiresAt - c.createdAt).toBe(5000);
            return r;
          },
        },
        {
          name: 'command and command64: command64 wins',
          status: 200,
          run: async () => {
            const r = await post(url, { command: 'ignored', command64: 'cGluZw==', priority: '1' }, owner.sid)();
            expect(stored(r).command.toString()).toBe('ping');
            return r;
          },
        },
        {
          name: 'a nearby unowned device',
          status: 200,
          run: post(`/0/devices/${nearby.authcode}`, { command: 'ping' }, owner.sid),
        },
        {
          name: 'priority 3',
          status: 400,
          token: 'device-fail',
          run: post(url, { command: 'ping', priority: '3' }, owner.sid),
        },
        {
          name: 'lifetime 0',
          status: 400,
          token: 'device-fail',
          run: post(url, { command: 'ping', lifetime: '0' }, owner.sid),
        },
        {
          name: 'a lifetime over commands.maxLifetimeMs',
          status: 400,
          token: 'device-fail',
          run: post(url, { command: 'ping', lifetime: String(limits.maxLifetimeMs + 1) }, owner.sid),
        },
        {
          name: 'a command that is not printable ASCII',
          status: 400,
          token: 'device-fail',
          run: post(url, { command: 'café' }, owner.sid),
        },
        {
          name: 'command64 not base64',
          status: 400,
          token: 'device-fail',
          run: post(url, { command64: 'abc' }, owner.sid),
        },
        {
          name: 'command64 decoding to more than commands.maxBytes',
          status: 400,
          token: 'device-fail',
          run: post(url, { command64: Buffer.alloc(limits.maxBytes + 1).toString('base64') }, owner.sid),
        },
        { name: 'no command', status: 400, token: 'device-fail', run: post(url, { priority: '1' }, owner.sid) },
        {
          name: 'a full queue',
          status: 400,
          token: 'device-fail',
          run: async () => {
            expect(main.store.commands.openCount(full.id)).toBe(maxOpen());
            return post(`/0/devices/${full.id}`, { command: 'ping' }, owner.sid)();
          },
        },
        {
          name: "another user's device",
          status: 400,
          token: 'device-fail',
          run: post(url, { command: 'ping' }, stranger.sid),
        },
        {
          name: 'malformed JSON',
          status: 400,
          token: 'device-fail',
          run: () => call(main.app, { url, raw: MALFORMED_JSON, cookie: owner.sid }),
        },
        {
          name: 'a JSON array',
          status: 400,
          token: 'device-fail',
          run: () => call(main.app, { url, json: ['ping'], cookie: owner.sid }),
        },
        { name: 'no session', status: 401, token: 'no-session', run: post(url, { command: 'ping' }) },
      ],
      url,
    );
    expect(main.store.commands.openCount(full.id)).toBe(maxOpen());
  });

  it('POST /0/devices/{id}/{command}', async () => {
    const base = `/0/devices/${own.id}`;
    await driveRoute(
      'POST',
      '/0/devices/{id}/{command}',
      [
        {
          name: 'a command, with the default priority and lifetime',
          status: 200,
          run: async () => {
            const r = await post(`${base}/ping`, undefined, owner.sid)();
            const c = stored(r);
            expect(c.command.toString()).toBe('ping');
            expect(c.priority).toBe(0);
            expect(c.expiresAt - c.createdAt).toBe(main.config.commands.defaultLifetimeMs);
            return r;
          },
        },
        {
          name: 'a percent-encoded command with spaces',
          status: 200,
          run: async () => {
            const r = await post(`${base}/greet%20the%20team`, undefined, owner.sid)();
            expect(stored(r).command.toString()).toBe('greet the team');
            return r;
          },
        },
        {
          name: 'a reserved segment',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/meta`, undefined, owner.sid),
        },
        {
          name: 'a command that is not printable ASCII',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/caf%C3%A9`, undefined, owner.sid),
        },
        {
          name: 'a segment longer than the router takes',
          status: 400,
          token: 'device-fail',
          run: post(`${base}/${'x'.repeat(300)}`, undefined, owner.sid),
        },
        {
          name: 'a full queue',
          status: 400,
          token: 'device-fail',
          run: post(`/0/devices/${full.id}/ping`, undefined, owner.sid),
        },
        {
          name: "another user's device",
          status: 400,
          token: 'device-fail',
          run: post(`${base}/ping`, undefined, stranger.sid),
        },
        {
          name: 'malformed JSON',
          status: 400,
          token: 'device-fail',
          run: () => call(main.app, { url: `${base}/ping`, raw: MALFORMED_JSON, cookie: owner.sid }),
        },
        { name: 'no session', status: 401, token: 'no-session', run: post(`${base}/ping`, undefined) },
      ],
      `${base}/ping`,
    );
  });

  it('GET /0/devices/{id}/commands/', async () => {
    const base = `/0/devices/${own.id}/commands/`;
    await driveRoute(
      'GET',
      '/0/devices/{id}/commands/',
      [
        {
          name: 'the commands, newest first',
          status: 200,
          run: async () => {
            const r = await get(base, owner.sid)();
            const list = JSON.parse(r.body) as Array<{ id: string; command?: string; command64?: string }>;
            const ids = list.map((c) => c.id);
            expect(ids.indexOf(binary)).toBeLessThan(ids.indexOf(ran));
            expect(list.find((c) => c.id === binary)).toMatchObject({ command64: 'YgD/' });
            expect(list.find((c) => c.id === binary)).not.toHaveProperty('command');
            return r;
          },
        },
        {
          name: 'latest=1',
          status: 200,
          run: async () => {
            const r = await get(`${base}?latest=1`, owner.sid)();
            expect(JSON.parse(r.body)).toHaveLength(1);
            return r;
          },
        },
        {
          name: 'latest=0: up to 1000',
          status: 200,
          run: async () => {
            const r = await get(`/0/devices/${full.id}/commands/?latest=0`, owner.sid)();
            expect(JSON.parse(r.body)).toHaveLength(Math.min(maxOpen(), 1000));
            return r;
          },
        },
        {
          name: 'a nearby device, by auth code',
          status: 200,
          run: get(`/0/devices/${nearby.authcode}/commands`, owner.sid),
        },
        {
          name: 'latest not a number',
          status: 400,
          token: 'device-fail',
          run: get(`${base}?latest=ten`, owner.sid),
        },
        { name: "another user's device", status: 404, token: 'device-fail', run: get(base, stranger.sid) },
        {
          name: 'an unknown device',
          status: 404,
          token: 'device-fail',
          run: get(`/0/devices/${randomUUID()}/commands/`, owner.sid),
        },
        { name: 'no session', status: 401, token: 'no-session', run: get(base) },
      ],
      base,
    );
  });

  it('GET /0/devices/{id}/commands/{cmd}', async () => {
    const base = `/0/devices/${own.id}/commands`;
    const t = main.clock.now();
    await driveRoute(
      'GET',
      '/0/devices/{id}/commands/{cmd}',
      [
        {
          name: 'a command the device ran',
          status: 200,
          run: async () => {
            const r = await get(`${base}/${ran}`, owner.sid)();
            expect(JSON.parse(r.body)).toEqual({
              id: ran,
              command: 'greet the team',
              priority: 1,
              state: 'done',
              created: t,
              expires: t + 60_000,
              sent: t,
              delivered: t + 1,
              started: t + 2,
              finished: t + 3,
              exitCode: 0,
              signal: null,
              output: 'hello, the team\n',
              truncated: false,
              reason: null,
            });
            return r;
          },
        },
        {
          name: 'its uuid in upper case',
          status: 200,
          run: get(`${base}/${ran.toUpperCase()}`, owner.sid),
        },
        {
          name: 'a command not yet sent, of bytes that are not printable ASCII',
          status: 200,
          run: async () => {
            const r = await get(`${base}/${binary}`, owner.sid)();
            expect(JSON.parse(r.body)).toMatchObject({ command64: 'YgD/', state: 'queued', sent: null });
            return r;
          },
        },
        {
          name: 'an unknown command',
          status: 404,
          token: 'device-fail',
          run: get(`${base}/${randomUUID()}`, owner.sid),
        },
        { name: 'not a uuid', status: 404, token: 'device-fail', run: get(`${base}/latest`, owner.sid) },
        {
          name: 'a command of another device',
          status: 404,
          token: 'device-fail',
          run: get(`/0/devices/${nearby.authcode}/commands/${ran}`, owner.sid),
        },
        {
          name: "another user's device",
          status: 404,
          token: 'device-fail',
          run: get(`${base}/${ran}`, stranger.sid),
        },
        { name: 'no session', status: 401, token: 'no-session', run: get(`${base}/${ran}`) },
      ],
      `${base}/${ran}`,
    );
  });
});

describe('the health and metrics routes answer what the document lists', () => {
  // Their 503 (the database or the link failing) is brought about in test/ops/health-metrics.test.ts.
  it('GET /healthz', async () => {
    await driveRoute('GET', '/healthz', [
      { name: 'healthy', status: 200, run: () => call(main.app, { method: 'GET', url: '/healthz' }) },
      {
        name: 'an app that names no frontend: the route reads none',
        status: 200,
        run: () => call(main.app, { method: 'GET', url: `/healthz?app=${randomUUID()}` }),
      },
    ]);
  });

  it('GET /metrics', async () => {
    await driveRoute('GET', '/metrics', [
      {
        name: 'no token set',
        status: 200,
        run: async () => {
          const r = await call(main.app, { method: 'GET', url: '/metrics' });
          expect(r.body).toContain('devcloud_http_requests_total');
          return r;
        },
      },
      {
        name: 'an app that names no frontend: the route reads none',
        status: 200,
        run: () => call(main.app, { method: 'GET', url: `/metrics?app=${randomUUID()}` }),
      },
      {
        name: 'no token set, a client on another machine',
        status: 403,
        token: 'metrics-local-only',
        run: () => call(main.app, { method: 'GET', url: '/metrics', remoteAddress: '192.0.2.7' }),
      },
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

  it('of the device routes reject what the routes reject, and accept what they accept', async () => {
    const u = await deviceUser();
    const device = await seedDevice({ owner: u.id });
    expect(await agree('/0/devices/', 'ClaimForm', { auth: 'not hex' }, u.sid)).toBe(false);
    expect(await agree('/0/devices/', 'ClaimForm', { auth: 12345678 }, u.sid)).toBe(false);
    expect(await agree('/0/devices/', 'ClaimForm', {}, u.sid)).toBe(false);
    expect(await agree('/0/devices/', 'ClaimForm', { auth: device.authcode }, u.sid)).toBe(true);
    const v = `/0/devices/${device.id}/s/raw`;
    expect(await agree(v, 'VariableForm', { value64: 'abc' }, u.sid)).toBe(false);
    expect(await agree(v, 'VariableForm', { value64: 'ab=c' }, u.sid)).toBe(false);
    expect(await agree(v, 'VariableForm', { value: 5 }, u.sid)).toBe(false);
    expect(await agree(v, 'VariableForm', { value64: '/wCA' }, u.sid)).toBe(true);
    expect(await agree(v, 'VariableForm', { value: 'x', value64: 'AA==' }, u.sid)).toBe(true);
  });

  it('of the command route reject what the route rejects, and accept what it accepts', async () => {
    const u = await deviceUser();
    const device = await seedDevice({ owner: u.id });
    const url = `/0/devices/${device.id}`;
    const max = main.config.commands.maxLifetimeMs;
    for (const [body, ok] of [
      [{ command: 'ping' }, true],
      [{ command: 'ping', priority: 2 }, true],
      [{ command: 'ping', priority: '01' }, true],
      [{ command: 'ping', priority: 3 }, false],
      [{ command: 'ping', priority: '3' }, false],
      [{ command: 'ping', priority: 1.5 }, false],
      [{ command: 'ping', lifetime: '60000' }, true],
      [{ command: 'ping', lifetime: max }, true],
      [{ command: 'ping', lifetime: max + 1 }, false],
      [{ command: 'ping', lifetime: 0 }, false],
      [{ command: 'ping', lifetime: '000' }, false],
      [{ command: 'ping', lifetime: '-5' }, false],
      [{ command: 'café' }, false],
      [{ command: '' }, false],
      [{ command: 5 }, false],
      [{ command64: 'abc' }, false],
      [{ command64: '/wCA' }, true],
      [{ command: 'ping', command64: 'ab=c' }, false],
    ] as const) {
      expect(await agree(url, 'CommandForm', body, u.sid)).toBe(ok);
    }
    // zod cannot read this `anyOf` back, so the keyword itself is checked; the route refuses a body with neither.
    expect(doc.components.schemas.CommandForm).toMatchObject({
      anyOf: [{ required: ['command'] }, { required: ['command64'] }],
    });
    const none = await call(main.app, { url, json: { priority: 1 }, cookie: u.sid });
    expect([none.status, none.body]).toEqual([400, 'device-fail']);
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
