/**
 * Bad input on the Devices and Network routes and on every `up/` topic of the MQTT contract, against a real
 * listening bridge with its embedded broker, a real agent connected to it and a raw MQTT device client.
 *
 * HTTP: every answer is the route's own token (decisions 4 and 14: `claim-fail`, `device-fail` 400 or 404,
 * 401 `no-session`, `not found` for a method or path no route has), never a 5xx. MQTT: every bad payload is
 * dropped with exactly one warning line and one counter, and is followed by a good message from the same
 * device that the bridge records. Afterwards the bridge still answers and the agent still synchronises.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import mqtt, { type MqttClient } from 'mqtt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type UpTopic, downFilter, topicFor } from '../../protocol/index.js';
import { type TestAgent, startAgent } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

const MAX_VALUE = 64;
const BODY_LIMIT = 4096;
const FORM = 'application/x-www-form-urlencoded';
const JSON_TYPE = 'application/json';

interface Reply {
  status: number;
  body: string;
}

/**
 * One request over its own connection, the path sent byte for byte (no URL normalisation). A reply that comes
 * before the whole body was written counts.
 */
function call(
  base: string,
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: string | Buffer,
): Promise<Reply> {
  const { hostname, port } = new URL(base);
  // Node sends the body of a DELETE without a length unless told: the server would read it as the next request.
  if (body !== undefined) headers = { ...headers, 'content-length': String(Buffer.byteLength(body)) };
  return new Promise((resolve, reject) => {
    let answered = false;
    const req = httpRequest({ host: hostname, port, method, path, headers, agent: false }, (res) => {
      answered = true;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', (err) => {
      if (!answered) reject(err);
    });
    req.end(body);
  });
}

