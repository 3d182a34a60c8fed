/**
 * The MQTT packet size cap (docs/protocol.md, "Packet size"): a device that announces a packet larger than
 * `MAX_PACKET_BYTES` is disconnected before the broker holds it, by the embedded broker of a real bridge process
 * and by a private Mosquitto run with the shipped config's `max_packet_size`; the broker's memory stays flat.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  MAX_PACKET_BYTES,
  MAX_PAYLOAD_BYTES,
  MAX_VALUE_BYTES,
  encode,
  messageId,
  topicFor,
} from '../../protocol/index.js';
import { ROOT, tempDir } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type BridgeProcess, spawnBridge } from '../support/bridge-process.js';
import { type TestBroker, freePort, startMosquitto } from '../support/brokers.js';
import { type RawClient, publishHeader, publishPacket, rawConnect, rssOf } from '../support/raw-mqtt.js';
import { requires } from '../support/system.js';
import { until } from '../support/wait.js';

const MIB = 1024 * 1024;

/** The shipped Mosquitto config's `max_packet_size`. */
function shippedMaxPacketSize(): number {
  const conf = readFileSync(join(ROOT, 'config/mosquitto/devcloud.conf'), 'utf8');
  const m = /^max_packet_size\s+(\d+)\s*$/m.exec(conf);
  if (!m) throw new Error('config/mosquitto/devcloud.conf sets no max_packet_size');
  return Number(m[1]);
}

/**
 * Streams one PUBLISH of `total` bytes in 64 KiB pieces, as fast as the socket takes them, until it is all sent or
 * the broker closes the connection; meanwhile samples the broker's resident memory. Returns the largest sample.
 */
async function streamOversized(client: RawClient, topic: string, total: number, pid: number): Promise<number> {
  let peak = rssOf(pid);
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, rssOf(pid));
    } catch {
      // The process is gone; the assertions below say so.
    }
  }, 20);
  try {
    await client.write(publishHeader(topic, total));
    const piece = Buffer.alloc(64 * 1024, 0x61);
    for (let sent = 0; sent < total && !client.closed(); sent += piece.length) {
      if (!(await client.write(piece))) break;
    }
    // Whatever the broker still had to read, let it.
    await new Promise((r) => setTimeout(r, 300));
    peak = Math.max(peak, rssOf(pid));
  } finally {
    clearInterval(sampler);
  }
  return peak;
}

describe('packet size cap', () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  it('the shipped Mosquitto config caps packets at the size derived from protocol/', () => {
    expect(shippedMaxPacketSize()).toBe(MAX_PACKET_BYTES);
    expect(MAX_PACKET_BYTES).toBeGreaterThan(MAX_PAYLOAD_BYTES);
  });

  it('the embedded broker passes a legal message close to the payload limit and refuses one over the cap', async () => {
    const live: LiveBridge = await startLiveBridge({ config: { mqtt: { openEnrolment: true } } });
    cleanups.push(() => live.close());
    const port = live.bridge.broker!.port;
    const deviceId = randomUUID();
    const login = { clientId: deviceId, username: deviceId, password: randomBytes(32).toString('hex') };

    // 120 values of 64 KiB: about 7.7 MiB of JSON, under MAX_PAYLOAD_BYTES.
    const value = 'v'.repeat(MAX_VALUE_BYTES);
    const time = Date.now();
    const items = Array.from({ length: 120 }, (_, i) => ({
      kind: 'push' as const,
      type: 'd' as const,
      name: `big${i}`,
      value,
      time,
      origin: 'device' as const,
    }));
    const big = encode('up/vars', { id: messageId(), items });
    expect(big.length).toBeLessThan(MAX_PAYLOAD_BYTES);
    const honest = await rawConnect(port, login);
    cleanups.push(() => honest.close());
    await honest.write(publishPacket(topicFor(deviceId, 'up/vars'), big));
    await until(
      async () => (await live.bridge.store.devices.getVar(deviceId, 'd', 'big119')) !== undefined,
      'the large message',
    );
    expect(honest.closed()).toBe(false);

    // One byte over the cap, announced in the header: the connection is closed without the body being read.
    await honest.write(publishHeader(topicFor(deviceId, 'up/vars'), MAX_PACKET_BYTES));
    await until(() => honest.closed(), 'the broker to close the connection');
    expect(live.bridge.broker!.refusals['packet-too-large']).toBe(1);
    const line = live.sink.events('broker.packet_too_large')[0];
    expect(line).toMatchObject({ level: 'warn', clientId: deviceId, limit: MAX_PACKET_BYTES });
  });

  it('a device streaming 200 MiB to the embedded broker is disconnected and the bridge process stays flat', async () => {
    const dataDir = tempDir('devcloud-bridge-');
    cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const bridge: BridgeProcess = await spawnBridge({
      dataDir,
      httpPort: await freePort(),
      mqttPort: await freePort(),
      config: { mqtt: { openEnrolment: true } },
    });
    cleanups.push(() => bridge.kill9());
    const port = Number(new URL(bridge.mqttUrl).port);
    const deviceId = randomUUID();
    const device = await rawConnect(port, {
      clientId: deviceId,
      username: deviceId,
      password: randomBytes(32).toString('hex'),
    });
    cleanups.push(() => device.close());
    // Let the bridge settle after the device's enrolment before taking the baseline.
    await new Promise((r) => setTimeout(r, 500));
    const pid = bridge.proc.pid!;
    const before = rssOf(pid);
    const peak = await streamOversized(device, topicFor(deviceId, 'up/vars'), 200 * MIB, pid);

    expect(device.closed()).toBe(true);
    expect(device.written()).toBeLessThan(50 * MIB);
    expect(peak - before).toBeLessThan(48 * MIB);
    expect(bridge.output()).toContain('"event":"broker.packet_too_large"');
    // The bridge still serves.
    const health = await fetch(`${bridge.url}/healthz`);
    expect(health.status).toBe(200);
  });

  it('a device streaming 200 MiB to Mosquitto run with the shipped limit is disconnected and Mosquitto stays flat', async (ctx) => {
    requires(ctx, 'mosquitto');
    const broker: TestBroker = await startMosquitto([`max_packet_size ${shippedMaxPacketSize()}`]);
    cleanups.push(() => broker.close());
    const deviceId = randomUUID();
    const device = await rawConnect(broker.port, { clientId: deviceId, username: deviceId, password: 'x' });
    cleanups.push(() => device.close());
    const pid = broker.pid!()!;
    const before = rssOf(pid);
    const peak = await streamOversized(device, topicFor(deviceId, 'up/vars'), 200 * MIB, pid);

    expect(device.closed()).toBe(true);
    expect(device.written()).toBeLessThan(50 * MIB);
    expect(peak - before).toBeLessThan(16 * MIB);
  });
});
