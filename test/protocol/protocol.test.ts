/**
 * The wire contract (docs/decisions.md §4, decisions 9 and 12): topics, payload schemas and value encoding. Both
 * sides import these, so a regression here breaks every agent and bridge at once.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  ALL_DEVICES_UP_FILTERS,
  DOWN_TOPICS,
  FW_FAILURE_CODES,
  MAX_BATCH_ITEMS,
  MAX_PAYLOAD_BYTES,
  MAX_VALUE_BYTES,
  type Payloads,
  SCHEMAS,
  type TopicName,
  UP_TOPICS,
  VAR_NAME_RE,
  type VarItem,
  decode,
  decodeValue,
  downFilter,
  encode,
  encodeValue,
  isDownTopic,
  isUpTopic,
  parseTopic,
  topicFor,
} from '../../protocol/index.js';

const ID = randomUUID();
const OTHER = randomUUID();
const ALL_TOPICS: readonly TopicName[] = [...UP_TOPICS, ...DOWN_TOPICS];

/** MQTT filter matching (`+` one level, `#` the rest), enough to check the cloud's subscriptions. */
function matches(filter: string, topic: string): boolean {
  const f = filter.split('/');
  const t = topic.split('/');
  for (let i = 0; i < f.length; i++) {
    if (f[i] === '#') return true;
    if (i >= t.length || (f[i] !== '+' && f[i] !== t[i])) return false;
  }
  return f.length === t.length;
}

describe('topics', () => {
  it.each(ALL_TOPICS)('%s round-trips through topicFor and parseTopic', (name) => {
    const topic = topicFor(ID, name);
    expect(topic).toBe(`dc/v1/${ID}/${name}`);
    expect(parseTopic(topic)).toEqual({ deviceId: ID, name });
  });

  it('splits the topic names into up and down without overlap', () => {
    for (const name of UP_TOPICS) expect([isUpTopic(name), isDownTopic(name)]).toEqual([true, false]);
    for (const name of DOWN_TOPICS) expect([isUpTopic(name), isDownTopic(name)]).toEqual([false, true]);
  });

  it('the agent filter covers exactly its own down topics; the cloud filters cover every up topic', () => {
    for (const name of ALL_TOPICS) {
      expect(matches(downFilter(ID), topicFor(ID, name))).toBe(isDownTopic(name));
      expect(matches(downFilter(ID), topicFor(OTHER, name))).toBe(false);
      const cloudSees = ALL_DEVICES_UP_FILTERS.some((f) => matches(f, topicFor(OTHER, name)));
      expect(cloudSees).toBe(isUpTopic(name));
    }
  });

  it.each([
    ['another root', `dc/v2/${ID}/state`],
    ['a root that only starts the same', `xdc/v1/${ID}/state`],
    ['a leading slash', `/dc/v1/${ID}/state`],
    ['no topic name', `dc/v1/${ID}`],
    ['an empty topic name', `dc/v1/${ID}/`],
    ['an empty topic', ''],
    ['a device id that is not a uuid', 'dc/v1/gateway-1/state'],
    ['an upper-case uuid', `dc/v1/${ID.toUpperCase()}/state`],
    ['a uuid without dashes', `dc/v1/${ID.replace(/-/g, '')}/state`],
    ['an unknown name', `dc/v1/${ID}/up/unknown`],
    ['a down name spelled as up', `dc/v1/${ID}/up/fw`],
    ['a known name with an extra level', `dc/v1/${ID}/up/vars/extra`],
    ['a trailing slash', `dc/v1/${ID}/up/vars/`],
    ['a + wildcard for the device', 'dc/v1/+/state'],
    ['a # wildcard for the name', `dc/v1/${ID}/#`],
    ['a + wildcard inside the name', `dc/v1/${ID}/up/+`],
    ['a # wildcard for the device', 'dc/v1/#'],
  ])('parseTopic rejects %s', (_what, topic) => {
    expect(parseTopic(topic)).toBeUndefined();
  });

  it.each(['', 'gateway-1', '+', '#', `${ID}/x`, ID.toUpperCase(), `${ID} `, ID.slice(0, -1)])(
    'topicFor and downFilter throw on the device id %j',
    (bad) => {
      expect(() => topicFor(bad, 'state')).toThrow(TypeError);
      expect(() => downFilter(bad)).toThrow(TypeError);
    },
  );
});

