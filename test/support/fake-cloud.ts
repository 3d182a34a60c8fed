/**
 * A fake cloud for agent tests: a real MQTT client on the test's broker that speaks `protocol/` the way the
 * bridge does (docs/sync.md, docs/protocol.md), keeping the same four stamps on its side. It records every version it
 * applies, so that tests can check that each change arrives exactly once.
 */
import mqtt, { type MqttClient } from 'mqtt';
import {
  type AckItem,
  ALL_DEVICES_UP_FILTERS,
  type DownTopic,
  type HelloMessage,
  type Payloads,
  type VarItem,
  decode,
  decodeValue,
  encode,
  messageId,
  parseTopic,
  topicFor,
  ackFor,
  varItem,
} from '../../protocol/index.js';

export interface CloudRecord {
  type: 'd' | 's';
  name: string;
  value: Buffer | null;
  time: number;
  origin: 'device' | 'cloud';
  acked: number;
  synced: number;
  syncacked: number;
}

export interface AppliedVersion {
  deviceId: string;
  type: 'd' | 's';
  name: string;
  value: string | null;
  time: number;
  origin: 'device' | 'cloud';
}

interface DeviceState {
  vars: Map<string, CloudRecord>;
  state: string | undefined;
  hellos: HelloMessage[];
  heard: Array<{ authcode: string; at: number }>;
}

const rank = (o: 'device' | 'cloud') => (o === 'cloud' ? 1 : 0);
function newer(a: { time: number; origin: 'device' | 'cloud' }, b: { time: number; origin: 'device' | 'cloud' }) {
  return a.time > b.time || (a.time === b.time && rank(a.origin) > rank(b.origin));
}

export class FakeCloud {
  private client!: MqttClient;
  readonly devices = new Map<string, DeviceState>();
  /** Every version applied, in order. */
  readonly applied: AppliedVersion[] = [];
  /** Payloads received per topic name, valid ones only. */
  readonly received: Record<string, number> = {};
  readonly invalid: string[] = [];
  /** When false, the cloud commits but does not acknowledge (to test re-sends). */
  autoAck = true;
  /** When false, nothing is sent on hello (to test what the agent does alone). */
  catchUpOnHello = true;
  /**
   * The cloud's clock, for every stamp and every clock the cloud sends: the real one, unless a test that moves an
   * agent's clock forward (its `monotonic`) moves the cloud's by as much, so that both go on agreeing.
   */
  now: () => number = () => Date.now();

  static async start(url: string): Promise<FakeCloud> {
    const cloud = new FakeCloud();
    cloud.client = await mqtt.connectAsync(url, {
      clientId: `fake-cloud-${messageId().slice(0, 8)}`,
      clean: true,
      reconnectPeriod: 200,
    });
    cloud.client.on('message', (topic, payload) => cloud.onMessage(topic, payload));
    // Resubscribe after a broker restart (mqtt.js resubscribes by default; the await makes start deterministic).
    await cloud.client.subscribeAsync([...ALL_DEVICES_UP_FILTERS], { qos: 1 });
    return cloud;
  }

  async close(): Promise<void> {
    await this.client.endAsync(true);
  }

  device(id: string): DeviceState {
    let d = this.devices.get(id);
    if (!d) {
      d = { vars: new Map(), state: undefined, hellos: [], heard: [] };
      this.devices.set(id, d);
    }
    return d;
  }

  get(deviceId: string, name: string, type: 'd' | 's' = 'd'): CloudRecord | undefined {
    return this.device(deviceId).vars.get(`${type}/${name}`);
  }

  value(deviceId: string, name: string, type: 'd' | 's' = 'd'): string | null | undefined {
    const rec = this.get(deviceId, name, type);
    return rec === undefined ? undefined : rec.value === null ? null : rec.value.toString('utf8');
  }

  /** A change made through the API: a new cloud version of a `d` variable, pushed to the device. */
  set(deviceId: string, name: string, value: string | Buffer | null, now = this.now()): CloudRecord {
    const dev = this.device(deviceId);
    const cur = dev.vars.get(`d/${name}`);
    const rec: CloudRecord = {
      type: 'd',
      name,
      value: value === null ? null : Buffer.isBuffer(value) ? value : Buffer.from(value, 'utf8'),
      time: cur ? Math.max(now, cur.time + 1) : now,
      origin: 'cloud',
      acked: 0,
      synced: cur?.synced ?? 0,
      syncacked: cur?.syncacked ?? 0,
    };
    dev.vars.set(`d/${name}`, rec);
    this.record(deviceId, rec);
    this.sendVars(deviceId, [varItem(rec, 'push')]);
    return rec;
  }

  /** A `POST` of a `d` variable with no value: re-send the current version. */
  sync(deviceId: string, name: string, now = this.now()): CloudRecord {
    const rec = this.get(deviceId, name);
    if (!rec) throw new Error(`no d/${name} for ${deviceId}`);
    rec.synced = Math.max(now, rec.synced + 1);
    this.sendVars(deviceId, [varItem(rec, 'sync')]);
    return rec;
  }

