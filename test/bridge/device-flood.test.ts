/**
 * Per-device rate limits (docs/operations.md, "Device rate limits"): a hello flood from one device, through a
 * real broker (the embedded one, and a private Mosquitto the bridge is a client of), is mostly dropped, the
 * device is cut off, the log says so in a few lines, and another user's REST calls keep being answered.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { DeviceRateLimiter } from '../../bridge/devices/ratelimit.js';
import { createLogger } from '../../lib/log.js';
import { encode, topicFor } from '../../protocol/index.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type TestBroker, startMosquitto } from '../support/brokers.js';
import { type RawClient, publishPacket, rawConnect } from '../support/raw-mqtt.js';
import { helloMessage } from '../support/mqtt-device.js';
import { requires } from '../support/system.js';
import { until } from '../support/wait.js';

const FLOOD = 3000;
const HELLOS_PER_MINUTE = 5;

function hello(deviceId: string): Buffer {
  return encode('up/hello', helloMessage(deviceId));
}

/** 3,000 hellos in one write, as fast as TCP takes them. */
async function flood(device: RawClient, deviceId: string): Promise<void> {
  const topic = topicFor(deviceId, 'up/hello');
  const packets = Array.from({ length: FLOOD }, () => publishPacket(topic, hello(deviceId)));
  await device.write(Buffer.concat(packets));
}

async function otherUser(live: LiveBridge): Promise<HttpClient> {
  const http = live.client();
  const r = await http.post('/0/session/signup', {
    form: { login: 'bystander@example.com', password: 'correct horse' },
  });
  expect(r.status).toBe(201);
  return http;
}

describe('a hello flood from one device', () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  it('through the embedded broker: the excess is dropped, the device disconnected and refused, REST answers', async () => {
    // The production limits (`rate: {}`), not the test bridges' generous ones.
    const live = await startLiveBridge({ config: { mqtt: { openEnrolment: true, rate: {} } } });
    cleanups.push(() => live.close());
    const http = await otherUser(live);
    const port = live.bridge.broker!.port;
    const deviceId = randomUUID();
    const login = { clientId: deviceId, username: deviceId, password: randomBytes(32).toString('hex') };
    const device = await rawConnect(port, login);
    cleanups.push(() => device.close());

    const during = http.get('/0/user/');
    await flood(device, deviceId);
    expect((await during).status).toBe(200);
    await until(() => device.closed(), 'the broker to disconnect the flooding device');
    // Whatever was let through has been handled by now.
    await until(() => live.sink.events('device.rate_disconnected').length === 1, 'the disconnect line');
    await new Promise((r) => setTimeout(r, 200));

    expect(live.sink.events('device.hello').length).toBeLessThanOrEqual(HELLOS_PER_MINUTE);
    expect(live.sink.events('device.hello').length).toBeGreaterThan(0);
    expect(live.bridge.broker!.refusals['rate-limited']).toBeGreaterThanOrEqual(1);
    // Rate-limited logging: one line when the drops began, one when the device was cut off.
    expect(live.sink.events('device.rate_limited')).toHaveLength(1);
    expect(live.sink.events('device.rate_disconnected')[0]).toMatchObject({ level: 'warn', deviceId });
    // Cut off: its login is refused for the penalty.
    await expect(rawConnect(port, login)).rejects.toThrow(/refused/);
    // Another user is served all along.
    expect((await http.get('/0/user/')).status).toBe(200);
  });

  it('through Mosquitto: the bridge drops the excess and ignores the device for the penalty, REST answers', async (ctx) => {
    requires(ctx, 'mosquitto');
    const broker: TestBroker = await startMosquitto();
    cleanups.push(() => broker.close());
    const live = await startLiveBridge({
      config: { mqtt: { url: broker.url, clientId: `bridge-${randomUUID()}`, rate: {} } },
    });
    cleanups.push(() => live.close());
    const http = await otherUser(live);
    const deviceId = randomUUID();
    const device = await rawConnect(broker.port, { clientId: deviceId, username: deviceId, password: 'x' });
    cleanups.push(() => device.close());

    const during = http.get('/0/user/');
    await flood(device, deviceId);
    expect((await during).status).toBe(200);
    await until(() => live.sink.events('device.rate_disconnected').length === 1, 'the device to be cut off');
    await new Promise((r) => setTimeout(r, 500));
    const hellos = live.sink.events('device.hello').length;
    expect(hellos).toBeLessThanOrEqual(HELLOS_PER_MINUTE);
    expect(hellos).toBeGreaterThan(0);
    expect(live.sink.events('device.rate_limited')).toHaveLength(1);

    // Ignored for the penalty: a further hello, even a single one, is not handled.
    await device.write(publishPacket(topicFor(deviceId, 'up/hello'), hello(deviceId)));
    await new Promise((r) => setTimeout(r, 300));
    expect(live.sink.events('device.hello').length).toBe(hellos);
    expect((await http.get('/0/user/')).status).toBe(200);
  });

  it('through Mosquitto: the bridge reads a burst a read at a time, with the event loop free between reads', async (ctx) => {
    requires(ctx, 'mosquitto');
    const broker: TestBroker = await startMosquitto();
    cleanups.push(() => broker.close());
    // Limits that let the whole burst through to the decoder, where each message is dropped as invalid.
    const live = await startLiveBridge({
      config: { mqtt: { url: broker.url, clientId: `bridge-${randomUUID()}`, rate: { messageBurst: 100_000 } } },
    });
    cleanups.push(() => live.close());
    const link = live.bridge.link;
    const deviceId = randomUUID();
    const device = await rawConnect(broker.port, { clientId: deviceId, username: deviceId, password: 'x' });
    cleanups.push(() => device.close());
    const invalid = publishPacket(topicFor(deviceId, 'up/meta'), Buffer.from('x'.repeat(300)));

    // Messages handled in each turn of the event loop.
    const steps: number[] = [];
    let seen = 0;
    let counting = true;
    const turn = () => {
      const n = link.dropped.invalid;
      if (n > seen) steps.push(n - seen);
      seen = n;
      if (counting) setImmediate(turn);
    };
    setImmediate(turn);
    await device.write(Buffer.concat(Array.from({ length: FLOOD }, () => invalid)));
    // A bridge busy elsewhere meanwhile: the burst waits in its socket, as it does under load.
    const busyUntil = Date.now() + 300;
    while (Date.now() < busyUntil);
    await until(() => link.dropped.invalid === FLOOD, 'the whole burst to be read');
    counting = false;
    // A read is at most 64 KiB (about 180 of these messages); the event loop turns after each, or at worst two.
    expect(steps.length).toBeGreaterThan(1);
    expect(Math.max(...steps)).toBeLessThanOrEqual(400);
  });
});

