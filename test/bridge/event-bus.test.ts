/**
 * The bridge's event bus (bridge/events/bus.ts, docs/scaling.md "The event bus"): the in-process bus; two
 * PostgreSQL buses as two bridges on one database (delivery once on each side, order, payloads split under
 * PostgreSQL's limit, the listener's connection killed and restored, frontends dropped across stores at once); and
 * a live bridge on SQLite announcing a variable a user sets through HTTP.
 */
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  type BusEvent,
  type DeliveredEvent,
  type EventSource,
  LocalBus,
  EVENTS_CHANNEL,
  MAX_PAYLOAD_BYTES,
  PostgresBus,
} from '../../bridge/events/bus.js';
import { type PostgresStore, openPostgresStore } from '../../bridge/store/postgres/store.js';
import { ProductConfig } from '../../bridge/store/types.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { startLiveBridge } from '../support/bridge.js';
import { connectMqttDevice } from '../support/mqtt-device.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';
import { until } from '../support/wait.js';

function logger() {
  const sink = new LogSink();
  return { sink, log: createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink }) };
}

/** What a subscriber got, in order. */
function recorder() {
  const got: Array<{ event: DeliveredEvent; source: EventSource }> = [];
  return {
    got,
    fn: (event: DeliveredEvent, source: EventSource) => got.push({ event, source }),
    of: (type: DeliveredEvent['type']) => got.filter((g) => g.event.type === type).map((g) => g.event),
  };
}

const frontendEvent = (id: string): BusEvent => ({ type: 'frontend.changed', id });

describe('LocalBus', () => {
  it('delivers to each subscriber at once, until it unsubscribes; a subscriber that throws is logged', () => {
    const { sink, log } = logger();
    const bus = new LocalBus(log);
    const a = recorder();
    const b = recorder();
    const offA = bus.subscribe(a.fn);
    bus.subscribe(() => {
      throw new Error('boom');
    });
    bus.subscribe(b.fn);
    bus.publish(frontendEvent('f1'));
    expect(a.got).toEqual([{ event: frontendEvent('f1'), source: { local: true } }]);
    expect(b.got).toHaveLength(1);
    expect(sink.events('events.subscriber_failed')).toEqual([
      expect.objectContaining({ level: 'error', type: 'frontend.changed', err: 'Error: boom' }),
    ]);
    offA();
    bus.publish(frontendEvent('f2'));
    expect(a.got).toHaveLength(1);
    expect(b.got.map((g) => g.event)).toEqual([frontendEvent('f1'), frontendEvent('f2')]);
  });
});

