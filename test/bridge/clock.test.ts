/**
 * The bridge's side of decision 24 (docs/sync.md#clocks), with devices played by raw MQTT clients against the whole
 * bridge and its embedded broker: `now` only for agents that ask for it, and the re-stamping of device versions
 * stamped by a wrong clock, answered with the version the bridge keeps instead of an acknowledgement.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import mqtt, { type MqttClient } from 'mqtt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type VarItem, messageId, topicFor } from '../../protocol/index.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

const HOUR = 3_600_000;

interface Down {
  topic: string;
  body: Record<string, unknown>;
}

interface Device {
  id: string;
  client: MqttClient;
  down: Down[];
  /** Publishes the hello; `clock` says the agent reads `now`; `skew` shifts its `ts`. */
  hello(clock: boolean, skew?: number): Promise<void>;
  vars(items: VarItem[]): Promise<void>;
  /** `down/` messages on `name` received so far. */
  on(name: string): Array<Record<string, unknown>>;
}

describe('the cloud clock on the bridge', () => {
  let live: LiveBridge;
  let http: HttpClient;
  const devices: Device[] = [];

  beforeAll(async () => {
    live = await startLiveBridge();
    http = live.client();
    const r = await http.post('/0/session/signup', { form: { login: 'clock@example.com', password: 'correct horse' } });
    expect(r.status).toBe(201);
  });
  afterAll(async () => {
    for (const d of devices) await d.client.endAsync(true);
    await live?.close();
  });

  /** A device that said hello (with `clock`, its own clock `skew` ahead) and that the user claimed. */
  async function device(clock: boolean, skew = 0): Promise<Device> {
    const id = randomUUID();
    const authcode = randomBytes(16).toString('hex');
    const secret = randomBytes(32).toString('hex');
    const client = await mqtt.connectAsync(live.mqttUrl, { clientId: id, username: id, password: secret });
    const down: Down[] = [];
    client.on('message', (topic, payload) => down.push({ topic, body: JSON.parse(payload.toString()) as never }));
    await client.subscribeAsync(`dc/v1/${id}/down/#`, { qos: 1 });
    const d: Device = {
      id,
      client,
      down,
      async hello(clock, skew = 0) {
        const hello = {
          id: messageId(),
          protocol: 1,
          deviceId: id,
          authcode,
          platform: 'linux-x64',
          agentVersion: '0.1.0',
          fwVersion: '1.0.0',
          mode: 'master',
          bootTime: Date.now() + skew,
          ts: Date.now() + skew,
          ...(clock ? { clock: true } : {}),
        };
        await client.publishAsync(topicFor(id, 'up/hello'), JSON.stringify(hello), { qos: 1 });
        await until(async () => (await live.bridge.store.devices.device(id))?.authcode === authcode, 'the hello');
      },
      async vars(items) {
        await client.publishAsync(topicFor(id, 'up/vars'), JSON.stringify({ id: messageId(), items }), { qos: 1 });
      },
      on: (name) => down.filter((m) => m.topic === topicFor(id, name as 'down/vars')).map((m) => m.body),
    };
    devices.push(d);
    await d.hello(clock, skew);
    if ((await http.post('/0/devices/', { form: { auth: authcode } })).status !== 201) throw new Error('claim');
    return d;
  }

  const item = (name: string, value: string, time: number, extra: Partial<VarItem> = {}): VarItem => ({
    kind: 'push',
    type: 'd',
    name,
    value,
    time,
    origin: 'device',
    ...extra,
  });

  async function cloudVar(id: string, name: string): Promise<{ value: string; time: number; acked: number }> {
    const r = await http.get(`/0/devices/${id}`);
    return (JSON.parse(r.body) as { d: Record<string, { value: string; time: number; acked: number }> }).d[name]!;
  }

  it('puts its clock on down/ payloads only for an agent that announces clock, and answers its hello with it', async () => {
    const before = Date.now();
    const old = await device(false);
    const fresh = await device(true);
    const beacon = await until(() => fresh.on('down/vars').find((m) => m.now !== undefined), 'the answer to hello');
    expect(beacon).toMatchObject({ items: [] });
    expect(beacon.now).toBeGreaterThanOrEqual(before - 5_000);
    expect(beacon.now).toBeLessThanOrEqual(Date.now());

    for (const d of [old, fresh]) await d.vars([item('temp', '21', Date.now())]);
    const acks = await until(() => fresh.on('down/acks')[0], 'acks for the new agent');
    expect(acks.now).toEqual(expect.any(Number));
    const oldAcks = await until(() => old.on('down/acks')[0], 'acks for the older agent');
    expect(oldAcks.now).toBeUndefined();
    // Nothing an older agent gets carries the field it would refuse.
    expect(old.down.every((m) => m.body.now === undefined)).toBe(true);
    expect(old.down.length).toBeGreaterThan(0);
  });

  it('moves an unverified version by the skew at hello: the user change made after it wins', async () => {
    const d = await device(true, HOUR);
    // Made offline an hour ahead, a moment before the user's change (more than the skew's measuring error, the
    // hello's delivery); it arrives after.
    const madeAt = Date.now();
    await until(() => Date.now() > madeAt + 500, 'a moment later');
    expect((await http.post(`/0/devices/${d.id}/d/led`, { form: { value: 'user' } })).status).toBe(200);
    const user = await cloudVar(d.id, 'led');
    await until(() => d.on('down/vars').some((m) => (m.items as VarItem[]).some((i) => i.name === 'led')), 'push');
    const seen = d.on('down/vars').length;
    await d.vars([item('led', 'gateway', madeAt + HOUR, { unverified: true })]);

    // Answered with the version the bridge keeps, the user's, instead of an acknowledgement.
    const answer = await until(() => d.on('down/vars')[seen], 'the answer');
    expect(answer.items).toEqual([
      expect.objectContaining({ value: 'user', time: user.time, origin: 'cloud', replaces: madeAt + HOUR }),
    ]);
    expect(d.on('down/acks')).toEqual([]);
    expect(await cloudVar(d.id, 'led')).toMatchObject({ value: 'user', time: user.time });

    // A later offline change wins, with its time moved back by the skew, and goes back to the device to take.
    const later = Date.now();
    await d.vars([item('fan', 'gateway', later + HOUR, { unverified: true })]);
    const fan = await until(async () => {
      const v = await cloudVar(d.id, 'fan');
      return v?.value === 'gateway' ? v : undefined;
    }, 'fan applied');
    expect(Math.abs(fan.time - later)).toBeLessThan(5_000);
    expect(fan.acked).toBeLessThan(fan.time);
    const back = await until(
      () =>
        d
          .on('down/vars')
          .flatMap((m) => m.items as VarItem[])
          .find((i) => i.name === 'fan'),
      'fan sent back',
    );
    expect(back).toMatchObject({ value: 'gateway', time: fan.time, origin: 'device', replaces: later + HOUR });
    expect(back.unverified).toBeUndefined();
    // The device takes it and acknowledges: the bridge's version is settled.
    await d.client.publishAsync(
      topicFor(d.id, 'up/acks'),
      JSON.stringify({
        id: messageId(),
        acks: [{ kind: 'push', type: 'd', name: 'fan', time: fan.time, origin: 'device' }],
      }),
      { qos: 1 },
    );
    await until(async () => (await cloudVar(d.id, 'fan')).acked >= fan.time, 'fan acknowledged');
    expect(live.sink.events('vars.restamped').length).toBeGreaterThanOrEqual(2);
  });

  it('never lets a version far ahead beat a user change the device had not seen', async () => {
    const d = await device(true);
    // The user's change is pending for the device; the device sends a version an hour ahead, made without it.
    expect((await http.post(`/0/devices/${d.id}/d/mode`, { form: { value: 'connected' } })).status).toBe(200);
    const user = await cloudVar(d.id, 'mode');
    await d.vars([item('mode', 'deadleaf', Date.now() + HOUR)]);
    await until(() => live.sink.events('vars.restamped').some((e) => e.deviceId === d.id), 're-stamped');
    expect(await cloudVar(d.id, 'mode')).toMatchObject({ value: 'connected', time: user.time });

    // With nothing pending, it is taken as made now: not an hour ahead, so a later user change still wins.
    const before = Date.now();
    await d.vars([item('level', 'gateway', Date.now() + HOUR)]);
    const level = await until(async () => {
      const v = await cloudVar(d.id, 'level');
      return v?.value === 'gateway' ? v : undefined;
    }, 'level applied');
    expect(level.time).toBeGreaterThanOrEqual(before);
    expect(level.time).toBeLessThanOrEqual(Date.now());

    // Within the tolerance, a version keeps its time and is acknowledged as usual.
    const near = Date.now() + 30_000;
    await d.vars([item('near', 'x', near)]);
    await until(() => d.on('down/acks').some((m) => (m.acks as VarItem[]).some((a) => a.name === 'near')), 'ack');
    expect(await cloudVar(d.id, 'near')).toMatchObject({ time: near });
  });
});
