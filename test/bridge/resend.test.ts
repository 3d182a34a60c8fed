/**
 * The resend schedule of the bridge (docs/sync.md, "Resend while connected"), on fake time: the device service
 * with a real SQLite store, its messages to devices recorded instead of published. A connected device that does
 * not acknowledge gets what it has not acknowledged again after 5 s, then 10 s, 20 s, ... up to 5 min; an
 * acknowledgement or a hello starts the wait again at 5 s; a device with nothing left, or gone, leaves the
 * schedule; and only devices with something pending are ever looked at.
 *
 * SQLite only, though the device suites run on PostgreSQL too: this file moves fake time, and
 * `vi.advanceTimersByTimeAsync` lets only promises settle that need no I/O, which SQLite's answers are and
 * PostgreSQL's (over a socket) are not; a turn of the schedule would read the store after the time had moved on. No
 * bridge is involved here. What the resend reads of the store on PostgreSQL (`pending` in pages, the acks) is in the
 * store suite on both engines (test/bridge/store-engines.test.ts), and a device that is sent a change over a live
 * bridge on PostgreSQL acknowledges it in test/bridge/devices.test.ts.
 */
import { randomUUID } from 'node:crypto';
import { rmSync } from 'node:fs';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { DeviceService } from '../../bridge/devices/service.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { type Payloads, type VarItem, ackFor, messageId } from '../../protocol/index.js';
import { LogSink, tempDir } from '../support/agent.js';
import { helloMessage } from '../support/mqtt-device.js';

const FIRST = 5000;
const MAX = 300_000;

interface Sent {
  deviceId: string;
  items: VarItem[];
}

