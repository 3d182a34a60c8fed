/**
 * The bridge with an external Mosquitto that has per-device credentials and ACLs (docs/decisions.md §4 and §5):
 * real agents provisioned with their own uuid and secret, the journey parts that go through the broker, the
 * isolation of one device from another's topics (on Mosquitto and on the embedded broker), and a bridge
 * restart while Mosquitto keeps the bridge's persistent session.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import mqtt, { type IClientOptions, type MqttClient } from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { encode, topicFor } from '../../protocol/index.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type SecureMosquitto, endClient, startSecureMosquitto, upVars } from '../support/brokers.js';
import { missing } from '../support/system.js';
import { until } from '../support/wait.js';

function udpSend(port: number, payload: string): Promise<void> {
  const s = createSocket('udp4');
  return new Promise((resolve, reject) =>
    s.send(payload, port, '127.0.0.1', (err) => {
      s.close();
      if (err) reject(err);
      else resolve();
    }),
  );
}

interface DeviceIdentity {
  deviceId: string;
  secret: string;
  authcode: string;
}

/** An identity made ahead, as `devcloud-bridge` provisioning would: the broker knows it before the agent runs. */
function newIdentity(): DeviceIdentity {
  return {
    deviceId: randomUUID(),
    secret: randomBytes(32).toString('hex'),
    authcode: randomBytes(16).toString('hex'),
  };
}

const BRIDGE_LOGIN = { username: 'devcloud-bridge', password: randomBytes(24).toString('hex') };

type VarRecord = { value?: string; time: number; acked: number; synced: number; syncacked: number };

async function getVar(http: HttpClient, deviceId: string, name: string): Promise<VarRecord | undefined> {
  const r = await http.get(`/0/devices/${deviceId}/d/${name}`);
  return r.status === 200 ? (JSON.parse(r.body) as VarRecord) : undefined;
}

async function metaState(http: HttpClient, deviceId: string): Promise<string | undefined> {
  const r = await http.get(`/0/devices/${deviceId}/meta/state`);
  return r.status === 200 ? (JSON.parse(r.body) as string) : undefined;
}

async function signup(http: HttpClient, login: string): Promise<string> {
  const r = await http.post('/0/session/signup', { form: { login, password: 'correct horse battery' } });
  expect(r.status).toBe(201);
  return (JSON.parse((await http.get('/0/user/')).body) as { authcode: string }).authcode;
}

/** A raw MQTT 3.1.1 client, connected, that never reconnects by itself. */
function rawClient(url: string, options: IClientOptions): Promise<MqttClient> {
  const client = mqtt.connect(url, { reconnectPeriod: 0, connectTimeout: 5000, ...options });
  return new Promise((resolve, reject) => {
    client.once('connect', () => resolve(client));
    client.once('error', (err) => {
      client.end(true);
      reject(err);
    });
  });
}

const noMosquitto = missing('mosquitto', 'mosquitto_passwd');

