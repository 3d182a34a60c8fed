/**
 * A durable cloud for benchmarks: an MQTT client that speaks `protocol/` like the bridge does (docs/decisions.md
 * §3 and §4) and, unlike the test FakeCloud, keeps its side in SQLite (WAL, `synchronous=FULL`, group commit).
 * Every version a device sends is committed before it is acknowledged, so a device's `acked` stamp means the
 * version is on the cloud's disk.
 */
import type { MqttClient } from 'mqtt';
import { type Db, GroupCommitter, type Migration, openDatabase } from '../../lib/sqlite.js';
import {
  type AckItem,
  type AcksMessage,
  ALL_DEVICES_UP_FILTERS,
  MAX_BATCH_ITEMS,
  type VarItem,
  type VarsMessage,
  decode,
  decodeValue,
  encode,
  encodeValue,
  messageId,
  parseTopic,
  topicFor,
  ackFor,
} from '../../protocol/index.js';
import { connectClient } from './bare-mqtt.js';

const MIGRATIONS: readonly Migration[] = [
  (db) =>
    db.exec(`
      CREATE TABLE vars (
        device    TEXT    NOT NULL,
        type      TEXT    NOT NULL,
        name      TEXT    NOT NULL,
        value     BLOB,
        time      INTEGER NOT NULL,
        origin    TEXT    NOT NULL,
        acked     INTEGER NOT NULL DEFAULT 0,
        synced    INTEGER NOT NULL DEFAULT 0,
        syncacked INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (device, type, name)
      ) WITHOUT ROWID;
    `),
];

/** How long {@link DurableCloud.push} waits for the device's ack. */
const ACK_TIMEOUT_MS = 10_000;

export class DurableCloud {
  private client!: MqttClient;
  private readonly db: Db;
  private readonly committer: GroupCommitter;
  private readonly stmts;
  private readonly ackWaiters = new Map<string, (at: number) => void>();
  private readonly hellos = new Map<string, number>();
  readonly counters = {
    versions: 0,
    unchanged: 0,
    syncs: 0,
    acksSent: 0,
    acksReceived: 0,
    invalid: 0,
    commitFailures: 0,
  };

  private constructor(path: string) {
    this.db = openDatabase(path, MIGRATIONS);
    this.committer = new GroupCommitter(this.db);
    this.stmts = {
      get: this.db.prepare<[string, string, string], { time: number }>(
        'SELECT time FROM vars WHERE device = ? AND type = ? AND name = ?',
      ),
      // Last writer wins, ties go to the cloud (docs/decisions.md §3); `changes` tells whether the version was newer.
      apply: this.db.prepare(`
        INSERT INTO vars (device, type, name, value, time, origin, acked)
        VALUES (@device, @type, @name, @value, @time, @origin, @acked)
        ON CONFLICT (device, type, name) DO UPDATE SET
          value = excluded.value, time = excluded.time, origin = excluded.origin, acked = excluded.acked
        WHERE excluded.time > vars.time
           OR (excluded.time = vars.time AND excluded.origin = 'cloud' AND vars.origin = 'device')`),
      acked: this.db.prepare(
        `UPDATE vars SET acked = max(?, time)
         WHERE device = ? AND type = ? AND name = ? AND time = ? AND origin = ?`,
      ),
      syncacked: this.db.prepare(
        'UPDATE vars SET syncacked = max(?, synced) WHERE device = ? AND type = ? AND name = ? AND synced = ?',
      ),
      count: this.db.prepare<[string, string], { n: number }>(
        "SELECT count(*) AS n FROM vars WHERE device = ? AND origin = 'device' AND name LIKE ? || '%'",
      ),
    };
  }

  static async start(url: string, dbPath: string): Promise<DurableCloud> {
    const cloud = new DurableCloud(dbPath);
    try {
      cloud.client = await connectClient('cloud', url);
    } catch (err) {
      cloud.db.close();
      throw err;
    }
    cloud.client.on('message', (topic, payload) => cloud.onMessage(topic, payload));
    await cloud.client.subscribeAsync([...ALL_DEVICES_UP_FILTERS], { qos: 1 });
    return cloud;
  }

  async close(): Promise<void> {
    await this.client.endAsync(true);
    this.committer.close();
    this.db.close();
  }

  /** Whether the device has said hello since the cloud started. */
  hasHello(deviceId: string): boolean {
    return this.hellos.has(deviceId);
  }

  /** The `bootTime` of the device's latest hello: a new one says a new agent process connected. */
  helloBootTime(deviceId: string): number | undefined {
    return this.hellos.get(deviceId);
  }

  /** Asks the device for a full sync (`down/vars` with `resync`), as a cloud that lost data would. */
  requestResync(deviceId: string): void {
    this.client.publish(
      topicFor(deviceId, 'down/vars'),
      encode('down/vars', { id: messageId(), items: [], resync: true }),
      {
        qos: 1,
      },
    );
  }

  /** Device versions committed for one device whose names start with `prefix`. */
  committedCount(deviceId: string, prefix: string): number {
    return this.stmts.count.get(deviceId, prefix)!.n;
  }

