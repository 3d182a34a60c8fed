import { randomBytes, randomUUID } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import mqtt, { type MqttClient } from 'mqtt';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { EmbeddedBroker, MemoryCredentials, hashSecret } from '../../bridge/broker.js';
import { topicFor } from '../../protocol/index.js';
import { LogSink, ROOT } from '../support/agent.js';
import { createLogger } from '../../lib/log.js';

function device() {
  return { id: randomUUID(), secret: randomBytes(32).toString('hex') };
}

async function connect(url: string, clientId: string, username: string, password: string): Promise<MqttClient> {
  return mqtt.connectAsync(url, { clientId, username, password, reconnectPeriod: 0, connectTimeout: 5000 });
}

async function refusedToConnect(url: string, clientId: string, username: string, password: string): Promise<boolean> {
  try {
    const c = await connect(url, clientId, username, password);
    await c.endAsync(true);
    return false;
  } catch {
    return true;
  }
}

describe('embedded broker: enrolment and topic isolation', () => {
  let broker: EmbeddedBroker;
  let credentials: MemoryCredentials;
  let sink: LogSink;
  const clients: MqttClient[] = [];

  async function start(openEnrolment: boolean) {
    credentials = new MemoryCredentials();
    sink = new LogSink();
    const log = createLogger({ level: 'info', pretty: 'never', base: {}, destination: sink });
    broker = await EmbeddedBroker.start({ host: '127.0.0.1', port: 0, openEnrolment, credentials, log, now: Date.now });
  }

  beforeEach(() => start(true));
  afterEach(async () => {
    for (const c of clients.splice(0)) await c.endAsync(true);
    await broker.close();
  });

  it('enrols a new device on first connect and then requires the same secret', async () => {
    const d = device();
    clients.push(await connect(broker.url, d.id, d.id, d.secret));
    expect(await credentials.secretHash(d.id)).toBe(hashSecret(d.secret));
    await clients.pop()!.endAsync(true);
    expect(await refusedToConnect(broker.url, d.id, d.id, 'wrong-secret-wrong-secret')).toBe(true);
    expect(broker.refusals['bad-secret']).toBe(1);
    clients.push(await connect(broker.url, d.id, d.id, d.secret));
    // The secret itself is never logged.
    expect(sink.text()).not.toContain(d.secret);
  });

  it('refuses a username that is not the device uuid of the client id', async () => {
    const d = device();
    expect(await refusedToConnect(broker.url, d.id, randomUUID(), d.secret)).toBe(true);
    expect(await refusedToConnect(broker.url, 'not-a-uuid', 'not-a-uuid', d.secret)).toBe(true);
    expect(broker.refusals['bad-username']).toBe(2);
  });

  it('refuses unknown devices when open enrolment is off', async () => {
    await broker.close();
    await start(false);
    const d = device();
    expect(await refusedToConnect(broker.url, d.id, d.id, d.secret)).toBe(true);
    expect(broker.refusals['not-enrolled']).toBe(1);
  });

  it("does not let a device publish to another device's topics or its own down topics", async () => {
    const a = device();
    const b = device();
    const ca = await connect(broker.url, a.id, a.id, a.secret);
    const cb = await connect(broker.url, b.id, b.id, b.secret);
    clients.push(ca, cb);
    const got: string[] = [];
    const bridge = await connect(broker.url, broker.bridgeClientId, broker.bridgeUsername, broker.bridgePassword);
    clients.push(bridge);
    bridge.on('message', (t) => got.push(t));
    await bridge.subscribeAsync('dc/v1/#', { qos: 1 });

    // Allowed: its own up topic.
    const delivered = new Promise<void>((resolve) => bridge.once('message', () => resolve()));
    await ca.publishAsync(topicFor(a.id, 'up/vars'), '{}', { qos: 1 });
    await delivered;
    // Refused: another device's up topic; aedes drops the connection of a client whose publish is refused.
    const closed = new Promise<void>((resolve) => ca.once('close', () => resolve()));
    ca.publish(topicFor(b.id, 'up/vars'), '{}', { qos: 1 });
    await closed;
    expect(broker.refusals['publish-denied']).toBe(1);

    // Refused: its own down topic (only the cloud writes there).
    const closedB = new Promise<void>((resolve) => cb.once('close', () => resolve()));
    cb.publish(topicFor(b.id, 'down/cmd'), '{}', { qos: 1 });
    await closedB;
    expect(broker.refusals['publish-denied']).toBe(2);
    expect(got).toEqual([topicFor(a.id, 'up/vars')]);
  });

  it("does not let a device subscribe to another device's topics or to wildcards", async () => {
    const a = device();
    const b = device();
    const ca = await connect(broker.url, a.id, a.id, a.secret);
    clients.push(ca);
    const own = await ca.subscribeAsync(`dc/v1/${a.id}/down/#`, { qos: 1 });
    expect(own[0]!.qos).toBe(1);
    for (const topic of [`dc/v1/${b.id}/down/#`, 'dc/v1/#', `dc/v1/+/down/#`, `dc/v1/${a.id}/up/#`]) {
      // mqtt.js rejects a subscription the broker refused (granted QoS 128).
      await expect(ca.subscribeAsync(topic, { qos: 1 }), topic).rejects.toThrow(/Subscribe error/);
    }
    expect(broker.refusals['subscribe-denied']).toBe(4);
  });

  it('accepts the bridge credential only with the bridge client id or one derived from it', async () => {
    expect(await refusedToConnect(broker.url, 'someone', broker.bridgeUsername, broker.bridgePassword)).toBe(true);
    expect(
      await refusedToConnect(broker.url, `${broker.bridgeClientId}x`, broker.bridgeUsername, broker.bridgePassword),
    ).toBe(true);
    expect(await refusedToConnect(broker.url, broker.bridgeClientId, broker.bridgeUsername, 'guess')).toBe(true);
    expect(await refusedToConnect(broker.url, `${broker.bridgeClientId}-watch`, broker.bridgeUsername, 'guess')).toBe(
      true,
    );
    const bridge = await connect(broker.url, broker.bridgeClientId, broker.bridgeUsername, broker.bridgePassword);
    clients.push(bridge);
    // A watcher with a derived client id sees every topic, and does not push the bridge's own client off.
    const watcher = await connect(
      broker.url,
      `${broker.bridgeClientId}-watch`,
      broker.bridgeUsername,
      broker.bridgePassword,
    );
    clients.push(watcher);
    const granted = await watcher.subscribeAsync('dc/v1/#', { qos: 1 });
    expect(granted[0]!.qos).toBe(1);
    const d = device();
    const cd = await connect(broker.url, d.id, d.id, d.secret);
    clients.push(cd);
    const seen = new Promise<string>((resolve) => watcher.once('message', (t) => resolve(t)));
    await cd.publishAsync(topicFor(d.id, 'up/meta'), '{}', { qos: 1 });
    expect(await seen).toBe(topicFor(d.id, 'up/meta'));
    expect(bridge.connected).toBe(true);
  });

  it('writes packet identifiers without building a cache of 65,536 buffers on the first connection', () => {
    // In a fresh process: the test workers share modules between files (vitest.config.ts), and mqtt-packet's cache
    // is one per process, which a client in an earlier file may have filled already.
    const script = `
      import { createRequire } from 'node:module';
      import mqtt from 'mqtt';
      import { EmbeddedBroker, MemoryCredentials } from './dist/bridge/broker.js';
      import { createLogger } from './dist/lib/log.js';
      const log = createLogger({ level: 'fatal', pretty: 'never', base: {} });
      const broker = await EmbeddedBroker.start({
        host: '127.0.0.1', port: 0, openEnrolment: true, credentials: new MemoryCredentials(), log, now: Date.now,
      });
      // The copy of mqtt-packet aedes writes with; its cache is filled on the first packet written when it is on.
      const fromAedes = createRequire(createRequire(import.meta.url).resolve('aedes'));
      const numbers = fromAedes('mqtt-packet/numbers.js');
      const id = crypto.randomUUID();
      const c = await mqtt.connectAsync(broker.url, { clientId: id, username: id, password: 'x'.repeat(64), reconnectPeriod: 0 });
      await c.subscribeAsync('dc/v1/' + id + '/down/#', { qos: 1 });
      await c.publishAsync('dc/v1/' + id + '/up/meta', '{}', { qos: 1 });
      await c.endAsync(true);
      await broker.close();
      process.stdout.write(String(Object.keys(numbers.cache).length));
    `;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], { cwd: ROOT, encoding: 'utf8' });
    expect(out).toBe('0');
  });
});