describe.skipIf(await missingPostgres())('PostgresBus: two bridges on one database', () => {
  const db = usePostgres();
  const cleanups: Array<() => Promise<unknown>> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  /** A "bridge": its own pool, log and bus, started; the listener named so that a test can find it. */
  const bridge = async (o: { maxPayloadBytes?: number } = {}) => {
    const { sink, log } = logger();
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    pool.on('error', () => undefined);
    const applicationName = `events-test-${randomBytes(4).toString('hex')}`;
    const bus = new PostgresBus({
      pool,
      url: db.url,
      log,
      applicationName,
      backoff: { firstMs: 20, maxMs: 200 },
      ...o,
    });
    const rec = recorder();
    bus.subscribe(rec.fn);
    await bus.start();
    cleanups.push(() => pool.end());
    cleanups.push(() => bus.stop());
    return { bus, pool, sink, rec, applicationName };
  };

  it("an event published on A reaches B's subscribers once, and A's own once (its echo is ignored)", async () => {
    const a = await bridge();
    const b = await bridge();
    a.bus.publish({ type: 'device.state', deviceId: 'dev-1', state: 'connected' });
    // A's subscriber had it at once, before anything went to the database.
    expect(a.rec.got).toEqual([
      { event: { type: 'device.state', deviceId: 'dev-1', state: 'connected' }, source: { local: true } },
    ]);
    await until(() => b.rec.got.length === 1, 'B to get A’s event');
    expect(b.rec.got[0]).toEqual({
      event: { type: 'device.state', deviceId: 'dev-1', state: 'connected' },
      source: { local: false },
    });
    // B answers after it got A's event: its NOTIFY commits after A's, so A's listener has had its own echo by the
    // time B's event reaches it.
    b.bus.publish(frontendEvent('marker'));
    await until(() => a.rec.of('frontend.changed').length === 1, 'A to get B’s marker');
    expect(a.rec.got.map((g) => [g.event.type, g.source.local])).toEqual([
      ['device.state', true],
      ['frontend.changed', false],
    ]);
    expect(b.rec.got.map((g) => [g.event.type, g.source.local])).toEqual([
      ['device.state', false],
      ['frontend.changed', true],
    ]);
  });

  it('keeps the order of each publisher, across turns and batches', async () => {
    const a = await bridge();
    const b = await bridge();
    const sent: string[] = [];
    for (let turn = 0; turn < 20; turn++) {
      for (let i = 0; i < 10; i++) {
        const id = `f-${turn}-${i}`;
        sent.push(id);
        a.bus.publish(frontendEvent(id));
      }
      await new Promise((r) => setImmediate(r));
    }
    await until(() => b.rec.got.length === sent.length, 'B to get every event');
    expect(b.rec.got.map((g) => (g.event as { id: string }).id)).toEqual(sent);
    expect(b.rec.of('bus.resync')).toEqual([]);
  });

  it('splits a large batch into payloads under the limit; an event too large alone is split or dropped', async () => {
    const a = await bridge();
    const b = await bridge();
    // The payloads as the server delivers them, to a listener of the test's own.
    const payloads: string[] = [];
    const spy = new pg.Client({ connectionString: db.url });
    spy.on('error', () => undefined);
    spy.on('notification', (n) => payloads.push(n.payload ?? ''));
    await spy.connect();
    cleanups.push(() => spy.end());
    await spy.query(`LISTEN ${EVENTS_CHANNEL}`);

    // 1000 events in one turn, about 90 bytes each: several payloads.
    const many: BusEvent[] = Array.from({ length: 1000 }, (_, i) => ({
      type: 'command.changed',
      deviceId: 'dev-1',
      id: `cmd-${String(i).padStart(5, '0')}`,
      state: 'done',
    }));
    for (const e of many) a.bus.publish(e);
    // One device.vars event of 400 variables (about 24 KB): split by its variables.
    const vars = Array.from({ length: 400 }, (_, i) => ({
      type: 'd' as const,
      name: `variable-with-a-long-name-${i}`,
      change: 'version' as const,
    }));
    a.bus.publish({ type: 'device.vars', deviceId: 'dev-2', vars });
    await until(() => b.rec.of('device.vars').length > 0 && b.rec.of('command.changed').length === 1000, 'B');
    await until(
      () => b.rec.of('device.vars').flatMap((e) => (e as { vars: unknown[] }).vars).length === 400,
      'every variable',
    );
    await until(() => payloads.length > 4, 'the payloads');
    expect(payloads.length).toBeGreaterThan(4);
    for (const p of payloads) expect(Buffer.byteLength(p)).toBeLessThanOrEqual(MAX_PAYLOAD_BYTES);
    expect(b.rec.of('command.changed')).toEqual(many);
    expect(b.rec.of('device.vars').flatMap((e) => (e as { vars: unknown[] }).vars)).toEqual(vars);
    expect(b.rec.of('bus.resync')).toEqual([]);

    // A frontend id of 9000 bytes cannot be sent: dropped, logged, and the others resync instead.
    a.bus.publish(frontendEvent('x'.repeat(9000)));
    await until(() => b.rec.of('bus.resync').length === 1, 'B to resync');
    expect(a.sink.events('events.dropped')).toEqual([
      expect.objectContaining({ level: 'error', type: 'frontend.changed' }),
    ]);
    expect(b.rec.of('frontend.changed')).toEqual([]);
    expect(b.sink.events('events.missed')).toEqual([expect.objectContaining({ lost: true })]);
  });

  it('a listener whose connection is killed comes back, logs it, and tells its subscribers to resync', async () => {
    const a = await bridge();
    const b = await bridge();
    const backend = await db.pool.query<{ pid: number }>(
      'SELECT pid FROM pg_stat_activity WHERE application_name = $1',
      [b.applicationName],
    );
    expect(backend.rows).toHaveLength(1);
    await db.pool.query('SELECT pg_terminate_backend($1)', [backend.rows[0]!.pid]);

    await until(() => b.sink.events('events.listener_restored').length === 1, 'the listener to come back');
    expect(b.sink.events('events.listener_lost')).toEqual([expect.objectContaining({ level: 'warn' })]);
    expect(b.rec.of('bus.resync')).toEqual([{ type: 'bus.resync' }]);
    expect(b.bus.listening).toBe(true);
    // A new backend, listening again.
    const again = await db.pool.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [
      b.applicationName,
    ]);
    expect(again.rows.map((r) => r.pid)).not.toContain(backend.rows[0]!.pid);
    a.bus.publish(frontendEvent('after'));
    await until(() => b.rec.of('frontend.changed').length === 1, 'B to get events again');
    // A was not touched.
    expect(a.sink.events('events.listener_lost')).toEqual([]);
    expect(a.rec.of('bus.resync')).toEqual([]);
  });

  describe('the frontends of two stores', () => {
    let a: PostgresStore;
    let b: PostgresStore;
    const dirs: string[] = [];
    afterAll(() => {
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    });
    beforeEach(async () => {
      await db.reset();
      const dataDir = tempDir('devcloud-events-');
      dirs.push(dataDir);
      a = await openPostgresStore(db.url, logger().log, { dataDir: join(dataDir, 'a'), poolSize: 2 });
      b = await openPostgresStore(db.url, logger().log, { dataDir: join(dataDir, 'b'), poolSize: 2 });
    });
    afterEach(async () => {
      vi.useRealTimers();
      await a.close();
      await b.close();
    });

    /** A bus on the store's pool, followed by the store. */
    const follow = async (store: PostgresStore) => {
      const bus = new PostgresBus({ pool: store.pool, url: db.url, log: logger().log });
      const rec = recorder();
      bus.subscribe(rec.fn);
      await bus.start();
      const unfollow = store.useEvents(bus);
      cleanups.push(() => bus.stop().then(unfollow));
      return { bus, rec };
    };

    it('a frontend changed through store A is seen by store B at once, without its one-second recheck', async () => {
      // The clock of the recheck stands still: only an event can make B read the frontends again.
      vi.useFakeTimers({ toFake: ['performance'] });
      await follow(a);
      const busB = await follow(b);
      expect(await b.frontend('f1')).toBeUndefined();
      expect(b.frontendLoads).toBe(1);
      // Kept: no read within the second.
      expect(await b.defaultFrontend()).toBeUndefined();
      expect(b.frontendLoads).toBe(1);

      await a.createFrontend({ id: 'f1', name: 'One', config: ProductConfig.parse({}), isDefault: true, createdAt: 1 });
      await until(() => busB.rec.of('frontend.changed').length === 1, 'B to hear of the frontend');
      expect((await b.frontend('f1'))?.name).toBe('One');
      expect((await b.defaultFrontend())?.id).toBe('f1');
      expect(b.frontendLoads).toBe(2);

      await a.write((tx) => tx.setFrontendConfig('f1', ProductConfig.parse({ nearby: false }), 'Renamed'));
      await until(() => busB.rec.of('frontend.changed').length === 2, 'B to hear of the change');
      expect(await b.frontend('f1')).toMatchObject({ name: 'Renamed', config: { nearby: false } });
      expect(b.frontendLoads).toBe(3);
      // A's own cache followed its own write at once.
      expect((await a.frontend('f1'))?.name).toBe('Renamed');
    });

    it('a resync drops them too', async () => {
      vi.useFakeTimers({ toFake: ['performance'] });
      const busB = await follow(b);
      expect(await b.frontend('f1')).toBeUndefined();
      // Written behind the store's back (as by a bridge whose event was lost).
      await db.pool.query(
        "INSERT INTO frontends (id, name, config, is_default, created_at) VALUES ('f1', 'One', '{}', true, 1)",
      );
      expect(await b.frontend('f1')).toBeUndefined();
      const backend = await db.pool.query<{ pid: number }>(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'devcloud-bridge-events' AND datname = current_database()",
      );
      expect(backend.rows).toHaveLength(1);
      await db.pool.query('SELECT pg_terminate_backend($1)', [backend.rows[0]!.pid]);
      await until(() => busB.rec.of('bus.resync').length === 1, 'the resync');
      expect((await b.frontend('f1'))?.name).toBe('One');
    });
  });
});

