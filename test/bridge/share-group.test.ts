/**
 * Several bridges on one broker (docs/scaling.md): the bridge's links to a private Mosquitto in one MQTT 5 share
 * group. Each `up/` message a device publishes goes to exactly one link of the group (a whole bridge's too; the
 * store is not shared yet, so the rest is tested on links), and every `state` to every link; a link that closes
 * leaves its share to the others at once, one that is lost keeps it for `mqtt.sessionExpirySec`; two links with
 * one client id are reported. With dynamic security the bridge's role may subscribe through the group (Mosquitto
 * checks the filter with its `$share/<group>/` prefix), and each enrolment request goes to one bridge. The config:
 * a share group needs an external broker and a client id of the bridge's own.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { type Server, type Socket, createServer, connect as netConnect } from 'node:net';
import mqtt, { type IClientOptions, type MqttClient } from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { DEFAULT_CLIENT_ID, loadBridgeConfig } from '../../bridge/config.js';
import { DeviceLink, type LinkOptions } from '../../bridge/devices/link.js';
import { BRIDGE_ACLS, BRIDGE_ROLE, Dynsec } from '../../bridge/mqtt/dynsec.js';
import { ConfigError } from '../../lib/config.js';
import { createLogger } from '../../lib/log.js';
import { DEVICES_UP_FILTER, ENROL_TOPIC, encode, messageId, topicFor } from '../../protocol/index.js';
import { LogSink } from '../support/agent.js';
import { startLiveBridge } from '../support/bridge.js';
import { type TestBroker, endClient, startDynsecMosquitto, startMosquitto } from '../support/brokers.js';
import { missing } from '../support/system.js';
import { until } from '../support/wait.js';

const GROUP = 'bridges';
const quiet = () => createLogger({ level: 'silent', pretty: 'never', base: {} });
const N = 300;

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** One link as the bridge makes it (bridge/bridge.ts), with what it received: `up/vars` ids, and `state`s. */
interface TestLink {
  link: DeviceLink;
  sink: LogSink;
  ids: string[];
  states: string[];
}

async function startLink(url: string, clientId: string, over: Partial<LinkOptions> = {}): Promise<TestLink> {
  const sink = new LogSink();
  const link = new DeviceLink({
    url,
    clientId,
    persistent: true,
    shareGroup: GROUP,
    sessionExpirySec: 60,
    log: createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink }),
    now: () => Date.now(),
    ...over,
  });
  const t: TestLink = { link, sink, ids: [], states: [] };
  link.on('message', (m) => {
    if (m.name === 'up/vars') t.ids.push(m.payload.id);
    if (m.name === 'state') t.states.push(`${m.deviceId} ${m.payload}`);
  });
  cleanups.push(() => link.close());
  await link.start(20_000);
  return t;
}

async function startBroker(start: () => Promise<TestBroker> = () => startMosquitto()): Promise<TestBroker> {
  const broker = await start();
  cleanups.push(() => broker.close());
  return broker;
}

interface Device {
  id: string;
  client: MqttClient;
}

/** A device's connection, MQTT 3.1.1 as the agent's. */
async function connectDevice(url: string, id = randomUUID(), options: IClientOptions = {}): Promise<Device> {
  const client = await mqtt.connectAsync(url, { clientId: id, reconnectPeriod: 0, ...options });
  cleanups.push(() => endClient(client));
  return { id, client };
}

/** `count` `up/vars` messages, from each device in turn, each acknowledged by the broker; their ids. */
async function publishVars(devices: Device[], count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const d = devices[i % devices.length]!;
    const id = messageId();
    const items = [
      {
        kind: 'push' as const,
        type: 'd' as const,
        name: 'n',
        value: String(i),
        time: Date.now(),
        origin: 'device' as const,
      },
    ];
    await d.client.publishAsync(topicFor(d.id, 'up/vars'), encode('up/vars', { id, items }), { qos: 1 });
    ids.push(id);
  }
  return ids;
}

