/**
 * Bad input on every session, account and user route (decision 4): missing, empty, huge, non-UTF-8 and wrongly
 * typed fields, wrong content types, malformed cookies and unknown frontends. Every answer is a 4xx (or the
 * route's normal answer) with the route's own token, never a 5xx and never a stack trace, and the server keeps
 * serving afterwards. Requests go over real sockets, so Node's HTTP parser sees exactly these bytes.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { type Socket, connect } from 'node:net';
import { rmSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PasswordHasher } from '../../bridge/accounts/password.js';
import { buildApp } from '../../bridge/app.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import { BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import { ERRORS } from '../../bridge/errors.js';
import { createMailer } from '../../bridge/mail/mailer.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { ProductConfig } from '../../bridge/store/types.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';

const USER = 'user@example.com';
const PASSWORD = 'a good password';
const BOGUS_TOKEN = 'A'.repeat(43);
const MB = 1024 * 1024;
/** Under the default `http.bodyLimit` of 256 KiB, over every field limit. */
const BIG = 200 * 1024;

interface Reply {
  status: number;
  body: string;
  headers: Record<string, string | string[] | undefined>;
}

interface Req {
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  body?: Buffer | string;
}

/** One request over its own connection. A reply that comes before the body was sent counts. */
function send(port: number, r: Req): Promise<Reply> {
  return new Promise((resolve, reject) => {
    let answered = false;
    const req = httpRequest(
      { host: '127.0.0.1', port, method: r.method, path: r.path, headers: r.headers, agent: false },
      (res) => {
        answered = true;
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), headers: res.headers }),
        );
        res.on('error', reject);
      },
    );
    // The server may answer a too-large body at once and close while the rest is still being written.
    req.on('error', (err) => {
      if (!answered) reject(err);
    });
    req.end(r.body);
  });
}

/** Raw bytes over a socket, for what `http.request` refuses to send; resolves with everything read. */
function sendRaw(port: number, bytes: Buffer): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s: Socket = connect(port, '127.0.0.1', () => s.end(bytes));
    s.on('data', (c: Buffer) => chunks.push(c));
    s.on('error', (err: NodeJS.ErrnoException) => {
      // A reset after the server's answer is the server closing a connection it will not read further.
      if (err.code === 'ECONNRESET' && chunks.length > 0) resolve(Buffer.concat(chunks).toString('latin1'));
      else reject(err);
    });
    s.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
  });
}

/** What a route answers: a token from the catalog, the recovery form, or the user object. */
type Expect = { status: number; body: string } | { status: number; match: RegExp };

