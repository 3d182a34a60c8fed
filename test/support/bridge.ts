/**
 * A bridge HTTP app for tests: a fresh store with its default frontend, scrypt at the cheapest cost, mail to an
 * outbox, a clock the test moves by hand, and HTTP clients with a cookie jar that talk to it through `inject()` or
 * over a real socket (plain HTTP with `fetch`, or HTTPS with a certificate made here with openssl).
 *
 * The store is SQLite in a temp dir unless `engine: 'postgres'`: then it is the PostgreSQL store on a database made
 * for that bridge on the machine's test server and dropped at its close (test/support/postgres.ts; making one and
 * dropping it costs about 0.2 s, migrating it 0.1 s). A file runs its suites on every engine the machine has with
 *
 *   describe.each(await engines())('the devices (%s)', (engine) => { ... startTestBridge({ engine }) ... });
 */
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { z } from 'zod';
import { type PasswordHasher, hasherFor } from '../../bridge/accounts/password.js';
import { buildApp } from '../../bridge/app.js';
import { Bridge } from '../../bridge/bridge.js';
import { CommandService } from '../../bridge/commands/service.js';
import { createDeviceService } from '../../bridge/devices/create.js';
import type { DeviceService } from '../../bridge/devices/service.js';
import { type BridgeConfig, BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import type { EventBus } from '../../bridge/events/bus.js';
import { type Mailer, createMailer } from '../../bridge/mail/mailer.js';
import { openPostgresStore } from '../../bridge/store/postgres/store.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { type BridgeStore, type Frontend, ProductConfig, type StoreEngine } from '../../bridge/store/types.js';
import { type Logger, createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from './agent.js';
import { type FreshDatabase, freshDatabase, missingPostgres } from './postgres.js';

export type { StoreEngine };

/**
 * The store engines a device suite runs on here: SQLite, and PostgreSQL when the test server answers. When it does
 * not, one line says what to install and PostgreSQL is left out; under `CI=true` the file fails instead
 * (test/support/postgres.ts, `missingPostgres`).
 */
export async function engines(): Promise<StoreEngine[]> {
  return (await missingPostgres()) ? ['sqlite'] : ['sqlite', 'postgres'];
}

/**
 * A database for a bridge under test. Its default collation is linguistic (ICU `en-US`, where the server has it), as
 * on most servers, so that text sorted other than in the schema's byte order shows. Its commits do not wait for the
 * server's disk (`synchronous_commit = off`, for the sessions the store opens on it): what a test sees is the same,
 * as a transaction is still atomic and visible once committed; only a crash of the server could lose the last of
 * them, and that is no test's concern.
 */
export async function bridgeDatabase(): Promise<FreshDatabase> {
  const database = await freshDatabase(undefined, { icuLocale: 'en-US' });
  try {
    await database.pool.query(`ALTER DATABASE "${database.name}" SET synchronous_commit = off`);
  } catch (err) {
    await database.drop();
    throw err;
  }
  return database;
}

/** A store of a test's own, and how to be rid of it. */
export interface TestStore {
  store: BridgeStore;
  /** PostgreSQL: the database of this store (made for it, or given). */
  database: FreshDatabase | undefined;
  /** Closes the store; PostgreSQL: and drops its database (unless it was given). */
  close: () => Promise<void>;
}

/**
 * Opens a store on `engine`: SQLite in `dataDir`, or PostgreSQL on `database` (kept at close) or else a fresh
 * database (dropped at close). Firmware images stay in `dataDir` either way.
 */
export async function openTestStore(
  engine: StoreEngine,
  dataDir: string,
  opts: { log?: Logger; now?: () => number; database?: FreshDatabase; backgroundCheckpoints?: boolean } = {},
): Promise<TestStore> {
  if (engine === 'sqlite') {
    const store = new SqliteStore(dataDir, opts.log, { backgroundCheckpoints: opts.backgroundCheckpoints ?? false });
    return { store, database: undefined, close: () => store.close() };
  }
  const own = opts.database === undefined;
  const database = opts.database ?? (await bridgeDatabase());
  const log = opts.log ?? createLogger({ level: 'warn', pretty: 'never', base: {}, destination: new LogSink() });
  let store: BridgeStore;
  try {
    store = await openPostgresStore(database.url, log, { dataDir, ...(opts.now ? { now: opts.now } : {}) });
  } catch (err) {
    if (own) await database.drop();
    throw err;
  }
  return {
    store,
    database,
    close: async () => {
      try {
        await store.close();
      } finally {
        if (own) await database.drop();
      }
    },
  };
}

/** How a test reaches the app: `inject()` without a socket, or a listening server. */
export type Transport = 'inject' | 'http' | 'https';

type ConfigInput = z.input<typeof BridgeConfigSchema>;
export type ConfigOverrides = { [K in keyof Omit<ConfigInput, 'dataDir'>]?: ConfigInput[K] };

/** The time the app sees; tests move it instead of waiting. */
export class TestClock {
  constructor(public t = Date.UTC(2030, 0, 1)) {}
  readonly now = (): number => this.t;
  advance(ms: number): void {
    this.t += ms;
  }
}

export interface RawRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string | Buffer;
}

export interface RawResponse {
  status: number;
  body: string;
  contentType: string;
  /** Every Set-Cookie header, as sent. */
  setCookies: string[];
}

type Send = (req: RawRequest) => Promise<RawResponse>;

export interface ParsedCookie {
  name: string;
  value: string;
  /** Attribute names in lower case; flags map to ''. */
  attrs: Map<string, string>;
}

export function parseSetCookie(header: string): ParsedCookie {
  const [pair = '', ...rest] = header.split(';');
  const eq = pair.indexOf('=');
  const attrs = new Map<string, string>();
  for (const a of rest) {
    const i = a.indexOf('=');
    if (i < 0) attrs.set(a.trim().toLowerCase(), '');
    else attrs.set(a.slice(0, i).trim().toLowerCase(), a.slice(i + 1).trim());
  }
  return { name: pair.slice(0, eq).trim(), value: pair.slice(eq + 1).trim(), attrs };
}

export interface RequestOptions {
  /** Form fields, sent as application/x-www-form-urlencoded. */
  form?: Record<string, string>;
  /** A JSON body. */
  json?: unknown;
  /** A raw body with its own content-type header. */
  body?: string | Buffer;
  headers?: Record<string, string>;
  /** Send this Cookie header instead of the jar's (null: none). The jar still learns from the answer. */
  cookie?: string | null;
}

export interface HttpResult extends RawResponse {
  /** The `sid` cookie this answer set, parsed, if any. */
  sid: ParsedCookie | undefined;
}

/** An HTTP client with a cookie jar, as a browser or the official client would keep one. */
export class HttpClient {
  readonly jar = new Map<string, string>();
  constructor(private readonly sendRaw: Send) {}

  get sid(): string | undefined {
    return this.jar.get('sid');
  }

  async request(method: string, path: string, opts: RequestOptions = {}): Promise<HttpResult> {
    const headers: Record<string, string> = {};
    let body: string | Buffer | undefined;
    if (opts.form) {
      headers['content-type'] = 'application/x-www-form-urlencoded';
      body = new URLSearchParams(opts.form).toString();
    } else if (opts.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(opts.json);
    } else if (opts.body !== undefined) {
      body = opts.body;
    }
    const cookie =
      opts.cookie === undefined ? [...this.jar].map(([k, v]) => `${k}=${v}`).join('; ') : (opts.cookie ?? '');
    if (cookie) headers.cookie = cookie;
    Object.assign(headers, opts.headers);
    const res = await this.sendRaw({ method, path, headers, ...(body === undefined ? {} : { body }) });
    let sid: ParsedCookie | undefined;
    for (const h of res.setCookies) {
      const c = parseSetCookie(h);
      if (c.name === 'sid') sid = c;
      if (c.value === '' || c.attrs.get('max-age') === '0') this.jar.delete(c.name);
      else this.jar.set(c.name, c.value);
    }
    return { ...res, sid };
  }

  post(path: string, opts?: RequestOptions): Promise<HttpResult> {
    return this.request('POST', path, opts);
  }

  get(path: string, opts?: RequestOptions): Promise<HttpResult> {
    return this.request('GET', path, opts);
  }
}

function setCookieList(v: string | string[] | number | undefined): string[] {
  if (v === undefined) return [];
  return Array.isArray(v) ? v : [String(v)];
}

function injectSend(app: FastifyInstance): Send {
  return async (req) => {
    const res = await app.inject({
      method: req.method as 'GET',
      url: req.path,
      headers: req.headers,
      ...(req.body === undefined ? {} : { payload: req.body }),
    });
    return {
      status: res.statusCode,
      body: res.body,
      contentType: String(res.headers['content-type'] ?? ''),
      setCookies: setCookieList(res.headers['set-cookie']),
    };
  };
}

/** A request with node's own client: `fetch` treats Host as forbidden and cannot trust a test CA. */
function nodeRequest(base: string, req: RawRequest, ca?: Buffer): Promise<RawResponse> {
  const url = new URL(req.path, base);
  const mod = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const r = mod.request(url, { method: req.method, headers: req.headers, ...(ca ? { ca } : {}) }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          body: Buffer.concat(chunks).toString('utf8'),
          contentType: res.headers['content-type'] ?? '',
          setCookies: res.headers['set-cookie'] ?? [],
        }),
      );
      res.on('error', reject);
    });
    r.on('error', reject);
    r.end(req.body);
  });
}