describe.skipIf(noMosquitto)('devices through a private Mosquitto with per-device credentials', () => {
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  async function setup(count: number, agentFlags: Record<string, unknown> = {}) {
    const ids = Array.from({ length: count }, newIdentity);
    const broker: SecureMosquitto = await startSecureMosquitto({
      devices: ids.map((i) => ({ id: i.deviceId, secret: i.secret })),
      bridge: BRIDGE_LOGIN,
    });
    cleanups.push(() => broker.close());
    const mqttConfig = { url: broker.url, username: BRIDGE_LOGIN.username, passwordFile: broker.bridgePasswordFile };
    const dataDir = tempDir('devcloud-bridge-');
    const state: { bridge: LiveBridge } = { bridge: await startLiveBridge({ dataDir, config: { mqtt: mqttConfig } }) };
    cleanups.push(() => state.bridge.close());
    const agents: TestAgent[] = [];
    for (const id of ids) {
      const dir = tempDir('devcloud-provision-');
      cleanups.push(() => {
        rmSync(dir, { recursive: true, force: true });
        return Promise.resolve();
      });
      const provisioningFile = join(dir, 'provision.json');
      writeFileSync(provisioningFile, JSON.stringify(id), { mode: 0o600 });
      const agent = await startAgent({
        mqttUrl: broker.url,
        flags: { 'identity.provisioningFile': provisioningFile, ...agentFlags },
      });
      cleanups.push(async () => {
        await agent.stop();
        rmSync(agent.config.stateDir, { recursive: true, force: true });
      });
      expect(agent.agent.identity).toEqual(id);
      agents.push(agent);
    }
    const restart = async () => {
      await state.bridge.close(false);
      state.bridge = await startLiveBridge({ dataDir, config: { mqtt: mqttConfig } });
    };
    return { ids, broker, state, agents, restart };
  }

  /** Signup, the authcode over UDP, the network view, the claim. */
  async function claimNearby(http: HttpClient, login: string, agent: TestAgent): Promise<string> {
    const { deviceId, authcode: deviceAuth } = agent.agent.identity;
    const authcode = await signup(http, login);
    await udpSend(agent.agent.nearby.port!, `${authcode}\n`);
    const network = await until(async () => {
      const body = JSON.parse((await http.get('/0/network/')).body) as Record<
        string,
        { meta: Record<string, { value: string }> }
      >;
      return body[deviceAuth];
    }, `${login}'s device in the network view`);
    expect(network.meta.unique!.value).toBe(deviceId);
    expect(network.meta.state!.value).toBe('connected');
    const claim = await http.post('/0/devices/', { form: { auth: deviceAuth } });
    expect([claim.status, claim.body]).toEqual([201, deviceId]);
    return deviceId;
  }

  it('two provisioned agents: claim, set and ack, sync and syncack, device changes, presence', async () => {
    const { state, agents } = await setup(2);
    const bridge = state.bridge;
    const users = [bridge.client(), bridge.client()];
    for (const [i, agent] of agents.entries()) {
      const http = users[i]!;
      const deviceId = await claimNearby(http, `owner${i}@example.com`, agent);

      expect((await http.post(`/0/devices/${deviceId}/d/led`, { form: { value: `on-${i}` } })).body).toBe('device-ok');
      const local = await agent.client();
      await until(async () => (await local.get('d', 'led').catch(() => undefined))?.value === `on-${i}`, 'led');
      await until(async () => {
        const r = await getVar(http, deviceId, 'led');
        return r && r.value === `on-${i}` && r.acked >= r.time;
      }, 'led acked');

      expect((await http.post(`/0/devices/${deviceId}/d/led`, { form: {} })).body).toBe('device-ok');
      await until(async () => {
        const r = await getVar(http, deviceId, 'led');
        return r && r.synced > 0 && r.syncacked >= r.synced;
      }, 'led syncacked');

      await local.set('d', 'temp', `2${i}.5`);
      await until(async () => (await getVar(http, deviceId, 'temp'))?.value === `2${i}.5`, 'temp through the API');
      await until(async () => (await local.get('d', 'temp')).acked > 0, 'temp acked on the agent');
      local.close();
    }

    // Each owner sees its own device only.
    const [a, b] = agents.map((x) => x.agent.identity.deviceId) as [string, string];
    expect(Object.keys(JSON.parse((await users[0]!.get('/0/devices/')).body) as object)).toEqual([a]);
    expect((await users[0]!.get(`/0/devices/${b}`)).status).toBe(404);

    // Presence: a stopped agent says `offline` (retained) under its own credentials; the other stays connected.
    expect(await metaState(users[0]!, a)).toBe('connected');
    await agents[0]!.stop();
    await until(async () => (await metaState(users[0]!, a)) === 'disconnected', 'device a disconnected');
    expect(await metaState(users[1]!, b)).toBe('connected');
  });

  it("a device cannot publish to another device's topics or read its down/", async () => {
    const { state, agents } = await setup(2);
    const bridge = state.bridge;
    const [agentA, agentB] = agents as [TestAgent, TestAgent];
    const idA = agentA.agent.identity;
    const idB = agentB.agent.identity;
    const httpA = bridge.client();
    const httpB = bridge.client();
    await claimNearby(httpA, 'a@example.com', agentA);
    await claimNearby(httpB, 'b@example.com', agentB);

    // Device A's credentials, on a connection of its own (Mosquitto ties the ACL to the username).
    const probe = await rawClient(bridge.mqttUrl, {
      clientId: `${idA.deviceId}-probe`,
      username: idA.deviceId,
      password: idA.secret,
    });
    const received: string[] = [];
    probe.on('message', (topic) => received.push(topic));
    await probe.subscribeAsync(`dc/v1/${idB.deviceId}/down/#`, { qos: 1 });
    await probe.subscribeAsync(`dc/v1/${idA.deviceId}/down/#`, { qos: 1 });

    // Denied publishes: Mosquitto acknowledges them to an MQTT 3.1.1 client and drops them.
    await probe.publishAsync(topicFor(idB.deviceId, 'up/vars'), upVars('intruder', 'x'), { qos: 1 });
    await probe.publishAsync(topicFor(idB.deviceId, 'state'), encode('state', 'offline'), { qos: 1, retain: true });
    // A's own publish after them: when it has arrived, so would they have.
    await probe.publishAsync(topicFor(idA.deviceId, 'up/vars'), upVars('probe', 'mine'), { qos: 1 });
    await until(async () => (await getVar(httpA, idA.deviceId, 'probe'))?.value === 'mine', "A's own publish");
    expect(await getVar(httpB, idB.deviceId, 'intruder')).toBeUndefined();
    expect(await bridge.bridge.store.devices.getVar(idB.deviceId, 'd', 'intruder')).toBeUndefined();
    expect(await metaState(httpB, idB.deviceId)).toBe('connected');

    // B's down/ never reaches A: a push to B first, then one to A; A's arrives, B's did not.
    expect((await httpB.post(`/0/devices/${idB.deviceId}/d/secret`, { form: { value: 'b-only' } })).body).toBe(
      'device-ok',
    );
    await until(async () => {
      const r = await getVar(httpB, idB.deviceId, 'secret');
      return r && r.acked >= r.time;
    }, "B's push acked by B");
    expect((await httpA.post(`/0/devices/${idA.deviceId}/d/mine`, { form: { value: 'a' } })).body).toBe('device-ok');
    await until(() => received.includes(topicFor(idA.deviceId, 'down/vars')), "A's push seen by A's credentials");
    expect(received.filter((t) => t.includes(idB.deviceId))).toEqual([]);
    await endClient(probe);

    // Wrong secret, another device's secret, no credentials: not let in.
    for (const bad of [
      { username: idB.deviceId, password: idA.secret },
      { username: idA.deviceId, password: 'not-the-secret' },
      {},
    ]) {
      await expect(rawClient(bridge.mqttUrl, { clientId: `probe-${randomUUID()}`, ...bad })).rejects.toThrow();
    }
  });

  it('changes made while the bridge restarts reach it through its persistent session', async () => {
    // The agent's own re-send is pushed far out: only the broker's session can bring the changes.
    const { state, agents, restart } = await setup(1, { 'sync.retryMs': 3_600_000 });
    const agent = agents[0]!;
    const http = state.bridge.client();
    const deviceId = await claimNearby(http, 'restart@example.com', agent);
    const local = await agent.client();
    await local.set('d', 'mode', 'before');
    await until(async () => (await getVar(http, deviceId, 'mode'))?.value === 'before', 'mode before');

    await state.bridge.close(false);
    await local.set('d', 'mode', 'during');
    await local.set('d', 'extra', 'made while the bridge was away');
    // The agent is still connected to Mosquitto and has published; nothing acknowledged them yet.
    expect((await local.get('d', 'mode')).acked).toBe(0);
    await restart();

    const again = state.bridge.client();
    for (const [k, v] of http.jar) again.jar.set(k, v);
    await until(async () => (await getVar(again, deviceId, 'mode'))?.value === 'during', 'mode during');
    expect((await getVar(again, deviceId, 'extra'))?.value).toBe('made while the bridge was away');
    await until(async () => (await local.get('d', 'extra')).acked > 0, 'extra acked on the agent');
    expect(state.bridge.bridge.link.connected).toBe(true);
    local.close();
  });
});