const AUTHCODE = randomBytes(16).toString('hex');
const NOW = 1_700_000_000_000;

const push = (over: Partial<VarItem> = {}): VarItem => ({
  kind: 'push',
  type: 'd',
  name: 'led',
  value: 'on',
  time: NOW,
  origin: 'device',
  ...over,
});

/** One valid payload per topic. */
const VALID: { [K in TopicName]: Payloads[K] } = {
  state: 'online',
  'up/hello': {
    id: randomUUID(),
    protocol: 1,
    deviceId: ID,
    authcode: AUTHCODE,
    platform: 'linux-arm64',
    agentVersion: '0.1.0',
    fwVersion: '1.2.3',
    mode: 'master',
    bootTime: NOW - 5000,
    ts: NOW,
  },
  'up/vars': {
    id: randomUUID(),
    items: [
      push(),
      push({ name: 'blob', value: undefined, value64: Buffer.from([0xff, 0x00]).toString('base64') }),
      push({ name: 'gone', value: undefined, deleted: true }),
      push({ type: 's', name: 'temp', value: '21.5' }),
    ],
  },
  'up/acks': {
    id: randomUUID(),
    acks: [
      { kind: 'push', type: 'd', name: 'led', time: NOW, origin: 'cloud' },
      { kind: 'sync', type: 'd', name: 'led', time: NOW, origin: 'cloud', synced: NOW + 10 },
    ],
  },
  'up/meta': { id: randomUUID(), ts: NOW, meta: { fwstate: 'done', fwprogress: '100' } },
  'up/heard': { id: randomUUID(), heard: [{ authcode: 'deadbeef', at: NOW }] },
  'up/cmd': {
    id: randomUUID(),
    cmd: randomUUID(),
    state: 'done',
    at: NOW,
    exitCode: 0,
    signal: null,
    output: 'pong\n',
    truncated: false,
  },
  'down/vars': {
    id: randomUUID(),
    items: [push({ origin: 'cloud' }), push({ kind: 'sync', origin: 'cloud', synced: NOW + 1 })],
  },
  'down/acks': { id: randomUUID(), acks: [{ kind: 'push', type: 's', name: 'temp', time: NOW, origin: 'device' }] },
  'down/cmd': {
    id: randomUUID(),
    cmd: randomUUID(),
    command64: Buffer.from('ping').toString('base64'),
    priority: 2,
    created: NOW,
    expires: NOW + 86_400_000,
  },
  'down/fw': {
    id: randomUUID(),
    action: 'start',
    job: randomUUID(),
    name: 'gateway-1.2.4',
    version: 124,
    platform: 'linux-arm64',
    url: 'https://cloud.example/0/firmware/gateway-1.2.4',
    token: 'download-token',
    size: 1_048_576,
    sha256: 'a'.repeat(64),
    signature: randomBytes(64).toString('base64'),
  },
};

const json = (v: unknown) => Buffer.from(JSON.stringify(v));
const expectRejected = (name: TopicName, payload: Buffer | string) => {
  const d = decode(name, typeof payload === 'string' ? Buffer.from(payload) : payload);
  expect(d.ok, `${name} accepted ${String(payload).slice(0, 120)}`).toBe(false);
  return d.ok ? '' : d.reason;
};
const expectAccepted = (name: TopicName, payload: unknown) => {
  const d = decode(name, json(payload));
  expect(d.ok ? 'ok' : d.reason).toBe('ok');
};
const withItem = (item: Record<string, unknown>) => ({ id: 'm1', items: [item] });