function fetchSend(base: string): Send {
  return async (req) => {
    if (req.headers.host !== undefined) return nodeRequest(base, req);
    const res = await fetch(new URL(req.path, base), {
      method: req.method,
      headers: req.headers,
      redirect: 'manual',
      ...(req.body === undefined ? {} : { body: req.body }),
    });
    return {
      status: res.status,
      body: await res.text(),
      contentType: res.headers.get('content-type') ?? '',
      setCookies: res.headers.getSetCookie(),
    };
  };
}

/** A self-signed certificate for 127.0.0.1, made with the system's openssl. */
export function selfSignedCert(dir: string): { certFile: string; keyFile: string; cert: Buffer } {
  const certFile = join(dir, 'cert.pem');
  const keyFile = join(dir, 'key.pem');
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      keyFile,
      '-out',
      certFile,
      '-days',
      '2',
      '-subj',
      '/CN=127.0.0.1',
      '-addext',
      'subjectAltName=IP:127.0.0.1',
    ],
    { stdio: 'pipe' },
  );
  return { certFile, keyFile, cert: readFileSync(certFile) };
}

export interface TestBridgeOptions {
  transport?: Transport;
  config?: ConfigOverrides;
  clock?: TestClock;
  /** The address to listen on (default 127.0.0.1); `url` names 127.0.0.1 for a wildcard address. */
  host?: string;
  /** The password hasher, instead of scrypt at its cheapest cost. */
  hasher?: PasswordHasher;
  /** The store's engine: SQLite (the default) or PostgreSQL on a database of the bridge's own. */
  engine?: StoreEngine;
  /** SQLite only: opens the store in the data directory, instead of a plain `SqliteStore`. */
  openStore?: (dataDir: string) => SqliteStore | Promise<SqliteStore>;
  /** The event bus the app and its services publish to (a test subscribes to it); else one nothing hears. */
  events?: EventBus;
  /** Where the web console's files are; else dist/console of the checkout. */
  consoleDir?: string;
}

