/**
 * What the bridge sends a device stays within what the device takes (docs/protocol.md, "Sizes"): a catch-up or a
 * resend of many large values is split into `down/vars` messages of at most MAX_MESSAGE_BYTES, never one message
 * over the payload limit that the agent would refuse, and the broker's packet limit would cut. A real bridge with
 * its embedded broker, a user on its REST API, and a device on a raw MQTT connection that records every message.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_MESSAGE_BYTES, MAX_PAYLOAD_BYTES } from '../../protocol/index.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type MqttDevice, connectMqttDevice } from '../support/mqtt-device.js';
import { until } from '../support/wait.js';

/** 150 values of 60 KiB: about 9 MiB, more than one message may hold. */
const VALUES = 150;
const VALUE_BYTES = 60 * 1024;

describe('large values to a device', () => {
  let live: LiveBridge;
  let device: MqttDevice;
  let user: HttpClient;
  /** While true the device drops what it is sent, so that everything waits for one resend. */
  let refusing = true;
  const sizes: number[] = [];
  const names = new Set<string>();
  let undecodable = 0;

  beforeAll(async () => {
    live = await startLiveBridge({
      config: { mqtt: { openEnrolment: true }, devices: { resendFirstMs: 300, resendMaxMs: 1000 } },
    });
    device = await connectMqttDevice(live.mqttUrl, (msg, payload) => {
      if (!msg.ok) {
        // What an agent does with it: drop it, unacknowledged.
        undecodable++;
        return;
      }
      if (refusing) return;
      sizes.push(payload.length);
      for (const item of msg.value.items) names.add(item.name);
      void device.ack(msg.value.items);
    });
    user = live.client();
    expect(
      (await user.post('/0/session/signup', { form: { login: 'big@example.com', password: 'correct horse' } })).status,
    ).toBe(201);
    await until(() => live.bridge.store.devices.deviceByAuthcode(device.authcode), 'the device saying hello');
    expect((await user.post('/0/devices/', { form: { auth: device.authcode } })).status).toBe(201);
  });

  afterAll(async () => {
    await device?.close();
    await live?.close();
  });

  it('go in messages the device can take, however many wait at once', async () => {
    for (let i = 0; i < VALUES; i++) {
      const value = `${i}:`.padEnd(VALUE_BYTES, String.fromCharCode(97 + (i % 26)));
      const r = await user.post(`/0/devices/${device.id}/d/big${i}`, { form: { value } });
      expect(r.status).toBe(200);
    }
    // Everything now waits for the resend, which takes it all at once.
    refusing = false;
    await until(() => names.size === VALUES, 'every value delivered', 40_000);
    expect(undecodable).toBe(0);
    expect(Math.max(...sizes)).toBeLessThanOrEqual(MAX_MESSAGE_BYTES + 64 * 1024);
    expect(Math.max(...sizes)).toBeLessThan(MAX_PAYLOAD_BYTES);
    // More than one message, and each holds more than one value: split by size, not one by one.
    expect(sizes.length).toBeGreaterThan(1);
    expect(sizes.length).toBeLessThan(VALUES);
    await until(async () => {
      const r = await user.get(`/0/devices/${device.id}/d/big${VALUES - 1}`);
      const rec = JSON.parse(r.body) as { time: number; acked: number };
      return rec.acked >= rec.time;
    }, 'the last value acknowledged');
  });
});
