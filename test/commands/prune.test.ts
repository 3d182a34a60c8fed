/**
 * Finished commands do not pile up: the agent removes those older than `commands.keepDays` at start and every
 * hour after, and the bridge those older than its `commands.keepDays`. Both on real SQLite files; the agent's
 * hour is vitest's fake time.
 */
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { COMMAND_MIGRATION, COMMAND_PROCESS_MIGRATION, CommandQueue } from '../../agent/commands/queue.js';
import { CommandRunner } from '../../agent/commands/runner.js';
import { CommandService } from '../../bridge/commands/service.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { GroupCommitter, openDatabase } from '../../lib/sqlite.js';
import { LogSink, tempDir } from '../support/agent.js';

const DAY = 86_400_000;
const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: new LogSink() });
const uuid = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;

describe('pruning finished commands', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('on the agent: at start, and again every hour', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout'] });
    let now = Date.UTC(2030, 0, 1);
    const db = openDatabase(join(tempDir(), 'agent.db'), [COMMAND_MIGRATION, COMMAND_PROCESS_MIGRATION]);
    const commit = new GroupCommitter(db);
    const queue = new CommandQueue(db);
    /** A command that finished at `at` and whose report reached the broker. */
    const finished = (n: number, at: number) =>
      commit.run(() => {
        queue.add({ id: uuid(n), command: Buffer.from('ping'), priority: 0, created: at, expires: at + DAY }, at);
        queue.finish(uuid(n), { state: 'done' }, at);
        queue.markReported(uuid(n), 'done');
      });
    await finished(1, now - 8 * DAY);
    await finished(2, now - 1 * DAY);
    // Finished long ago but its report never reached the broker: kept, it still has to be reported.
    await commit.run(() => {
      queue.add({ id: uuid(3), command: Buffer.from('ping'), priority: 0, created: 0, expires: DAY }, now - 9 * DAY);
      queue.finish(uuid(3), { state: 'done' }, now - 9 * DAY);
    });
    const runner = new CommandRunner({
      queue,
      commit,
      reporter: { publish: () => false, connected: false },
      actions: {
        identify: () => ({}),
        reboot: () => Promise.resolve({ state: 'failed' }),
        restart: () => undefined,
        factoryReset: () => Promise.resolve(0),
      },
      now: () => now,
      log,
      concurrency: 1,
      commandsDir: undefined,
      timeoutMs: 1000,
      outputBytes: 4096,
      allowFactoryReset: false,
      allowReboot: false,
      env: {},
      keepMs: 7 * DAY,
    });
    await runner.start();
    expect([queue.get(uuid(1)), queue.get(uuid(2)), queue.get(uuid(3))].map((c) => c?.id)).toEqual([
      undefined,
      uuid(2),
      uuid(3),
    ]);

    // A week later, without a restart: the hourly pass removes the second one.
    now += 7 * DAY;
    await vi.advanceTimersByTimeAsync(3_600_000);
    await commit.run(() => undefined);
    expect(queue.get(uuid(2))).toBeUndefined();
    expect(queue.get(uuid(3))).toBeDefined();
    runner.stop();
    commit.close();
    db.close();
  });

  it('on the bridge: finished commands older than keepDays, open ones kept whatever their age', async () => {
    const store = new SqliteStore(tempDir('devcloud-bridge-'));
    let now = Date.UTC(2030, 0, 1);
    const service = new CommandService({ store, log, now: () => now, maxOpen: 1000 });
    const device = uuid(99);
    await store.write(async (tx) => {
      await tx.devices.touch(device, now);
      for (let n = 1; n <= 3; n++) {
        await tx.commands.add({
          id: uuid(n),
          deviceId: device,
          userId: null,
          command: Buffer.from('ping'),
          priority: 0,
          createdAt: now,
          expiresAt: now + 40 * DAY,
        });
      }
      await tx.commands.report(device, { id: 'r1', cmd: uuid(1), state: 'done', at: now });
      await tx.commands.report(device, { id: 'r2', cmd: uuid(2), state: 'failed', at: now + 20 * DAY, reason: 'x' });
    });
    now += 31 * DAY;
    expect(await service.prune(30)).toBe(1);
    expect(await store.commands.get(uuid(1))).toBeUndefined();
    expect((await store.commands.get(uuid(2)))?.state).toBe('failed');
    // Still open after 31 days: kept.
    expect((await store.commands.get(uuid(3)))?.state).toBe('queued');
    await store.close();
  });
});
