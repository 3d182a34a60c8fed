/**
 * The resend of unacknowledged changes end to end (docs/sync.md, "Resend while connected"): a real bridge with its
 * embedded broker, a user on its REST API, and a device on a raw MQTT connection that, like a gateway whose disk
 * is full, commits nothing and acknowledges nothing for a while. Every change the user made is answered
 * `device-ok`, stays unacknowledged while the device refuses, and ends up acknowledged once the device takes
 * what the bridge sends again, on the same connection: the device never reconnects.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type MqttDevice, connectMqttDevice } from '../support/mqtt-device.js';
import { until } from '../support/wait.js';

const CHANGES = 30;

describe('a connected device that does not acknowledge gets the changes again', () => {
  let live: LiveBridge;
  let device: MqttDevice;
  let user: HttpClient;
  /** While true the device drops what it is sent, as an agent that cannot commit does. */
  let refusing = true;
  const received: Array<{ at: number; names: string[] }> = [];
  let connects = 0;

  beforeAll(async () => {
    live = await startLiveBridge({
      config: { mqtt: { openEnrolment: true }, devices: { resendFirstMs: 200, resendMaxMs: 1000 } },
    });
    device = await connectMqttDevice(live.mqttUrl, (msg) => {
      if (!msg.ok) throw new Error(`bad down/vars: ${msg.reason}`);
      received.push({ at: Date.now(), names: msg.value.items.map((i) => i.name) });
      if (refusing) return;
      void device.ack(msg.value.items);
    });
    device.client.on('connect', () => connects++);
    connects = 1;
    user = live.client();
    expect(
      (await user.post('/0/session/signup', { form: { login: 'u@example.com', password: 'correct horse' } })).status,
    ).toBe(201);
    await until(() => live.bridge.store.devices.deviceByAuthcode(device.authcode), 'the device saying hello');
    expect((await user.post('/0/devices/', { form: { auth: device.authcode } })).status).toBe(201);
  });

  afterAll(async () => {
    await device?.close();
    await live?.close();
  });

  const stamps = async (name: string): Promise<{ time: number; acked: number }> => {
    const r = await user.get(`/0/devices/${device.id}/d/${name}`);
    expect(r.status).toBe(200);
    return JSON.parse(r.body) as { time: number; acked: number };
  };

  it('acknowledges every change without a reconnect once the device takes them', async () => {
    for (let i = 0; i < CHANGES; i++) {
      const r = await user.post(`/0/devices/${device.id}/d/v${i}`, { form: { value: `value ${i}` } });
      expect({ status: r.status, body: r.body }).toEqual({ status: 200, body: 'device-ok' });
    }
    // The device hears each change, drops it, and hears it again: the bridge does not wait for a reconnect.
    const timesHeard = () => {
      const n = new Map<string, number>();
      for (const m of received) for (const name of m.names) n.set(name, (n.get(name) ?? 0) + 1);
      return n;
    };
    await until(() => {
      const n = timesHeard();
      return Array.from({ length: CHANGES }, (_, i) => n.get(`v${i}`) ?? 0).every((c) => c >= 2);
    }, 'every change sent again while the device is connected');
    for (let i = 0; i < CHANGES; i++) expect((await stamps(`v${i}`)).acked).toBe(0);
    // The disk has room again.
    refusing = false;
    await until(async () => {
      for (let i = 0; i < CHANGES; i++) {
        const s = await stamps(`v${i}`);
        if (s.acked < s.time) return false;
      }
      return true;
    }, 'every change acknowledged');
    expect(connects).toBe(1);
    expect(device.client.connected).toBe(true);
    expect(live.sink.events('vars.resend').length).toBeGreaterThanOrEqual(2);
    // Once everything is acknowledged the device leaves the schedule: nothing more is sent.
    await until(() => live.bridge.devices.resend.size === 0, 'the device leaving the resend schedule');
  });
});
