/**
 * The notification routes (docs/notifications.md, "Rules" and "The event log"), over HTTP on each store engine, as
 * the official client calls them: a rule made from a form or a JSON body, listed and read back with its trigger in
 * its canonical text; a bad trigger answered with where it is wrong; every refusal of a field, a device, a webhook
 * or the per-user limit; an update that changes only what it names and arms the rule again for a new trigger; the
 * webhook's secret made, kept and taken off; another user's rule as no rule at all; a test fire by a body that
 * holds only `app`; a removal that leaves the log alone; the log's `latest` and `from`; 401 without a session.
 * Devices are written into the store as the MQTT side writes them, and claimed over HTTP.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { LocalBus } from '../../bridge/events/bus.js';
import {
  type ConfigOverrides,
  type HttpClient,
  type HttpResult,
  type StoreEngine,
  type TestBridge,
  engines,
  startTestBridge,
} from '../support/bridge.js';
import { until } from '../support/wait.js';

const PASSWORD = 'correct horse battery';

interface RuleJson {
  id: number;
  name: string;
  message: string;
  trigger: string;
  deviceid: string;
  email: boolean;
  webhook: string | null;
  webhookSecret: string | null;
  state: 'armed' | 'pending' | 'fired';
  created: number;
  updated: number;
  lastFired: number | null;
}

interface EventJson {
  id: number;
  type: 'user-event';
  rule: number | null;
  name: string;
  deviceid: string;
  trigger: string;
  test: boolean;
  time: number;
}

interface Person {
  c: HttpClient;
  id: number;
}

const running: TestBridge[] = [];
afterEach(async () => {
  for (const b of running.splice(0).reverse()) await b.close();
});

/**
 * A bridge over a real socket. Its device service and its rule engine share a bus, so that a variable a user sets
 * is evaluated; tests fire rules as often as they like unless `over` says otherwise.
 */
async function bridge(engine: StoreEngine, over: ConfigOverrides['notifications'] = {}): Promise<TestBridge> {
  const b = await startTestBridge({
    engine,
    transport: 'http',
    events: new LocalBus(),
    config: { notifications: { ruleMinIntervalMs: 0, userEventsLimit: 100_000, ...over } },
  });
  running.push(b);
  return b;
}

function expectToken(res: HttpResult, status: number, token: string): void {
  expect({ status: res.status, body: res.body }).toEqual({ status, body: token });
}

let people = 0;
async function person(b: TestBridge): Promise<Person> {
  const login = `r${++people}@example.com`;
  const c = b.client();
  expectToken(await c.post('/0/session/signup', { form: { login, password: PASSWORD } }), 201, 'signup-ok');
  return { c, id: (await b.store.userByLogin(b.defaultFrontend.id, login))!.id };
}

/** A device as the bridge keeps it after its hello: its auth code, connected. */
async function device(b: TestBridge): Promise<{ id: string; auth: string }> {
  const id = randomUUID();
  const auth = randomBytes(16).toString('hex');
  const now = b.clock.now();
  await b.store.write(async ({ devices }) => {
    await devices.touch(id, now);
    await devices.setAuthcode(id, auth);
    await devices.setMeta(id, 'state', 'connected', now, 'server');
  });
  return { id, auth };
}

/** A device the person claimed over HTTP. */
async function owned(b: TestBridge, p: Person): Promise<string> {
  const d = await device(b);
  const r = await p.c.post('/0/devices/', { form: { auth: d.auth } });
  expect([r.status, r.body]).toEqual([201, d.id]);
  return d.id;
}

const rule = (deviceid: string, more: Record<string, string> = {}) => ({
  name: 'Too hot',
  message: 'The boiler room is over 30 °C',
  trigger: 'd.temp > 30',
  deviceid,
  ...more,
});

async function create(p: Person, form: Record<string, string>): Promise<number> {
  const r = await p.c.post('/0/user/event/', { form });
  expect(r.status, r.body).toBe(201);
  expect(r.contentType).toMatch(/^text\/plain/);
  expect(r.body).toMatch(/^[1-9]\d*$/);
  return Number(r.body);
}

async function rules(p: Person): Promise<RuleJson[]> {
  const r = await p.c.get('/0/user/event/');
  expect(r.status, r.body).toBe(200);
  return JSON.parse(r.body) as RuleJson[];
}

async function one(p: Person, id: number): Promise<RuleJson> {
  const r = await p.c.get(`/0/user/event/${id}`);
  expect(r.status, r.body).toBe(200);
  return JSON.parse(r.body) as RuleJson;
}

