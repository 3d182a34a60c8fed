/**
 * Reconnecting after a broker outage (docs/agent.md, reconnect backoff): the schedule under fake time, and a real
 * aedes broker stopped and started again on the same port while a device's uplink was connected and healthy (its
 * timers fake, its sockets real).
 */
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ReconnectBackoff, Uplink, backoffDelay } from '../../agent/uplink.js';
import { createLogger } from '../../lib/log.js';
import { messageId } from '../../protocol/index.js';
import { startAedes } from '../support/brokers.js';
import { LogSink } from '../support/agent.js';
import { until } from '../support/wait.js';

/** Captured before any test fakes the timers. */
const realSetTimeout = globalThis.setTimeout;

const POLICY = { minMs: 1000, maxMs: 60_000, fastMaxMs: 5000, fastForMs: 120_000, healthyAfterMs: 60_000 };

/** The delays of `n` attempts, the clock moving on by each delay as the uplink's timer would. */
function delays(b: ReconnectBackoff, n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const d = b.next();
    out.push(d);
    vi.advanceTimersByTime(d);
  }
  return out;
}

describe('the reconnect schedule', () => {
  afterEach(() => vi.useRealTimers());

  it('without a healthy connection: exponential from the minimum to the maximum', () => {
    vi.useFakeTimers();
    const b = new ReconnectBackoff(POLICY, () => 1, Date.now);
    expect(delays(b, 8)).toEqual([1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]);
  });

  it('after losing a connection that was up a minute: capped at 5 s for two minutes, then growing', () => {
    vi.useFakeTimers();
    const b = new ReconnectBackoff(POLICY, () => 1, Date.now);
    b.connected();
    vi.advanceTimersByTime(60_000);
    b.lost();
    expect(b.fast).toBe(true);
    // 24 attempts of 5 s fill the two minutes; then the delays grow on from twice the fast cap.
    const d = delays(b, 29);
    expect(d.slice(0, 24)).toEqual(Array<number>(24).fill(5000));
    expect(d.slice(24)).toEqual([16_000, 32_000, 60_000, 60_000, 60_000]);
    expect(b.fast).toBe(false);
  });

  it('spreads the fast delays with full jitter between half the minimum and the fast cap', () => {
    vi.useFakeTimers();
    const seq = [0, 0.25, 0.5, 0.999];
    let i = 0;
    const b = new ReconnectBackoff(POLICY, () => seq[i++ % seq.length]!, Date.now);
    b.connected();
    vi.advanceTimersByTime(61_000);
    b.lost();
    expect(delays(b, 4)).toEqual([500, 1625, 2750, 4996]);
  });

  it('a connection lost before it was healthy gets the ordinary schedule; a new connection starts over', () => {
    vi.useFakeTimers();
    const b = new ReconnectBackoff(POLICY, () => 1, Date.now);
    b.connected();
    vi.advanceTimersByTime(59_999);
    b.lost();
    expect(b.fast).toBe(false);
    expect(delays(b, 4)).toEqual([1000, 2000, 4000, 8000]);
    b.connected();
    vi.advanceTimersByTime(120_000);
    b.lost();
    expect(delays(b, 2)).toEqual([5000, 5000]);
    // A short connection during the fast phase does not extend it, and ends it.
    b.connected();
    b.lost();
    expect(delays(b, 2)).toEqual([1000, 2000]);
  });

  it('never exceeds the long cap when the fast cap is above it', () => {
    vi.useFakeTimers();
    const b = new ReconnectBackoff({ ...POLICY, maxMs: 500, minMs: 50 }, () => 1, Date.now);
    b.connected();
    vi.advanceTimersByTime(60_000);
    b.lost();
    expect(delays(b, 3)).toEqual([500, 500, 500]);
    expect(backoffDelay(3, 50, 500, () => 1)).toBe(400);
  });
});

describe('a broker outage', () => {
  afterEach(() => vi.useRealTimers());

  /** Captured before the timers are faked: waiting for real I/O. */
  const realSleep = (ms: number) => new Promise<void>((r) => realSetTimeout(r, ms));

  it('a device whose connection was healthy is back within the fast cap of the broker', async () => {
    const broker = await startAedes();
    const deviceId = randomUUID();
    const sink = new LogSink();
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
    const scheduled = () => sink.events('mqtt.reconnect_scheduled');
    // The time of the uplink's timers: the fake clock once it is installed (after the first connection).
    const now = () => vi.getMockedSystemTime()?.getTime() ?? Date.now();
    // The longest delay every time (random = 1): with the ordinary schedule from 200 ms, the attempts after the
    // outage fall at 0.2, 0.6, 1.4, 3.0, 6.2 and 12.6 s, so a broker back after 6.5 s would be found 6 s late.
    const uplink = new Uplink({
      url: broker.url,
      deviceId,
      username: deviceId,
      password: 'secret-reconnect',
      keepaliveSec: 30,
      connectTimeoutMs: 2000,
      backoffMinMs: 200,
      backoffMaxMs: 60_000,
      backoffFastMaxMs: 1000,
      backoffFastForMs: 60_000,
      healthyAfterMs: 300,
      rejectUnauthorized: true,
      hello: () => ({
        id: messageId(),
        protocol: 1,
        deviceId,
        authcode: '0123456789abcdef',
        platform: 'test',
        agentVersion: '0.0.0',
        fwVersion: '0',
        mode: 'connected',
        bootTime: 1,
        ts: Date.now(),
      }),
      log,
      random: () => 1,
      now,
    });
    try {
      uplink.start();
      await until(() => uplink.connected, 'the first connection');
      // From here the reconnect timers (and the connect timeouts) are fake; the sockets are real.
      vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
      await vi.advanceTimersByTimeAsync(400);
      await broker.stop();
      while (uplink.connected) await realSleep(5);

      // The outage: each attempt is refused at once, and schedules the next. Fired one timer at a time, each
      // attempt is given the real time it needs before the clock moves on.
      const down = now();
      while (now() - down < 6500) {
        const before = scheduled().length;
        await vi.advanceTimersToNextTimerAsync();
        const patience = Date.now() + 5000;
        while (scheduled().length === before && Date.now() < patience) await realSleep(2);
      }
      expect(scheduled().length).toBeGreaterThanOrEqual(4);
      expect(scheduled().every((e) => e.fast === true && (e.delayMs as number) <= 1000)).toBe(true);

      // The broker is back: the attempt already scheduled reaches it.
      const back = now();
      await broker.start();
      while (!uplink.connected && now() - back <= 10_000) {
        await vi.advanceTimersToNextTimerAsync();
        const patience = Date.now() + 2000;
        while (!uplink.connected && Date.now() < patience) await realSleep(2);
      }
      expect(uplink.connected).toBe(true);
      // Within the fast cap, by the uplink's clock.
      expect(now() - back).toBeLessThanOrEqual(1000);
      expect(uplink.connects).toBe(2);
    } finally {
      vi.useRealTimers();
      await uplink.stop();
      await broker.close();
    }
  }, 30_000);
});