describe('payload schemas', () => {
  it('has one valid example for every topic (this table covers SCHEMAS)', () => {
    expect(Object.keys(VALID).sort()).toEqual(Object.keys(SCHEMAS).sort());
    expect(Object.keys(SCHEMAS).sort()).toEqual([...ALL_TOPICS].sort());
  });

  it.each(ALL_TOPICS)('%s: the example survives encode and decode', (name) => {
    const decoded = decode(name, encode(name, VALID[name]));
    expect(decoded).toEqual({ ok: true, value: VALID[name] });
  });

  it('decodes from a view into a larger buffer, not from the whole buffer', () => {
    const inner = encode('up/heard', VALID['up/heard']);
    const outer = Buffer.concat([Buffer.from('garbage{'), inner, Buffer.from('}garbage')]);
    const view = new Uint8Array(outer.buffer, outer.byteOffset + 8, inner.length);
    expect(decode('up/heard', view)).toEqual({ ok: true, value: VALID['up/heard'] });
  });

  describe.each(ALL_TOPICS.filter((n) => n !== 'state'))('%s rejects', (name) => {
    const example = VALID[name] as Record<string, unknown>;
    it('a payload that is not JSON', () => {
      expect(expectRejected(name, '{"id": "m1",')).toBe('payload is not JSON');
      expectRejected(name, '');
      expectRejected(name, Buffer.from([0xff, 0xfe, 0x00]));
    });
    it('JSON that is not an object', () => {
      for (const p of ['null', '[]', '"text"', '42', 'true']) expectRejected(name, p);
    });
    it('a missing or wrongly typed id', () => {
      const { id: _id, ...noId } = example;
      expect(expectRejected(name, json(noId))).toMatch(/^id: /);
      expectRejected(name, json({ ...example, id: 42 }));
      expectRejected(name, json({ ...example, id: '' }));
      expectRejected(name, json({ ...example, id: 'x'.repeat(65) }));
    });
    it('an unknown key', () => {
      expectRejected(name, json({ ...example, extra: 1 }));
    });
    it('every field replaced by a value of the wrong type', () => {
      for (const key of Object.keys(example)) {
        const v = example[key];
        const wrong = typeof v === 'string' || v === null ? 12345 : typeof v === 'number' ? '12345' : 'not-an-object';
        expectRejected(name, json({ ...example, [key]: wrong }));
      }
    });
  });

  it('state is plain text, one of three words', () => {
    for (const s of ['online', 'offline', 'sleeping'] as const) {
      expect(decode('state', encode('state', s))).toEqual({ ok: true, value: s });
    }
    for (const bad of ['"online"', 'Online', 'online\n', '', 'asleep']) expectRejected('state', bad);
  });

  it('refuses a payload larger than MAX_PAYLOAD_BYTES before parsing it', () => {
    expect(expectRejected('up/vars', Buffer.alloc(MAX_PAYLOAD_BYTES + 1, 0x20))).toMatch(/exceeds/);
  });

  describe('VarItem', () => {
    it('accepts exactly one of value, value64 and deleted', () => {
      expectAccepted('up/vars', withItem(push()));
      expectAccepted('up/vars', withItem(push({ value: '' })));
      expectRejected('up/vars', json(withItem(push({ value64: 'AAAA' }))));
      expectRejected('up/vars', json(withItem(push({ deleted: true }))));
      expectRejected('up/vars', json(withItem(push({ value: undefined, value64: 'AAAA', deleted: true }))));
      expect(expectRejected('up/vars', json(withItem(push({ value: undefined }))))).toMatch(/exactly one/);
      expectRejected('up/vars', json(withItem({ ...push({ value: undefined }), deleted: false })));
    });

    it('carries synced exactly when the kind is sync', () => {
      expectAccepted('down/vars', withItem(push({ kind: 'sync', synced: NOW })));
      expect(expectRejected('down/vars', json(withItem(push({ kind: 'sync' }))))).toMatch(/synced/);
      expectRejected('down/vars', json(withItem(push({ synced: NOW }))));
    });

    it('checks kind, type, origin and the stamps', () => {
      for (const bad of [
        { kind: 'resend' },
        { type: 'meta' },
        { origin: 'user' },
        { time: -1 },
        { time: 1.5 },
        { time: '1700000000000' },
        { time: Number.MAX_SAFE_INTEGER + 2 },
      ]) {
        expectRejected('up/vars', json(withItem({ ...push(), ...bad })));
      }
      const { time: _t, ...noTime } = push();
      expectRejected('up/vars', json(withItem(noTime)));
    });

    it('limits a text value to 64 KiB of UTF-8, counted in bytes', () => {
      expectAccepted('up/vars', withItem(push({ value: 'x'.repeat(MAX_VALUE_BYTES) })));
      expect(expectRejected('up/vars', json(withItem(push({ value: 'x'.repeat(MAX_VALUE_BYTES + 1) }))))).toMatch(
        /too large/,
      );
      // 32769 two-byte characters: fewer characters than the limit, more bytes.
      expectRejected('up/vars', json(withItem(push({ value: 'é'.repeat(MAX_VALUE_BYTES / 2 + 1) }))));
    });

    it('limits value64 to 64 KiB of decoded bytes and checks that it is base64', () => {
      const b64 = (n: number) => push({ value: undefined, value64: Buffer.alloc(n, 0xff).toString('base64') });
      expectAccepted('up/vars', withItem(b64(MAX_VALUE_BYTES)));
      // Base64 rounds up to whole 3-byte groups: one and two bytes over the limit encode to the same length.
      expectRejected('up/vars', json(withItem(b64(MAX_VALUE_BYTES + 1))));
      expectRejected('up/vars', json(withItem(b64(MAX_VALUE_BYTES + 2))));
      expectRejected('up/vars', json(withItem(b64(MAX_VALUE_BYTES + 3))));
      for (const bad of ['AAA', 'AA=A', '@@@@', 'AAAA====', 'AA AA', 'AAA=\n', '-_-_']) {
        expect(expectRejected('up/vars', json(withItem(push({ value: undefined, value64: bad }))))).toMatch(/base64/);
      }
    });

    it.each([
      ['a', true],
      ['Z', true],
      ['0', true],
      ['a'.repeat(64), true],
      ['fw.version_2-b', true],
      ['9lives', true],
      ['', false],
      ['a'.repeat(65), false],
      ['_hidden', false],
      ['.dot', false],
      ['-dash', false],
      ['has space', false],
      ['a/b', false],
      ['a+b', false],
      ['é', false],
      ['name\n', false],
    ])('variable name %j valid: %s (decision 12)', (name, valid) => {
      expect(VAR_NAME_RE.test(name)).toBe(valid);
      const d = decode('up/vars', json(withItem(push({ name }))));
      expect(d.ok).toBe(valid);
      const a = decode(
        'up/acks',
        json({ id: 'm', acks: [{ kind: 'push', type: 'd', name, time: 1, origin: 'cloud' }] }),
      );
      expect(a.ok).toBe(valid);
    });
  });

  describe('batches', () => {
    it('carry at most MAX_BATCH_ITEMS items', () => {
      const items = (n: number) => Array.from({ length: n }, (_, i) => push({ name: `v${i}` }));
      expectAccepted('up/vars', { id: 'm', items: items(MAX_BATCH_ITEMS) });
      expectRejected('up/vars', json({ id: 'm', items: items(MAX_BATCH_ITEMS + 1) }));
      const acks = (n: number) =>
        Array.from({ length: n }, (_, i) => ({ kind: 'push', type: 'd', name: `v${i}`, time: 1, origin: 'cloud' }));
      expectAccepted('down/acks', { id: 'm', acks: acks(MAX_BATCH_ITEMS) });
      expectRejected('down/acks', json({ id: 'm', acks: acks(MAX_BATCH_ITEMS + 1) }));
      const heard = (n: number) => Array.from({ length: n }, () => ({ authcode: 'abcdef01', at: 1 }));
      expectAccepted('up/heard', { id: 'm', heard: heard(MAX_BATCH_ITEMS) });
      expectRejected('up/heard', json({ id: 'm', heard: heard(MAX_BATCH_ITEMS + 1) }));
    });

    it('are never empty, except a vars message asking for a resync', () => {
      expectRejected('up/acks', json({ id: 'm', acks: [] }));
      expectRejected('down/acks', json({ id: 'm', acks: [] }));
      expectRejected('up/heard', json({ id: 'm', heard: [] }));
      expectRejected('up/meta', json({ id: 'm', ts: 1, meta: {} }));
      expectRejected('down/vars', json({ id: 'm', items: [] }));
      expectRejected('down/vars', json({ id: 'm', items: [], resync: false }));
      expectAccepted('down/vars', { id: 'm', items: [], resync: true });
    });

    it('acks carry synced exactly when the kind is sync', () => {
      const ack = { kind: 'sync', type: 'd', name: 'led', time: 1, origin: 'cloud' };
      expectRejected('up/acks', json({ id: 'm', acks: [ack] }));
      expectAccepted('up/acks', { id: 'm', acks: [{ ...ack, synced: 2 }] });
      expectRejected('up/acks', json({ id: 'm', acks: [{ ...ack, kind: 'push', synced: 2 }] }));
    });
  });

  describe('other payloads', () => {
    it('hello: protocol 1, a uuid, a lower-case hex auth code and a known mode', () => {
      const hello = VALID['up/hello'];
      for (const bad of [
        { protocol: 2 },
        { deviceId: 'gateway-1' },
        { authcode: AUTHCODE.toUpperCase() },
        { authcode: 'abc' },
        { mode: 'sleepy' },
        { platform: '' },
      ]) {
        expectRejected('up/hello', json({ ...hello, ...bad }));
      }
    });

    it('heard: user authcodes of 8 to 128 lower-case hex digits (decision 19)', () => {
      const heard = (authcode: string) => ({ id: 'm', heard: [{ authcode, at: 1 }] });
      expectAccepted('up/heard', heard('0123abcd'));
      expectAccepted('up/heard', heard('f'.repeat(128)));
      for (const bad of ['0123abc', 'f'.repeat(129), 'DEADBEEF', 'deadbeeg', 'dead beef']) {
        expectRejected('up/heard', json(heard(bad)));
      }
    });

    it('meta: variable names as keys, bounded string values', () => {
      expectRejected('up/meta', json({ id: 'm', ts: 1, meta: { 'bad name': 'x' } }));
      expectRejected('up/meta', json({ id: 'm', ts: 1, meta: { fwstate: 1 } }));
      expectRejected('up/meta', json({ id: 'm', ts: 1, meta: { fwerror: 'x'.repeat(4097) } }));
    });

    it('meta: fwerrorcode, when present, is empty or has the form of a firmware failure code', () => {
      const meta = (m: Record<string, string>) => ({ id: 'm', ts: 1, meta: m });
      for (const code of FW_FAILURE_CODES) {
        expectAccepted('up/meta', meta({ fwstate: 'failed', fwerror: 'why', fwerrorcode: code }));
      }
      expectAccepted('up/meta', meta({ fwstate: 'downloading', fwerror: '', fwerrorcode: '' }));
      // An agent that predates the codes reports the text alone.
      expectAccepted('up/meta', meta({ fwstate: 'failed', fwerror: 'download: the server answered 401' }));
      // A code a newer agent knows and this bridge does not yet: kept, so that its firmware state is not lost.
      expectAccepted('up/meta', meta({ fwstate: 'failed', fwerror: 'why', fwerrorcode: 'brownout-during-flash' }));
      for (const bad of ['Download', ' download', 'download ', 'verify (signature)', '-x', 'x'.repeat(41)]) {
        expect(expectRejected('up/meta', json(meta({ fwstate: 'failed', fwerrorcode: bad })))).toBe(
          'meta.fwerrorcode: not a firmware failure code',
        );
      }
    });

    it('cmd: priority 0 to 2, a command of at most 4 KiB, bounded output', () => {
      const cmd = VALID['down/cmd'];
      const of = (n: number) => Buffer.alloc(n, 0x41).toString('base64');
      expectAccepted('down/cmd', { ...cmd, command64: of(4096) });
      expectRejected('down/cmd', json({ ...cmd, command64: of(4097) }));
      expectRejected('down/cmd', json({ ...cmd, command64: '' }));
      expectRejected('down/cmd', json({ ...cmd, command64: 'not base64!' }));
      for (const priority of [-1, 3, 1.5, '1']) expectRejected('down/cmd', json({ ...cmd, priority }));
      expectRejected('down/cmd', json({ ...cmd, cmd: 'not-a-uuid' }));
      const status = VALID['up/cmd'];
      expectRejected('up/cmd', json({ ...status, state: 'paused' }));
      expectRejected('up/cmd', json({ ...status, output: 'x'.repeat(4097) }));
      expectRejected('up/cmd', json({ ...status, exitCode: 0.5 }));
    });

    it('fw: start needs a URL, a sha256 and a signature; cancel only a job', () => {
      const start = VALID['down/fw'] as Extract<Payloads['down/fw'], { action: 'start' }>;
      expectAccepted('down/fw', { id: 'm', action: 'cancel', job: randomUUID() });
      expectRejected('down/fw', json({ id: 'm', action: 'cancel', job: randomUUID(), url: start.url }));
      expectRejected('down/fw', json({ ...start, action: 'pause' }));
      expectRejected('down/fw', json({ ...start, url: 'not a url' }));
      expectRejected('down/fw', json({ ...start, sha256: 'A'.repeat(64) }));
      expectRejected('down/fw', json({ ...start, sha256: 'a'.repeat(63) }));
      expectRejected('down/fw', json({ ...start, signature: randomBytes(129).toString('base64') }));
    });
  });
});

