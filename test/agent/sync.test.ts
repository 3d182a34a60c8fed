/**
 * Variable sync between an in-process agent and a fake cloud through a real broker (aedes and Mosquitto),
 * checked against docs/decisions.md §3: values and the four stamps on both sides, duplicates, older versions,
 * tombstones, catch-up after an outage, retries, and bad input on every `down/` topic.
 */
import Database from 'better-sqlite3';
import { randomUUID } from 'node:crypto';
import mqtt, { type MqttClient } from 'mqtt';
import { type AddressInfo, type Server, type Socket, connect, createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { monotonicMs } from '../../agent/clock.js';
import { runCli } from '../../agent/cli/index.js';
import type { LocalClient } from '../../agent/local/client.js';
import type { VarJson, WatchEvent } from '../../agent/local/messages.js';
import {
  type AckItem,
  type DownTopic,
  MAX_BATCH_ITEMS,
  MAX_COMMAND_BYTES,
  MAX_PAYLOAD_BYTES,
  MAX_VALUE_BYTES,
  type VarItem,
  decode,
  messageId,
  parseTopic,
  topicFor,
} from '../../protocol/index.js';
import { type BrokerKind, type TestBroker, brokerKinds, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { type TestAgent, startAgent } from '../support/agent.js';

/** A third MQTT client that sees both directions as they travel, to count messages and items. */
class Tap {
  readonly upVars: VarItem[] = [];
  readonly upAcks: AckItem[] = [];
  readonly downAcks: AckItem[] = [];
  readonly topics = new Set<string>();
  /** Called as each `up/acks` item arrives, before anything else in this process looks at it. */
  onUpAck: ((ack: AckItem) => void) | undefined;

  private constructor(readonly client: MqttClient) {}

  static async start(url: string): Promise<Tap> {
    const client = await mqtt.connectAsync(url, { clientId: `tap-${messageId().slice(0, 8)}`, reconnectPeriod: 200 });
    const tap = new Tap(client);
    client.on('message', (topic, payload) => tap.onMessage(topic, payload));
    await client.subscribeAsync('dc/v1/#', { qos: 1 });
    return tap;
  }

  async close(): Promise<void> {
    await this.client.endAsync(true);
  }

  pushes(name: string, time?: number): VarItem[] {
    return this.upVars.filter((i) => i.kind === 'push' && i.name === name && (time === undefined || i.time === time));
  }

  syncs(name?: string): VarItem[] {
    return this.upVars.filter((i) => i.kind === 'sync' && (name === undefined || i.name === name));
  }

  acksOf(name: string, kind: 'push' | 'sync', time?: number): AckItem[] {
    return this.upAcks.filter((a) => a.name === name && a.kind === kind && (time === undefined || a.time === time));
  }

  private onMessage(topic: string, payload: Buffer): void {
    this.topics.add(topic);
    const parsed = parseTopic(topic);
    if (!parsed) return;
    if (parsed.name === 'up/vars') {
      const d = decode('up/vars', payload);
      if (d.ok) this.upVars.push(...d.value.items);
    } else if (parsed.name === 'up/acks') {
      const d = decode('up/acks', payload);
      if (!d.ok) return;
      for (const ack of d.value.acks) this.onUpAck?.(ack);
      this.upAcks.push(...d.value.acks);
    } else if (parsed.name === 'down/acks') {
      const d = decode('down/acks', payload);
      if (d.ok) this.downAcks.push(...d.value.acks);
    }
  }
}

interface StoredRow {
  type: string;
  name: string;
  value: Buffer | null;
  time: number;
  origin: string;
  acked: number;
  synced: number;
  syncacked: number;
}

/** Reads the agent's database through a connection of its own: only what is committed is visible. */
function readDb<T>(ta: TestAgent, fn: (db: Database.Database) => T): T {
  const db = new Database(join(ta.config.stateDir, 'agent.db'), { readonly: true, fileMustExist: true });
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

function stored(ta: TestAgent, name: string, type: 'd' | 's' = 'd'): StoredRow | undefined {
  return readDb(ta, (db) =>
    db.prepare<[string, string], StoredRow>('SELECT * FROM vars WHERE type = ? AND name = ?').get(type, name),
  );
}

function historyCount(ta: TestAgent, name: string): number {
  return readDb(
    ta,
    (db) =>
      db.prepare<[string], { n: number }>("SELECT count(*) AS n FROM history WHERE type = 'd' AND name = ?").get(name)!
        .n,
  );
}

/**
 * A TCP relay between the agent and the broker, so that the test decides when the agent reaches the broker
 * again after an outage. The cloud is back first, as in production where the bridge keeps running; otherwise
 * what the agent sends before the cloud has subscribed again is lost and only the slow retry would help.
 */
class Gate {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private port = 0;

  private constructor(private readonly target: number) {}

  static async start(target: number): Promise<Gate> {
    const gate = new Gate(target);
    await gate.open();
    return gate;
  }

  get url(): string {
    return `mqtt://127.0.0.1:${this.port}`;
  }

  async open(): Promise<void> {
    const server = createServer((down) => {
      const up = connect(this.target, '127.0.0.1');
      for (const s of [down, up]) {
        this.sockets.add(s);
        s.on('error', () => undefined);
        s.on('close', () => {
          this.sockets.delete(s);
          down.destroy();
          up.destroy();
        });
      }
      down.pipe(up);
      up.pipe(down);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  /** Drops every connection and refuses new ones until `open()`. */
  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

const acked = (r: { time: number; acked: number } | undefined) => r !== undefined && r.acked >= r.time;

describe.each<BrokerKind>(brokerKinds())('variable sync through %s', (kind) => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let tap: Tap;
  let ta: TestAgent | undefined;
  const clients: LocalClient[] = [];
  const gates: Gate[] = [];

  beforeEach(async () => {
    broker = await startBroker(kind);
    cloud = await FakeCloud.start(broker.url);
    tap = await Tap.start(broker.url);
  });

  afterEach(async () => {
    vi.useRealTimers();
    for (const c of clients.splice(0)) c.close();
    await ta?.stop();
    ta = undefined;
    for (const g of gates.splice(0)) await g.close();
    await tap?.close();
    await cloud?.close();
    await broker?.close();
  });

  /** Waits until the cloud and the tap, reconnecting on their own after a broker restart, subscribe again. */
  async function resubscribed(): Promise<void> {
    const probeId = randomUUID();
    const probe = topicFor(probeId, 'state');
    const deadline = Date.now() + 30_000;
    while (cloud.device(probeId).state !== 'online' || !tap.topics.has(probe)) {
      if (Date.now() > deadline) throw new Error('timed out waiting for the cloud to subscribe again');
      // Probes published before a subscription are lost, so publish again until both have seen one.
      tap.client.publish(probe, 'online', { qos: 1 });
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Starts the agent, waits for its uplink, and follows its changes and stamps on the local socket. */
  async function boot(flags: Record<string, unknown> = {}, mqttUrl = broker.url, monotonic?: () => number) {
    const agent = await startAgent({ mqttUrl, flags, ...(monotonic ? { monotonic } : {}) });
    ta = agent;
    const id = agent.agent.identity.deviceId;
    // After the hello the cloud's catch-up is done, so it sends nothing the test did not ask for.
    // Connected, and the cloud's clock known from its answer to the hello, so changes are stamped by it.
    await cloud.until(
      () => agent.agent.uplink.connected && cloud.device(id).hellos.length > 0 && agent.agent.clock.verified,
      'agent connected',
    );
    const c = await agent.client();
    const watcher = await agent.client();
    clients.push(c, watcher);
    const events: WatchEvent[] = [];
    await watcher.watch((ev) => events.push(ev));
    const changes = (name: string, source?: 'local' | 'cloud') =>
      events.filter(
        (e) => e.event === 'change' && e.var.name === name && (source === undefined || e.source === source),
      );
    return { ta: agent, c, id, events, changes };
  }

  it('commits a cloud push before acknowledging it; the cloud stamps acked', async () => {
    const { ta, c, id, changes } = await boot();
    let onDisk: StoredRow | undefined | null = null;
    tap.onUpAck = (ack) => {
      if (ack.name === 'led' && onDisk === null) onDisk = stored(ta, 'led');
    };
    const sent = cloud.set(id, 'led', 'on');
    await cloud.until(() => acked(cloud.get(id, 'led')), 'the cloud stamps acked');
    await cloud.until(() => onDisk !== null, 'the tap saw the ack');

    // When the ack was on the wire, the value was already committed to the agent's database.
    expect(onDisk).toMatchObject({ value: Buffer.from('on'), time: sent.time, origin: 'cloud' });
    expect(tap.acksOf('led', 'push')).toEqual([
      { kind: 'push', type: 'd', name: 'led', time: sent.time, origin: 'cloud' },
    ]);

    const local = await c.get('d', 'led');
    expect(local).toEqual({
      type: 'd',
      name: 'led',
      value: 'on',
      time: sent.time,
      origin: 'cloud',
      acked: expect.any(Number) as number,
      synced: 0,
      syncacked: 0,
    });
    expect(local.acked).toBeGreaterThanOrEqual(local.time);
    const rec = cloud.get(id, 'led')!;
    expect(rec).toMatchObject({ value: Buffer.from('on'), time: sent.time, origin: 'cloud', synced: 0, syncacked: 0 });
    expect(rec.acked).toBeGreaterThanOrEqual(rec.time);

    expect(ta.agent.vars.counters.applied).toBe(1);
    expect(historyCount(ta, 'led')).toBe(1);
    await cloud.until(() => changes('led', 'cloud').length === 1, 'the watcher sees the change');
  });

  it('acknowledges a cloud sync without changing the value; the cloud stamps syncacked', async () => {
    const { ta, c, id, changes } = await boot();
    const sent = cloud.set(id, 'led', 'on');
    await cloud.until(() => acked(cloud.get(id, 'led')) && changes('led').length === 1, 'push acked');
    const before = await c.get('d', 'led');
    const applied = ta.agent.vars.counters.applied;

    const synced = cloud.sync(id, 'led').synced;
    expect(cloud.get(id, 'led')!.syncacked).toBeLessThan(synced);
    await cloud.until(
      () => cloud.get(id, 'led')!.syncacked >= synced && tap.acksOf('led', 'sync').length > 0,
      'the cloud stamps syncacked',
    );

    expect(tap.acksOf('led', 'sync')).toEqual([
      { kind: 'sync', type: 'd', name: 'led', time: sent.time, origin: 'cloud', synced },
    ]);
    const rec = cloud.get(id, 'led')!;
    expect(rec).toMatchObject({ value: Buffer.from('on'), time: sent.time, origin: 'cloud', synced });
    expect(rec.acked).toBeGreaterThanOrEqual(rec.time);
    // The agent's own record, stamps included, is untouched: its synced is about its own syncs.
    expect(await c.get('d', 'led')).toEqual(before);
    expect(ta.agent.vars.counters.applied).toBe(applied);
    expect(historyCount(ta, 'led')).toBe(1);
    expect(changes('led')).toHaveLength(1);
  });

  it('syncs a variable from the gateway (CLI and client); the agent stamps syncacked', async () => {
    const { ta, c, id } = await boot();
    const set = await c.set('d', 'temp', '21.5');
    await cloud.until(() => acked(ta.agent.vars.get('d', 'temp')), 'push acked');

    const out: string[] = [];
    const err: string[] = [];
    const io = { out: (s: string) => out.push(s), err: (s: string) => err.push(s) };
    expect(await runCli(['var', 'sync', 'temp', '--socket', ta.socket, '--json'], io, {})).toBe(0);
    const shown = JSON.parse(out[0]!) as VarJson;
    expect(shown).toMatchObject({ type: 'd', name: 'temp', value: '21.5', time: set.time, origin: 'device' });
    expect(shown.synced).toBeGreaterThan(0);
    expect(shown.syncacked).toBeLessThan(shown.synced);

    await cloud.until(
      () =>
        ta.agent.vars.get('d', 'temp')!.syncacked >= shown.synced &&
        tap.syncs('temp').length > 0 &&
        tap.downAcks.some((a) => a.name === 'temp' && a.kind === 'sync'),
      'agent syncacked',
    );
    expect(tap.syncs('temp')).toEqual([
      { kind: 'sync', type: 'd', name: 'temp', value: '21.5', time: set.time, origin: 'device', synced: shown.synced },
    ]);
    expect(tap.downAcks).toContainEqual({
      kind: 'sync',
      type: 'd',
      name: 'temp',
      time: set.time,
      origin: 'device',
      synced: shown.synced,
    });
    const after = await c.get('d', 'temp');
    expect(after).toMatchObject({ value: '21.5', time: set.time, origin: 'device', synced: shown.synced });
    expect(after.acked).toBeGreaterThanOrEqual(after.time);
    expect(after.syncacked).toBeGreaterThanOrEqual(after.synced);
    // A sync is not a new version: the cloud applied the value once.
    expect(cloud.versionsOf(id, 'temp')).toHaveLength(1);

    // Each sync is a new, strictly later synced stamp, acknowledged on its own.
    const again = await c.sync('d', 'temp');
    expect(again.synced).toBeGreaterThan(shown.synced);
    await cloud.until(
      () => ta.agent.vars.get('d', 'temp')!.syncacked >= again.synced && tap.syncs('temp').length === 2,
      'second sync acked',
    );
    expect(tap.syncs('temp').map((i) => i.synced)).toEqual([shown.synced, again.synced]);

    expect(await runCli(['var', 'sync', 'nope', '--socket', ta.socket], io, {})).toBe(1);
    expect(err.join('\n')).toContain('(not-found)');
    expect(await runCli(['var', 'sync', 'temp', '--type', 's', '--socket', ta.socket], io, {})).toBe(2);
  });

  it('stamps acked on a gateway change once the cloud acknowledges; s variables go up as s', async () => {
    const { ta, c, id } = await boot();
    const set = await c.set('d', 'temp', '21.5');
    expect(set).toMatchObject({ value: '21.5', origin: 'device', acked: 0, synced: 0, syncacked: 0 });
    await cloud.until(() => acked(ta.agent.vars.get('d', 'temp')), 'agent acked');
    const local = await c.get('d', 'temp');
    expect(local).toMatchObject({ value: '21.5', time: set.time, origin: 'device' });
    expect(local.acked).toBeGreaterThanOrEqual(local.time);
    const rec = cloud.get(id, 'temp')!;
    expect(rec).toMatchObject({ type: 'd', value: Buffer.from('21.5'), time: set.time, origin: 'device' });
    expect(rec.acked).toBeGreaterThanOrEqual(rec.time);

    const s = await c.set('s', 'note', 'hello');
    expect(s).toMatchObject({ type: 's', value: 'hello', origin: 'device', acked: 0 });
    await cloud.until(() => acked(ta.agent.vars.get('s', 'note')) && tap.pushes('note').length > 0, 's acked');
    expect(tap.pushes('note')).toEqual([
      { kind: 'push', type: 's', name: 'note', value: 'hello', time: s.time, origin: 'device' },
    ]);
    const srec = cloud.get(id, 'note', 's')!;
    expect(srec).toMatchObject({ type: 's', value: Buffer.from('hello'), time: s.time, origin: 'device' });
    expect(srec.acked).toBeGreaterThanOrEqual(srec.time);
    expect(cloud.get(id, 'note', 'd')).toBeUndefined();
    expect((await c.get('s', 'note')).acked).toBeGreaterThanOrEqual(s.time);
    expect(ta.agent.vars.pending()).toEqual({ pushes: 0, syncs: 0 });
  });

  it('catches up both ways after an outage; later time wins, a tie goes to the cloud', async () => {
    const gate = await Gate.start(broker.port);
    gates.push(gate);
    // A retry far beyond the wait below: only the catch-up on reconnect can make the two sides converge.
    const { ta, c, id } = await boot({ 'sync.retryMs': 120_000 }, gate.url);
    const base = await c.set('d', 'base', '1');
    const kept = cloud.set(id, 'kept', 'k');
    const steady = cloud.set(id, 'steady', 's');
    await cloud.until(
      () => acked(ta.agent.vars.get('d', 'base')) && acked(cloud.get(id, 'kept')) && acked(cloud.get(id, 'steady')),
      'baseline',
    );

    await gate.close();
    await broker.stop();
    await cloud.until(() => !ta.agent.uplink.connected, 'agent sees the outage');

    // The gateway keeps working while offline.
    const fromDevice = await c.set('d', 'from-device', 'dev');
    const removed = await c.rm('d', 'base');
    const deviceWins = await c.set('d', 'race-device', 'device');
    const cloudWins = await c.set('d', 'race-cloud', 'device');
    const tie = await c.set('d', 'race-tie', 'device');
    for (const v of [fromDevice, removed, deviceWins, cloudWins, tie]) expect(v.acked).toBeLessThan(v.time);
    const agentSync = await c.sync('d', 'from-device');
    expect(agentSync.syncacked).toBeLessThan(agentSync.synced);
    expect(removed.time).toBeGreaterThan(base.time);

    // The API changes things meanwhile too.
    const fromCloud = cloud.set(id, 'from-cloud', 'cloud');
    const keptDel = cloud.set(id, 'kept', null);
    expect(keptDel.time).toBeGreaterThan(kept.time);
    cloud.set(id, 'race-device', 'cloud', deviceWins.time - 1000);
    const cloudWinsRec = cloud.set(id, 'race-cloud', 'cloud', cloudWins.time + 1000);
    const tieRec = cloud.set(id, 'race-tie', 'cloud', tie.time);
    expect(tieRec.time).toBe(tie.time);
    const cloudSync = cloud.sync(id, 'steady').synced;

    await broker.start();
    await resubscribed();
    await gate.open();
    await cloud.until(() => ta.sink.events('vars.catch_up').length > 0, 'agent reconnects');
    // On reconnect the agent sends again everything the cloud has not acknowledged.
    expect(ta.sink.events('vars.catch_up')[0]).toMatchObject({ pushes: 5, syncs: 1 });

    const expected: Record<string, { value: string | null; time: number; origin: 'device' | 'cloud' }> = {
      'from-device': { value: 'dev', time: fromDevice.time, origin: 'device' },
      base: { value: null, time: removed.time, origin: 'device' },
      'race-device': { value: 'device', time: deviceWins.time, origin: 'device' },
      'from-cloud': { value: 'cloud', time: fromCloud.time, origin: 'cloud' },
      kept: { value: null, time: keptDel.time, origin: 'cloud' },
      'race-cloud': { value: 'cloud', time: cloudWinsRec.time, origin: 'cloud' },
      'race-tie': { value: 'cloud', time: tie.time, origin: 'cloud' },
      steady: { value: 's', time: steady.time, origin: 'cloud' },
    };
    const converged = () =>
      Object.entries(expected).every(([name, want]) => {
        const a = stored(ta, name);
        const b = cloud.get(id, name);
        return (
          a !== undefined &&
          b !== undefined &&
          a.time === want.time &&
          b.time === want.time &&
          a.origin === want.origin &&
          b.origin === want.origin &&
          a.acked >= a.time &&
          b.acked >= b.time
        );
      });
    await cloud.until(
      () =>
        converged() &&
        stored(ta, 'from-device')!.syncacked >= agentSync.synced &&
        cloud.get(id, 'steady')!.syncacked >= cloudSync,
      'both sides converge, everything acknowledged',
    );

    for (const [name, want] of Object.entries(expected)) {
      const a = stored(ta, name)!;
      const b = cloud.get(id, name)!;
      expect({ name, value: a.value === null ? null : a.value.toString() }).toEqual({ name, value: want.value });
      expect({ name, value: b.value === null ? null : b.value.toString() }).toEqual({ name, value: want.value });
      if (want.value === null) {
        await expect(c.get('d', name)).rejects.toMatchObject({ code: 'not-found' });
      } else {
        const local = await c.get('d', name);
        expect(local).toMatchObject({ value: want.value, time: want.time, origin: want.origin });
        expect(local.acked).toBeGreaterThanOrEqual(local.time);
      }
    }
    expect((await c.list('d')).map((v) => v.name).sort()).toEqual([
      'from-cloud',
      'from-device',
      'race-cloud',
      'race-device',
      'race-tie',
      'steady',
    ]);
    // The cloud's sync left the agent's own sync stamps alone.
    expect(stored(ta, 'steady')).toMatchObject({ synced: 0, syncacked: 0 });
    await cloud.until(() => ta.agent.vars.isSettled(), 'nothing pending on the agent');
    for (const rec of cloud.device(id).vars.values()) {
      expect({ name: rec.name, acked: rec.acked >= rec.time }).toEqual({ name: rec.name, acked: true });
    }
  });

  it('applies a duplicate once and acknowledges it again; an older version is ignored but acknowledged', async () => {
    const { ta, c, id, changes } = await boot();
    const item: VarItem = { kind: 'push', type: 'd', name: 'dup', value: 'one', time: Date.now(), origin: 'cloud' };
    const msg = { id: messageId(), items: [item] };
    cloud.publish(id, 'down/vars', msg);
    cloud.publish(id, 'down/vars', msg);
    await cloud.until(() => tap.acksOf('dup', 'push', item.time).length >= 2 && changes('dup').length > 0, 'two acks');

    expect(tap.acksOf('dup', 'push', item.time)).toHaveLength(2);
    expect(ta.agent.vars.counters.applied).toBe(1);
    expect(ta.agent.vars.counters.ignored).toBe(1);
    expect(historyCount(ta, 'dup')).toBe(1);
    const local = await c.get('d', 'dup');
    expect(local).toMatchObject({ value: 'one', time: item.time, origin: 'cloud' });
    expect(local.acked).toBeGreaterThanOrEqual(local.time);

    // An older version of what the agent holds: ignored, acknowledged all the same.
    const older: VarItem = { ...item, value: 'zero', time: item.time - 1000 };
    cloud.publish(id, 'down/vars', { id: messageId(), items: [older] });
    await cloud.until(() => tap.acksOf('dup', 'push', older.time).length === 1, 'older version acked');
    expect(await c.get('d', 'dup')).toEqual(local);
    expect(ta.agent.vars.counters.applied).toBe(1);
    expect(ta.agent.vars.counters.ignored).toBe(2);
    expect(historyCount(ta, 'dup')).toBe(1);
    expect(changes('dup')).toHaveLength(1);

    // A sync of an older version means the sender lacks the agent's: the agent pushes its own again.
    const mine = await c.set('d', 'mine', 'v2');
    await cloud.until(() => acked(ta.agent.vars.get('d', 'mine')), 'mine acked');
    const oldSync: VarItem = {
      kind: 'sync',
      type: 'd',
      name: 'mine',
      value: 'v1',
      time: mine.time - 1000,
      origin: 'device',
      synced: Date.now(),
    };
    cloud.publish(id, 'down/vars', { id: messageId(), items: [oldSync] });
    await cloud.until(() => tap.pushes('mine', mine.time).length === 2, 'pushed again');
    await cloud.until(() => tap.acksOf('mine', 'sync', oldSync.time).length === 1, 'older sync acked');
    expect(tap.acksOf('mine', 'sync')[0]!.synced).toBe(oldSync.synced);
    await cloud.until(() => acked(ta.agent.vars.get('d', 'mine')), 'acked again');
    expect(await c.get('d', 'mine')).toMatchObject({ value: 'v2', time: mine.time, origin: 'device' });
    expect(historyCount(ta, 'mine')).toBe(1);
  });

  it('synchronises deletions as tombstones that an older push cannot undo', async () => {
    const { ta, c, id } = await boot();

    // Deleted on the gateway.
    const set = await c.set('d', 'gone', 'x');
    await cloud.until(() => acked(ta.agent.vars.get('d', 'gone')), 'set acked');
    const rm = await c.rm('d', 'gone');
    expect(rm).toMatchObject({ type: 'd', name: 'gone', deleted: true, origin: 'device', acked: 0 });
    expect(rm.value).toBeUndefined();
    expect(rm.time).toBeGreaterThan(set.time);
    await cloud.until(() => acked(stored(ta, 'gone')) && tap.pushes('gone', rm.time).length > 0, 'tombstone acked');
    expect(tap.pushes('gone', rm.time)).toEqual([
      { kind: 'push', type: 'd', name: 'gone', deleted: true, time: rm.time, origin: 'device' },
    ]);
    const crec = cloud.get(id, 'gone')!;
    expect(crec).toMatchObject({ value: null, time: rm.time, origin: 'device' });
    expect(crec.acked).toBeGreaterThanOrEqual(crec.time);
    await expect(c.get('d', 'gone')).rejects.toMatchObject({ code: 'not-found' });
    await expect(c.rm('d', 'gone')).rejects.toMatchObject({ code: 'not-found' });

    // Deleted through the API.
    const lamp = cloud.set(id, 'lamp', 'on');
    await cloud.until(() => acked(cloud.get(id, 'lamp')), 'lamp acked');
    expect((await c.get('d', 'lamp')).value).toBe('on');
    const del = cloud.set(id, 'lamp', null);
    await cloud.until(() => cloud.get(id, 'lamp')!.acked >= del.time, 'delete acked by the agent');
    await expect(c.get('d', 'lamp')).rejects.toMatchObject({ code: 'not-found' });
    expect((await c.list('d')).map((v) => v.name)).toEqual([]);
    const tomb = stored(ta, 'lamp')!;
    expect(tomb).toMatchObject({ value: null, time: del.time, origin: 'cloud' });
    expect(tomb.acked).toBeGreaterThanOrEqual(tomb.time);

    // Late pushes of what came before the deletions: acknowledged, not resurrected.
    const lateLamp: VarItem = { kind: 'push', type: 'd', name: 'lamp', value: 'on', time: lamp.time, origin: 'cloud' };
    const lateGone: VarItem = { kind: 'push', type: 'd', name: 'gone', value: 'x', time: rm.time - 1, origin: 'cloud' };
    cloud.publish(id, 'down/vars', { id: messageId(), items: [lateLamp, lateGone] });
    await cloud.until(
      () => tap.acksOf('lamp', 'push', lamp.time).length === 2 && tap.acksOf('gone', 'push', rm.time - 1).length === 1,
      'late pushes acked',
    );
    await expect(c.get('d', 'lamp')).rejects.toMatchObject({ code: 'not-found' });
    await expect(c.get('d', 'gone')).rejects.toMatchObject({ code: 'not-found' });
    expect((await c.list('d')).map((v) => v.name)).toEqual([]);
    expect(stored(ta, 'lamp')).toMatchObject({ value: null, time: del.time, origin: 'cloud' });
    expect(stored(ta, 'gone')).toMatchObject({ value: null, time: rm.time, origin: 'device' });
    expect(historyCount(ta, 'lamp')).toBe(2);
  });

  it('syncs every d variable, tombstones included, when the cloud asks for a resync', async () => {
    const { ta, c, id } = await boot();
    const r1 = await c.set('d', 'r1', '1');
    const r2 = await c.set('d', 'r2', '2');
    await c.set('d', 'r3', '3');
    const r3 = await c.rm('d', 'r3');
    await c.set('s', 'note', 'n');
    await cloud.until(() => ta.agent.vars.isSettled(), 'everything acked');
    expect(tap.syncs()).toEqual([]);

    cloud.requestResync(id);
    await cloud.until(
      () =>
        tap.syncs().length >= 3 &&
        tap.downAcks.filter((a) => a.kind === 'sync').length >= 3 &&
        ta.agent.vars.isSettled(),
      'resync sent and acked',
    );

    expect(tap.syncs().map((i) => i.name)).toEqual(['r1', 'r2', 'r3']);
    for (const [name, rec, shape] of [
      ['r1', r1, { value: '1' }],
      ['r2', r2, { value: '2' }],
      ['r3', r3, { deleted: true }],
    ] as const) {
      const row = stored(ta, name)!;
      expect(row.time).toBe(rec.time);
      expect(row.synced).toBeGreaterThan(0);
      expect(row.syncacked).toBeGreaterThanOrEqual(row.synced);
      expect(tap.syncs(name)).toEqual([
        { kind: 'sync', type: 'd', name, ...shape, time: rec.time, origin: 'device', synced: row.synced },
      ]);
      expect(tap.downAcks).toContainEqual({
        kind: 'sync',
        type: 'd',
        name,
        time: rec.time,
        origin: 'device',
        synced: row.synced,
      });
    }
    const live = await c.get('d', 'r1');
    expect(live).toMatchObject({ value: '1', time: r1.time });
    expect(live.syncacked).toBeGreaterThanOrEqual(live.synced);
    // s variables live on the server and are not part of a sync.
    expect(stored(ta, 'note', 's')!.synced).toBe(0);
    expect(ta.sink.events('vars.sync_all')).toMatchObject([{ count: 3 }]);
  });

  it('drops malformed payloads on every down topic with one warning each, and keeps working', async () => {
    const { ta, c, id } = await boot();
    const now = Date.now();
    const json = (v: unknown) => JSON.stringify(v);
    const uuid = '8f0e4c1a-3b2d-4e5f-9a6b-7c8d9e0f1a2b';
    const cases: Array<{ topic: DownTopic; what: string; payload: string | Buffer; reason: RegExp }> = [
      { topic: 'down/vars', what: 'not JSON', payload: '{"id":', reason: /not JSON/ },
      {
        topic: 'down/vars',
        what: 'wrong shape',
        payload: json({ id: 'm1', items: [{ kind: 'push', type: 'd', name: 'x' }] }),
        reason: /./,
      },
      {
        topic: 'down/vars',
        what: 'bad name',
        payload: json({
          id: 'm2',
          items: [{ kind: 'push', type: 'd', name: '../x', value: 'v', time: now, origin: 'cloud' }],
        }),
        reason: /not a valid variable name/,
      },
      {
        topic: 'down/vars',
        what: 'oversized value',
        payload: json({
          id: 'm3',
          items: [
            {
              kind: 'push',
              type: 'd',
              name: 'big',
              value: 'x'.repeat(MAX_VALUE_BYTES + 1),
              time: now,
              origin: 'cloud',
            },
          ],
        }),
        reason: /value too large/,
      },
      { topic: 'down/acks', what: 'not JSON', payload: 'ack', reason: /not JSON/ },
      { topic: 'down/acks', what: 'wrong shape', payload: json({ id: 'm4', acks: [] }), reason: /./ },
      {
        topic: 'down/acks',
        what: 'too many acks',
        payload: json({
          id: 'm5',
          acks: Array.from({ length: MAX_BATCH_ITEMS + 1 }, (_, i) => ({
            kind: 'push',
            type: 'd',
            name: `v${i}`,
            time: now,
            origin: 'device',
          })),
        }),
        reason: /./,
      },
      { topic: 'down/cmd', what: 'not JSON', payload: Buffer.from([0xff, 0xfe, 0x00]), reason: /not JSON/ },
      {
        topic: 'down/cmd',
        what: 'wrong shape',
        payload: json({ id: 'm6', cmd: 'nope', command64: 'bHM=', priority: 5, created: now, expires: now }),
        reason: /./,
      },
      {
        topic: 'down/cmd',
        what: 'oversized command',
        payload: json({
          id: 'm7',
          cmd: uuid,
          command64: Buffer.alloc(MAX_COMMAND_BYTES + 3, 0x61).toString('base64'),
          priority: 0,
          created: now,
          expires: now + 60_000,
        }),
        reason: /./,
      },
      { topic: 'down/fw', what: 'empty', payload: '', reason: /not JSON/ },
      { topic: 'down/fw', what: 'wrong shape', payload: json({ id: 'm8', action: 'reboot', job: uuid }), reason: /./ },
      {
        topic: 'down/fw',
        what: 'oversized payload',
        payload: Buffer.alloc(MAX_PAYLOAD_BYTES + 1, 0x20),
        reason: /exceeds/,
      },
    ];

    for (const [i, k] of cases.entries()) {
      await cloud.publishRaw(id, k.topic, k.payload);
      await cloud.until(() => ta.agent.uplink.dropped.invalid === i + 1, `${k.topic} ${k.what} dropped`);
      const drops = ta.sink.events('mqtt.drop');
      expect(drops.length, `${k.topic} ${k.what}`).toBe(i + 1);
      expect(drops[i], `${k.topic} ${k.what}`).toMatchObject({ level: 'warn', topic: k.topic });
      expect(drops[i]!.reason, `${k.topic} ${k.what}`).toMatch(k.reason);
    }

    // A topic under the device's down/ that the contract does not know.
    await tap.client.publishAsync(topicFor(id, 'down/vars').replace(/vars$/, 'bogus'), '{}', { qos: 1 });
    await cloud.until(() => ta.agent.uplink.dropped.foreign === 1, 'foreign topic dropped');
    expect(ta.sink.events('mqtt.drop')).toHaveLength(cases.length + 1);

    // Valid on the wire, but s variables are never pushed to a device: that item alone is dropped.
    const sItem: VarItem = { kind: 'push', type: 's', name: 'note', value: 'no', time: now, origin: 'cloud' };
    const dItem: VarItem = { kind: 'push', type: 'd', name: 'ok', value: 'yes', time: now, origin: 'cloud' };
    cloud.publish(id, 'down/vars', { id: messageId(), items: [sItem, dItem] });
    await cloud.until(() => tap.acksOf('ok', 'push').length === 1, 'd item acked');
    expect(ta.agent.vars.counters.dropped).toBe(1);
    expect(ta.sink.events('vars.drop')).toMatchObject([{ level: 'warn', name: 'note' }]);
    expect(tap.acksOf('note', 'push')).toEqual([]);
    await expect(c.get('s', 'note')).rejects.toMatchObject({ code: 'not-found' });
    expect((await c.get('d', 'ok')).value).toBe('yes');

    // Still working: a push is applied and acknowledged, and nothing was applied from the bad input.
    const after = cloud.set(id, 'after', 'fine');
    await cloud.until(() => acked(cloud.get(id, 'after')), 'push after bad input acked');
    expect(await c.get('d', 'after')).toMatchObject({ value: 'fine', time: after.time, origin: 'cloud' });
    expect((await c.list('d')).map((v) => v.name)).toEqual(['after', 'ok']);
    expect(ta.agent.uplink.dropped).toEqual({ invalid: cases.length, foreign: 1 });
    expect(ta.sink.events('mqtt.drop')).toHaveLength(cases.length + 1);
    const status = await c.status<{ dropped: { invalid: number }; sync: { dropped: number } }>();
    expect(status.dropped.invalid).toBe(cases.length);
    expect(status.sync.dropped).toBe(1);
    expect(ta.agent.uplink.connected).toBe(true);
  });

  it('re-sends an unacknowledged change while connected until the cloud acknowledges it', async () => {
    // The retry runs on an interval and judges by the monotonic clock: both are the test's. The agent's clock and
    // the cloud's move on together, so that the cloud's clock on what it sends stays the agent's.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    let elapsed = 0;
    cloud.now = () => Date.now() + elapsed;
    const { ta, c, id } = await boot({ 'sync.retryMs': 1000 }, broker.url, () => monotonicMs() + elapsed);
    /** A retry period passes: the interval checks, and everything sent before is due again. */
    const retryPeriod = async () => {
      elapsed += 1000;
      await vi.advanceTimersByTimeAsync(1000);
    };
    cloud.autoAck = false;
    const set = await c.set('d', 'retry', '1');
    await cloud.until(() => tap.pushes('retry', set.time).length === 1, 'the change is sent');
    await retryPeriod();
    await cloud.until(() => tap.pushes('retry', set.time).length >= 2, 'the change is sent again');

    const local = await c.get('d', 'retry');
    expect(local.acked).toBeLessThan(local.time);
    expect(cloud.value(id, 'retry')).toBe('1');
    expect(cloud.versionsOf(id, 'retry')).toHaveLength(1);
    expect(ta.sink.events('vars.resend').length).toBeGreaterThan(0);
    expect(ta.agent.vars.pending().pushes).toBe(1);

    cloud.autoAck = true;
    await retryPeriod();
    await cloud.until(() => acked(ta.agent.vars.get('d', 'retry')), 'acked after a re-send');
    const done = await c.get('d', 'retry');
    expect(done).toMatchObject({ value: '1', time: set.time, origin: 'device' });
    expect(done.acked).toBeGreaterThanOrEqual(done.time);
    expect(ta.agent.vars.pending()).toEqual({ pushes: 0, syncs: 0 });
    expect(cloud.versionsOf(id, 'retry')).toHaveLength(1);

    // A sync waits for its own acknowledgement the same way.
    cloud.autoAck = false;
    const sync = await c.sync('d', 'retry');
    const syncsSent = () => tap.syncs('retry').filter((i) => i.synced === sync.synced).length;
    await cloud.until(() => syncsSent() === 1, 'the sync is sent');
    await retryPeriod();
    await cloud.until(() => syncsSent() >= 2, 'the sync is sent again');
    expect((await c.get('d', 'retry')).syncacked).toBeLessThan(sync.synced);
    expect(ta.agent.vars.pending()).toEqual({ pushes: 0, syncs: 1 });
    cloud.autoAck = true;
    await retryPeriod();
    await cloud.until(() => ta.agent.vars.get('d', 'retry')!.syncacked >= sync.synced, 'sync acked after a re-send');
    expect(ta.agent.vars.pending()).toEqual({ pushes: 0, syncs: 0 });
  });

  it('carries a value that is not UTF-8 as value64, byte for byte, both ways', async () => {
    const { ta, c, id } = await boot();
    const bytes = Buffer.from([0xff, 0x00, 0xc3, 0x28, 0x80, 0xfe, 0x0a]);
    const set = await c.set('d', 'blob', bytes);
    expect(set.value64).toBe(bytes.toString('base64'));
    expect(set.value).toBeUndefined();
    await cloud.until(() => acked(ta.agent.vars.get('d', 'blob')) && tap.pushes('blob').length > 0, 'blob acked');
    expect(tap.pushes('blob')).toEqual([
      { kind: 'push', type: 'd', name: 'blob', value64: bytes.toString('base64'), time: set.time, origin: 'device' },
    ]);
    expect(cloud.get(id, 'blob')!.value!.equals(bytes)).toBe(true);

    const back = Buffer.from([0x80, 0x81, 0xff, 0x00]);
    const sent = cloud.set(id, 'blob2', back);
    await cloud.until(() => acked(cloud.get(id, 'blob2')), 'blob2 acked');
    const got = await c.get('d', 'blob2');
    expect(got).toMatchObject({ value64: back.toString('base64'), time: sent.time, origin: 'cloud' });
    expect(got.value).toBeUndefined();
    expect(ta.agent.vars.get('d', 'blob2')!.value!.equals(back)).toBe(true);
    expect(stored(ta, 'blob2')!.value!.equals(back)).toBe(true);
  });
});