export interface TestBridge {
  app: FastifyInstance;
  store: BridgeStore;
  engine: StoreEngine;
  /** PostgreSQL: the bridge's database, dropped at its close. */
  database: FreshDatabase | undefined;
  config: BridgeConfig;
  clock: TestClock;
  sink: LogSink;
  mailer: Mailer;
  /** The app's device service (no broker: what it sends goes nowhere), on the test's clock. */
  devices: DeviceService;
  dataDir: string;
  defaultFrontend: Frontend;
  transport: Transport;
  /** The base URL when listening. */
  url: string | undefined;
  /** A new client with an empty cookie jar over the bridge's transport. */
  client(): HttpClient;
  /** Adds a frontend with the given product configuration. */
  addFrontend(config?: Partial<ProductConfig>): Promise<Frontend>;
  close(): Promise<void>;
}

export async function startTestBridge(opts: TestBridgeOptions = {}): Promise<TestBridge> {
  const transport = opts.transport ?? 'inject';
  const dataDir = tempDir('devcloud-bridge-');
  const over = opts.config ?? {};
  const tls = transport === 'https' ? selfSignedCert(dataDir) : undefined;
  const config = BridgeConfigSchema.parse({
    ...over,
    dataDir,
    http: { ...over.http, ...(tls ? { certFile: tls.certFile, keyFile: tls.keyFile } : {}) },
    accounts: { scryptLogN: 10, ...over.accounts },
    // Generous limits: the rate limiters have their own tests, and here they would only get in the way.
    rateLimits: {
      login: { limit: 1000 },
      signup: { limit: 1000 },
      resend: { limit: 1000 },
      recover: { limit: 1000 },
      ...over.rateLimits,
    },
  });
  const clock = opts.clock ?? new TestClock();
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const engine = opts.engine ?? 'sqlite';
  if (opts.openStore && engine !== 'sqlite') throw new Error('startTestBridge: openStore opens a SQLite store');
  const opened: TestStore = opts.openStore
    ? await (async () => {
        const store = await opts.openStore!(dataDir);
        return { store, database: undefined, close: () => store.close() };
      })()
    : await openTestStore(engine, dataDir, { now: clock.now });
  const { store, database } = opened;
  const defaultFrontend = await ensureDefaultFrontend(store, clock.now());
  const hasher = opts.hasher ?? hasherFor(config);
  const mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log, clock.now);
  const events = opts.events;
  const commands = new CommandService({
    store,
    log,
    now: clock.now,
    maxOpen: config.commands.maxOpen,
    ...(events ? { events } : {}),
  });
  const devices = createDeviceService(config, store, log, clock.now, commands, events);
  // Every answer of every test is held to the API document: an undocumented one answers 500 `undocumented-answer`.
  const app = buildApp({
    ...{ config, store, hasher, mailer, log, now: clock.now, devices, commands, checkAnswers: true },
    ...(events ? { events } : {}),
    ...(opts.consoleDir === undefined ? {} : { consoleDir: opts.consoleDir }),
  });
  let url: string | undefined;
  let send: Send;
  if (transport === 'inject') {
    await app.ready();
    send = injectSend(app);
  } else {
    const host = opts.host ?? '127.0.0.1';
    await app.listen({ host, port: 0 });
    const address = app.server.address();
    const port = typeof address === 'object' && address ? address.port : 0;
    url = `${transport}://${host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host}:${port}`;
    const base = url;
    send = tls ? (req) => nodeRequest(base, req, tls.cert) : fetchSend(base);
  }
  return {
    app,
    store,
    engine,
    database,
    config,
    clock,
    sink,
    mailer,
    devices,
    dataDir,
    defaultFrontend,
    transport,
    url,
    client: () => new HttpClient(send),
    async addFrontend(product = {}) {
      const f: Frontend = {
        id: randomUUID(),
        name: 'test',
        config: ProductConfig.parse(product),
        isDefault: false,
        createdAt: clock.now(),
      };
      await store.createFrontend(f);
      return f;
    },
    async close() {
      await app.close();
      await devices.close();
      await mailer.close();
      await opened.close();
      rmSync(dataDir, { recursive: true, force: true });
      // A test that never looked at the status of an undocumented answer still fails.
      const undocumented = sink.events('http.undocumented_answer');
      if (undocumented.length > 0) throw new Error(`undocumented answers: ${JSON.stringify(undocumented)}`);
    },
  };
}

