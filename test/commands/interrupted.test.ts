/**
 * What the runner makes at start of commands a crash left `running` (docs/agent.md, the command runner), on a real
 * SQLite file and real processes: a handler that was never launched runs (or expires) as usual; one whose process
 * group survived is killed and reported interrupted; one whose recorded pid now belongs to another process is left
 * alone.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { processStartTicks } from '../../agent/commands/procs.js';
import { CommandQueue } from '../../agent/commands/queue.js';
import { CommandRunner } from '../../agent/commands/runner.js';
import { AGENT_MIGRATIONS } from '../../agent/migrations.js';
import { createLogger } from '../../lib/log.js';
import { GroupCommitter, openDatabase } from '../../lib/sqlite.js';
import { LogSink, tempDir } from '../support/agent.js';
import { until } from '../support/wait.js';
import { runsIn, writeHandlers } from './support.js';

const HOUR = 3_600_000;
const uuid = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return processStartTicks(pid) !== null;
  } catch {
    return false;
  }
}

describe('commands found running at start', () => {
  const stops: Array<() => void> = [];
  afterEach(() => {
    for (const s of stops.splice(0)) s();
  });

  function setUp(launcher?: { file: string; args: string[]; pdeathsig: boolean }) {
    const work = tempDir('devcloud-cmd-work-');
    const handlers = join(work, 'handlers');
    writeHandlers(handlers, work);
    const db = openDatabase(join(work, 'agent.db'), AGENT_MIGRATIONS);
    const commit = new GroupCommitter(db);
    const queue = new CommandQueue(db);
    const sink = new LogSink();
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
    const now = Date.now();
    const take = async (n: number, command: string, expires = now + HOUR) => {
      await commit.run(() => {
        queue.add({ id: uuid(n), command: Buffer.from(command), priority: 0, created: now, expires }, now);
        queue.start(uuid(n), now);
      });
    };
    const runner = () => {
      const r = new CommandRunner({
        queue,
        commit,
        reporter: { publish: () => false, connected: false },
        actions: {
          identify: () => ({}),
          reboot: () => Promise.resolve({ state: 'failed' }),
          restart: () => undefined,
          factoryReset: () => Promise.resolve(0),
        },
        now: Date.now,
        log,
        concurrency: 1,
        commandsDir: handlers,
        timeoutMs: 10_000,
        outputBytes: 4096,
        allowFactoryReset: false,
        allowReboot: false,
        env: {},
        keepMs: HOUR,
        ...(launcher ? { launcher } : {}),
      });
      stops.push(() => r.stop());
      return r;
    };
    stops.push(() => {
      commit.close();
      db.close();
    });
    return { work, queue, commit, take, runner, sink };
  }

  it('runs a handler that was taken but never launched, once, and expires one whose lifetime ended', async () => {
    const { work, queue, take, runner, sink } = setUp();
    await take(1, 'rec never-launched');
    await take(2, 'rec lapsed', Date.now() - 1);
    await runner().start();
    await until(() => queue.get(uuid(1))?.state === 'done', 'the command to run');
    await until(() => queue.get(uuid(2))?.state === 'expired', 'the lapsed one to expire');
    expect(runsIn(work)).toEqual(['never-launched']);
    expect(sink.events('cmd.requeued').map((e) => e.cmd)).toEqual([uuid(1), uuid(2)]);
    expect(sink.events('cmd.interrupted')).toEqual([]);
  });

  it('records the process before the handler starts', async () => {
    const { queue, take, runner } = setUp();
    await take(3, 'rec recorded');
    const r = runner();
    await r.start();
    await until(() => queue.get(uuid(3))?.state === 'done', 'the command to run');
    const c = queue.get(uuid(3))!;
    expect(c.pid).toBeGreaterThan(0);
    expect(c.pidStart).toBeGreaterThan(0);
  });

  it('kills a process group that survived, and leaves alone a pid given to another process since', async () => {
    const { take, queue, commit, runner, sink } = setUp();
    // A handler left behind by a killed agent: its own group, with a child.
    const orphan = spawn('/bin/sh', ['-c', 'sleep 60 & wait'], { detached: true, stdio: 'ignore' });
    orphan.unref();
    const pid = orphan.pid!;
    await until(() => processStartTicks(pid) !== null, 'the orphan');
    await take(4, 'hang survived');
    await commit.run(() => queue.launched(uuid(4), pid, processStartTicks(pid)));
    // A recorded pid whose start time differs: the pid was reused; that process is not the handler.
    const other = spawn('/bin/sh', ['-c', 'sleep 60'], { detached: true, stdio: 'ignore' });
    other.unref();
    const otherPid = other.pid!;
    stops.push(() => {
      try {
        process.kill(-otherPid, 'SIGKILL');
      } catch {
        // Gone.
      }
    });
    await until(() => processStartTicks(otherPid) !== null, 'the other process');
    await take(5, 'hang reused');
    await commit.run(() => queue.launched(uuid(5), otherPid, processStartTicks(otherPid)! - 1));

    await runner().start();
    await until(() => !alive(pid), 'the surviving group to be killed', 5000);
    expect(queue.get(uuid(4))).toMatchObject({
      state: 'failed',
      signal: 'SIGKILL',
      reason: 'interrupted: the agent stopped while it ran; what was left of it was killed',
    });
    expect(queue.get(uuid(5))).toMatchObject({
      state: 'failed',
      signal: null,
      reason: 'interrupted: the agent stopped while it ran',
    });
    expect(alive(otherPid)).toBe(true);
    expect(sink.events('cmd.interrupted').map((e) => [e.cmd, e.killed])).toEqual([
      [uuid(4), true],
      [uuid(5), false],
    ]);
  });
});