const tok = (body: string): Expect => {
  const e = Object.values(ERRORS).find((x) => x.body === body);
  const status = e?.status ?? { 'user-ok': 200, 'login-ok': 201, 'logout-ok': 201, 'signup-ok': 201 }[body] ?? 200;
  return { status, body };
};
/** The specification's token for a failed user-data update, at 400 for malformed input (decision 29). */
const MALFORMED_USER_DATA: Expect = { status: 400, body: 'user-data-failed' };
const FORM: Expect = { status: 200, match: /^<!doctype html>.*<form method="post" action="\/0\/session\/recover">/s };
const USER_JSON: Expect = {
  status: 200,
  match: /^\{"login":"user@example\.com","confirmed":false,"authcode":"[0-9a-f]{32}"/,
};

/**
 * What a case must get:
 * - `fail`: input the route must refuse (missing, empty or unusable fields);
 * - `typed`: fields of the wrong JSON type, or a body that is not an object;
 * - `malformed`: a body the parser refuses (not UTF-8, broken JSON);
 * - `tooLarge`: a field over its limit, the body under `http.bodyLimit`;
 * - `overLimit`: a body over `http.bodyLimit`;
 * - `any`: the well-formed fields are still there, so any of the route's answers;
 * - `noSession`: the cookie does not name a valid session of this frontend;
 * - `notFound`: an unknown frontend (decision 15);
 * - `valid`: the route's normal answer.
 */
type Kind = 'fail' | 'typed' | 'malformed' | 'tooLarge' | 'overLimit' | 'any' | 'noSession' | 'notFound' | 'valid';

interface Route {
  name: string;
  method: 'GET' | 'POST';
  path: string;
  /** Well-formed fields (form body for POST, query for GET); a function when each use must differ. */
  fields: () => Record<string, string>;
  /** The route runs with a fresh logged-in session unless a case replaces the cookie. */
  session?: true;
  /** The answer to the well-formed fields (with the session, if any). */
  valid: Expect;
  /** The answer when the session cookie is missing or malformed; else `valid`. */
  noSession?: Expect;
  fail: Expect[];
  typed?: Expect[];
  malformed?: Expect[];
  tooLarge?: Expect[];
  overLimit?: Expect[];
  /** A field whose absence makes another valid request, with its answer. */
  optional?: Record<string, Expect>;
  /**
   * The session the cookie names tells the frontend when neither Host nor the query does (decision 25): another
   * frontend's session is a session here.
   */
  sessionNamesFrontend?: true;
}

function wanted(route: Route, kind: Kind): Expect[] {
  switch (kind) {
    case 'valid':
      return [route.valid];
    case 'noSession':
      return [route.noSession ?? route.valid];
    case 'notFound':
      return [tok('not found')];
    case 'fail':
      return route.fail;
    case 'typed':
      return route.typed ?? route.fail;
    case 'malformed':
      return route.malformed ?? route.fail;
    case 'tooLarge':
      return route.tooLarge ?? route.fail;
    case 'overLimit':
      return route.overLimit ?? route.fail;
    case 'any':
      return [
        route.valid,
        ...route.fail,
        ...(route.typed ?? []),
        ...(route.malformed ?? []),
        ...(route.tooLarge ?? []),
        ...(route.overLimit ?? []),
      ];
  }
}

let signups = 0;
const ROUTES: Route[] = [
  {
    name: 'POST /0/session/',
    method: 'POST',
    path: '/0/session/',
    fields: () => ({}),
    valid: { status: 201, body: 'user-ok' },
    // The route takes no parameters: whatever the fields, an anonymous session is made. The specification
    // gives it no failure token, so a body the parser refuses gets the generic one.
    fail: [{ status: 201, body: 'user-ok' }],
    malformed: [{ status: 400, body: 'bad-request' }],
    overLimit: [{ status: 400, body: 'bad-request' }],
  },
  {
    name: 'POST /0/session/login',
    method: 'POST',
    path: '/0/session/login',
    fields: () => ({ login: USER, password: PASSWORD }),
    valid: tok('login-ok'),
    fail: [tok('login-fail')],
  },
  {
    name: 'POST /0/session/logout',
    method: 'POST',
    path: '/0/session/logout',
    fields: () => ({}),
    session: true,
    valid: tok('logout-ok'),
    noSession: tok('logout-fail'),
    // Logout takes no fields: stray ones are ignored, a body the parser refuses is a failed logout.
    fail: [tok('logout-ok')],
    malformed: [tok('logout-fail')],
    overLimit: [tok('logout-fail')],
  },
  {
    name: 'POST /0/session/signup',
    method: 'POST',
    path: '/0/session/signup',
    fields: () => ({ login: `new${++signups}@example.com`, password: PASSWORD }),
    valid: tok('signup-ok'),
    fail: [tok('signup-fail'), tok('signup-fail-no-email')],
  },
  {
    name: 'POST /0/session/resend',
    method: 'POST',
    path: '/0/session/resend',
    fields: () => ({ login: USER }),
    valid: tok('resend-ok'),
    fail: [tok('resend-fail')],
  },
  {
    name: 'POST /0/session/recovery',
    method: 'POST',
    path: '/0/session/recovery',
    fields: () => ({ login: USER }),
    valid: tok('recover-ok'),
    fail: [tok('recover-fail')],
  },
  {
    name: 'POST /0/session/recover (mail)',
    method: 'POST',
    path: '/0/session/recover',
    fields: () => ({ login: USER }),
    valid: tok('recover-ok'),
    fail: [tok('recover-fail')],
  },
  {
    name: 'POST /0/session/recover (new password)',
    method: 'POST',
    path: '/0/session/recover',
    fields: () => ({ login: USER, token: BOGUS_TOKEN, password: 'another good password' }),
    valid: tok('recover-fail'),
    fail: [tok('recover-fail')],
    // Without a token this is a request for a recovery mail.
    optional: { token: tok('recover-ok') },
  },
  {
    name: 'GET /0/session/confirm',
    method: 'GET',
    path: '/0/session/confirm',
    fields: () => ({ token: BOGUS_TOKEN }),
    valid: tok('confirm-fail'),
    fail: [tok('confirm-fail')],
  },
  {
    name: 'GET /0/session/recover',
    method: 'GET',
    path: '/0/session/recover',
    fields: () => ({ login: USER, token: BOGUS_TOKEN }),
    valid: FORM,
    // The form is only a page: it shows whatever it was given (escaped), the POST checks.
    fail: [FORM],
  },
  {
    name: 'GET /0/user/',
    method: 'GET',
    path: '/0/user/',
    fields: () => ({}),
    session: true,
    valid: USER_JSON,
    noSession: tok('not found'),
    fail: [USER_JSON],
  },
  {
    name: 'POST /0/user/',
    method: 'POST',
    path: '/0/user/',
    fields: () => ({ color: 'blue' }),
    session: true,
    valid: tok('user-data-ok'),
    noSession: tok('no-session'),
    // Empty strings and no fields at all are fine user data.
    fail: [tok('user-data-ok'), MALFORMED_USER_DATA],
    typed: [MALFORMED_USER_DATA],
    malformed: [MALFORMED_USER_DATA],
    tooLarge: [tok('user-data-failed')],
    overLimit: [tok('user-data-failed')],
    optional: { color: tok('user-data-ok') },
    sessionNamesFrontend: true,
  },
];

const FORM_TYPE = 'application/x-www-form-urlencoded';
const JSON_TYPE = 'application/json';

interface Case {
  name: string;
  /** Builds the request from the route and its well-formed fields. */
  build(route: Route, fields: Record<string, string>, cookie: string | undefined): Req;
  expect: Kind | ((route: Route) => Expect[]);
  /** Only for routes with this method. */
  only?: 'GET' | 'POST';
}

const form = (f: Record<string, unknown>) => new URLSearchParams(f as Record<string, string>).toString();
const query = (path: string, f: Record<string, string>) => (Object.keys(f).length ? `${path}?${form(f)}` : path);

/** A request whose fields travel the route's normal way, with extra headers. */
function normal(
  route: Route,
  f: Record<string, unknown>,
  cookie: string | undefined,
  headers: Record<string, string> = {},
): Req {
  const h: Record<string, string> = { ...(cookie !== undefined ? { cookie } : {}), ...headers };
  if (route.method === 'GET')
    return { method: 'GET', path: query(route.path, f as Record<string, string>), headers: h };
  return { method: 'POST', path: route.path, headers: { 'content-type': FORM_TYPE, ...h }, body: form(f) };
}

/** A POST with this body and content type, the session cookie kept. */
const post =
  (contentType: string | undefined, body: (f: Record<string, string>) => Buffer | string) =>
  (route: Route, f: Record<string, string>, cookie: string | undefined): Req => ({
    method: 'POST',
    path: route.path,
    headers: { ...(cookie !== undefined ? { cookie } : {}), ...(contentType ? { 'content-type': contentType } : {}) },
    body: body(f),
  });

/** The route's field names; routes without fields get one stray field. */
const names = (f: Record<string, string>): string[] => (Object.keys(f).length ? Object.keys(f) : ['x']);
const mapFields = (f: Record<string, string>, v: (k: string) => unknown): Record<string, unknown> =>
  Object.fromEntries(names(f).map((k) => [k, v(k)]));
/** A query string (or form) written by hand, for encodings URLSearchParams would fix. */
const rawPairs = (f: Record<string, string>, value: string) =>
  names(f)
    .map((k) => `${k}=${value}`)
    .join('&');

const deepJson = '['.repeat(50_000) + ']'.repeat(50_000);

/** A body case for each field: the well-formed fields without it. */
function missingFieldCases(route: Route): Case[] {
  return Object.keys(route.fields()).map((name): Case => ({
    name: `no ${name} field`,
    expect: (r) => (r.optional?.[name] ? [r.optional[name]] : wanted(r, 'fail')),
    build: (r, f, c) => normal(r, Object.fromEntries(Object.entries(f).filter(([k]) => k !== name)), c),
  }));
}

const BODY_CASES: Case[] = [
  { name: 'no body and no content type', expect: 'fail', build: post(undefined, () => '') },
  { name: 'an empty form', expect: 'fail', build: post(FORM_TYPE, () => '') },
  { name: 'empty strings', expect: 'fail', build: post(FORM_TYPE, (f) => form(mapFields(f, () => ''))) },
  {
    name: 'a 200 KB value in the first field',
    expect: 'tooLarge',
    build: post(FORM_TYPE, (f) => form({ ...f, [names(f)[0]!]: 'a'.repeat(BIG) })),
  },
  {
    name: 'a 200 KB value in the last field',
    expect: 'tooLarge',
    build: post(FORM_TYPE, (f) => form({ ...f, [names(f).at(-1)!]: `${'b'.repeat(BIG)}@example.com` })),
  },
  {
    name: 'a 1 MB form field (over the body limit)',
    expect: 'overLimit',
    build: post(FORM_TYPE, (f) => form({ ...f, big: 'c'.repeat(MB) })),
  },
  {
    name: 'a 1 MB JSON field (over the body limit)',
    expect: 'overLimit',
    build: post(JSON_TYPE, (f) => JSON.stringify({ ...f, big: 'd'.repeat(MB) })),
  },
  { name: '1 MB of text/plain', expect: 'overLimit', build: post('text/plain', () => 'e'.repeat(MB)) },
  {
    name: 'ten thousand small fields besides the right ones',
    expect: 'any',
    build: post(FORM_TYPE, (f) => `${form(f)}&${Array.from({ length: 10_000 }, (_, i) => `f${i}=1`).join('&')}`),
  },
  {
    name: 'raw non-UTF-8 bytes in a form',
    expect: 'malformed',
    build: post(FORM_TYPE, (f) =>
      Buffer.concat([Buffer.from(`${form(f)}&`), Buffer.from([0x6c, 0x3d, 0xff, 0xfe, 0xc3, 0x28, 0x80])]),
    ),
  },
  {
    name: 'percent-encoded non-UTF-8 in every field',
    expect: 'fail',
    build: post(FORM_TYPE, (f) => rawPairs(f, '%FF%FE%C3%28')),
  },
  { name: 'malformed percent escapes', expect: 'fail', build: post(FORM_TYPE, (f) => rawPairs(f, '%%ZZ%E0%A4%')) },
  {
    name: 'raw non-UTF-8 bytes in JSON',
    expect: 'fail',
    build: post(JSON_TYPE, (f) =>
      Buffer.concat([Buffer.from(`{"${names(f)[0]!}":"`), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]),
    ),
  },
  {
    name: 'CR, LF and NUL inside the values',
    expect: 'fail',
    build: post(FORM_TYPE, (f) => form(mapFields(f, () => `${USER}\r\nBcc: someone@example.com\0`))),
  },
  {
    name: 'the login repeated with a bad last value',
    expect: 'fail',
    build: post(FORM_TYPE, (f) => `${form(f)}&${rawPairs(f, 'not-an-address')}`),
  },
  ...(
    [
      ['numbers', 5],
      ['arrays', [USER]],
      ['nulls', null],
      ['objects', { $gt: '' }],
      ['booleans', true],
    ] as const
  ).map(([what, v]): Case => ({
    name: `JSON ${what} in every field`,
    expect: 'typed',
    build: post(JSON_TYPE, (f) => JSON.stringify(mapFields(f, () => v))),
  })),
  ...['[]', `[{"login":"${USER}"}]`, 'null', `"${USER}"`, '5', 'true'].map((body): Case => ({
    name: `JSON body ${body}`,
    expect: 'typed',
    build: post(JSON_TYPE, () => body),
  })),
  ...['{', '{"login":', '', ' ', '{"login":"a"}{"login":"b"}'].map((body): Case => ({
    name: `broken JSON ${JSON.stringify(body)}`,
    expect: 'malformed',
    build: post(JSON_TYPE, () => body),
  })),
  {
    name: 'JSON with __proto__',
    expect: 'malformed',
    build: post(JSON_TYPE, (f) => `{"__proto__":{"login":"x@example.com"},${JSON.stringify(f).slice(1)}`),
  },
  {
    name: 'JSON with constructor.prototype',
    expect: 'malformed',
    build: post(JSON_TYPE, () => '{"constructor":{"prototype":{"password":"x"}}}'),
  },
  { name: 'JSON nested 50,000 deep', expect: 'typed', build: post(JSON_TYPE, () => deepJson) },
  { name: 'a form sent as text/plain', expect: 'fail', build: post('text/plain', (f) => form(f)) },
  {
    name: 'multipart garbage',
    expect: 'fail',
    build: post('multipart/form-data; boundary=XYZ', () => '--XYZ\r\ngarbage\r\n\r\n\0\xff--XY'),
  },
  {
    name: 'well-formed multipart (not a supported body)',
    expect: 'fail',
    build: post('multipart/form-data; boundary=XYZ', (f) =>
      Object.entries(f)
        .map(([k, v]) => `--XYZ\r\nContent-Disposition: form-data; name="${k}"\r\n\r\n${v}\r\n`)
        .join('')
        .concat('--XYZ--\r\n'),
    ),
  },
  { name: 'content type "/"', expect: 'malformed', build: post('/', (f) => form(f)) },
  { name: 'content type with a broken parameter', expect: 'any', build: post(`${FORM_TYPE}; charset`, (f) => form(f)) },
  { name: 'application/octet-stream', expect: 'fail', build: post('application/octet-stream', () => '\0\x01\x02') },
];

/** A GET with this hand-written query, the session cookie kept. */
const get =
  (q: (f: Record<string, string>) => string) =>
  (route: Route, f: Record<string, string>, cookie: string | undefined): Req => ({
    ...normal(route, {}, cookie),
    path: `${route.path}?${q(f)}`,
  });

const QUERY_CASES: Case[] = [
  { name: 'no query', expect: 'fail', build: (r, _f, c) => normal(r, {}, c) },
  {
    name: 'empty values',
    expect: 'fail',
    build: (r, f, c) =>
      normal(
        r,
        mapFields(f, () => ''),
        c,
      ),
  },
  {
    name: '4 KB values',
    expect: 'fail',
    build: (r, f, c) =>
      normal(
        r,
        mapFields(f, () => 'q'.repeat(4096)),
        c,
      ),
  },
  { name: 'repeated parameters', expect: 'fail', build: get((f) => `${form(f)}&${form(f)}`) },
  {
    name: 'bracketed parameter names',
    expect: 'fail',
    build: get((f) =>
      names(f)
        .map((k) => `${k}[]=a&${k}[x]=b`)
        .join('&'),
    ),
  },
  { name: 'percent-encoded non-UTF-8', expect: 'fail', build: get((f) => rawPairs(f, '%FF%FE%C3%28')) },
  { name: 'malformed percent escapes', expect: 'fail', build: get((f) => rawPairs(f, '%%ZZ%E0%A4%')) },
  { name: 'a query of only separators', expect: 'fail', build: get(() => '&&&=&==&') },
  {
    name: 'markup in the values',
    expect: 'fail',
    build: (r, f, c) =>
      normal(
        r,
        mapFields(f, () => '"><script>alert(1)</script>'),
        c,
      ),
  },
];

const cookieCase = (name: string, cookie: () => string): Case => ({
  name: `cookie: ${name}`,
  expect: 'noSession',
  build: (r, f) => normal(r, f, cookie()),
});

/** Filled in `beforeAll`: cookies of real sessions that must not count here. */
const cookies = { loggedOut: '', otherFrontend: '' };

const COOKIE_CASES: Case[] = [
  cookieCase('no cookie header', () => ''),
  cookieCase('sid=garbage', () => 'sid=garbage'),
  cookieCase('sid= (empty)', () => 'sid='),
  cookieCase('sid without a value', () => 'sid'),
  cookieCase('only separators', () => ';;; ; =; =='),
  cookieCase('sid of 8,000 characters', () => `sid=${'A'.repeat(8000)}`),
  cookieCase('a forged id of the right shape', () => `sid=${randomBytes(32).toString('base64url')}`),
  cookieCase(
    'two forged ids',
    () => `sid=${randomBytes(32).toString('base64url')}; sid=${randomBytes(32).toString('base64url')}`,
  ),
  cookieCase('an id with a trailing character', () => `sid=${randomBytes(32).toString('base64url')}x`),
  cookieCase('a quoted id', () => `sid="${randomBytes(32).toString('base64url')}"`),
  cookieCase('400 other cookies around a forged id', () =>
    [
      ...Array.from({ length: 200 }, (_, i) => `c${i}=v${i}`),
      `sid=${randomBytes(32).toString('base64url')}`,
      ...Array.from({ length: 200 }, (_, i) => `d${i}=w${i}`),
    ].join('; '),
  ),
  cookieCase('Latin-1 bytes', () => `sid=\u00ff\u00fe${'A'.repeat(41)}`),
  cookieCase('a logged-out session', () => cookies.loggedOut),
  {
    name: "cookie: another frontend's session",
    expect: (r) => wanted(r, r.sessionNamesFrontend ? 'valid' : 'noSession'),
    build: (r, f) => normal(r, f, cookies.otherFrontend),
  },
];

const frontendCase = (name: string, only: 'GET' | 'POST' | undefined, build: Case['build']): Case => ({
  name: `unknown frontend: ${name}`,
  expect: 'notFound',
  build,
  ...(only ? { only } : {}),
});

const FRONTEND_CASES: Case[] = [
  frontendCase('Host <uuid>.<server>', undefined, (r, f, c) =>
    normal(r, f, c, { host: `${randomUUID()}.devcloud.example` }),
  ),
  frontendCase('Host <UUID>.<server> in capitals', undefined, (r, f, c) =>
    normal(r, f, c, { host: `${randomUUID().toUpperCase()}.devcloud.example:8080` }),
  ),
  frontendCase('app query parameter', undefined, (r, f, c) => {
    const req = normal(r, f, c);
    return { ...req, path: `${req.path}${req.path.includes('?') ? '&' : '?'}app=${randomUUID()}` };
  }),
  frontendCase('app query parameter that is no uuid', undefined, (r, f, c) => {
    const req = normal(r, f, c);
    return { ...req, path: `${req.path}${req.path.includes('?') ? '&' : '?'}app=shop` };
  }),
  frontendCase('empty app query parameter', undefined, (r, f, c) => {
    const req = normal(r, f, c);
    return { ...req, path: `${req.path}${req.path.includes('?') ? '&' : '?'}app=` };
  }),
  // Where the body is all data (decision 25), `app` in it is a field like any other.
  {
    ...frontendCase('app form field', 'POST', (r, f, c) => normal(r, { ...f, app: randomUUID() }, c)),
    expect: (r) => wanted(r, r.sessionNamesFrontend ? 'valid' : 'notFound'),
  },
  {
    ...frontendCase('app JSON field', 'POST', (r, f, c) => ({
      ...normal(r, f, c, { 'content-type': JSON_TYPE }),
      body: JSON.stringify({ ...f, app: randomUUID() }),
    })),
    expect: (r) => wanted(r, r.sessionNamesFrontend ? 'valid' : 'notFound'),
  },
];

/** Bodies must never show internals. */
const INTERNALS = /\n\s+at\s|\bat \S+ \(|node_modules|\.[cm]?[jt]s:\d+|[A-Za-z]Error\b|FST_ERR|SQLITE_|scrypt/;

let app: FastifyInstance;
let port: number;
let store: SqliteStore;
let dataDir: string;
const sink = new LogSink();

async function login(extra: Record<string, string> = {}): Promise<string> {
  const r = await send(port, {
    method: 'POST',
    path: '/0/session/login',
    headers: { 'content-type': FORM_TYPE },
    body: form({ login: USER, password: PASSWORD, ...extra }),
  });
  expect(r.status).toBe(201);
  const set = String(r.headers['set-cookie']);
  return /sid=([^;]+)/.exec(set)![1]!;
}

beforeAll(async () => {
  dataDir = tempDir('devcloud-badinput-');
  const big = { limit: 1_000_000, windowMs: 60_000 };
  const config = BridgeConfigSchema.parse({
    dataDir,
    accounts: { scryptLogN: 10 },
    // The table makes hundreds of attempts from one address; the limits are tested elsewhere.
    rateLimits: { login: big, signup: big, resend: big, recover: big },
  });
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  store = new SqliteStore(dataDir);
  const now = Date.now();
  await ensureDefaultFrontend(store, now);
  const other = { id: randomUUID(), name: 'other', config: ProductConfig.parse({}), isDefault: false, createdAt: now };
  await store.createFrontend(other);
  const a = config.accounts;
  const hasher = new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: a.hashConcurrency,
    maxQueued: a.hashQueue,
  });
  const mailer = createMailer({ from: config.mail.from, outboxDir: outboxDir(config), smtp: undefined }, log, Date.now);
  app = buildApp({ config, store, hasher, mailer, log, checkAnswers: true });
  app.addHook('onClose', () => mailer.close());
  await app.listen({ host: '127.0.0.1', port: 0 });
  port = (app.server.address() as { port: number }).port;

  // The user every route acts on, in the default frontend and, with the same login, in another one.
  for (const extra of [{}, { app: other.id }]) {
    const r = await send(port, {
      method: 'POST',
      path: '/0/session/signup',
      headers: { 'content-type': FORM_TYPE },
      body: form({ login: USER, password: PASSWORD, ...extra }),
    });
    expect(r.status).toBe(201);
  }
  const sid = await login();
  expect(
    (await send(port, { method: 'POST', path: '/0/session/logout', headers: { cookie: `sid=${sid}` } })).status,
  ).toBe(201);
  cookies.loggedOut = `sid=${sid}`;
  cookies.otherFrontend = `sid=${await login({ app: other.id })}`;
});

