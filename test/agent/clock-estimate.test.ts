/**
 * The agent's estimate of the cloud's clock (agent/clock.ts, docs/sync.md#clocks) with its clocks injected: which
 * samples it takes, and what survives a restart in the same boot and after a reboot. The database is a real SQLite
 * file with the agent's migrations.
 */
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { CloudClock } from '../../agent/clock.js';
import { AGENT_MIGRATIONS } from '../../agent/migrations.js';
import { createLogger } from '../../lib/log.js';
import { GroupCommitter, openDatabase } from '../../lib/sqlite.js';
import { LogSink, tempDir } from '../support/agent.js';

const CLOUD = Date.parse('2030-01-01T00:00:00Z');
const HOUR = 3_600_000;

function harness(path: string, boot: string | undefined) {
  const t = { own: CLOUD + HOUR, mono: 5_000 };
  const db = openDatabase(path, AGENT_MIGRATIONS);
  const commit = new GroupCommitter(db);
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const clock = new CloudClock({ db, commit, log, own: () => t.own, monotonic: () => t.mono, boot });
  /** Both clocks move on by `ms`. */
  const pass = (ms: number) => {
    t.own += ms;
    t.mono += ms;
  };
  const close = async () => {
    await commit.run(() => undefined);
    commit.close();
    db.close();
  };
  return { t, clock, sink, pass, close };
}

describe('the estimate of the cloud clock', () => {
  it('uses its own clock until a sample, then the cloud time on the monotonic clock', async () => {
    const h = harness(join(tempDir(), 'agent.db'), 'boot-1');
    expect(h.clock.verified).toBe(false);
    expect(h.clock.now()).toBe(CLOUD + HOUR);
    expect(h.clock.status()).toEqual({ source: 'own', offsetMs: null, ageMs: null });

    h.clock.learn(CLOUD);
    expect(h.clock.verified).toBe(true);
    expect(h.clock.now()).toBe(CLOUD);
    expect(h.sink.events('clock.offset')).toEqual([expect.objectContaining({ offsetMs: -HOUR, previousMs: null })]);

    // The wall clock steps back an hour (NTP): corrected time goes on with the monotonic clock.
    h.pass(10_000);
    h.t.own -= HOUR;
    expect(h.clock.now()).toBe(CLOUD + 10_000);
    expect(h.clock.status()).toEqual({ source: 'cloud', offsetMs: 0, ageMs: 10_000 });
    await h.close();
  });

  it('keeps the highest estimate, ignores slower deliveries and implausible stamps, follows a step back', async () => {
    const h = harness(join(tempDir(), 'agent.db'), 'boot-1');
    h.clock.learn(CLOUD);
    h.pass(1_000);
    // 1.5 s in transit: lower than the estimate by less than the slack, so ignored.
    h.clock.learn(CLOUD + 1_000 - 1_500);
    expect(h.clock.now()).toBe(CLOUD + 1_000);
    // A faster one raises it.
    h.clock.learn(CLOUD + 1_000 + 40);
    expect(h.clock.now()).toBe(CLOUD + 1_040);
    // Not a clock at all.
    h.clock.learn(1_000);
    expect(h.clock.now()).toBe(CLOUD + 1_040);
    // The cloud's clock stepped back 10 s: taken, and logged.
    h.clock.learn(CLOUD + 1_000 - 10_000);
    expect(h.clock.now()).toBe(CLOUD - 9_000);
    expect(h.sink.events('clock.offset')).toHaveLength(2);
    await h.close();
  });

  it('is used again after a restart in the same boot, and not after a reboot', async () => {
    const path = join(tempDir(), 'agent.db');
    const first = harness(path, 'boot-1');
    first.clock.learn(CLOUD);
    await first.close();

    // The same boot: the monotonic clock went on, so the saved estimate still holds.
    const again = harness(path, 'boot-1');
    again.t.mono = 65_000;
    expect(again.clock.verified).toBe(true);
    expect(again.clock.now()).toBe(CLOUD + 60_000);
    expect(again.clock.status()).toMatchObject({ source: 'saved', ageMs: 60_000 });
    await again.close();

    // Another boot (or a system without boot ids): the gateway's own clock, unverified.
    for (const boot of ['boot-2', undefined]) {
      const rebooted = harness(path, boot);
      expect(rebooted.clock.verified).toBe(false);
      expect(rebooted.clock.now()).toBe(CLOUD + HOUR);
      await rebooted.close();
    }
  });
});
