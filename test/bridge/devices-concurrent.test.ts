/**
 * The messages of many devices handled at once, as the bridge's link hands them over (it does not wait for one to be
 * handled before the next): the device service with a real store, its messages to devices recorded instead of
 * published, on each store engine (SQLite, and PostgreSQL when the test server answers: test/support/bridge.ts,
 * `engines`). Nothing is lost to a race between the messages of one device, and they take effect in the order they
 * came. On PostgreSQL each message is a transaction of its own; before the service kept them in order there, a
 * hello racing the connect of a new device failed on its variables' foreign key, two reports of one device
 * deadlocked, and a later report could be overwritten by an earlier one.
 */
import { randomUUID } from 'node:crypto';
import { rmSync } from 'node:fs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { DeviceService } from '../../bridge/devices/service.js';
import { createLogger } from '../../lib/log.js';
import { messageId } from '../../protocol/index.js';
import { LogSink, tempDir } from '../support/agent.js';
import { type TestStore, engines, openTestStore } from '../support/bridge.js';
import { helloMessage } from '../support/mqtt-device.js';

describe.each(await engines())('messages of many devices at once (%s)', (engine) => {
  let dir: string;
  let opened: TestStore;
  let service: DeviceService;
  let sink: LogSink;

  beforeEach(async () => {
    dir = tempDir('devcloud-concurrent-');
    sink = new LogSink();
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
    opened = await openTestStore(engine, dir, { log });
    service = new DeviceService({
      store: opened.store,
      log,
      now: Date.now,
      nearbyWindowMs: 300_000,
      lastActivityMs: 0,
    });
    service.attach(() => true);
  });

  afterEach(async () => {
    await service.close();
    await opened.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const meta = (deviceId: string, entries: Record<string, string>) =>
    service.handle({ deviceId, name: 'up/meta', payload: { id: messageId(), ts: Date.now(), meta: entries } });
  const metaOf = async (deviceId: string, name: string) =>
    (await opened.store.devices.getVar(deviceId, 'meta', name))?.value?.toString('utf8');

  it('loses nothing, and applies the messages of each device in the order they came', async () => {
    const ids = Array.from({ length: 40 }, () => randomUUID());
    const hellos = new Map(ids.map((id) => [id, helloMessage(id)]));
    // A new device connects and says hello: the two messages come together.
    await Promise.all(
      ids.flatMap((deviceId) => [
        service.handle({ deviceId, name: 'state', payload: 'online' }),
        service.handle({ deviceId, name: 'up/hello', payload: hellos.get(deviceId)! }),
      ]),
    );
    for (const id of ids) {
      expect((await opened.store.devices.device(id))?.authcode, id).toBe(hellos.get(id)!.authcode);
      expect(await metaOf(id, 'state'), id).toBe('connected');
    }
    // Known devices now: reports that write the same entries in other orders, a hello, and changes from the API.
    const rounds = 3;
    const all: Array<Promise<unknown>> = [];
    for (let round = 0; round < rounds; round++) {
      for (const deviceId of ids) {
        all.push(meta(deviceId, { alpha: `a${round}`, beta: `b${round}` }));
        all.push(service.handle({ deviceId, name: 'up/hello', payload: helloMessage(deviceId) }));
        all.push(service.setVar(deviceId, 'd', 'x', Buffer.from(String(round))));
        all.push(meta(deviceId, { beta: `b${round}'`, alpha: `a${round}'` }));
      }
    }
    await Promise.all(all);
    expect(sink.events('device.message_failed')).toEqual([]);
    expect(service.counters.failed).toBe(0);
    for (const id of ids) {
      // The last report of each device is what it holds.
      expect([await metaOf(id, 'alpha'), await metaOf(id, 'beta')], id).toEqual([`a${rounds - 1}'`, `b${rounds - 1}'`]);
      expect(await metaOf(id, 'state'), id).toBe('connected');
    }
  });
});