afterAll(async () => {
  await app?.close();
  await store?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

function check(route: Route, c: Case, r: Reply): void {
  const where = `${route.name} with ${c.name}: ${r.status} ${r.body.slice(0, 120)}`;
  expect(r.status, where).toBeLessThan(500);
  expect(r.body, where).not.toMatch(INTERNALS);
  // Whatever a request carries comes back escaped, if at all.
  expect(r.body, where).not.toContain('<script>');
  const expected = typeof c.expect === 'function' ? c.expect(route) : wanted(route, c.expect);
  const ok = expected.some((w) => w.status === r.status && ('body' in w ? r.body === w.body : w.match.test(r.body)));
  const shown = expected.map((w) => ('body' in w ? `${w.status} ${w.body}` : `${w.status} ${String(w.match)}`));
  expect(ok, `${where}\nexpected one of ${JSON.stringify(shown)}`).toBe(true);
}

async function runCase(route: Route, c: Case): Promise<void> {
  const cookie = route.session ? `sid=${await login()}` : undefined;
  const req = c.build(route, route.fields(), cookie);
  // A case that sets the cookie itself replaces the session; an empty header means none at all.
  if (req.headers.cookie === '') delete req.headers.cookie;
  check(route, c, await send(port, req));
}

describe('bad input on every route', () => {
  for (const route of ROUTES) {
    it(`${route.name}: never a 5xx, always its own token`, async () => {
      // Control: the well-formed request gets the route's normal answer.
      await runCase(route, { name: 'well-formed fields', expect: 'valid', build: (r, f, c) => normal(r, f, c) });
      const cases = [
        ...(route.method === 'POST' ? [...missingFieldCases(route), ...BODY_CASES] : QUERY_CASES),
        ...COOKIE_CASES,
        ...FRONTEND_CASES.filter((c) => c.only === undefined || c.only === route.method),
      ];
      for (const c of cases) await runCase(route, c);
    });
  }

  it('answers bytes Node refuses to parse with a 4xx and keeps serving', async () => {
    const cases: Buffer[] = [
      // Not HTTP at all.
      Buffer.from('\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n', 'latin1'),
      // No Host header in HTTP/1.1.
      Buffer.from('POST /0/session/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n'),
      // Raw bytes above 0x7f in the path and in a header.
      Buffer.concat([
        Buffer.from('GET /0/session/confirm?token='),
        Buffer.from([0xff, 0xfe, 0x80]),
        Buffer.from(' HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'),
      ]),
      Buffer.concat([
        Buffer.from('POST /0/session/ HTTP/1.1\r\nHost: localhost\r\nCookie: sid='),
        Buffer.from([0xff, 0x00, 0x80]),
        Buffer.from('\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'),
      ]),
      // A header larger than Node accepts.
      Buffer.from(`GET /0/user/ HTTP/1.1\r\nHost: localhost\r\nCookie: sid=${'A'.repeat(MB)}\r\n\r\n`),
      // A request line larger than Node accepts.
      Buffer.from(`GET /0/session/confirm?token=${'B'.repeat(MB)} HTTP/1.1\r\nHost: localhost\r\n\r\n`),
      // A Content-Length that does not match the body, and two that disagree.
      Buffer.from('POST /0/session/login HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nlogin=a&password=b'),
      Buffer.from(
        'POST /0/session/login HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab',
      ),
      // Chunked encoding that breaks off in the middle.
      Buffer.from(
        'POST /0/session/signup HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n' +
          `Content-Type: ${FORM_TYPE}\r\n\r\nzz\r\nlogin=\r\n`,
      ),
      // A whole request followed by garbage: Node drops the connection while the handler still runs, so the
      // handler finds the client gone (no address to count it under).
      ...['login', 'signup', 'resend', 'recovery', 'recover'].map((route) => {
        const body = form({ login: USER, password: PASSWORD });
        return Buffer.from(
          `POST /0/session/${route} HTTP/1.1\r\nHost: localhost\r\nContent-Type: ${FORM_TYPE}\r\n` +
            `Content-Length: ${body.length}\r\n\r\n${body}\0\0\0 garbage\r\n\r\n`,
        );
      }),
    ];
    for (const bytes of cases) {
      const answer = await sendRaw(port, bytes);
      const label = JSON.stringify(bytes.subarray(0, 60).toString('latin1'));
      // Either no answer at all (the connection is dropped) or a 4xx without internals.
      if (answer !== '') {
        expect(answer, label).toMatch(/^HTTP\/1\.1 4\d\d /);
        expect(answer, label).not.toMatch(INTERNALS);
      }
    }
  });

  it('still serves normally after all of it, and logged no server failure', async () => {
    const r = await send(port, { method: 'POST', path: '/0/session/', headers: {} });
    expect(r).toMatchObject({ status: 201, body: 'user-ok' });
    expect(String(r.headers['set-cookie'])).toMatch(/^sid=[A-Za-z0-9_-]{43}; /);
    const sid = await login();
    const user = await send(port, { method: 'GET', path: '/0/user/', headers: { cookie: `sid=${sid}` } });
    expect(user.status).toBe(200);
    expect(JSON.parse(user.body)).toMatchObject({ login: USER, confirmed: false });
    expect(sink.lines.filter((l) => l.level === 'error' || l.level === 'fatal')).toEqual([]);
    expect(sink.events('http.failed')).toEqual([]);
  });
});
