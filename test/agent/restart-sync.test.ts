/**
 * A start resumes from the stamps (docs/sync.md, offline and catch-up): a restart with thousands of acknowledged
 * variables sends nothing, one with a few pending sends exactly those, and a database put back from a backup is
 * synced in full. What the agent sends is counted at a real broker by a client subscribed to its `up/vars`.
 */
import { randomUUID } from 'node:crypto';
import { copyFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import mqtt, { type MqttClient } from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { GENERATION_FILE } from '../../agent/vars/generation.js';
import { type VarItem, decode, topicFor } from '../../protocol/index.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type TestBroker, startAedes } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';

/** Every `up/vars` item a device publishes, as the broker delivers them. */
class VarsTap {
  readonly items: VarItem[] = [];
  private constructor(readonly client: MqttClient) {}
  static async start(url: string, deviceId: string): Promise<VarsTap> {
    const client = await mqtt.connectAsync(url, { reconnectPeriod: 0 });
    const tap = new VarsTap(client);
    client.on('message', (_topic, payload) => {
      const d = decode('up/vars', payload);
      if (d.ok) tap.items.push(...d.value.items);
    });
    await client.subscribeAsync(topicFor(deviceId, 'up/vars'), { qos: 1 });
    return tap;
  }
  of(kind: 'push' | 'sync'): string[] {
    return this.items.filter((i) => i.kind === kind).map((i) => i.name);
  }
  close(): Promise<void> {
    return this.client.endAsync(true);
  }
}

describe('restarting the agent', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent | undefined;
  let tap: VarsTap | undefined;
  const stateDir = tempDir('devcloud-restart-sync-');

  afterEach(async () => {
    await agent?.stop();
    agent = undefined;
    await tap?.close();
    tap = undefined;
    await cloud?.close();
    await broker?.close();
  });

  async function start(): Promise<TestAgent> {
    agent = await startAgent({ mqttUrl: broker.url, stateDir, level: 'info' });
    return agent;
  }

  async function connected(a: TestAgent): Promise<void> {
    const id = a.agent.identity.deviceId;
    const hellos = cloud.device(id).hellos.length;
    await cloud.until(() => a.agent.uplink.connected, 'the agent to connect');
    await cloud.until(() => cloud.device(id).hellos.length > hellos, 'its hello');
  }

  /**
   * After the catch-up had its turn: a change made now goes out behind whatever the connect queued (one client,
   * in order), so once it is acknowledged and nothing is pending, the tap has seen all there was.
   */
  async function drained(a: TestAgent, marker: string): Promise<void> {
    const c = await a.client();
    await c.set('d', marker, 'x');
    c.close();
    await cloud.until(() => tap!.of('push').includes(marker), `the ${marker} push at the broker`);
    await cloud.until(() => a.agent.vars.isSettled(), 'nothing pending');
  }

  /** Waits until the cloud, reconnecting on its own after a broker restart, has subscribed again. */
  async function resubscribed(): Promise<void> {
    const probeId = randomUUID();
    const probe = await mqtt.connectAsync(broker.url, { reconnectPeriod: 0 });
    try {
      await cloud.until(() => {
        if (cloud.device(probeId).state === 'online') return true;
        probe.publish(topicFor(probeId, 'state'), 'online', { qos: 1 });
        return false;
      }, 'the cloud to subscribe again');
    } finally {
      await probe.endAsync(true);
    }
  }

  it('sends no sync for acknowledged variables, exactly the pending ones, and everything after a restore', async () => {
    broker = await startAedes();
    cloud = await FakeCloud.start(broker.url);
    const n = 3000;

    // 1. First life: n variables, all acknowledged by the cloud.
    const first = await start();
    const id = first.agent.identity.deviceId;
    await connected(first);
    const c = await first.client();
    for (let i = 0; i < n; i += 500) {
      await Promise.all(Array.from({ length: Math.min(500, n - i) }, (_, k) => c.set('d', `v${i + k}`, `x${i + k}`)));
    }
    c.close();
    await cloud.until(() => first.agent.vars.isSettled(), 'every change acknowledged', 60_000);
    expect(first.agent.vars.pending()).toEqual({ pushes: 0, syncs: 0 });
    await first.stop();
    // A backup of the database as it is now, for step 4.
    const backup = join(tempDir('devcloud-restart-backup-'), 'agent.db');
    copyFileSync(join(stateDir, 'agent.db'), backup);

    // 2. A restart with nothing pending: nothing goes out but the change made to find the end.
    tap = await VarsTap.start(broker.url, id);
    const second = await start();
    await connected(second);
    await drained(second, 'marker1');
    expect(tap.of('sync')).toEqual([]);
    expect(tap.of('push')).toEqual(['marker1']);
    expect(second.sink.events('vars.sync_all')).toEqual([]);
    expect(second.sink.events('vars.catch_up')).toEqual([]);
    expect(second.sink.events('vars.restored')).toEqual([]);

    // 3. A few pending while the broker is away: three changes and two syncs; the restart sends exactly those.
    await broker.stop();
    await cloud.until(() => !second.agent.uplink.connected, 'the agent to see the outage');
    const c2 = await second.client();
    for (const name of ['v1', 'v2', 'v3']) await c2.set('d', name, 'changed');
    for (const name of ['v10', 'v11']) await c2.sync('d', name);
    c2.close();
    expect(second.agent.vars.pending()).toEqual({ pushes: 3, syncs: 2 });
    await second.stop();
    await broker.start();
    await tap.close();
    tap = await VarsTap.start(broker.url, id);
    await resubscribed();
    const third = await start();
    await connected(third);
    await drained(third, 'marker2');
    expect(tap.of('push').sort()).toEqual(['marker2', 'v1', 'v2', 'v3']);
    expect(tap.of('sync').sort()).toEqual(['v10', 'v11']);
    expect(third.sink.events('vars.catch_up')).toMatchObject([{ pushes: 3, syncs: 2 }]);
    expect(cloud.value(id, 'v2')).toBe('changed');
    await third.stop();

    // 4. The database put back from the backup of step 1: its stamps are not the latest, so all is synced.
    const generation = Number(readFileSync(join(stateDir, GENERATION_FILE), 'utf8'));
    for (const f of ['agent.db-wal', 'agent.db-shm']) rmSync(join(stateDir, f), { force: true });
    copyFileSync(backup, join(stateDir, 'agent.db'));
    await tap.close();
    tap = await VarsTap.start(broker.url, id);
    const fourth = await start();
    expect(fourth.sink.events('vars.restored')).toMatchObject([{ expected: generation }]);
    await connected(fourth);
    await cloud.until(() => tap!.of('sync').length >= n, 'the full sync at the broker', 60_000);
    await drained(fourth, 'marker3');
    expect(new Set(tap.of('sync')).size).toBe(n);
    expect(fourth.sink.events('vars.sync_all')).toMatchObject([{ count: n }]);
    expect(existsSync(join(stateDir, GENERATION_FILE))).toBe(true);
  }, 120_000);
});