export interface LiveBridge {
  bridge: Bridge;
  engine: StoreEngine;
  /** PostgreSQL: the bridge's database, dropped by `close()` unless it keeps the data. */
  database: FreshDatabase | undefined;
  config: BridgeConfig;
  sink: LogSink;
  dataDir: string;
  /** The base URL of the listening HTTP server. */
  url: string;
  /** The MQTT URL devices connect to: the embedded broker's, or the external one. */
  mqttUrl: string;
  /** A new client with an empty cookie jar. */
  client(): HttpClient;
  /** Stops the bridge and closes its store; the data directory (and PostgreSQL database) stays unless `remove`. */
  close(remove?: boolean): Promise<void>;
}

/** The config of a whole bridge in a test: free ports, open enrolment, scrypt at its cheapest, generous limits. */
export function liveBridgeConfig(dataDir: string, over: ConfigOverrides = {}): BridgeConfig {
  return BridgeConfigSchema.parse({
    ...over,
    dataDir,
    http: { port: 0, ...over.http },
    // Open enrolment unless the test says otherwise: the agents tests start make their own identities, many of them
    // from one address (the enrolment limits have their own tests).
    mqtt: {
      port: 0,
      openEnrolment: true,
      enrolLimits: { perAddress: 100_000, total: 100_000 },
      // Tests send many hellos from one device on purpose; the device limits have their own tests.
      rate: { hellosPerMinute: 100_000 },
      ...over.mqtt,
    },
    accounts: { scryptLogN: 10, ...over.accounts },
    rateLimits: {
      login: { limit: 1000 },
      signup: { limit: 1000 },
      resend: { limit: 1000 },
      recover: { limit: 1000 },
      ...over.rateLimits,
    },
  });
}

