/**
 * History retention (docs/api.md, "History"): by age (`devices.historyDays`) and by count per variable
 * (`devices.historyPerVariable`), in the background in small batches. Through the bridge's store and its REST
 * API (`?latest=`), on a clock the test moves; the pruner's batches and its yielding to other work; and the
 * first pass after a restart, which finds what an earlier run left over the limits.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { rmSync } from 'node:fs';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { HistoryRetention, MIN_BATCH_ROWS } from '../../bridge/devices/retention.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { until } from '../support/wait.js';
import { type HttpClient, type TestBridge, TestClock, startTestBridge } from '../support/bridge.js';

const DAY = 86_400_000;

interface Entry {
  key: string;
  value: string;
  by: string;
  timestamp: number;
  id: number;
}

describe('history retention through the REST API', () => {
  let tb: TestBridge | undefined;

  afterEach(async () => {
    await tb?.close();
    tb = undefined;
  });

  /** A user with one device; returns the client and the device id. */
  async function owner(b: TestBridge): Promise<{ user: HttpClient; id: string }> {
    const user = b.client();
    expect(
      (await user.post('/0/session/signup', { form: { login: 'o@example.com', password: 'correct horse' } })).status,
    ).toBe(201);
    const u = (await b.store.userByLogin(b.defaultFrontend.id, 'o@example.com'))!;
    const id = randomUUID();
    await b.store.write(async (tx) => {
      await tx.devices.touch(id, b.clock.now());
      await tx.devices.setAuthcode(id, randomBytes(16).toString('hex'));
      await tx.devices.claim(id, u.id, b.clock.now());
    });
    return { user, id };
  }

  async function history(user: HttpClient, path: string): Promise<Entry[]> {
    const r = await user.get(path);
    expect(r.status).toBe(200);
    return JSON.parse(r.body) as Entry[];
  }

  it('keeps the newest historyPerVariable entries of each variable', async () => {
    tb = await startTestBridge({ config: { devices: { historyPerVariable: 5, historyDays: 0 } } });
    const { user, id } = await owner(tb);
    for (let i = 0; i < 12; i++) {
      expect((await user.post(`/0/devices/${id}/d/led`, { form: { value: `led ${i}` } })).status).toBe(200);
      expect((await user.post(`/0/devices/${id}/s/note`, { form: { value: `note ${i}` } })).status).toBe(200);
      tb.clock.advance(1000);
    }
    await user.post(`/0/devices/${id}/d/fan`, { form: { value: 'on' } });
    expect(await history(user, `/0/devices/${id}/d/led?latest=1000`)).toHaveLength(12);

    const r = await tb.devices.retention.pass();
    expect(r).toMatchObject({ byAge: 0, byCount: 14 });
    const led = await history(user, `/0/devices/${id}/d/led?latest=1000`);
    expect(led.map((e) => e.value)).toEqual(['led 11', 'led 10', 'led 9', 'led 8', 'led 7']);
    expect((await history(user, `/0/devices/${id}/s/note?latest=0`)).map((e) => e.value)).toEqual([
      'note 11',
      'note 10',
      'note 9',
      'note 8',
      'note 7',
    ]);
    expect(await history(user, `/0/devices/${id}/d/fan?latest=1000`)).toHaveLength(1);
    // Paging backwards ends at the fifth entry.
    expect(await history(user, `/0/devices/${id}/d/led?latest=10&from=${led[4]!.id}`)).toEqual([]);
    // The variable itself is untouched.
    expect(JSON.parse((await user.get(`/0/devices/${id}/d/led`)).body)).toMatchObject({ value: 'led 11' });

    // Three more: the next pass looks only at the variable that grew, and keeps five again.
    for (let i = 12; i < 15; i++) await user.post(`/0/devices/${id}/d/led`, { form: { value: `led ${i}` } });
    const read = vi.spyOn(tb.store.devices, 'pruneVariableHistory');
    expect(await tb.devices.retention.pass()).toMatchObject({ byCount: 3 });
    expect(read.mock.calls.map((c) => c[0].name)).toEqual(['led']);
    expect((await history(user, `/0/devices/${id}/d/led?latest=1000`)).map((e) => e.value)).toEqual([
      'led 14',
      'led 13',
      'led 12',
      'led 11',
      'led 10',
    ]);
  });

  it('removes entries older than historyDays, by the clock', async () => {
    const clock = new TestClock();
    tb = await startTestBridge({ clock, config: { devices: { historyDays: 2, historyPerVariable: 0 } } });
    const { user, id } = await owner(tb);
    const set = async (value: string) =>
      expect((await user.post(`/0/devices/${id}/d/mode`, { form: { value } })).status).toBe(200);
    await set('three days ago');
    clock.advance(DAY - 1);
    await set('two days ago');
    clock.advance(DAY + 1);
    await set('a day ago');
    clock.advance(DAY);
    await set('now');
    const values = async () => (await history(user, `/0/devices/${id}/d/mode?latest=0`)).map((e) => e.value);
    expect(await values()).toEqual(['now', 'a day ago', 'two days ago', 'three days ago']);
    expect(await tb.devices.retention.pass()).toMatchObject({ byAge: 2, byCount: 0 });
    expect(await values()).toEqual(['now', 'a day ago']);
    // Nothing else is old yet; two days on, everything is.
    expect(await tb.devices.retention.pass()).toMatchObject({ byAge: 0 });
    clock.advance(2 * DAY + 1);
    expect(await tb.devices.retention.pass()).toMatchObject({ byAge: 2 });
    expect(await values()).toEqual([]);
    // The variable keeps its value: only its history goes.
    expect(JSON.parse((await user.get(`/0/devices/${id}/d/mode`)).body)).toMatchObject({ value: 'now' });
  });

  it('runs at start and then every few minutes, logging history.pruned', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      tb = await startTestBridge({ config: { devices: { historyPerVariable: 2, historyDays: 0 } } });
      const { user, id } = await owner(tb);
      for (let i = 0; i < 5; i++) await user.post(`/0/devices/${id}/d/x`, { form: { value: `${i}` } });
      const retention = tb.devices.retention;
      retention.start();
      await vi.waitUntil(() => tb!.sink.events('history.pruned').length === 1, { interval: 1 });
      expect(tb.sink.events('history.pruned')[0]).toMatchObject({ byCount: 3, byAge: 0 });
      for (let i = 0; i < 4; i++) await user.post(`/0/devices/${id}/d/x`, { form: { value: `${i}` } });
      await vi.advanceTimersByTimeAsync(retention.everyMs - 1000);
      expect(tb.sink.events('history.pruned')).toHaveLength(1);
      await vi.advanceTimersByTimeAsync(2000);
      await vi.waitUntil(() => tb!.sink.events('history.pruned').length === 2, { interval: 1 });
      expect(tb.sink.events('history.pruned')[1]).toMatchObject({ byCount: 4 });
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('the pruner', () => {
  const dirs: string[] = [];
  const stores: SqliteStore[] = [];

  afterEach(async () => {
    for (const s of stores.splice(0)) await s.close();
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  function open(dir = tempDir('devcloud-retention-')): { dir: string; store: SqliteStore } {
    if (!dirs.includes(dir)) dirs.push(dir);
    const store = new SqliteStore(dir);
    stores.push(store);
    return { dir, store };
  }

  function retention(
    store: SqliteStore,
    o: { maxAgeDays?: number; maxPerVariable?: number; batchRows?: number; batchMs?: number },
  ) {
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: new LogSink() });
    return new HistoryRetention({
      store,
      now: () => Date.UTC(2030, 0, 1),
      log,
      maxAgeDays: o.maxAgeDays ?? 0,
      maxPerVariable: o.maxPerVariable ?? 0,
      batchRows: o.batchRows ?? 2000,
      // Unless a test says otherwise, batches are as large as batchRows allows.
      batchMs: o.batchMs ?? 60_000,
    });
  }

  /** `n` entries of `name` on `deviceId`, one second apart, ending at `end`. */
  async function grow(store: SqliteStore, deviceId: string, name: string, n: number, end: number): Promise<void> {
    await store.write(async (tx) => {
      await tx.devices.touch(deviceId, end);
      for (let i = 0; i < n; i++) {
        const time = end - (n - 1 - i) * 1000;
        await tx.devices.putVersion(
          deviceId,
          { type: 'd', name, value: Buffer.from(`${name} ${i}`), time, origin: 'cloud' },
          time,
          'user',
        );
      }
    });
  }

  const rows = async (store: SqliteStore, deviceId: string, name: string) =>
    (await store.devices.history(deviceId, 'd', name, 1_000_000)).length;

  it('removes in batches of at most batchRows, each its own transaction, yielding between them', async () => {
    const { store } = open();
    const end = Date.UTC(2030, 0, 1);
    const D = randomUUID();
    await grow(store, D, 'old', 3000, end - 10 * DAY);
    await grow(store, D, 'busy', 2600, end);
    for (let v = 0; v < 30; v++) await grow(store, D, `small${v}`, 12, end);
    const r = retention(store, { maxAgeDays: 5, maxPerVariable: 10, batchRows: 250 });
    const write = vi.spyOn(store, 'write');
    const removedPerWrite: number[] = [];
    const age = vi.spyOn(store.devices, 'pruneHistory');
    const count = vi.spyOn(store.devices, 'pruneVariableHistory');
    // Meanwhile, other work gets turns of the event loop: count them while the pass runs.
    let turns = 0;
    let running = true;
    const pass = r.pass().finally(() => (running = false));
    while (running) {
      turns++;
      await new Promise((resolve) => setImmediate(resolve));
    }
    const result = await pass;
    for (const c of age.mock.results) removedPerWrite.push(await (c.value as Promise<number>));
    expect(age.mock.calls.every((c) => c[1] <= 250)).toBe(true);
    expect(age.mock.calls.at(-2)![1]).toBe(250);
    expect(count.mock.calls.every((c) => c[2] <= 250)).toBe(true);
    expect(Math.max(...removedPerWrite)).toBeLessThanOrEqual(250);
    expect(result.byAge).toBe(3000);
    expect(result.byCount).toBe(2590 + 30 * 2);
    // 3000 by age in batches of 250 (and one that finds none left), then 2650 by count.
    expect(result.batches).toBeGreaterThanOrEqual(Math.ceil(3000 / 250) + Math.ceil(2650 / 250));
    expect(write.mock.calls.length).toBe(result.batches);
    expect(turns).toBeGreaterThanOrEqual(result.batches);
    expect(await rows(store, D, 'old')).toBe(0);
    expect(await rows(store, D, 'busy')).toBe(10);
    expect(await rows(store, D, 'small7')).toBe(10);
    expect((await store.devices.history(D, 'd', 'busy', 1))[0]!.value!.toString()).toBe('busy 2599');
  });

  it('shrinks its batches to what fits in batchMs, and no further than MIN_BATCH_ROWS', async () => {
    const { store } = open();
    const end = Date.UTC(2030, 0, 1);
    const D = randomUUID();
    await grow(store, D, 'old', 600, end - 10 * DAY);
    // No batch fits in a nanosecond: after the first, each removes the fewest rows.
    const tight = retention(store, { maxAgeDays: 5, batchRows: 250, batchMs: 1e-6 });
    const age = vi.spyOn(store.devices, 'pruneHistory');
    expect(await tight.pass()).toMatchObject({ byAge: 600 });
    const sizes = age.mock.calls.map((c) => c[1]);
    expect(sizes.slice(1).every((n) => n === MIN_BATCH_ROWS)).toBe(true);
    expect(sizes.length).toBeGreaterThanOrEqual((600 - sizes[0]!) / MIN_BATCH_ROWS);
    expect(await rows(store, D, 'old')).toBe(0);

    // Every batch fits: they grow to batchRows, at most doubling from one to the next.
    await grow(store, D, 'old', 2000, end - 10 * DAY);
    age.mockClear();
    const loose = retention(store, { maxAgeDays: 5, batchRows: 250, batchMs: 60_000 });
    expect(await loose.pass()).toMatchObject({ byAge: 2000 });
    const grown = age.mock.calls.map((c) => c[1]);
    for (let i = 1; i < grown.length; i++) expect(grown[i]).toBe(Math.min(250, grown[i - 1]! * 2));
    expect(grown.at(-1)).toBe(250);
  });

  it('waits for the end of a WAL checkpoint under way before its next batch', async () => {
    const { store } = open();
    const end = Date.UTC(2030, 0, 1);
    const D = randomUUID();
    await grow(store, D, 'old', 1000, end - 10 * DAY);
    let checkpointing = true;
    vi.spyOn(store, 'checkpointing', 'get').mockImplementation(() => checkpointing);
    const age = vi.spyOn(store.devices, 'pruneHistory');
    const r = retention(store, { maxAgeDays: 5, batchRows: 100 });
    let done = false;
    const pass = r.pass().finally(() => (done = true));
    await until(() => age.mock.calls.length > 0, 'the first batch');
    // While the checkpoint runs, no further batch starts.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(age.mock.calls.length).toBe(1);
    expect(done).toBe(false);
    checkpointing = false;
    expect(await pass).toMatchObject({ byAge: 1000 });
    expect(age.mock.calls.length).toBeGreaterThan(1);
  });

  it('after a restart, its first pass finds every variable over the limit', async () => {
    const first = open();
    const end = Date.UTC(2030, 0, 1);
    const devices = Array.from({ length: 40 }, () => randomUUID());
    for (const d of devices) await grow(first.store, d, 'x', 30, end);
    await first.store.close();
    stores.splice(stores.indexOf(first.store), 1);

    const { store } = open(first.dir);
    const r = retention(store, { maxPerVariable: 20, batchRows: 100 });
    expect(await r.pass()).toMatchObject({ byCount: 40 * 10 });
    for (const d of devices) expect(await rows(store, d, 'x')).toBe(20);
    // Nothing grew since: the next pass looks at nothing.
    const count = vi.spyOn(store.devices, 'pruneVariableHistory');
    expect(await r.pass()).toMatchObject({ byCount: 0 });
    expect(count).not.toHaveBeenCalled();
  });

  it('does nothing with both limits at 0', async () => {
    const { store } = open();
    await grow(store, randomUUID(), 'x', 50, Date.UTC(2000, 0, 1));
    const r = retention(store, {});
    expect(r.enabled).toBe(false);
    expect(await r.pass()).toMatchObject({ byAge: 0, byCount: 0, batches: 0 });
  });
});