  /** Asks the device to sync all of its `d` variables. */
  requestResync(deviceId: string): void {
    this.publish(deviceId, 'down/vars', { id: messageId(), items: [], resync: true });
  }

  /** Like the bridge, puts its clock on what it sends to an agent whose hello says `clock`. */
  publish<K extends DownTopic>(deviceId: string, name: K, payload: Payloads[K]): void {
    const clock = this.device(deviceId).hellos.at(-1)?.clock === true;
    const body = clock ? { ...payload, now: this.now() } : payload;
    this.client.publish(topicFor(deviceId, name), encode(name, body), { qos: 1 });
  }

  /** Publishes bytes as they are, for malformed-payload tests. */
  publishRaw(deviceId: string, name: DownTopic, payload: Buffer | string): Promise<unknown> {
    return this.client.publishAsync(topicFor(deviceId, name), payload, { qos: 1 });
  }

  /** Waits, on the real clock, until `check` holds. */
  async until(check: () => boolean, what: string, timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!check()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  /** The versions applied for one variable (to check exactly-once). */
  versionsOf(deviceId: string, name: string): AppliedVersion[] {
    return this.applied.filter((a) => a.deviceId === deviceId && a.name === name);
  }

  private sendVars(deviceId: string, items: VarItem[]): void {
    for (let i = 0; i < items.length; i += 500) {
      this.publish(deviceId, 'down/vars', { id: messageId(), items: items.slice(i, i + 500) });
    }
  }

  private record(deviceId: string, rec: CloudRecord): void {
    this.applied.push({
      deviceId,
      type: rec.type,
      name: rec.name,
      value: rec.value === null ? null : rec.value.toString('utf8'),
      time: rec.time,
      origin: rec.origin,
    });
  }

  private onMessage(topic: string, payload: Buffer): void {
    const parsed = parseTopic(topic);
    if (!parsed) return;
    const decoded = decode(parsed.name, payload);
    if (!decoded.ok) {
      this.invalid.push(`${parsed.name}: ${decoded.reason}`);
      return;
    }
    this.received[parsed.name] = (this.received[parsed.name] ?? 0) + 1;
    const dev = this.device(parsed.deviceId);
    const id = parsed.deviceId;
    const msg = { name: parsed.name, payload: decoded.value } as {
      [K in keyof Payloads]: { name: K; payload: Payloads[K] };
    }[keyof Payloads];
    switch (msg.name) {
      case 'state':
        dev.state = msg.payload;
        return;
      case 'up/hello':
        dev.hellos.push(msg.payload);
        if (this.catchUpOnHello) {
          // The bridge answers a hello with its clock.
          if (msg.payload.clock === true)
            this.publish(id, 'down/vars', { id: messageId(), items: [], now: this.now() });
          this.catchUp(id);
        }
        return;
      case 'up/heard':
        dev.heard.push(...msg.payload.heard);
        return;
      case 'up/vars': {
        const acks: AckItem[] = [];
        const now = this.now();
        for (const item of msg.payload.items) {
          const key = `${item.type}/${item.name}`;
          const cur = dev.vars.get(key);
          if (!cur || newer(item, cur)) {
            const rec: CloudRecord = {
              type: item.type,
              name: item.name,
              value: decodeValue(item),
              time: item.time,
              origin: item.origin,
              acked: Math.max(now, item.time),
              synced: cur?.synced ?? 0,
              syncacked: cur?.syncacked ?? 0,
            };
            dev.vars.set(key, rec);
            this.record(id, rec);
          }
          acks.push(ackFor(item));
        }
        if (this.autoAck) {
          for (let i = 0; i < acks.length; i += 500) {
            this.publish(id, 'down/acks', { id: messageId(), acks: acks.slice(i, i + 500) });
          }
        }
        return;
      }
      case 'up/acks': {
        const now = this.now();
        for (const ack of msg.payload.acks) {
          const rec = dev.vars.get(`${ack.type}/${ack.name}`);
          if (!rec) continue;
          if (ack.kind === 'push' && rec.time === ack.time && rec.origin === ack.origin)
            rec.acked = Math.max(now, rec.time);
          if (ack.kind === 'sync' && rec.synced === ack.synced) rec.syncacked = Math.max(now, rec.synced);
        }
        return;
      }
      default:
        return;
    }
  }

  /** What the bridge does on hello: send again every cloud version and sync not yet acknowledged. */
  private catchUp(deviceId: string): void {
    const items: VarItem[] = [];
    for (const rec of this.device(deviceId).vars.values()) {
      if (rec.type !== 'd') continue;
      if (rec.origin === 'cloud' && rec.acked < rec.time) items.push(varItem(rec, 'push'));
      if (rec.syncacked < rec.synced) items.push(varItem(rec, 'sync'));
    }
    if (items.length > 0) this.sendVars(deviceId, items);
  }
}