describe('value encoding (decision 9)', () => {
  it.each(['', 'on', '21.5', 'ünïcödé ✓ 🚀', 'line\nbreak\ttab\u0000nul', '\ufeffwith a BOM', 'x'.repeat(1000)])(
    'keeps UTF-8 text %j as value',
    (text) => {
      const bytes = Buffer.from(text, 'utf8');
      const enc = encodeValue(bytes);
      expect(enc).toEqual({ value: text });
      expect(decodeValue(enc)!.equals(bytes)).toBe(true);
    },
  );

  it.each([
    ['a lone 0xff', [0xff]],
    ['a NUL and 0xfe 0xff', [0x00, 0xfe, 0xff]],
    ['a truncated sequence', [0x61, 0xe2, 0x82]],
    ['an overlong slash', [0xc0, 0xaf]],
    ['an encoded surrogate', [0xed, 0xa0, 0x80]],
    ['a code point above U+10FFFF', [0xf4, 0x90, 0x80, 0x80]],
    ['a stray continuation byte', [0x61, 0x80, 0x62]],
  ])('sends %s as value64 and gets the same bytes back', (_what, raw) => {
    const bytes = Buffer.from(raw);
    const enc = encodeValue(bytes);
    expect(enc).toEqual({ value64: bytes.toString('base64') });
    expect(decodeValue(enc)!.equals(bytes)).toBe(true);
  });

  it('round-trips random bytes exactly, through the schema and JSON', () => {
    for (let i = 0; i < 300; i++) {
      const bytes = randomBytes(i % 40);
      const item = { ...push({ value: undefined }), ...encodeValue(bytes) };
      const d = decode('up/vars', json({ id: 'm', items: [item] }));
      if (!d.ok) throw new Error(d.reason);
      expect(decodeValue(d.value.items[0]!)!.equals(bytes)).toBe(true);
    }
  });

  it('decodes a tombstone as null', () => {
    expect(decodeValue({ deleted: true })).toBeNull();
    expect(decodeValue(push({ value: undefined, deleted: true }))).toBeNull();
  });
});