type Want = { status: number; body: string | RegExp };
const GET_FAIL: Want = { status: 404, body: 'device-fail' };
const SET_FAIL: Want = { status: 400, body: 'device-fail' };
const CLAIM_FAIL: Want = { status: 400, body: 'claim-fail' };
const NO_SESSION: Want = { status: 401, body: 'no-session' };
const NOT_FOUND: Want = { status: 404, body: 'not found' };
const DEVICE_OK: Want = { status: 200, body: 'device-ok' };
const JSON_OK: Want = { status: 200, body: /^[[{"]/ };
const claimed = (id: string): Want => ({ status: 201, body: new RegExp(`^(${id}|\\{"id":"${id}"\\})$`) });

interface HttpCase {
  what: string;
  method: string;
  path: string;
  /** Content type and body. */
  type?: string;
  body?: string | Buffer;
  /** Whose session: the owner's (default), another user's, none, or a raw Cookie header. */
  as?: 'owner' | 'other' | 'none' | { cookie: string };
  want: Want;
}

const form = (fields: Record<string, string>) => ({ type: FORM, body: new URLSearchParams(fields).toString() });
const json = (value: unknown) => ({ type: JSON_TYPE, body: JSON.stringify(value) });
const raw = (type: string, body: string | Buffer) => ({ type, body });
const b64 = (bytes: number) => randomBytes(bytes).toString('base64');

/** Every route that names a device, with a well-formed rest of the request; `id` fills the path. */
function deviceRoutes(id: string): Array<Omit<HttpCase, 'what' | 'want'> & { kind: 'get' | 'set' }> {
  return [
    { kind: 'get', method: 'GET', path: `/0/devices/${id}` },
    { kind: 'set', method: 'DELETE', path: `/0/devices/${id}` },
    { kind: 'get', method: 'GET', path: `/0/devices/${id}/d` },
    { kind: 'get', method: 'GET', path: `/0/devices/${id}/d/led` },
    { kind: 'get', method: 'GET', path: `/0/devices/${id}/d/led?latest=5` },
    { kind: 'set', method: 'POST', path: `/0/devices/${id}/d/led`, ...form({ value: 'on' }) },
    { kind: 'set', method: 'DELETE', path: `/0/devices/${id}/s/note` },
  ];
}

// ---- MQTT ----

type Outcome = 'invalid' | 'helloMismatch' | 'authcodeTaken' | 'heardUnknown' | 'noop';

interface MqttCase {
  what: string;
  topic: UpTopic;
  payload: string | Buffer | Record<string, unknown> | unknown[];
  outcome: Outcome;
  /** Checked after the message was handled. */
  after?: () => Promise<void>;
}

function connectDevice(url: string, id: string, secret: string): Promise<MqttClient> {
  return mqtt.connectAsync(url, {
    clientId: id,
    username: id,
    password: secret,
    reconnectPeriod: 0,
    connectTimeout: 5000,
  });
}

const mid = () => randomUUID();
const omit = <T extends Record<string, unknown>>(o: T, key: keyof T): Record<string, unknown> => {
  const copy: Record<string, unknown> = { ...o };
  delete copy[key as string];
  return copy;
};

describe('bad input on the device routes and the device topics', () => {
  let live: LiveBridge;
  let agent: TestAgent;
  /** The agent's device (owned by `owner`) and its auth code. */
  let D: string;
  let A: string;
  /** A raw device client (also owned by `owner`), its secret and auth code. */
  const R = randomUUID();
  const R_SECRET = randomBytes(32).toString('hex');
  const RA = randomBytes(16).toString('hex');
  let rogue: MqttClient;
  let ownerCookie: string;
  let otherCookie: string;
  const statuses: number[] = [];

  const cookieOf = (as: HttpCase['as']): string | undefined => {
    if (as === undefined || as === 'owner') return ownerCookie;
    if (as === 'other') return otherCookie;
    if (as === 'none') return undefined;
    return as.cookie;
  };

  async function http(c: Omit<HttpCase, 'what' | 'want'>): Promise<Reply> {
    const headers: Record<string, string> = {};
    const cookie = cookieOf(c.as);
    if (cookie !== undefined) headers.cookie = cookie;
    if (c.type !== undefined) headers['content-type'] = c.type;
    const r = await call(live.url, c.method, c.path, headers, c.body);
    statuses.push(r.status);
    return r;
  }

  const getJson = async <T>(path: string): Promise<T | undefined> => {
    const r = await http({ method: 'GET', path });
    return r.status === 200 ? (JSON.parse(r.body) as T) : undefined;
  };

  async function signup(login: string): Promise<string> {
    const c = live.client();
    const r = await c.post('/0/session/signup', { form: { login, password: 'correct horse battery' } });
    expect(r.status).toBe(201);
    return `sid=${c.sid!}`;
  }

  function hello(over: Record<string, unknown> = {}): Record<string, unknown> {
    return {
      id: mid(),
      protocol: 1,
      deviceId: R,
      authcode: RA,
      platform: 'test-board',
      agentVersion: '0.0.1',
      fwVersion: '1.0',
      mode: 'master',
      bootTime: 1_700_000_000_000,
      ts: Date.now(),
      ...over,
    };
  }

  beforeAll(async () => {
    live = await startLiveBridge({
      config: { devices: { maxValueBytes: MAX_VALUE }, http: { bodyLimit: BODY_LIMIT } },
    });
    agent = await startAgent({ mqttUrl: live.mqttUrl, level: 'info' });
    D = agent.agent.identity.deviceId;
    A = agent.agent.identity.authcode;
    ownerCookie = await signup('owner@example.com');
    otherCookie = await signup('other@example.com');

    rogue = await connectDevice(live.mqttUrl, R, R_SECRET);
    await rogue.publishAsync(topicFor(R, 'up/hello'), JSON.stringify(hello()), { qos: 1 });
    // Both devices said hello: claim them by their auth codes.
    for (const code of [A, RA]) {
      await until(() => live.bridge.store.devices.deviceByAuthcode(code), `the device with auth code ${code}`);
      expect((await http({ method: 'POST', path: '/0/devices/', ...form({ auth: code }) })).status).toBe(201);
    }
    // Variables the cases read, page and delete.
    for (const [id, type, name, value] of [
      [D, 'd', 'led', 'on'],
      [D, 's', 'note', 'hello'],
      [R, 'd', 'led', 'on'],
    ] as const) {
      const r = await http({ method: 'POST', path: `/0/devices/${id}/${type}/${name}`, ...form({ value }) });
      expect(r).toEqual({ status: 200, body: 'device-ok' });
    }
    await until(async () => {
      const r = await getJson<{ acked: number; time: number }>(`/0/devices/${D}/d/led`);
      return r && r.acked >= r.time;
    }, 'the agent acknowledging d/led');
  });

  afterAll(async () => {
    await rogue?.endAsync(true);
    await agent?.stop();
    await live?.close();
  });

  it('answers bad input on every device and network route with its own token, never a 5xx', async () => {
    const cases: HttpCase[] = [];
    const add = (what: string, c: Omit<HttpCase, 'what'>) => cases.push({ what, ...c });

    // Malformed, unknown and invisible ids, on every route that names a device (decision 14).
    const badIds: Record<string, string> = {
      'too short hex': 'abcdef0123',
      'hex one short of an auth code': 'a'.repeat(15),
      'hex over the auth code length': 'a'.repeat(129),
      'non-hex': 'g'.repeat(32),
      'a uuid missing a digit': D.slice(0, -1),
      'a uuid with a digit too many': `${D}0`,
      'a uuid of no device': randomUUID(),
      'an auth code of no device': randomBytes(16).toString('hex'),
      '10 KB': 'a'.repeat(10 * 1024),
      'bad percent-encoding': '%zz',
      'percent-encoded overlong UTF-8': '%C0%AF',
      'percent-encoded NUL': '%00',
      'percent-encoded slash': `%2F${'a'.repeat(16)}`,
      'percent-encoded dots': '%2e%2e',
      'dot-dot': '..',
      unicode: '%E2%82%AC',
    };
    for (const [what, id] of Object.entries(badIds)) {
      for (const r of deviceRoutes(id))
        add(`id ${what}: ${r.method} ${r.path.slice(0, 60)}`, { ...r, want: r.kind === 'get' ? GET_FAIL : SET_FAIL });
    }
    // Another user sees neither device, by uuid or by auth code.
    for (const id of [D, A, R, RA]) {
      for (const r of deviceRoutes(id))
        add(`invisible: ${r.method} ${r.path}`, { ...r, as: 'other', want: r.kind === 'get' ? GET_FAIL : SET_FAIL });
    }
    add('invisible: the list is empty', {
      method: 'GET',
      path: '/0/devices/',
      as: 'other',
      want: { status: 200, body: '{}' },
    });
    add('invisible: network shows no claimed device', {
      method: 'GET',
      path: '/0/network/',
      as: 'other',
      want: { status: 200, body: '{}' },
    });

    // The owner reaches its device by uuid and by auth code, in either case.
    for (const id of [D.toUpperCase(), A.toUpperCase(), A]) {
      add(`by ${id}: GET device`, { method: 'GET', path: `/0/devices/${id}`, want: JSON_OK });
      add(`by ${id}: GET d`, { method: 'GET', path: `/0/devices/${id}/d`, want: JSON_OK });
      add(`by ${id}: GET d/led`, { method: 'GET', path: `/0/devices/${id}/d/led`, want: JSON_OK });
      add(`by ${id}: POST s/case`, {
        method: 'POST',
        path: `/0/devices/${id}/s/case`,
        ...form({ value: 'x' }),
        want: DEVICE_OK,
      });
    }

    // Bad types.
    for (const [what, t] of Object.entries({
      x: 'x',
      'upper D': 'D',
      'upper META': 'META',
      dd: 'dd',
      empty: '',
      unicode: '%C3%A9',
    })) {
      if (t !== '') add(`type ${what}: GET list`, { method: 'GET', path: `/0/devices/${D}/${t}`, want: GET_FAIL });
      add(`type ${what}: GET var`, { method: 'GET', path: `/0/devices/${D}/${t}/led`, want: GET_FAIL });
      add(`type ${what}: GET history`, { method: 'GET', path: `/0/devices/${D}/${t}/led?latest=1`, want: GET_FAIL });
      add(`type ${what}: POST var`, {
        method: 'POST',
        path: `/0/devices/${D}/${t}/led`,
        ...form({ value: '1' }),
        want: SET_FAIL,
      });
      add(`type ${what}: DELETE var`, { method: 'DELETE', path: `/0/devices/${D}/${t}/led`, want: SET_FAIL });
    }
    // meta is read-only (decision 22), and a meta name that does not exist is not found.
    add('meta: POST state', {
      method: 'POST',
      path: `/0/devices/${D}/meta/state`,
      ...form({ value: 'x' }),
      want: SET_FAIL,
    });
    add('meta: POST a new name', {
      method: 'POST',
      path: `/0/devices/${D}/meta/custom`,
      ...form({ value: 'x' }),
      want: SET_FAIL,
    });
    add('meta: POST with no value', { method: 'POST', path: `/0/devices/${D}/meta/state`, want: SET_FAIL });
    add('meta: DELETE state', { method: 'DELETE', path: `/0/devices/${D}/meta/state`, want: SET_FAIL });
    add('meta: GET a name that is not there', { method: 'GET', path: `/0/devices/${D}/meta/nothing`, want: GET_FAIL });
    add('meta: GET state', {
      method: 'GET',
      path: `/0/devices/${D}/meta/state`,
      want: { status: 200, body: '"connected"' },
    });

    // Bad names (decision 12), on d and s.
    const badNames: Record<string, string> = {
      'leading dot': '.hidden',
      'leading underscore': '_x',
      'leading dash': '-x',
      '65 characters': 'a'.repeat(65),
      'encoded slash': 'a%2Fb',
      'encoded space': 'a%20b',
      'encoded NUL': 'a%00',
      'unicode letters': '%C3%A9t%C3%A9',
      emoji: '%F0%9F%98%80',
      'encoded dot-dot': '%2e%2e',
    };
    for (const [what, n] of Object.entries(badNames)) {
      for (const t of ['d', 's']) {
        add(`name ${what} (${t}): GET`, { method: 'GET', path: `/0/devices/${D}/${t}/${n}`, want: GET_FAIL });
        add(`name ${what} (${t}): GET history`, {
          method: 'GET',
          path: `/0/devices/${D}/${t}/${n}?latest=2`,
          want: GET_FAIL,
        });
        add(`name ${what} (${t}): POST`, {
          method: 'POST',
          path: `/0/devices/${D}/${t}/${n}`,
          ...form({ value: '1' }),
          want: SET_FAIL,
        });
        add(`name ${what} (${t}): DELETE`, { method: 'DELETE', path: `/0/devices/${D}/${t}/${n}`, want: SET_FAIL });
      }
    }
    // Names that are good, however they look to JavaScript.
    for (const n of ['a'.repeat(64), 'constructor', 'hasOwnProperty', 'toString', 'x.y-z_1']) {
      add(`name ${n.slice(0, 20)}: POST s`, {
        method: 'POST',
        path: `/0/devices/${D}/s/${n}`,
        ...form({ value: n }),
        want: DEVICE_OK,
      });
      add(`name ${n.slice(0, 20)}: GET s`, { method: 'GET', path: `/0/devices/${D}/s/${n}`, want: JSON_OK });
    }
    add('a name never set: GET', { method: 'GET', path: `/0/devices/${D}/d/ghost`, want: GET_FAIL });
    add('a name never set: DELETE', { method: 'DELETE', path: `/0/devices/${D}/d/ghost`, want: SET_FAIL });
    add('a name never set: sync', { method: 'POST', path: `/0/devices/${D}/d/ghost`, want: SET_FAIL });
    add('a name never set: history is empty', {
      method: 'GET',
      path: `/0/devices/${D}/d/ghost?latest=3`,
      want: { status: 200, body: '[]' },
    });

    // Values: sizes against devices.maxValueBytes, base64, and both fields.
    const note = `/0/devices/${D}/s/note`;
    const setNote = (what: string, body: { type?: string; body?: string | Buffer }, want: Want) =>
      add(`value ${what}`, { method: 'POST', path: note, ...body, want });
    setNote('at the limit', form({ value: 'v'.repeat(MAX_VALUE) }), DEVICE_OK);
    setNote('one byte over the limit', form({ value: 'v'.repeat(MAX_VALUE + 1) }), SET_FAIL);
    setNote('of multi-byte characters over the limit in bytes', form({ value: '€'.repeat(22) }), SET_FAIL);
    setNote('of multi-byte characters under the limit', form({ value: '€'.repeat(21) }), DEVICE_OK);
    setNote('empty', form({ value: '' }), DEVICE_OK);
    setNote('absent on an s variable', form({}), SET_FAIL);
    setNote('value64 at the limit', form({ value64: b64(MAX_VALUE) }), DEVICE_OK);
    setNote('value64 decoding one byte over the limit', form({ value64: b64(MAX_VALUE + 1) }), SET_FAIL);
    setNote('value64 not base64', form({ value64: '!!!!' }), SET_FAIL);
    setNote('value64 without its padding', form({ value64: 'YWJjZA' }), SET_FAIL);
    setNote('value64 with too much padding', form({ value64: 'YQ===' }), SET_FAIL);
    setNote('value64 with padding inside', form({ value64: 'YW=j' }), SET_FAIL);
    setNote('value64 with a newline', form({ value64: 'YWJj\n' }), SET_FAIL);
    setNote('value64 base64url', form({ value64: '-_-_' }), SET_FAIL);
    setNote('value64 bad, value good', form({ value: 'text', value64: 'abc' }), SET_FAIL);
    setNote('value64 too large, value good', form({ value: 'text', value64: b64(MAX_VALUE + 3) }), SET_FAIL);
    setNote('value too large, value64 good', form({ value: 'v'.repeat(MAX_VALUE + 1), value64: 'YQ==' }), DEVICE_OK);
    add('value and value64: value64 wins', {
      method: 'POST',
      path: `/0/devices/${D}/s/both`,
      ...form({ value: 'text', value64: Buffer.from('bin').toString('base64') }),
      want: DEVICE_OK,
    });

    // JSON bodies of the wrong shape.
    setNote('JSON object', json({ value: 'ok' }), DEVICE_OK);
    setNote('JSON array', json(['value', 'x']), SET_FAIL);
    setNote('JSON number', json(42), SET_FAIL);
    setNote('JSON string', json('value=x'), SET_FAIL);
    setNote('JSON null', json(null), SET_FAIL);
    setNote('JSON nested object for value', json({ value: { a: 1 } }), SET_FAIL);
    setNote('JSON number for value', json({ value: 5 }), SET_FAIL);
    setNote('JSON array for value', json({ value: ['x'] }), SET_FAIL);
    setNote('JSON null for value', json({ value: null }), SET_FAIL);
    setNote('JSON boolean for value', json({ value: true }), SET_FAIL);
    setNote('JSON number for value64', json({ value64: 5 }), SET_FAIL);
    setNote('JSON broken', raw(JSON_TYPE, '{"value":'), SET_FAIL);
    setNote('JSON empty', raw(JSON_TYPE, ''), SET_FAIL);
    setNote('JSON __proto__', raw(JSON_TYPE, '{"__proto__":{"value":"polluted"}}'), SET_FAIL);
    setNote('JSON constructor.prototype', raw(JSON_TYPE, '{"constructor":{"prototype":{"value":"x"}}}'), SET_FAIL);
    add('JSON array on a d variable never set (nothing to sync)', {
      method: 'POST',
      path: `/0/devices/${D}/d/ghost`,
      ...json([1, 2]),
      want: SET_FAIL,
    });
    // On a d variable that exists, "no fields" would be a sync: a body that is not fields must not read as one.
    for (const [what, body] of [
      ['a JSON array', json([1, 2])],
      ['a JSON number', json(7)],
      ['a JSON string', json('value=on')],
      ['text/plain', raw('text/plain', 'value=on')],
    ] as const) {
      add(`${what} on an existing d variable (not a sync)`, {
        method: 'POST',
        path: `/0/devices/${D}/d/led`,
        ...body,
        want: SET_FAIL,
      });
    }
    // Forms that are not forms.
    setNote('form not UTF-8', raw(FORM, Buffer.from([0x76, 0x61, 0x6c, 0x75, 0x65, 0x3d, 0xff, 0xfe])), SET_FAIL);
    setNote('form with __proto__', raw(FORM, '__proto__=x&constructor=y&value=ok'), DEVICE_OK);
    setNote('form with a repeated field', raw(FORM, 'value=a&value=b'), DEVICE_OK);
    setNote('text/plain', raw('text/plain', 'value=x'), SET_FAIL);
    setNote(
      'multipart',
      raw(
        'multipart/form-data; boundary=x',
        '--x\r\nContent-Disposition: form-data; name="value"\r\n\r\nx\r\n--x--\r\n',
      ),
      SET_FAIL,
    );
    setNote('a form labelled JSON', raw(JSON_TYPE, 'value=x'), SET_FAIL);
    setNote('a body with no content type', { body: 'value=x' }, SET_FAIL);
    setNote('a content type with junk parameters', raw(`${FORM}; charset=ebcdic; x`, 'value=x'), DEVICE_OK);
    // Over http.bodyLimit.
    const huge = `value=${'x'.repeat(1024 * 1024)}`;
    setNote('over the body limit', raw(FORM, huge), SET_FAIL);
    add('DELETE with a body over the limit', { method: 'DELETE', path: note, ...raw(FORM, huge), want: SET_FAIL });
    add('DELETE of a device with a body over the limit', {
      method: 'DELETE',
      path: `/0/devices/${D}`,
      ...raw(FORM, huge),
      want: SET_FAIL,
    });
    add('claim with a body over the limit', {
      method: 'POST',
      path: '/0/devices/',
      ...raw(FORM, `auth=${A}&x=${'y'.repeat(BODY_LIMIT)}`),
      want: CLAIM_FAIL,
    });
    add('GET the list with a body', { method: 'GET', path: '/0/devices/', ...raw(FORM, huge), want: JSON_OK });

    // latest and from (decision 10).
    const led = `/0/devices/${D}/d/led`;
    for (const q of [
      'latest=abc',
      'latest=-1',
      'latest=1.5',
      'latest=1e3',
      'latest=',
      'latest=%20',
      'latest=+1',
      'latest=0x10',
      'latest=%FF',
      `latest=${'9'.repeat(16)}`,
      `latest=${'1'.repeat(5000)}`,
      'latest=1&latest=2',
      'from=abc',
      'from=-5',
      'from=',
      'from=1&from=2',
      'latest=1&from=x',
      'latest=x&from=1',
    ]) {
      add(`history ${q.slice(0, 40)}`, { method: 'GET', path: `${led}?${q}`, want: SET_FAIL });
    }
    for (const q of [
      'latest=0',
      'latest=2',
      `latest=${'9'.repeat(15)}`,
      'from=0',
      `from=${'9'.repeat(15)}`,
      'latest=1&from=1',
    ]) {
      add(`history ${q.slice(0, 40)}`, { method: 'GET', path: `${led}?${q}`, want: { status: 200, body: /^\[/ } });
    }
    add('history of a meta variable', {
      method: 'GET',
      path: `/0/devices/${D}/meta/state?latest=1`,
      want: { status: 200, body: /^\[/ },
    });
    add('a query that is not latest or from', { method: 'GET', path: `${led}?latest[]=1&x=%zz`, want: JSON_OK });

    // Claim (decision 8).
    const claim = (what: string, body: { type?: string; body?: string | Buffer }, want: Want, as?: HttpCase['as']) =>
      add(`claim ${what}`, { method: 'POST', path: '/0/devices/', ...body, want, ...(as ? { as } : {}) });
    claim('with no body', {}, CLAIM_FAIL);
    claim('with auth missing', form({ other: 'x' }), CLAIM_FAIL);
    claim('with auth missing and an unknown app (decision 15)', form({ app: 'x' }), NOT_FOUND);
    claim('with auth empty', form({ auth: '' }), CLAIM_FAIL);
    claim('with auth too short', form({ auth: 'abc123' }), CLAIM_FAIL);
    claim('with auth not hex', form({ auth: 'z'.repeat(32) }), CLAIM_FAIL);
    claim('with auth too long', form({ auth: 'a'.repeat(129) }), CLAIM_FAIL);
    claim('with a uuid for auth', form({ auth: D }), CLAIM_FAIL);
    claim('with an auth code of no device', form({ auth: randomBytes(16).toString('hex') }), CLAIM_FAIL);
    claim('with auth a JSON array', json({ auth: [A] }), CLAIM_FAIL);
    claim('with auth a JSON number', json({ auth: 1234567890123456 }), CLAIM_FAIL);
    claim('with auth a JSON object', json({ auth: { auth: A } }), CLAIM_FAIL);
    claim('with a JSON array body', json([A]), CLAIM_FAIL);
    claim(
      'with a form not UTF-8',
      raw(FORM, Buffer.concat([Buffer.from(`auth=${A}&x=`), Buffer.from([0xc3, 0x28])])),
      CLAIM_FAIL,
    );
    claim('as text/plain', raw('text/plain', `auth=${A}`), CLAIM_FAIL);
    claim('with broken JSON', raw(JSON_TYPE, `{"auth":"${A}"`), CLAIM_FAIL);
    claim('of a device another user owns', form({ auth: A }), CLAIM_FAIL, 'other');
    claim('again by the owner (idempotent)', form({ auth: A }), claimed(D));
    claim('again by the owner in JSON', json({ auth: A }), claimed(D));
    claim('in upper case with spaces', form({ auth: ` ${A.toUpperCase()} ` }), claimed(D));

    // No session (decision 3), on every route: none, a malformed cookie, a huge one.
    const everyRoute: Array<Omit<HttpCase, 'what' | 'want' | 'as'>> = [
      { method: 'GET', path: '/0/devices/' },
      { method: 'POST', path: '/0/devices/', ...form({ auth: A }) },
      ...deviceRoutes(D),
      { method: 'GET', path: '/0/network/' },
    ];
    for (const [what, as] of [
      ['no cookie', 'none'],
      ['a junk sid', { cookie: 'sid=junk' }],
      ['a sid of the right length', { cookie: `sid=${'A'.repeat(43)}` }],
      ['an 8 KB cookie', { cookie: `sid=${'x'.repeat(8 * 1024)}` }],
      ['a cookie without sid', { cookie: 'a=b; c' }],
    ] as const) {
      for (const r of everyRoute) add(`${what}: ${r.method} ${r.path}`, { ...r, as, want: NO_SESSION });
    }

    // Methods and paths no route has.
    for (const path of [
      '/0/devices/',
      `/0/devices/${D}`,
      `/0/devices/${D}/d`,
      `/0/devices/${D}/d/led`,
      '/0/network/',
    ]) {
      for (const method of ['PUT', 'PATCH'])
        add(`${method} ${path}`, { method, path, ...form({ value: 'x' }), want: NOT_FOUND });
    }
    add('an unknown app (decision 15)', {
      method: 'GET',
      path: `/0/devices/${D}?app=${randomUUID()}`,
      want: NOT_FOUND,
    });
    add('an app that is not a uuid', {
      method: 'POST',
      path: `/0/devices/${D}/s/note?app=x`,
      ...form({ value: 'x' }),
      want: NOT_FOUND,
    });
    add('DELETE the list', { method: 'DELETE', path: '/0/devices/', want: NOT_FOUND });
    // POST of a device is a command, and POST of one path segment below it the older clients' command spelling:
    // without a command (or with a type's name as the command) both are malformed.
    add('POST a device', { method: 'POST', path: `/0/devices/${D}`, ...form({ value: 'x' }), want: SET_FAIL });
    add('POST a type', { method: 'POST', path: `/0/devices/${D}/d`, ...form({ value: 'x' }), want: SET_FAIL });
    add('DELETE a type', { method: 'DELETE', path: `/0/devices/${D}/d`, want: NOT_FOUND });
    add('a path below a variable', { method: 'GET', path: `/0/devices/${D}/d/led/x`, want: NOT_FOUND });
    add('POST network', { method: 'POST', path: '/0/network/', want: NOT_FOUND });
    add('DELETE network', { method: 'DELETE', path: '/0/network/', want: NOT_FOUND });
    add('a path below network', { method: 'GET', path: '/0/network/x', want: NOT_FOUND });
    add('network with repeated and junk parameters', { method: 'GET', path: '/0/network/?x=1&x=2&%zz', want: JSON_OK });

    const wrong: Array<{ what: string; status: number; body: string; want: string }> = [];
    for (const c of cases) {
      const r = await http(c);
      const ok =
        r.status === c.want.status &&
        (typeof c.want.body === 'string' ? r.body === c.want.body : c.want.body.test(r.body));
      if (!ok)
        wrong.push({
          what: c.what,
          status: r.status,
          body: r.body.slice(0, 120),
          want: `${c.want.status} ${String(c.want.body)}`,
        });
    }
    expect(wrong).toEqual([]);
    expect(statuses.filter((s) => s >= 500)).toEqual([]);
    expect(live.sink.events('http.failed')).toEqual([]);

    // What the good cases among them did.
    const both = await getJson<{ value: string }>(`/0/devices/${D}/s/both`);
    expect(both?.value).toBe('bin');
    const device = await getJson<{ s: Record<string, { value: string }> }>(`/0/devices/${D}`);
    expect(Object.getOwnPropertyDescriptor(device?.s, 'constructor')?.value).toEqual({
      value: 'constructor',
      time: expect.any(Number),
    });
    expect(Object.getOwnPropertyDescriptor(device?.s, 'hasOwnProperty')?.value).toEqual({
      value: 'hasOwnProperty',
      time: expect.any(Number),
    });
    // Nothing the bad cases sent was kept: the device is still the owner's, d/led still on.
    expect(Object.keys((await getJson<Record<string, unknown>>('/0/devices/'))!).sort()).toEqual([D, R].sort());
    expect((await getJson<{ value: string }>(led))?.value).toBe('on');
    // s/note holds the last good value sent to it (the content type with junk parameters).
    expect((await getJson<{ value: string }>(note))?.value).toBe('x');
  });

  it('drops every bad payload on every up/ topic with one warning line and a counter', async () => {
    const link = live.bridge.link;
    const service = live.bridge.devices;
    const big = randomBytes(1024 * 1024);
    const item = (over: Record<string, unknown> = {}) => ({
      kind: 'push',
      type: 'd',
      name: 'fromdev',
      value: 'x',
      time: Date.now(),
      origin: 'device',
      ...over,
    });
    const vars = (...items: unknown[]) => ({ id: mid(), items });
    const ack = (over: Record<string, unknown> = {}) => ({
      kind: 'push',
      type: 'd',
      name: 'ghost',
      time: 1,
      origin: 'cloud',
      ...over,
    });
    const acks = (...list: unknown[]) => ({ id: mid(), acks: list });
    const meta = (m: unknown) => ({ id: mid(), ts: Date.now(), meta: m });
    const heard = (...list: unknown[]) => ({ id: mid(), heard: list });
    const cmd = (over: Record<string, unknown> = {}) => ({
      id: mid(),
      cmd: randomUUID(),
      state: 'done',
      at: Date.now(),
      exitCode: 0,
      ...over,
    });
    const rLed = () => getJson<{ value: string; time: number; acked: number }>(`/0/devices/${R}/d/led`);
    const ledBefore = (await rLed())!;
    expect(ledBefore.acked).toBe(0);

    const cases: MqttCase[] = [];
    const add = (
      topic: UpTopic,
      what: string,
      payload: MqttCase['payload'],
      outcome: Outcome,
      after?: () => Promise<void>,
    ) => cases.push({ topic, what, payload, outcome, ...(after ? { after } : {}) });
    // What every topic refuses the same way.
    for (const topic of ['state', 'up/hello', 'up/vars', 'up/acks', 'up/meta', 'up/heard', 'up/cmd'] as const) {
      add(topic, 'an empty payload', '', 'invalid');
      add(topic, '1 MB of junk', big, 'invalid');
      add(topic, 'bytes that are not UTF-8', Buffer.from([0xff, 0xfe, 0x7b, 0x7d]), 'invalid');
      if (topic === 'state') continue;
      add(topic, 'not JSON', 'online', 'invalid');
      add(topic, 'broken JSON', '{"id":', 'invalid');
      add(topic, 'a JSON array', [], 'invalid');
      add(topic, 'a JSON string', JSON.stringify('x'), 'invalid');
      add(topic, 'JSON null', 'null', 'invalid');
      add(topic, 'an empty object', {}, 'invalid');
    }
    // state
    for (const p of ['bogus', 'ONLINE', ' online', 'online\n', '"online"', 'offline'.repeat(1000)]) {
      add('state', JSON.stringify(p.slice(0, 20)), p, 'invalid');
    }
    // up/hello
    add('up/hello', 'an extra field', { ...hello(), extra: 1 }, 'invalid');
    add('up/hello', 'no authcode', omit(hello(), 'authcode'), 'invalid');
    add('up/hello', 'protocol as a string', hello({ protocol: '1' }), 'invalid');
    add('up/hello', 'protocol 2', hello({ protocol: 2 }), 'invalid');
    add('up/hello', 'a device id that is not a uuid', hello({ deviceId: 'not-a-uuid' }), 'invalid');
    add('up/hello', 'an authcode not hex', hello({ authcode: 'x'.repeat(32) }), 'invalid');
    add('up/hello', 'an authcode in upper case', hello({ authcode: RA.toUpperCase() }), 'invalid');
    add('up/hello', 'an authcode too short', hello({ authcode: 'a'.repeat(15) }), 'invalid');
    add('up/hello', 'an authcode too long', hello({ authcode: 'a'.repeat(129) }), 'invalid');
    add('up/hello', 'an oversized platform', hello({ platform: 'p'.repeat(129) }), 'invalid');
    add('up/hello', 'an empty platform', hello({ platform: '' }), 'invalid');
    add('up/hello', 'an oversized agent version', hello({ agentVersion: 'v'.repeat(65) }), 'invalid');
    add('up/hello', 'an oversized id', hello({ id: 'i'.repeat(65) }), 'invalid');
    add('up/hello', 'an unknown mode', hello({ mode: 'turbo' }), 'invalid');
    add('up/hello', 'a negative boot time', hello({ bootTime: -1 }), 'invalid');
    add('up/hello', 'a fractional ts', hello({ ts: 1.5 }), 'invalid');
    add('up/hello', 'ts as a string', hello({ ts: '123' }), 'invalid');
    add('up/hello', "naming another device's id", hello({ deviceId: D }), 'helloMismatch', async () => {
      // The other device keeps its own identity.
      const d = await getJson<{ meta: Record<string, { value: string }> }>(`/0/devices/${D}`);
      expect(d?.meta.unique?.value).toBe(D);
      expect(d?.meta.platform?.value).toBe(agent.config.platform);
    });
    add('up/hello', "with another device's auth code", hello({ authcode: A }), 'authcodeTaken', async () => {
      // Each auth code still names its own device.
      const byA = await getJson<{ meta: Record<string, { value: string }> }>(`/0/devices/${A}`);
      expect(byA?.meta.unique?.value).toBe(D);
      const byRA = await getJson<{ meta: Record<string, { value: string }> }>(`/0/devices/${RA}`);
      expect(byRA?.meta.unique?.value).toBe(R);
    });
    // up/vars
    add('up/vars', 'no items and no resync', vars(), 'invalid');
    add('up/vars', 'items not an array', { id: mid(), items: item() }, 'invalid');
    add('up/vars', 'an extra field', { ...vars(item()), extra: true }, 'invalid');
    add('up/vars', 'no id', omit(vars(item()), 'id'), 'invalid');
    add('up/vars', 'a name with a leading dot', vars(item({ name: '.x' })), 'invalid');
    add('up/vars', 'a name of 65 characters', vars(item({ name: 'n'.repeat(65) })), 'invalid');
    add('up/vars', 'a name with a slash', vars(item({ name: 'a/b' })), 'invalid');
    add('up/vars', 'a unicode name', vars(item({ name: 'été' })), 'invalid');
    add('up/vars', 'both value and value64', vars(item({ value64: 'eA==' })), 'invalid');
    add('up/vars', 'neither value nor value64 nor deleted', vars(omit(item(), 'value')), 'invalid');
    add('up/vars', 'deleted false', vars(omit(item({ deleted: false }), 'value')), 'invalid');
    add('up/vars', 'value and deleted', vars(item({ deleted: true })), 'invalid');
    add('up/vars', 'an unknown kind', vars(item({ kind: 'merge' })), 'invalid');
    add('up/vars', 'type meta', vars(item({ type: 'meta' })), 'invalid');
    add('up/vars', 'an unknown type', vars(item({ type: 'x' })), 'invalid');
    add('up/vars', 'an unknown origin', vars(item({ origin: 'server' })), 'invalid');
    add('up/vars', 'a negative time', vars(item({ time: -1 })), 'invalid');
    add('up/vars', 'a fractional time', vars(item({ time: 1.5 })), 'invalid');
    add('up/vars', 'time as a string', vars(item({ time: '1' })), 'invalid');
    add('up/vars', 'a time past the largest safe integer', vars(item({ time: 2 ** 53 })), 'invalid');
    add('up/vars', 'a value as a number', vars(item({ value: 1 })), 'invalid');
    add('up/vars', 'an oversized value', vars(item({ value: 'v'.repeat(64 * 1024 + 1) })), 'invalid');
    add('up/vars', 'value64 not base64', vars(omit(item({ value64: '!!!!' }), 'value')), 'invalid');
    add('up/vars', 'value64 decoding too large', vars(omit(item({ value64: b64(64 * 1024 + 1) }), 'value')), 'invalid');
    add('up/vars', 'a push with synced', vars(item({ synced: 1 })), 'invalid');
    add('up/vars', 'a sync without synced', vars(item({ kind: 'sync' })), 'invalid');
    add('up/vars', 'an extra field in an item', vars(item({ extra: 1 })), 'invalid');
    add(
      'up/vars',
      'one bad item among good ones',
      vars(item({ name: 'good1' }), item({ name: '' }), item({ name: 'good2' })),
      'invalid',
      async () => {
        // A batch is taken whole or not at all.
        expect((await http({ method: 'GET', path: `/0/devices/${R}/d/good1` })).status).toBe(404);
      },
    );
    add('up/vars', '1001 items', vars(...Array.from({ length: 1001 }, (_, i) => item({ name: `n${i}` }))), 'invalid');
    // up/acks
    add('up/acks', 'no acks', acks(), 'invalid');
    add('up/acks', 'acks not an array', { id: mid(), acks: ack() }, 'invalid');
    add('up/acks', 'a bad name', acks(ack({ name: '.x' })), 'invalid');
    add('up/acks', 'an unknown kind', acks(ack({ kind: 'nack' })), 'invalid');
    add('up/acks', 'type meta', acks(ack({ type: 'meta' })), 'invalid');
    add('up/acks', 'a value in an ack', acks(ack({ value: 'x' })), 'invalid');
    add('up/acks', 'a sync ack without synced', acks(ack({ kind: 'sync' })), 'invalid');
    add('up/acks', 'a push ack with synced', acks(ack({ synced: 3 })), 'invalid');
    add('up/acks', '1001 acks', acks(...Array.from({ length: 1001 }, () => ack())), 'invalid');
    const ghostUnchanged = async () => {
      expect((await http({ method: 'GET', path: `/0/devices/${R}/d/ghost` })).status).toBe(404);
      expect((await http({ method: 'GET', path: `/0/devices/${R}/d/ghost?latest=10` })).body).toBe('[]');
    };
    add('up/acks', 'a push of a variable that does not exist', acks(ack()), 'noop', ghostUnchanged);
    add(
      'up/acks',
      'a sync of a variable that does not exist',
      acks(ack({ kind: 'sync', synced: 5 })),
      'noop',
      ghostUnchanged,
    );
    const ledUnacked = async () => {
      const led = await rLed();
      expect(led).toMatchObject({ value: 'on', time: ledBefore.time, acked: 0 });
    };
    add(
      'up/acks',
      'a version of d/led that was never sent',
      acks(ack({ name: 'led', time: ledBefore.time + 1 })),
      'noop',
      ledUnacked,
    );
    add(
      'up/acks',
      'the right time but the device as origin',
      acks(ack({ name: 'led', time: ledBefore.time, origin: 'device' })),
      'noop',
      ledUnacked,
    );
    add('up/acks', 'of an s variable', acks(ack({ type: 's', name: 'note' })), 'noop');
    // up/meta
    add('up/meta', 'meta empty', meta({}), 'invalid');
    add('up/meta', 'meta an array', meta(['x']), 'invalid');
    add('up/meta', 'a bad name', meta({ '.x': 'y' }), 'invalid');
    add('up/meta', 'a name __proto__', '{"id":"m","ts":1,"meta":{"__proto__":"x"}}', 'invalid');
    add('up/meta', 'a value as a number', meta({ uptime: 5 }), 'invalid');
    add('up/meta', 'an oversized value', meta({ uptime: 'u'.repeat(4097) }), 'invalid');
    add('up/meta', 'no ts', omit(meta({ uptime: '1' }), 'ts'), 'invalid');
    add('up/meta', 'an extra field', { ...meta({ uptime: '1' }), extra: 1 }, 'invalid');
    add(
      'up/meta',
      'the bridge’s own entries',
      meta({ state: 'hacked', unique: 'someone', platform: 'fake' }),
      'noop',
      async () => {
        expect(await getJson<string>(`/0/devices/${R}/meta/state`)).toBe('connected');
        expect(await getJson<string>(`/0/devices/${R}/meta/unique`)).toBe(R);
      },
    );
    add(
      'up/meta',
      'names that are Object members',
      meta({ constructor: 'c', hasOwnProperty: 'h' }),
      'noop',
      async () => {
        expect(await getJson<string>(`/0/devices/${R}/meta/constructor`)).toBe('c');
        const dev = await getJson<{ meta: Record<string, { value: string }> }>(`/0/devices/${R}`);
        expect(Object.getOwnPropertyDescriptor(dev?.meta, 'hasOwnProperty')?.value).toEqual({
          value: 'h',
          time: expect.any(Number),
        });
      },
    );
    // up/heard
    add('up/heard', 'heard empty', heard(), 'invalid');
    add('up/heard', 'an authcode not hex', heard({ authcode: 'xyz'.repeat(8), at: Date.now() }), 'invalid');
    add('up/heard', 'an authcode too short', heard({ authcode: 'abc', at: Date.now() }), 'invalid');
    add('up/heard', 'an authcode too long', heard({ authcode: 'a'.repeat(129), at: Date.now() }), 'invalid');
    add('up/heard', 'an authcode in upper case', heard({ authcode: 'ABCDEF0123456789', at: Date.now() }), 'invalid');
    add('up/heard', 'an authcode as a number', heard({ authcode: 12345678, at: Date.now() }), 'invalid');
    add('up/heard', 'a negative at', heard({ authcode: 'abcdef0123456789', at: -1 }), 'invalid');
    add('up/heard', 'no at', heard({ authcode: 'abcdef0123456789' }), 'invalid');
    add('up/heard', 'an extra field in an entry', heard({ authcode: 'abcdef0123456789', at: 1, rssi: -40 }), 'invalid');
    add('up/heard', 'an authcode of no user', heard({ authcode: 'abcdef0123456789', at: Date.now() }), 'heardUnknown');
    // up/cmd
    add('up/cmd', 'a command id that is not a uuid', cmd({ cmd: 'nope' }), 'invalid');
    add('up/cmd', 'an unknown state', cmd({ state: 'bogus' }), 'invalid');
    add('up/cmd', 'an oversized output', cmd({ output: 'o'.repeat(4097) }), 'invalid');
    add('up/cmd', 'a fractional exit code', cmd({ exitCode: 1.5 }), 'invalid');
    add('up/cmd', 'an oversized signal', cmd({ signal: 'S'.repeat(33) }), 'invalid');
    add('up/cmd', 'an extra field', cmd({ extra: 1 }), 'invalid');
    add('up/cmd', 'the status of a command never sent', cmd(), 'noop');

    let probe = 0;
    const expected = { invalid: 0, helloMismatch: 0, authcodeTaken: 0, heardUnknown: 0 };
    const wrong: string[] = [];
    for (const c of cases) {
      const before = {
        invalid: link.dropped.invalid,
        foreign: link.dropped.foreign,
        ...service.counters,
        lines: live.sink.lines.length,
      };
      const payload =
        typeof c.payload === 'string' || Buffer.isBuffer(c.payload) ? c.payload : JSON.stringify(c.payload);
      await rogue.publishAsync(topicFor(R, c.topic), payload, { qos: 1 });
      // A good message from the same device after it: once it is recorded, the bad one has been dealt with.
      const n = String(++probe);
      await rogue.publishAsync(topicFor(R, 'up/meta'), JSON.stringify(meta({ probe: n })), { qos: 1 });
      await until(
        async () => (await getJson<string>(`/0/devices/${R}/meta/probe`)) === n,
        `probe ${n} after ${c.what}`,
      );

      const lines = live.sink.lines.slice(before.lines);
      const warnings = lines.filter((l) => l.level === 'warn' || l.level === 'error');
      const got = {
        invalid: link.dropped.invalid - before.invalid,
        foreign: link.dropped.foreign - before.foreign,
        helloMismatch: service.counters.helloMismatch - before.helloMismatch,
        authcodeTaken: service.counters.authcodeTaken - before.authcodeTaken,
        heardUnknown: service.counters.heardUnknown - before.heardUnknown,
        failed: service.counters.failed - before.failed,
        warnings: warnings.map((l) => [l.event, l.topic ?? '', l.deviceId ?? ''].map(String).join(' ')),
      };
      const want = {
        invalid: c.outcome === 'invalid' ? 1 : 0,
        foreign: 0,
        helloMismatch: c.outcome === 'helloMismatch' ? 1 : 0,
        authcodeTaken: c.outcome === 'authcodeTaken' ? 1 : 0,
        heardUnknown: c.outcome === 'heardUnknown' ? 1 : 0,
        failed: 0,
        warnings:
          c.outcome === 'invalid' || c.outcome === 'helloMismatch'
            ? [`mqtt.drop ${c.topic} ${R}`]
            : c.outcome === 'authcodeTaken'
              ? [`device.authcode_taken  ${R}`]
              : [],
      };
      if (JSON.stringify(got) !== JSON.stringify(want)) {
        wrong.push(`${c.topic} ${c.what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
      }
      if (c.outcome === 'invalid') {
        const drop = warnings[0];
        if (drop?.bytes !== Buffer.byteLength(payload) || typeof drop.reason !== 'string') {
          wrong.push(`${c.topic} ${c.what}: drop line ${JSON.stringify(drop)?.slice(0, 200)}`);
        }
      }
      if (c.outcome !== 'noop') expected[c.outcome]++;
      await c.after?.();
    }
    expect(wrong).toEqual([]);
    expect(link.dropped.invalid).toBe(expected.invalid);
    expect(service.counters.helloMismatch).toBe(expected.helloMismatch);
    expect(service.counters.authcodeTaken).toBe(expected.authcodeTaken);
    expect(service.counters.heardUnknown).toBe(expected.heardUnknown);
    expect(service.counters.failed).toBe(0);
    expect(live.sink.events('device.message_failed')).toEqual([]);
    expect(rogue.connected).toBe(true);
  });

  it('refuses a device publishing outside its own up/ topics, before the bridge sees it', async () => {
    // One connection per client id: each new connection below would take over this one.
    await rogue.endAsync();
    const broker = live.bridge.broker!;
    const link = live.bridge.link;
    const refused = broker.refusals['publish-denied'];
    const received = JSON.stringify(link.received);
    const foreign = link.dropped.foreign;
    const topics = [
      `dc/v1/${R}/down/vars`,
      `dc/v1/${R}/up/other`,
      `dc/v1/${R}/up/vars/extra`,
      `dc/v1/${R}/up`,
      `dc/v1/${R}`,
      `dc/v1/${R.toUpperCase()}/up/vars`,
      `dc/v1/${D}/up/vars`,
      `dc/v1/${D}/state`,
      'dc/v1/x/up/vars',
      'elsewhere/topic',
    ];
    const payload = JSON.stringify({
      id: mid(),
      items: [{ kind: 'push', type: 'd', name: 'injected', value: 'x', time: Date.now(), origin: 'device' }],
    });
    for (const [i, topic] of topics.entries()) {
      const c = await connectDevice(live.mqttUrl, R, R_SECRET);
      const closed = new Promise<void>((resolve) => c.once('close', () => resolve()));
      c.publish(topic, payload, { qos: 1 });
      await closed;
      await c.endAsync(true);
      expect(broker.refusals['publish-denied'], topic).toBe(refused + i + 1);
    }
    // Nor may it listen to another device, or to every device.
    const c = await connectDevice(live.mqttUrl, R, R_SECRET);
    const subRefused = broker.refusals['subscribe-denied'];
    const granted = await c.subscribeAsync([downFilter(R), downFilter(D), 'dc/v1/+/up/#', '#'], { qos: 1 }).then(
      () => undefined,
      (err: unknown) => (err as { packet?: { granted?: number[] } }).packet?.granted,
    );
    expect(granted).toEqual([1, 128, 128, 128]);
    expect(broker.refusals['subscribe-denied']).toBe(subRefused + 3);
    await c.endAsync(true);

    expect(JSON.stringify(link.received)).toBe(received);
    expect(link.dropped.foreign).toBe(foreign);
    expect((await http({ method: 'GET', path: `/0/devices/${D}/d/injected` })).status).toBe(404);
    expect((await http({ method: 'GET', path: `/0/devices/${R}/d/injected` })).status).toBe(404);
  });

  it('keeps serving afterwards: the bridge answers and records, the agent keeps syncing', async () => {
    // The raw device connects again and is heard: its good message is recorded and acknowledged to it.
    const c = await connectDevice(live.mqttUrl, R, R_SECRET);
    const acked = new Promise<string>((resolve) =>
      c.on('message', (topic, payload) => {
        if (topic === topicFor(R, 'down/acks')) resolve(payload.toString());
      }),
    );
    await c.subscribeAsync(downFilter(R), { qos: 1 });
    const time = Date.now();
    await c.publishAsync(
      topicFor(R, 'up/vars'),
      JSON.stringify({
        id: mid(),
        items: [{ kind: 'push', type: 'd', name: 'after', value: 'fine', time, origin: 'device' }],
      }),
      { qos: 1 },
    );
    expect(JSON.parse(await acked)).toMatchObject({
      acks: [{ kind: 'push', type: 'd', name: 'after', time, origin: 'device' }],
    });
    expect((await getJson<{ value: string }>(`/0/devices/${R}/d/after`))?.value).toBe('fine');
    await c.endAsync(true);

    // The agent, connected all along: a variable set through the API reaches it and is acknowledged...
    expect(await http({ method: 'POST', path: `/0/devices/${D}/d/after`, ...form({ value: 'storm' }) })).toEqual({
      status: 200,
      body: 'device-ok',
    });
    const local = await agent.client();
    try {
      await until(
        async () => (await local.get('d', 'after').catch(() => undefined))?.value === 'storm',
        'd/after on the agent',
      );
      await until(async () => {
        const r = await getJson<{ value: string; time: number; acked: number }>(`/0/devices/${D}/d/after`);
        return r && r.value === 'storm' && r.acked >= r.time;
      }, 'd/after acknowledged');
      // ...and a change made on the gateway reaches the API.
      await local.set('d', 'fromgateway', 'yes');
      await until(
        async () => (await getJson<{ value: string }>(`/0/devices/${D}/d/fromgateway`))?.value === 'yes',
        'd/fromgateway through the API',
      );
    } finally {
      local.close();
    }
    expect(await getJson<string>(`/0/devices/${D}/meta/state`)).toBe('connected');
    expect(statuses.filter((s) => s >= 500)).toEqual([]);
    expect(live.sink.events('http.failed')).toEqual([]);
  });
});
