/**
 * Catch-up at scale: what waited during an outage goes out a page at a time and in messages the cloud can take,
 * and the store's schema upgrades keep what it holds.
 */
import { join } from 'node:path';
import mqtt from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { AGENT_MIGRATIONS } from '../../agent/migrations.js';
import { VAR_MIGRATIONS, VarStore } from '../../agent/vars/store.js';
import { openDatabase } from '../../lib/sqlite.js';
import { MAX_PAYLOAD_BYTES, topicFor } from '../../protocol/index.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type TestBroker, startAedes } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';

describe('catch-up after an outage', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent;

  afterEach(async () => {
    await agent?.stop();
    await cloud?.close();
    await broker?.close();
  });

  async function setUp() {
    broker = await startAedes();
    cloud = await FakeCloud.start(broker.url);
    // After a broker restart the agent may reconnect before the cloud has subscribed again; what it sends then
    // is lost and the retry sends it again, so keep the retry short here.
    agent = await startAgent({ mqttUrl: broker.url, level: 'info', flags: { 'sync.retryMs': 1000 } });
    await cloud.until(() => agent.agent.uplink.connected, 'agent connected');
  }

  it('sends more than a page of pending changes after the outage, every one acknowledged', async () => {
    await setUp();
    const id = agent.agent.identity.deviceId;
    await broker.stop();
    await cloud.until(() => !agent.agent.uplink.connected, 'agent disconnected');
    const c = await agent.client();
    const n = 1234;
    await Promise.all(Array.from({ length: n }, (_, i) => c.set('d', `p${i}`, `v${i}`)));
    expect(agent.agent.vars.pending().pushes).toBe(n);
    await broker.start();
    await cloud.until(() => agent.agent.vars.pending().pushes === 0, 'all acknowledged', 60_000);
    for (let i = 0; i < n; i++) expect(cloud.value(id, `p${i}`)).toBe(`v${i}`);
    expect(new Set(cloud.applied.filter((a) => a.name.startsWith('p')).map((a) => a.name)).size).toBe(n);
    const catchUp = agent.sink.events('vars.catch_up');
    expect(catchUp.at(-1)).toMatchObject({ pushes: n });
    c.close();
  });

  it('splits a catch-up of large values into messages under the payload limit', async () => {
    await setUp();
    const id = agent.agent.identity.deviceId;
    const sizes: number[] = [];
    const tap = await mqtt.connectAsync(broker.url, { reconnectPeriod: 100 });
    tap.on('message', (_t, payload) => sizes.push(payload.length));
    await tap.subscribeAsync(topicFor(id, 'up/vars'), { qos: 1 });

    await broker.stop();
    await cloud.until(() => !agent.agent.uplink.connected, 'agent disconnected');
    const c = await agent.client();
    const big = 'x'.repeat(60_000);
    const n = 200; // 12 MB of values: more than one message may carry
    for (let i = 0; i < n; i++) await c.set('d', `big${i}`, `${i}:${big}`);
    await broker.start();
    await tap.subscribeAsync(topicFor(id, 'up/vars'), { qos: 1 });
    await cloud.until(() => agent.agent.vars.pending().pushes === 0, 'all acknowledged', 60_000);
    for (let i = 0; i < n; i++) expect(cloud.value(id, `big${i}`)).toBe(`${i}:${big}`);
    expect(cloud.invalid).toEqual([]);
    expect(Math.max(...sizes)).toBeLessThan(MAX_PAYLOAD_BYTES);
    await tap.endAsync(true);
    c.close();
  });
});

describe('store schema upgrades', () => {
  it('keeps variables and their stamps when a first-version database is upgraded', () => {
    const path = join(tempDir(), 'agent.db');
    const v1 = openDatabase(path, VAR_MIGRATIONS.slice(0, 1));
    // What the first version wrote: one pending change and one acknowledged one.
    const insert = v1.prepare(
      "INSERT INTO vars (type, name, value, time, origin, acked, synced, syncacked) VALUES ('d', ?, ?, 1000, 'device', ?, 0, 0)",
    );
    insert.run('kept', Buffer.from('yes'), 0);
    insert.run('acked', Buffer.from('a'), 2000);
    expect(v1.pragma('user_version', { simple: true })).toBe(1);
    v1.close();

    const v2 = openDatabase(path, AGENT_MIGRATIONS);
    expect(v2.pragma('user_version', { simple: true })).toBe(AGENT_MIGRATIONS.length);
    const store = new VarStore(v2, 100);
    // Versions from before the cloud's clock was kept count as verified: they were stamped as they always were.
    expect(store.get('d', 'kept')).toMatchObject({ value: Buffer.from('yes'), time: 1000, acked: 0, unverified: 0 });
    expect(store.get('d', 'acked')).toMatchObject({ acked: 2000 });
    expect(store.unacked().map((r) => r.name)).toEqual(['kept']);
    expect(store.pendingCounts()).toEqual({ pushes: 1, syncs: 0 });
    v2.close();
  });

  it('refuses a database written by a newer version', () => {
    const path = join(tempDir(), 'agent.db');
    const db = openDatabase(path, VAR_MIGRATIONS);
    db.pragma(`user_version = ${VAR_MIGRATIONS.length + 1}`);
    db.close();
    expect(() => openDatabase(path, VAR_MIGRATIONS)).toThrow(/newer than this program knows/);
  });
});