describe('a live bridge on SQLite', () => {
  it('publishes device.vars when a user sets a variable through HTTP', async () => {
    const live = await startLiveBridge({ config: { mqtt: { openEnrolment: true } } });
    const device = await connectMqttDevice(live.mqttUrl, () => undefined);
    try {
      const rec = recorder();
      const off = live.bridge.events.subscribe(rec.fn);
      const http = live.client();
      expect(
        (await http.post('/0/session/signup', { form: { login: 'ann@example.com', password: 'pw-ann-1234' } })).status,
      ).toBe(201);
      await until(() => live.sink.events('device.hello').length === 1, 'the hello');
      expect((await http.post('/0/devices/', { form: { auth: device.authcode } })).status).toBe(201);
      expect((await http.post(`/0/devices/${device.id}/d/led`, { form: { value: 'on' } })).body).toBe('device-ok');
      off();

      expect(rec.of('device.registration')).toEqual([
        { type: 'device.registration', deviceId: device.id, owned: true, userId: expect.any(Number) as number },
      ]);
      // Published after the commit: the variable can be read when the event comes.
      expect(rec.of('device.vars')).toContainEqual({
        type: 'device.vars',
        deviceId: device.id,
        vars: [{ type: 'd', name: 'led', change: 'version' }],
      });
      expect(rec.got.every((g) => g.source.local)).toBe(true);
    } finally {
      await device.close();
      await live.close();
    }
  });
});