/**
 * The whole bridge as `devcloud-bridge run` starts it (`Bridge.start`, bridge/bridge.ts): HTTP on a free port, and
 * the embedded broker on a free port unless `config.mqtt.url` names an external one. The real clock unless `now`; scrypt at its
 * cheapest. The store is SQLite in the data directory, or with `engine: 'postgres'` the PostgreSQL store on a
 * database made for the bridge (or `database`, to start again on the data a `close(false)` kept). `now` replaces the
 * real clock for every part of the bridge (a {@link TestClock}'s `now`, for a test that moves time instead of
 * waiting); sockets and their timers still run in real time.
 */
export async function startLiveBridge(
  opts: {
    config?: ConfigOverrides;
    dataDir?: string;
    engine?: StoreEngine;
    database?: FreshDatabase;
    now?: () => number;
  } = {},
): Promise<LiveBridge> {
  const now = opts.now ?? Date.now;
  const engine = opts.engine ?? 'sqlite';
  const dataDir = opts.dataDir ?? tempDir('devcloud-bridge-');
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const database = engine === 'postgres' ? (opts.database ?? (await bridgeDatabase())) : undefined;
  const over = opts.config ?? {};
  const config = liveBridgeConfig(
    dataDir,
    database ? { ...over, database: { ...over.database, url: database.url } } : over,
  );
  let opened: TestStore;
  let bridge: Bridge;
  try {
    opened = await openTestStore(engine, dataDir, {
      log,
      now,
      backgroundCheckpoints: true,
      ...(database ? { database } : {}),
    });
  } catch (err) {
    await database?.drop();
    throw err;
  }
  const { store } = opened;
  try {
    // Every answer is held to the API document, as in the app-level harness above.
    bridge = await Bridge.start({ config, store, log, now, checkAnswers: true });
  } catch (err) {
    await store.close();
    await database?.drop();
    throw err;
  }
  const send = fetchSend(bridge.url);
  return {
    bridge,
    engine,
    database,
    config,
    sink,
    dataDir,
    url: bridge.url,
    mqttUrl: bridge.broker?.url ?? config.mqtt.url!,
    client: () => new HttpClient(send),
    async close(remove = true) {
      try {
        await bridge.stop();
      } finally {
        await store.close();
      }
      if (remove) {
        rmSync(dataDir, { recursive: true, force: true });
        await database?.drop();
      }
      // A test that never looked at the status of an undocumented answer still fails.
      const undocumented = sink.events('http.undocumented_answer');
      if (undocumented.length > 0) throw new Error(`undocumented answers: ${JSON.stringify(undocumented)}`);
    },
  };
}