/** Waits until the links together have every id of `sent`; then each id was delivered exactly once. */
async function deliveredOnce(sent: string[], ...got: string[][]): Promise<void> {
  const wanted = new Set(sent);
  const seen = () => got.flat().filter((id) => wanted.has(id));
  await until(() => new Set(seen()).size === wanted.size, `all ${wanted.size} messages`);
  expect(seen()).toHaveLength(wanted.size);
}

/** Of `ids`, those in `sent`. */
const of = (ids: string[], sent: string[]) => ids.filter((id) => sent.includes(id));

/**
 * A TCP relay to the broker that can be cut: the broker then sees its client's connection end without a
 * DISCONNECT, as when the bridge's process or network dies.
 */
async function relay(port: number): Promise<{ url: string; cut(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((down) => {
    const up = netConnect(port, '127.0.0.1');
    for (const s of [down, up]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    down.pipe(up).pipe(down);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const cut = async () => {
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const s of sockets) s.destroy();
    await closed;
  };
  cleanups.push(() => (server.listening ? cut() : Promise.resolve()));
  return { url: `mqtt://127.0.0.1:${(server.address() as { port: number }).port}`, cut };
}

function sessionPresent(t: TestLink): unknown {
  return t.sink.events('mqtt.connected').at(-1)?.sessionPresent;
}

describe.skipIf(missing('mosquitto'))('links in one share group on Mosquitto', () => {
  it('each up/ message reaches one link of the group, every state every link; without the group a link reads all', async () => {
    const broker = await startBroker();
    const devices = await Promise.all([1, 2, 3].map(() => connectDevice(broker.url)));
    const [d0, d1] = devices as [Device, Device];
    // A state from before the links: retained, so every link reads it when it subscribes.
    await d0.client.publishAsync(topicFor(d0.id, 'state'), encode('state', 'online'), { qos: 0, retain: true });

    const a = await startLink(broker.url, 'bridge-a');
    const b = await startLink(broker.url, 'bridge-b');
    const alone = await startLink(broker.url, 'bridge-alone', { shareGroup: undefined });
    expect(a.sink.events('mqtt.connected')[0]).toMatchObject({ clientId: 'bridge-a', shareGroup: GROUP });
    expect(alone.sink.events('mqtt.connected')[0]).not.toHaveProperty('shareGroup');
    for (const t of [a, b, alone]) await until(() => t.states.includes(`${d0.id} online`), 'the retained state');

    const sent = await publishVars(devices, N);
    await deliveredOnce(sent, a.ids, b.ids);
    await deliveredOnce(sent, alone.ids);
    // Mosquitto hands a group's messages to its members in turn.
    expect(a.ids.length).toBeGreaterThan(N / 10);
    expect(b.ids.length).toBeGreaterThan(N / 10);

    // A state while they run: every link, in the group or not, reads it.
    await d1.client.publishAsync(topicFor(d1.id, 'state'), encode('state', 'offline'), { qos: 0, retain: true });
    for (const t of [a, b, alone]) await until(() => t.states.includes(`${d1.id} offline`), 'the new state');

    // B closes: its session ends with it, and every following message goes to A.
    await b.link.close();
    const after = await publishVars(devices, 100);
    await deliveredOnce(after, a.ids);
    await deliveredOnce(after, alone.ids);
    expect(of(b.ids, after)).toEqual([]);
  });

  it("a whole bridge in a group: its link joins it, and what it does not get goes to the group's other member", async () => {
    const broker = await startBroker();
    const live = await startLiveBridge({
      config: { mqtt: { url: broker.url, shareGroup: GROUP, clientId: 'bridge-1' } },
    });
    cleanups.push(() => live.close());
    await until(() => live.bridge.link.connected, 'the bridge linked');
    expect(live.sink.events('mqtt.connected')[0]).toMatchObject({ clientId: 'bridge-1', shareGroup: GROUP });
    const peer = await startLink(broker.url, 'bridge-2');
    const d = await connectDevice(broker.url);
    // One variable per message: the bridge's store has those it handled.
    const names = Array.from({ length: 60 }, (_, i) => `v${i}`);
    const byName = new Map<string, string>();
    for (const name of names) {
      const id = messageId();
      byName.set(id, name);
      const items = [
        { kind: 'push' as const, type: 'd' as const, name, value: 'x', time: Date.now(), origin: 'device' as const },
      ];
      await d.client.publishAsync(topicFor(d.id, 'up/vars'), encode('up/vars', { id, items }), { qos: 1 });
    }
    const store = live.bridge.store.devices;
    const atBridge = async () => {
      const held: string[] = [];
      for (const n of names) if ((await store.getVar(d.id, 'd', n)) !== undefined) held.push(n);
      return held;
    };
    const atPeer = () => peer.ids.map((id) => byName.get(id)).filter((n) => n !== undefined);
    await until(async () => (await atBridge()).length + atPeer().length >= names.length, 'every message handled');
    expect([...(await atBridge()), ...atPeer()].sort()).toEqual([...names].sort());
    expect((await atBridge()).length).toBeGreaterThan(0);
    expect(atPeer().length).toBeGreaterThan(0);
  });

  it('a lost link keeps its share for mqtt.sessionExpirySec: back in time it gets it, later it is gone', async () => {
    const broker = await startBroker();
    const devices = await Promise.all([1, 2].map(() => connectDevice(broker.url)));
    const a = await startLink(broker.url, 'bridge-a');

    // B is lost (its connection cut, no DISCONNECT) and comes back within its session's expiry.
    const path = await relay(broker.port);
    const b = await startLink(path.url, 'bridge-b', { sessionExpirySec: 60 });
    await path.cut();
    await b.link.close();
    const during = await publishVars(devices, 100);
    await until(() => of(a.ids, during).length > 0, "A's share");
    expect(of(a.ids, during).length).toBeLessThan(during.length);
    const back = await startLink(broker.url, 'bridge-b', { sessionExpirySec: 60 });
    expect(sessionPresent(back)).toBe(true);
    await deliveredOnce(during, a.ids, back.ids);
    await back.link.close();

    // C is lost and stays away longer than its expiry: what the broker kept for it is gone, and from then on
    // every message goes to A.
    const path2 = await relay(broker.port);
    const c = await startLink(path2.url, 'bridge-c', { sessionExpirySec: 1 });
    await path2.cut();
    await c.link.close();
    // Mosquitto ends expired sessions once a second.
    await new Promise((r) => setTimeout(r, 2500));
    const later = await publishVars(devices, 100);
    await deliveredOnce(later, a.ids);
    const cBack = await startLink(broker.url, 'bridge-c', { sessionExpirySec: 1 });
    expect(sessionPresent(cBack)).toBe(false);
    expect(cBack.ids).toEqual([]);
  });

  it('a session its client id had before the group keeps no plain subscription', async () => {
    const broker = await startBroker();
    // The id read every up/ message alone, over MQTT 3.1.1, with a persistent session.
    const before = await mqtt.connectAsync(broker.url, { clientId: 'bridge-b', clean: false, reconnectPeriod: 0 });
    await before.subscribeAsync(DEVICES_UP_FILTER, { qos: 1 });
    await before.endAsync();

    const devices = await Promise.all([1, 2].map(() => connectDevice(broker.url)));
    const a = await startLink(broker.url, 'bridge-a');
    const b = await startLink(broker.url, 'bridge-b');
    expect(sessionPresent(b)).toBe(true);
    const sent = await publishVars(devices, 100);
    await deliveredOnce(sent, a.ids, b.ids);
    expect(of(b.ids, sent).length).toBeLessThan(sent.length);
  });

  it('two links with one client id take it from each other, which is reported', async () => {
    const broker = await startBroker();
    const a = await startLink(broker.url, 'bridge-twice');
    const b = await startLink(broker.url, 'bridge-twice');
    const reports = () => [...a.sink.events('mqtt.taken_over'), ...b.sink.events('mqtt.taken_over')];
    await until(() => reports().length > 0, 'mqtt.taken_over');
    expect(reports()[0]).toMatchObject({ level: 'error', clientId: 'bridge-twice', url: broker.url });
  });
});

describe.skipIf(missing('mosquitto', 'mosquitto_ctrl', 'dpkg'))('a share group with dynamic security', () => {
  const admin = { username: 'devcloud-bridge', password: randomBytes(16).toString('hex') };
  const enrolPassword = randomBytes(16).toString('hex');

  /** A Mosquitto with the plugin, set up by the bridge's own code as the running bridge does (bridge/mqtt/). */
  async function setUp(): Promise<{ broker: TestBroker; dynsec: Dynsec }> {
    const broker = await startBroker(() => startDynsecMosquitto(admin));
    const dynsec = new Dynsec(
      // The plugin disconnects a client whose roles change: the setup gives the admin the bridge's role.
      { url: broker.url, ...admin, clientId: 'admin-test', reconnect: true, log: quiet() },
      (d) => d.setup({ bridgeUsername: admin.username, enrolUsername: 'devcloud-enrol', enrolPassword }),
    );
    cleanups.push(() => dynsec.close());
    await dynsec.ready;
    return { broker, dynsec };
  }

  it("the bridge's role may read through the group; without its $share ACL Mosquitto refuses the filter", async () => {
    const { broker, dynsec } = await setUp();
    // A login with the bridge's role alone: the plugin's admin role reads everything by itself.
    const login = { username: 'bridge-data', password: randomBytes(16).toString('hex') };
    expect(await dynsec.run({ command: 'createClient', ...login, roles: [{ rolename: BRIDGE_ROLE }] })).toBeUndefined();
    const device = { id: randomUUID(), secret: randomBytes(32).toString('hex') };
    expect(await dynsec.createDevice(device.id, device.secret)).toBe(true);

    const a = await startLink(broker.url, 'bridge-a', login);
    const b = await startLink(broker.url, 'bridge-b', login);
    const d = await connectDevice(broker.url, device.id, { username: device.id, password: device.secret });
    const sent = await publishVars([d], 100);
    await deliveredOnce(sent, a.ids, b.ids);
    expect(of(a.ids, sent).length).toBeGreaterThan(0);
    expect(of(b.ids, sent).length).toBeGreaterThan(0);

    // Mosquitto checks a subscription against the filter as sent: `dc/v1/#` alone does not cover the group's. (A
    // role of its own: the plugin disconnects every client of a role whose ACLs change, the admin's included.)
    const rolename = 'bridge-without-share';
    expect(await dynsec.run({ command: 'createRole', rolename })).toBeUndefined();
    for (const acl of BRIDGE_ACLS.filter((a) => !a.topic.startsWith('$share/'))) {
      expect(await dynsec.run({ command: 'addRoleACL', rolename, ...acl })).toBeUndefined();
    }
    const without = { username: 'bridge-without-share', password: randomBytes(16).toString('hex') };
    expect(await dynsec.run({ command: 'createClient', ...without, roles: [{ rolename }] })).toBeUndefined();
    const sink = new LogSink();
    const refused = new DeviceLink({
      url: broker.url,
      clientId: 'bridge-c',
      ...without,
      persistent: true,
      shareGroup: GROUP,
      sessionExpirySec: 60,
      log: createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink }),
      now: () => Date.now(),
    });
    cleanups.push(() => refused.close());
    void refused.start(60_000).catch(() => undefined);
    await until(() => sink.events('mqtt.subscribe_failed').length > 0, 'the refusal');
    expect(sink.events('mqtt.subscribe_failed')[0]?.err).toMatch(/Not authorized/);
    expect(refused.connected).toBe(false);
    // The same login without the group subscribes to the plain filters, and reads the device.
    const plain = await startLink(broker.url, 'bridge-d', { ...without, shareGroup: undefined });
    await deliveredOnce(await publishVars([d], 10), plain.ids);
  });

  it('each enrolment request goes to one bridge of the group', async () => {
    const { broker } = await setUp();
    const got: string[][] = [[], []];
    for (const [i, clientId] of ['bridge-a-dynsec', 'bridge-b-dynsec'].entries()) {
      const d = new Dynsec({
        url: broker.url,
        ...admin,
        clientId,
        shareGroup: GROUP,
        reconnect: true,
        log: quiet(),
      });
      cleanups.push(() => d.close());
      await d.onEnrol((req) => got[i]!.push(req.deviceId));
      await d.ready;
    }
    const enrol = await mqtt.connectAsync(broker.url, {
      clientId: 'devcloud-enrol',
      username: 'devcloud-enrol',
      password: enrolPassword,
      reconnectPeriod: 0,
    });
    cleanups.push(() => endClient(enrol));
    const ids = Array.from({ length: 40 }, () => randomUUID());
    for (const deviceId of ids) {
      await enrol.publishAsync(ENROL_TOPIC, JSON.stringify({ deviceId, secret: randomBytes(16).toString('hex') }), {
        qos: 1,
      });
    }
    await deliveredOnce(ids, ...got);
    expect(got[0]!.length).toBeGreaterThan(0);
    expect(got[1]!.length).toBeGreaterThan(0);
  });
});

describe('mqtt.shareGroup in the config', () => {
  const env = { CONFIGURATION_DIRECTORY: '/nonexistent' };
  const load = (flags: Record<string, unknown>, more: NodeJS.ProcessEnv = {}) =>
    loadBridgeConfig({ dataDir: '/tmp/unused', ...flags }, { ...env, ...more });
  const problems = (flags: Record<string, unknown>, more: NodeJS.ProcessEnv = {}): readonly string[] => {
    try {
      load(flags, more);
    } catch (err) {
      if (err instanceof ConfigError) return err.problems;
      throw err;
    }
    return [];
  };

  it('is unset by default: one bridge, the plain filters, its client id devcloud-bridge', () => {
    const c = load({});
    expect(c.mqtt.shareGroup).toBeUndefined();
    expect(c.mqtt.clientId).toBe(DEFAULT_CLIENT_ID);
    expect(c.mqtt.sessionExpirySec).toBe(60);
  });

  it('is refused with the embedded broker: it serves one bridge only', () => {
    expect(problems({ 'mqtt.shareGroup': GROUP, 'mqtt.clientId': 'bridge-1' })).toEqual([
      'mqtt.shareGroup: the embedded broker serves one bridge only: a share group needs an external broker (mqtt.url) (from flag --mqtt-share-group)',
    ]);
  });

  it("needs a client id of the bridge's own, from the file, a flag or the environment", () => {
    const url = { 'mqtt.url': 'mqtt://broker.example.com' };
    expect(problems({ ...url, 'mqtt.shareGroup': GROUP })).toEqual([
      `mqtt.clientId: with mqtt.shareGroup each bridge needs a client id of its own, not the default devcloud-bridge: set mqtt.clientId (--mqtt-client-id, DEVCLOUD_MQTT_CLIENT_ID) to a name no other bridge uses`,
    ]);
    const c = load(url, { DEVCLOUD_MQTT_SHARE_GROUP: GROUP, DEVCLOUD_MQTT_CLIENT_ID: 'bridge-2' });
    expect([c.mqtt.shareGroup, c.mqtt.clientId]).toEqual([GROUP, 'bridge-2']);
    expect(load({ ...url, 'mqtt.shareGroup': GROUP, 'mqtt.clientId': 'bridge-1' }).mqtt.clientId).toBe('bridge-1');
  });

  it('is one topic level without wildcards or $', () => {
    const ok = { 'mqtt.url': 'mqtt://broker.example.com', 'mqtt.clientId': 'bridge-1' };
    for (const bad of ['a/b', 'a+', '#', '$share', 'x$', '']) {
      expect(problems({ ...ok, 'mqtt.shareGroup': bad }), bad).toHaveLength(1);
    }
    expect(problems({ ...ok, 'mqtt.shareGroup': 'devcloud-eu_1.prod' })).toEqual([]);
  });
});