describe('the default device limits', () => {
  it('let a healthy agent catch up 45,000 variables at once, and stop a flood', () => {
    const config = BridgeConfigSchema.parse({ dataDir: '/x' });
    let now = 0;
    const limiter = new DeviceRateLimiter(
      config.mqtt.rate,
      createLogger({ level: 'silent', pretty: 'never', base: {} }),
      () => now,
    );
    const id = randomUUID();
    // After a reconnect: a hello, then every variable pushed and synced, 500 items (about 300 bytes each) per
    // message, as fast as the agent can send them, and the acknowledgements of what the cloud sent meanwhile.
    expect(limiter.admit(id, 'state', 6)).toBe('ok');
    expect(limiter.admit(id, 'up/hello', 300)).toBe('ok');
    for (let i = 0; i < (2 * 45_000) / 500; i++) expect(limiter.admit(id, 'up/vars', 500 * 300)).toBe('ok');
    for (let i = 0; i < 45_000 / 1000; i++) expect(limiter.admit(id, 'up/acks', 1000 * 120)).toBe('ok');
    expect(limiter.counters.dropped).toBe(0);
    // A device that reconnects now and then says hello each time.
    for (let i = 0; i < 5; i++) {
      now += 5000;
      expect(limiter.admit(id, 'up/hello', 300)).toBe('ok');
    }
    // A flood of hellos is cut off.
    const verdicts = Array.from({ length: 200 }, () => limiter.admit(id, 'up/hello', 300));
    expect(verdicts).toContain('disconnect');
    expect(verdicts.filter((v) => v === 'ok').length).toBeLessThanOrEqual(HELLOS_PER_MINUTE);
  });
});