describe('the embedded broker keeps devices apart', () => {
  let bridge: LiveBridge | undefined;
  let agent: TestAgent | undefined;
  afterEach(async () => {
    await agent?.stop();
    await bridge?.close();
    agent = undefined;
    bridge = undefined;
  });

  it("a device's credentials do not reach another device's topics", async () => {
    bridge = await startLiveBridge();
    agent = await startAgent({ mqttUrl: bridge.mqttUrl });
    const idB = agent.agent.identity;
    const live = bridge;
    await until(() => live.bridge.store.devices.getVar(idB.deviceId, 'meta', 'state'), 'device b connected');
    const broker = live.bridge.broker!;
    const a = newIdentity();
    const asA: IClientOptions = { clientId: a.deviceId, username: a.deviceId, password: a.secret };

    // Trust on first use enrols A; its subscription to B's down/ is refused (granted 128).
    const probe = await rawClient(live.mqttUrl, asA);
    await expect(probe.subscribeAsync(`dc/v1/${idB.deviceId}/down/#`, { qos: 1 })).rejects.toThrow(/Subscribe error/);
    expect(broker.refusals['subscribe-denied']).toBe(1);

    // A publish under B's topics is refused and the connection closed; each try gets a connection of its own.
    for (const [topic, payload] of [
      [topicFor(idB.deviceId, 'up/vars'), upVars('intruder', 'x')],
      [topicFor(idB.deviceId, 'state'), encode('state', 'offline')],
    ] as const) {
      const c = probe.connected ? probe : await rawClient(live.mqttUrl, asA);
      const closed = new Promise<void>((resolve) => c.once('close', () => resolve()));
      c.publish(topic, payload, { qos: 1 });
      await closed;
      await endClient(c);
    }
    expect(broker.refusals['publish-denied']).toBe(2);

    // A's own publish goes through; B's topics were left alone.
    const own = await rawClient(live.mqttUrl, asA);
    await own.publishAsync(topicFor(a.deviceId, 'up/vars'), upVars('probe', 'mine'), { qos: 1 });
    await until(() => live.bridge.store.devices.getVar(a.deviceId, 'd', 'probe'), "A's own publish");
    expect(await live.bridge.store.devices.getVar(idB.deviceId, 'd', 'intruder')).toBeUndefined();
    expect((await live.bridge.store.devices.getVar(idB.deviceId, 'meta', 'state'))?.value?.toString()).toBe(
      'connected',
    );
    await endClient(own);

    // Once enrolled, A's uuid needs A's secret; B's secret does not open it.
    await expect(
      rawClient(live.mqttUrl, { clientId: a.deviceId, username: a.deviceId, password: idB.secret }),
    ).rejects.toThrow();
    expect(broker.refusals['bad-secret']).toBe(1);
  });
});