async function events(p: Person, query = ''): Promise<EventJson[]> {
  const r = await p.c.get(`/0/user/events/${query}`);
  expect(r.status, r.body).toBe(200);
  return JSON.parse(r.body) as EventJson[];
}

/** A test fire as the official client's `testNotification` sends it: a body with only the frontend. */
async function testFire(b: TestBridge, p: Person, id: number): Promise<number> {
  const r = await p.c.post(`/0/user/event/${id}`, { form: { app: b.defaultFrontend.id } });
  expect(r.status, r.body).toBe(201);
  expect(r.body).toMatch(/^[1-9]\d*$/);
  return Number(r.body);
}

describe.each(await engines())('the notification routes on %s', (engine) => {
  it('make a rule from a form or a JSON body; list (oldest first) and GET show it, its trigger canonical', async () => {
    const b = await bridge(engine);
    const alice = await person(b);
    const dev = await owned(b, alice);
    const made = b.clock.now();
    const first = await create(alice, {
      ...rule(dev, { name: '  Too hot  ', trigger: 'D.Temp>30 FOR 600s' }),
      app: b.defaultFrontend.id,
    });
    b.clock.advance(1000);
    // JSON, as a client that sends JSON does: a real boolean, the device in upper case.
    const r = await alice.c.post('/0/user/event/', {
      json: {
        name: 'Gone',
        trigger: 'offline  for 300s',
        deviceid: dev.toUpperCase(),
        email: true,
        webhook: 'https://hooks.example.com/devcloud?k=1',
        app: b.defaultFrontend.id,
      },
    });
    expect(r.status, r.body).toBe(201);
    const second = Number(r.body);
    expect(second).toBeGreaterThan(first);

    const expected: RuleJson = {
      id: first,
      name: 'Too hot',
      message: 'The boiler room is over 30 °C',
      trigger: 'd.Temp > 30 for 10m',
      deviceid: dev,
      email: false,
      webhook: null,
      webhookSecret: null,
      state: 'armed',
      created: made,
      updated: made,
      lastFired: null,
    };
    const list = await rules(alice);
    expect(list).toHaveLength(2);
    expect(list[0]).toEqual(expected);
    expect(list[1]).toEqual({
      id: second,
      name: 'Gone',
      message: '',
      trigger: 'offline for 5m',
      deviceid: dev,
      email: true,
      webhook: 'https://hooks.example.com/devcloud?k=1',
      webhookSecret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/) as unknown,
      state: 'armed',
      created: made + 1000,
      updated: made + 1000,
      lastFired: null,
    });
    expect(await one(alice, first)).toEqual(expected);
    expect(await one(alice, second)).toEqual(list[1]);
    // The canonical text parses to itself: making a rule from it gives the same text.
    expect((await one(alice, await create(alice, rule(dev, { trigger: expected.trigger })))).trigger).toBe(
      expected.trigger,
    );
    // Another user has none.
    expect(await rules(await person(b))).toEqual([]);
  });

  it('a bad trigger is a 400 with where it is wrong, as JSON, and makes no rule', async () => {
    const b = await bridge(engine);
    const alice = await person(b);
    const dev = await owned(b, alice);
    const cases: Array<[string, number, number, number]> = [
      ['d.temp =>', 7, 1, 8],
      ['x.temp > 1', 0, 1, 1],
      ['', 0, 1, 1],
      ['d.temp >', 8, 1, 9],
      ['d.temp > 1\nfor x', 15, 2, 5],
      ['d.temp > 30 for 0s', 16, 1, 17],
      ['d'.repeat(501), 500, 1, 501],
    ];
    for (const [trigger, position, line, column] of cases) {
      const r = await alice.c.post('/0/user/event/', { form: rule(dev, { trigger }) });
      expect(r.status, trigger).toBe(400);
      expect(r.contentType).toMatch(/^application\/json/);
      const body = JSON.parse(r.body) as Record<string, unknown>;
      expect(body, trigger).toEqual({
        error: 'event-fail-trigger',
        position,
        line,
        column,
        message: expect.any(String) as unknown,
      });
      expect((body.message as string).length).toBeGreaterThan(10);
    }
    const message = (await alice.c.post('/0/user/event/', { form: rule(dev, { trigger: 'd.temp =>' }) })).body;
    expect((JSON.parse(message) as { message: string }).message).toContain('"=>"');
    expect(await rules(alice)).toEqual([]);
    // An update with a bad trigger is answered the same, and changes nothing.
    const id = await create(alice, rule(dev));
    const before = await one(alice, id);
    const r = await alice.c.post(`/0/user/event/${id}`, { json: { name: 'New', trigger: 'x.temp > 1' } });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body)).toMatchObject({ error: 'event-fail-trigger', position: 0 });
    expect(await one(alice, id)).toEqual(before);
  });

  it('refuse a missing or malformed field, a device the user may not watch, a bad webhook, a rule too many', async () => {
    const b = await bridge(engine, { rulesPerUser: 2 });
    const [alice, bob] = [await person(b), await person(b)];
    const dev = await owned(b, alice);
    const bobs = await owned(b, bob);
    const post = (form: Record<string, string>) => alice.c.post('/0/user/event/', { form });
    const { name: _n, ...noName } = rule(dev);
    const { trigger: _t, ...noTrigger } = rule(dev);
    const { deviceid: _d, ...noDevice } = rule(dev);
    for (const [why, form] of [
      ['no name', noName],
      ['no trigger', noTrigger],
      ['no deviceid', noDevice],
      ['an empty name', rule(dev, { name: '' })],
      ['a name of spaces', rule(dev, { name: '   ' })],
      ['a name over 100 characters', rule(dev, { name: 'n'.repeat(101) })],
      ['a message over 1000 characters', rule(dev, { message: 'm'.repeat(1001) })],
      ['a deviceid that is no uuid', rule(dev, { deviceid: 'nope' })],
      ['email maybe', rule(dev, { email: 'maybe' })],
    ] as const) {
      const r = await post(form);
      expect({ why, status: r.status, body: r.body }).toEqual({ why, status: 400, body: 'event-fail' });
    }
    // JSON that is not an object of fields.
    expectToken(await alice.c.post('/0/user/event/', { json: [rule(dev)] }), 400, 'event-fail');
    expectToken(await alice.c.post('/0/user/event/', { json: { ...rule(dev), email: 'yes' } }), 400, 'event-fail');
    // Devices the user may not watch: another user's, an unknown one, and one only nearby (heard, not claimed).
    expectToken(await post(rule(bobs)), 400, 'event-fail-device');
    expectToken(await post(rule(randomUUID())), 400, 'event-fail-device');
    const nearby = await device(b);
    await b.store.write((tx) => tx.devices.heard(nearby.id, alice.id, b.clock.now()));
    expect(JSON.parse((await alice.c.get('/0/network/')).body)).toHaveProperty(nearby.auth);
    expectToken(await post(rule(nearby.id)), 400, 'event-fail-device');
    // A device shared with the user may be watched (decision 23).
    const login = (JSON.parse((await alice.c.get('/0/user/')).body) as { login: string }).login;
    expectToken(await bob.c.post('/0/devices/', { form: { auth: bobs, user: login } }), 200, 'share-ok');
    const onShared = await create(alice, rule(bobs));
    expectToken(await alice.c.request('DELETE', `/0/user/event/${onShared}`), 200, 'event-ok');
    // Webhooks the bridge may not POST to.
    for (const webhook of [
      'http://hooks.example.com/x',
      'https://user:pw@hooks.example.com/x',
      'https://hooks.example.com/x#frag',
      'ftp://hooks.example.com/x',
      'hooks.example.com/x',
      `https://hooks.example.com/${'p'.repeat(2030)}`,
    ]) {
      expectToken(await post(rule(dev, { webhook })), 400, 'event-fail-webhook');
    }
    expect(await rules(alice)).toEqual([]);
    // Up to notifications.rulesPerUser, and not one more; a removal makes room again.
    const first = await create(alice, rule(dev));
    await create(alice, rule(dev, { name: 'Limit, 1 of 2' }));
    expectToken(await post(rule(dev, { name: 'Limit, 3 of 2' })), 400, 'event-fail-limit');
    expect(await rules(alice)).toHaveLength(2);
    // The limit is per user.
    await create(bob, rule(bobs));
    expectToken(await alice.c.request('DELETE', `/0/user/event/${first}`), 200, 'event-ok');
    await create(alice, rule(dev, { name: 'Again' }));
  });

  it('an update changes only the fields it names; a new trigger or device arms the rule again', async () => {
    const b = await bridge(engine);
    const alice = await person(b);
    const [dev, other] = [await owned(b, alice), await owned(b, alice)];
    const id = await create(alice, rule(dev, { email: 'true' }));
    const before = await one(alice, id);

    b.clock.advance(5000);
    expectToken(
      await alice.c.post(`/0/user/event/${id}`, { form: { name: 'Hot', app: b.defaultFrontend.id } }),
      200,
      'event-ok',
    );
    expect(await one(alice, id)).toEqual({ ...before, name: 'Hot', updated: before.created + 5000 });
    expectToken(await alice.c.post(`/0/user/event/${id}`, { json: { message: '', email: false } }), 200, 'event-ok');
    const quiet = { ...before, name: 'Hot', message: '', email: false, updated: before.created + 5000 };
    expect(await one(alice, id)).toEqual(quiet);

    // The rule fires: its user sets the variable over the threshold.
    const fire = async (value: string) =>
      expectToken(await alice.c.post(`/0/devices/${dev}/d/temp`, { form: { value } }), 200, 'device-ok');
    await fire('31');
    const fired = await until(async () => {
      const r = await one(alice, id);
      return r.state === 'fired' && r;
    }, 'the rule to fire');
    expect(fired.lastFired).toBe(b.clock.now());
    // The same trigger, spelled otherwise, is no new trigger: the rule stays fired.
    expectToken(await alice.c.post(`/0/user/event/${id}`, { form: { trigger: 'd.temp>30' } }), 200, 'event-ok');
    expect((await one(alice, id)).state).toBe('fired');
    // A new trigger starts it afresh.
    expectToken(await alice.c.post(`/0/user/event/${id}`, { form: { trigger: 'D.temp >= 31' } }), 200, 'event-ok');
    expect(await one(alice, id)).toMatchObject({ trigger: 'd.temp >= 31', state: 'armed', deviceid: dev });

    // Fired again, then moved to another device: armed.
    await fire('20');
    await fire('32');
    await until(async () => (await one(alice, id)).state === 'fired', 'the rule to fire again');
    expectToken(await alice.c.post(`/0/user/event/${id}`, { form: { deviceid: other } }), 200, 'event-ok');
    expect(await one(alice, id)).toMatchObject({ deviceid: other, state: 'armed', trigger: 'd.temp >= 31' });

    // A refused field changes nothing, not even the fields that were fine.
    const now = await one(alice, id);
    const refused: Array<Record<string, string>> = [
      { name: 'Fine', message: 'm'.repeat(1001) },
      { name: 'Fine', email: 'maybe' },
      { name: 'n'.repeat(101) },
      { name: 'Fine', deviceid: 'nope' },
    ];
    for (const form of refused) {
      expectToken(await alice.c.post(`/0/user/event/${id}`, { form }), 400, 'event-fail');
    }
    expectToken(
      await alice.c.post(`/0/user/event/${id}`, { form: { deviceid: randomUUID() } }),
      400,
      'event-fail-device',
    );
    const webhook = 'http://hooks.example.com/x';
    expectToken(
      await alice.c.post(`/0/user/event/${id}`, { form: { name: 'Fine', webhook } }),
      400,
      'event-fail-webhook',
    );
    expect(await one(alice, id)).toEqual(now);
    // An unknown number, or none.
    for (const path of [String(id + 1000), 'abc', '0', '-1']) {
      expectToken(await alice.c.post(`/0/user/event/${path}`, { form: { name: 'x' } }), 400, 'event-fail');
    }
  });

  it("a webhook's secret is made with it, kept while its URL changes, and goes with it", async () => {
    const b = await bridge(engine);
    const alice = await person(b);
    const dev = await owned(b, alice);
    const id = await create(alice, rule(dev));
    expect(await one(alice, id)).toMatchObject({ webhook: null, webhookSecret: null });
    const set = async (webhook: string) =>
      expectToken(await alice.c.post(`/0/user/event/${id}`, { form: { webhook } }), 200, 'event-ok');

    await set('https://hooks.example.com/a');
    const { webhookSecret: secret } = await one(alice, id);
    expect(secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    await set('https://hooks.example.com/b?token=1');
    expect(await one(alice, id)).toMatchObject({
      webhook: 'https://hooks.example.com/b?token=1',
      webhookSecret: secret,
    });
    await set('');
    expect(await one(alice, id)).toMatchObject({ webhook: null, webhookSecret: null });
    // A webhook set again gets a new key: the old one was given away with the old receiver.
    await set('https://hooks.example.com/c');
    const again = (await one(alice, id)).webhookSecret;
    expect(again).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(again).not.toBe(secret);
    // Each rule has its own.
    const other = await create(alice, rule(dev, { webhook: 'https://hooks.example.com/c' }));
    expect((await one(alice, other)).webhookSecret).not.toBe(again);
  });

  it("another user's rule is no rule: GET 404, update, test and remove 400 event-fail, nothing changed", async () => {
    const b = await bridge(engine);
    const [alice, mallory] = [await person(b), await person(b)];
    const dev = await owned(b, alice);
    await owned(b, mallory);
    const id = await create(alice, rule(dev, { webhook: 'https://hooks.example.com/secret' }));
    const before = await one(alice, id);

    expectToken(await mallory.c.get(`/0/user/event/${id}`), 404, 'event-fail');
    expectToken(await mallory.c.get(`/0/user/event/${id + 1000}`), 404, 'event-fail');
    expectToken(await mallory.c.get('/0/user/event/abc'), 404, 'event-fail');
    expectToken(await mallory.c.post(`/0/user/event/${id}`, { form: { name: 'Mine' } }), 400, 'event-fail');
    expectToken(
      await mallory.c.post(`/0/user/event/${id}`, { form: { app: b.defaultFrontend.id } }),
      400,
      'event-fail',
    );
    expectToken(await mallory.c.request('DELETE', `/0/user/event/${id}`), 400, 'event-fail');
    expect(await rules(mallory)).toEqual([]);
    expect(await one(alice, id)).toEqual(before);
    expect(await events(alice)).toEqual([]);
    expect(await events(mallory)).toEqual([]);
  });

  it('a body that holds only app (or nothing) fires the rule as a test: 201 with the event, shown as a test', async () => {
    const b = await bridge(engine);
    const [alice, bob] = [await person(b), await person(b)];
    const dev = await owned(b, alice);
    const id = await create(alice, rule(dev));
    const before = await one(alice, id);
    expectToken(await alice.c.post(`/0/devices/${dev}/d/temp`, { form: { value: '12.5' } }), 200, 'device-ok');

    const eventId = await testFire(b, alice, id);
    const [e] = await events(alice);
    expect(e).toMatchObject({
      id: eventId,
      type: 'user-event',
      rule: id,
      name: 'Too hot',
      message: 'The boiler room is over 30 °C',
      deviceid: dev,
      trigger: 'd.temp > 30',
      variable: { type: 'd', name: 'temp' },
      value: '12.5',
      time: b.clock.now(),
      test: true,
      email: null,
      webhook: null,
    });
    // JSON with only app, and a body-less POST, are tests too.
    const json = await alice.c.post(`/0/user/event/${id}`, { json: { app: b.defaultFrontend.id } });
    expect(json.status, json.body).toBe(201);
    const bare = await alice.c.post(`/0/user/event/${id}`);
    expect(bare.status, bare.body).toBe(201);
    expect((await events(alice)).map((x) => x.id)).toEqual([Number(bare.body), Number(json.body), eventId]);
    // A test moves nothing of the rule; nobody else sees its events.
    expect(await one(alice, id)).toEqual(before);
    expect(await events(bob)).toEqual([]);
  });

  // The answer checker of the test bridge holds the 429 to its documented Retry-After (else it answers 500).
  it('a test over notifications.userEventsLimit answers 429 with Retry-After', async () => {
    const b = await bridge(engine, { userEventsLimit: 2, userEventsWindowMs: 60_000 });
    const alice = await person(b);
    const id = await create(alice, rule(await owned(b, alice)));
    await testFire(b, alice, id);
    await testFire(b, alice, id);
    const r = await alice.c.post(`/0/user/event/${id}`, { form: { app: b.defaultFrontend.id } });
    expectToken(r, 429, 'too-many-requests');
    expect(await events(alice)).toHaveLength(2);
  });

  it('remove: 200 event-ok, then 400 event-fail; the log keeps its events, with the rule number', async () => {
    const b = await bridge(engine);
    const alice = await person(b);
    const dev = await owned(b, alice);
    const [id, kept] = [await create(alice, rule(dev)), await create(alice, rule(dev, { name: 'Kept' }))];
    const eventId = await testFire(b, alice, id);

    expectToken(await alice.c.request('DELETE', `/0/user/event/${id}`), 200, 'event-ok');
    expectToken(await alice.c.request('DELETE', `/0/user/event/${id}`), 400, 'event-fail');
    expectToken(await alice.c.request('DELETE', '/0/user/event/abc'), 400, 'event-fail');
    expectToken(await alice.c.get(`/0/user/event/${id}`), 404, 'event-fail');
    expectToken(await alice.c.post(`/0/user/event/${id}`, { form: { name: 'Back' } }), 400, 'event-fail');
    expectToken(await alice.c.post(`/0/user/event/${id}`), 400, 'event-fail');
    expect((await rules(alice)).map((r) => r.id)).toEqual([kept]);
    expect(await events(alice)).toEqual([expect.objectContaining({ id: eventId, rule: id, name: 'Too hot' })]);
    // A removed rule's number is never given again.
    expect(await create(alice, rule(dev))).toBeGreaterThan(kept);
  });

  it('the event log: newest first, latest and from page back, latest 0 or over 1000 mean 1000', async () => {
    const b = await bridge(engine);
    const [alice, bob] = [await person(b), await person(b)];
    const dev = await owned(b, alice);
    const id = await create(alice, rule(dev));
    const bobs = await create(bob, rule(await owned(b, bob)));
    const fired: number[] = [];
    for (let i = 0; i < 5; i++) {
      fired.push(await testFire(b, alice, id));
      await testFire(b, bob, bobs);
      b.clock.advance(1000);
    }
    const newest = fired.slice().reverse();
    const ids = async (query: string) => (await events(alice, query)).map((e) => e.id);
    expect(await ids('')).toEqual(newest);
    expect((await events(alice)).map((e) => e.time)).toEqual(
      [0, 1, 2, 3, 4].map((s) => b.clock.now() - 1000 - s * 1000),
    );
    expect(await ids('?latest=2')).toEqual(newest.slice(0, 2));
    expect(await ids(`?latest=2&from=${newest[1]!}`)).toEqual(newest.slice(2, 4));
    expect(await ids(`?latest=2&from=${newest[3]!}`)).toEqual(newest.slice(4));
    expect(await ids(`?from=${newest[4]!}`)).toEqual([]);
    expect(await ids('?from=0')).toEqual([]);
    expect(await ids('?latest=0')).toEqual(newest);
    expect(await ids(`?app=${b.defaultFrontend.id}&latest=3`)).toEqual(newest.slice(0, 3));
    for (const q of ['latest=abc', 'latest=-1', 'latest=1.5', 'from=abc', 'from=-5', 'latest=', 'latest=1&latest=2']) {
      expectToken(await alice.c.get(`/0/user/events/?${q}`), 400, 'event-fail');
    }

    // Over 1000 events (written as the engine writes them): a page is 1000 at most.
    await b.store.write(async (tx) => {
      for (let i = 0; i < 1000; i++) {
        await tx.rules.addEvent({
          ...{ userId: alice.id, ruleId: id, deviceId: dev, name: 'Bulk', message: '', trigger: 'd.temp > 30' },
          ...{ varType: 'd', varName: 'temp', value: Buffer.from(String(i)), test: false, at: b.clock.now() },
          ...{ emailState: null, webhookUrl: null },
        });
      }
    });
    for (const q of ['', '?latest=0', '?latest=1001', '?latest=999999999999999']) {
      const page = await events(alice, q);
      expect(page, q).toHaveLength(1000);
      expect(page[0]!.id).toBeGreaterThan(newest[0]!);
    }
    expect(await events(alice, '?latest=1000')).toHaveLength(1000);
    expect(await events(alice, '?latest=999')).toHaveLength(999);
    const last = (await events(alice, '?latest=1000')).at(-1)!.id;
    expect(await ids(`?from=${last}`)).toEqual(newest);
    expect(await events(bob)).toHaveLength(5);
  });

  it('every route answers 401 no-session without a session', async () => {
    const b = await bridge(engine);
    const alice = await person(b);
    const id = await create(alice, rule(await owned(b, alice)));
    const nobody = b.client();
    const calls: Array<[string, string, Record<string, string>?]> = [
      ['GET', '/0/user/event/'],
      ['POST', '/0/user/event/', rule(randomUUID())],
      ['GET', `/0/user/event/${id}`],
      ['POST', `/0/user/event/${id}`, { name: 'x' }],
      ['POST', `/0/user/event/${id}`],
      ['DELETE', `/0/user/event/${id}`],
      ['GET', '/0/user/events/'],
    ];
    for (const [method, path, form] of calls) {
      expectToken(await nobody.request(method, path, form ? { form } : {}), 401, 'no-session');
    }
    // A session that ended is none.
    expectToken(await alice.c.post('/0/session/logout'), 201, 'logout-ok');
    expectToken(await alice.c.get('/0/user/event/'), 401, 'no-session');
    expect(await b.store.rules.ofUser(alice.id)).toHaveLength(1);
  });
});