  /** Batches and units the cloud committed, for the report. */
  get commitStats(): { commits: number; units: number } {
    return { ...this.committer.stats };
  }

  /**
   * A change made through the API: commits a new cloud version of a `d` variable, pushes it on `down/vars`,
   * and resolves with the milliseconds from the publish until the device's ack arrived on `up/acks`.
   */
  async push(deviceId: string, name: string, value: string): Promise<number> {
    const time = await this.committer.run(() => {
      const now = Date.now();
      const cur = this.stmts.get.get(deviceId, 'd', name);
      const t = cur ? Math.max(now, cur.time + 1) : now;
      this.stmts.apply.run({
        device: deviceId,
        type: 'd',
        name,
        value: Buffer.from(value),
        time: t,
        origin: 'cloud',
        acked: 0,
      });
      return t;
    });
    const item: VarItem = { kind: 'push', type: 'd', name, ...encodeValue(Buffer.from(value)), time, origin: 'cloud' };
    const key = ackKey(deviceId, 'push', name, time);
    let timer: NodeJS.Timeout | undefined;
    const arrived = new Promise<number>((resolve, reject) => {
      this.ackWaiters.set(key, resolve);
      timer = setTimeout(() => {
        this.ackWaiters.delete(key);
        reject(new Error(`no ack for ${name}@${time} within ${ACK_TIMEOUT_MS} ms`));
      }, ACK_TIMEOUT_MS);
    });
    const sentAt = performance.now();
    this.client.publish(topicFor(deviceId, 'down/vars'), encode('down/vars', { id: messageId(), items: [item] }), {
      qos: 1,
    });
    try {
      return (await arrived) - sentAt;
    } finally {
      clearTimeout(timer);
    }
  }

  /** The bytes {@link push} publishes for one value, for a baseline of the same size. */
  static pushPayload(name: string, value: string): Buffer {
    const item: VarItem = { kind: 'push', type: 'd', name, value, time: Date.now(), origin: 'cloud' };
    return encode('down/vars', { id: messageId(), items: [item] });
  }

  private onMessage(topic: string, payload: Buffer): void {
    const arrivedAt = performance.now();
    const parsed = parseTopic(topic);
    if (!parsed) return;
    const deviceId = parsed.deviceId;
    switch (parsed.name) {
      case 'up/hello': {
        const d = decode('up/hello', payload);
        if (d.ok) this.hellos.set(deviceId, d.value.bootTime);
        else this.counters.invalid++;
        return;
      }
      case 'up/vars': {
        const d = decode('up/vars', payload);
        if (d.ok) this.onVars(deviceId, d.value);
        else this.counters.invalid++;
        return;
      }
      case 'up/acks': {
        const d = decode('up/acks', payload);
        if (d.ok) this.onAcks(deviceId, d.value, arrivedAt);
        else this.counters.invalid++;
        return;
      }
      default:
        return;
    }
  }

  private onVars(deviceId: string, msg: VarsMessage): void {
    this.committer
      .run(() => {
        const acked = Date.now();
        const acks: AckItem[] = [];
        for (const item of msg.items) {
          const changed = this.stmts.apply.run({
            device: deviceId,
            type: item.type,
            name: item.name,
            value: decodeValue(item),
            time: item.time,
            origin: item.origin,
            acked: Math.max(acked, item.time),
          }).changes;
          if (item.kind === 'sync') this.counters.syncs++;
          if (changed > 0) this.counters.versions++;
          else this.counters.unchanged++;
          acks.push(ackFor(item));
        }
        return acks;
      })
      .then(
        // Acknowledged only now that the commit is on disk.
        (acks) => {
          for (let i = 0; i < acks.length; i += MAX_BATCH_ITEMS) {
            const chunk = acks.slice(i, i + MAX_BATCH_ITEMS);
            this.client.publish(
              topicFor(deviceId, 'down/acks'),
              encode('down/acks', { id: messageId(), acks: chunk }),
              {
                qos: 1,
              },
            );
            this.counters.acksSent += chunk.length;
          }
        },
        () => this.counters.commitFailures++,
      );
  }

  private onAcks(deviceId: string, msg: AcksMessage, arrivedAt: number): void {
    this.counters.acksReceived += msg.acks.length;
    for (const ack of msg.acks) {
      const key = ackKey(deviceId, ack.kind, ack.name, ack.kind === 'push' ? ack.time : ack.synced!);
      const waiter = this.ackWaiters.get(key);
      if (waiter) {
        this.ackWaiters.delete(key);
        waiter(arrivedAt);
      }
    }
    this.committer
      .run(() => {
        const now = Date.now();
        for (const ack of msg.acks) {
          if (ack.kind === 'push') this.stmts.acked.run(now, deviceId, ack.type, ack.name, ack.time, ack.origin);
          else this.stmts.syncacked.run(now, deviceId, ack.type, ack.name, ack.synced);
        }
      })
      .catch(() => this.counters.commitFailures++);
  }
}

function ackKey(deviceId: string, kind: 'push' | 'sync', name: string, stamp: number): string {
  return `${deviceId} ${kind} ${name} ${stamp}`;
}
