/**
 * What the bridge sends a device stays within what the device takes (docs/protocol.md, "Sizes"): a catch-up or a
 * resend of many large values is split into `down/vars` messages of at most MAX_MESSAGE_BYTES, never one message
 * over the payload limit that the agent would refuse, and the broker's packet limit would cut. A real bridge with
 * its embedded broker, a user on its REST API, and a device on a raw MQTT connection that records every message.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import mqtt, { type MqttClient } from 'mqtt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  MAX_MESSAGE_BYTES,
  MAX_PAYLOAD_BYTES,
  ackFor,
  decode,
  downFilter,
  encode,
  messageId,
  topicFor,
} from '../../protocol/index.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

/** 150 values of 60 KiB: about 9 MiB, more than one message may hold. */
const VALUES = 150;
const VALUE_BYTES = 60 * 1024;

describe('large values to a device', () => {
  let live: LiveBridge;
  let device: MqttClient;
  let user: HttpClient;
  const D = randomUUID();
  const AUTH = randomBytes(16).toString('hex');
  /** While true the device drops what it is sent, so that everything waits for one resend. */
  let refusing = true;
  const sizes: number[] = [];
  const names = new Set<string>();
  let undecodable = 0;

  beforeAll(async () => {
    live = await startLiveBridge({
      config: { mqtt: { openEnrolment: true }, devices: { resendFirstMs: 300, resendMaxMs: 1000 } },
    });
    device = await mqtt.connectAsync(live.mqttUrl, {
      clientId: D,
      username: D,
      password: randomBytes(32).toString('hex'),
      reconnectPeriod: 0,
      connectTimeout: 5000,
    });
    device.on('message', (topic, payload) => {
      if (topic !== topicFor(D, 'down/vars')) return;
      const msg = decode('down/vars', payload);
      if (!msg.ok) {
        // What an agent does with it: drop it, unacknowledged.
        undecodable++;
        return;
      }
      if (refusing) return;
      sizes.push(payload.length);
      for (const item of msg.value.items) names.add(item.name);
      void device.publishAsync(
        topicFor(D, 'up/acks'),
        encode('up/acks', { id: messageId(), acks: msg.value.items.map(ackFor) }),
        { qos: 1 },
      );
    });
    await device.subscribeAsync(downFilter(D), { qos: 1 });
    await device.publishAsync(
      topicFor(D, 'up/hello'),
      encode('up/hello', {
        id: messageId(),
        protocol: 1,
        deviceId: D,
        authcode: AUTH,
        platform: 'test-board',
        agentVersion: '0.0.1',
        fwVersion: '1.0',
        mode: 'master',
        bootTime: Date.now(),
        ts: Date.now(),
      }),
      { qos: 1 },
    );
    user = live.client();
    expect(
      (await user.post('/0/session/signup', { form: { login: 'big@example.com', password: 'correct horse' } })).status,
    ).toBe(201);
    await until(() => live.bridge.store.devices.deviceByAuthcode(AUTH), 'the device saying hello');
    expect((await user.post('/0/devices/', { form: { auth: AUTH } })).status).toBe(201);
  });

  afterAll(async () => {
    await device?.endAsync(true);
    await live?.close();
  });

  it('go in messages the device can take, however many wait at once', async () => {
    for (let i = 0; i < VALUES; i++) {
      const value = `${i}:`.padEnd(VALUE_BYTES, String.fromCharCode(97 + (i % 26)));
      const r = await user.post(`/0/devices/${D}/d/big${i}`, { form: { value } });
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
      const r = await user.get(`/0/devices/${D}/d/big${VALUES - 1}`);
      const rec = JSON.parse(r.body) as { time: number; acked: number };
      return rec.acked >= rec.time;
    }, 'the last value acknowledged');
  });
});