describe('the resend of unacknowledged changes to connected devices', () => {
  let dir: string;
  let store: SqliteStore;
  let service: DeviceService;
  let sink: LogSink;
  let sent: Sent[];

  beforeEach(() => {
    // setImmediate stays real: the resend yields between pages with it.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'], now: Date.UTC(2030, 0, 1) });
    dir = tempDir('devcloud-resend-');
    store = new SqliteStore(dir);
    sink = new LogSink();
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
    service = new DeviceService({
      store,
      log,
      now: Date.now,
      nearbyWindowMs: 300_000,
      lastActivityMs: 5000,
      resend: { firstMs: FIRST, maxMs: MAX },
    });
    sent = [];
    service.attach((deviceId, name, payload) => {
      if (name === 'down/vars') sent.push({ deviceId, items: (payload as Payloads['down/vars']).items });
      return true;
    });
  });

  afterEach(async () => {
    await service.close();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
    vi.useRealTimers();
  });

  async function connect(deviceId: string = randomUUID()): Promise<string> {
    await service.handle({ deviceId, name: 'state', payload: 'online' });
    await service.handle({
      deviceId,
      name: 'up/hello',
      payload: helloMessage(deviceId),
    });
    return deviceId;
  }

  const sentTo = (deviceId: string): Sent[] => sent.filter((s) => s.deviceId === deviceId);

  async function ack(deviceId: string, items: VarItem[]): Promise<void> {
    await service.handle({ deviceId, name: 'up/acks', payload: { id: messageId(), acks: items.map(ackFor) } });
  }

  it('sends again after 5 s, then doubles the wait up to 5 min, while the device stays connected', async () => {
    const D = await connect();
    expect(await service.setVar(D, 'd', 'led', Buffer.from('on'))).toBe(true);
    expect(sentTo(D)).toHaveLength(1);
    const at: number[] = [];
    const start = Date.now();
    // Each resend is recorded with the time it happened, over an hour without an acknowledgement.
    for (let t = 0; t < 3_600_000; t += 1000) {
      const before = sentTo(D).length;
      await vi.advanceTimersByTimeAsync(1000);
      if (sentTo(D).length > before) at.push(Date.now() - start);
    }
    const waits = at.map((t, i) => t - (i === 0 ? 0 : at[i - 1]!));
    expect(waits.slice(0, 8)).toEqual([5000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]);
    expect(Math.max(...waits)).toBe(MAX);
    // Every resend carries the same version, as a push.
    for (const s of sentTo(D)) expect(s.items.map((i) => [i.kind, i.name, i.value])).toEqual([['push', 'led', 'on']]);
    expect(sink.events('vars.resend').length).toBe(at.length);
  });

  it('starts again at 5 s after an acknowledgement, and stops once everything is acknowledged', async () => {
    const D = await connect();
    await service.setVar(D, 'd', 'a', Buffer.from('1'));
    await service.setVar(D, 'd', 'b', Buffer.from('2'));
    // Unacknowledged for 5 + 10 + 20 + 40 s: the next wait would be 80 s.
    await vi.advanceTimersByTimeAsync(75_000);
    expect(sentTo(D)).toHaveLength(2 + 4);
    // The device takes `a` only; `b` goes again 5 s later, not 80 s.
    const a = sentTo(D)
      .at(-1)!
      .items.find((i) => i.name === 'a')!;
    await ack(D, [a]);
    await vi.advanceTimersByTimeAsync(FIRST - 1);
    expect(sentTo(D)).toHaveLength(6);
    await vi.advanceTimersByTimeAsync(1);
    expect(sentTo(D)).toHaveLength(7);
    expect(
      sentTo(D)
        .at(-1)!
        .items.map((i) => i.name),
    ).toEqual(['b']);
    await ack(D, sentTo(D).at(-1)!.items);
    expect(await store.devices.pending(D, '', 10)).toEqual([]);
    // Nothing left: the device leaves the schedule at its next due time, and nothing more is sent.
    await vi.advanceTimersByTimeAsync(MAX * 3);
    expect(sentTo(D)).toHaveLength(7);
    expect(service.resend.size).toBe(0);
  });

  it('does not send twice what a busy device is still acknowledging', async () => {
    const D = await connect();
    // A change a second, each acknowledged 1.5 s later: at any moment one is on its way.
    const sentItems: VarItem[] = [];
    for (let k = 0; k < 60; k++) {
      await service.setVar(D, 'd', 'level', Buffer.from(String(k)));
      sentItems.push(sentTo(D).at(-1)!.items[0]!);
      await vi.advanceTimersByTimeAsync(500);
      if (k > 0) await ack(D, [sentItems[k - 1]!]);
      await vi.advanceTimersByTimeAsync(500);
    }
    expect(sentTo(D)).toHaveLength(60);
    expect(sink.events('vars.resend')).toEqual([]);
    // The last one is never acknowledged: it goes again 5 s after it was sent, and only then.
    await vi.advanceTimersByTimeAsync(5000);
    expect(sentTo(D)).toHaveLength(61);
    expect(
      sentTo(D)
        .at(-1)!
        .items.map((i) => i.value),
    ).toEqual(['59']);
  });

  it('resends syncs too, and a hello starts the wait again at 5 s', async () => {
    const D = await connect();
    await service.setVar(D, 'd', 'mode', Buffer.from('x'));
    await ack(D, sentTo(D).at(-1)!.items);
    await service.syncVar(D, 'mode');
    expect(
      sentTo(D)
        .at(-1)!
        .items.map((i) => i.kind),
    ).toEqual(['sync']);
    await vi.advanceTimersByTimeAsync(5000 + 10_000 + 20_000);
    expect(
      sentTo(D)
        .slice(-3)
        .map((s) => s.items.map((i) => i.kind)),
    ).toEqual([['sync'], ['sync'], ['sync']]);
    // The wait is now 40 s. A hello (a reconnect) sends everything at once, and the next resend is 5 s later.
    const n = sentTo(D).length;
    await connect(D);
    expect(sentTo(D)).toHaveLength(n + 1);
    await vi.advanceTimersByTimeAsync(FIRST);
    expect(sentTo(D)).toHaveLength(n + 2);
  });

  it('leaves a device alone once it disconnects; its next hello sends what it lacks', async () => {
    const D = await connect();
    await service.setVar(D, 'd', 'led', Buffer.from('on'));
    await service.handle({ deviceId: D, name: 'state', payload: 'offline' });
    expect(service.resend.size).toBe(0);
    // A change made while it is away is sent (the broker may hold it), and not sent again while it is away.
    await service.setVar(D, 'd', 'led', Buffer.from('off'));
    await vi.advanceTimersByTimeAsync(MAX * 2);
    expect(sentTo(D)).toHaveLength(2);
    expect(service.resend.size).toBe(0);
    await connect(D);
    expect(
      sentTo(D)
        .at(-1)!
        .items.map((i) => i.value),
    ).toEqual(['off']);
  });

  it('sends a large backlog again in pages of 500', async () => {
    const D = await connect();
    await store.write(async (tx) => {
      for (let i = 0; i < 1200; i++) {
        const name = `v${String(i).padStart(4, '0')}`;
        await tx.devices.putVersion(
          D,
          { type: 'd', name, value: Buffer.from('x'), time: Date.now(), origin: 'cloud' },
          0,
          'user',
        );
      }
    });
    await service.setVar(D, 'd', 'z', Buffer.from('last'));
    const n = sentTo(D).length;
    await vi.advanceTimersByTimeAsync(FIRST);
    // The pages after the first go out after a turn of the event loop each.
    for (let i = 0; i < 20 && sentTo(D).length < n + 3; i++) await new Promise((r) => setImmediate(r));
    const pages = sentTo(D).slice(n);
    expect(pages.map((p) => p.items.length)).toEqual([500, 500, 201]);
    expect(new Set(pages.flatMap((p) => p.items.map((i) => i.name))).size).toBe(1201);
  });

  it('looks only at devices with something pending, however many are connected', async () => {
    const quiet: string[] = [];
    for (let i = 0; i < 300; i++) quiet.push(await connect());
    const D = await connect();
    await service.setVar(D, 'd', 'led', Buffer.from('on'));
    expect(service.resend.size).toBe(1);
    const pending = vi.spyOn(store.devices, 'pending');
    await vi.advanceTimersByTimeAsync(FIRST + 10_000 + 20_000);
    expect(sentTo(D)).toHaveLength(4);
    expect(new Set(pending.mock.calls.map((c) => c[0]))).toEqual(new Set([D]));
    expect(pending.mock.calls).toHaveLength(3);
    expect(sent.filter((s) => quiet.includes(s.deviceId))).toEqual([]);
  });
});
