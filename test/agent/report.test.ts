/**
 * The agent's periodic `meta` report (agent/report.ts): one at every connect, then one every
 * `report.intervalSec` while connected, none while disconnected or with 0; and, from a real agent through a live
 * bridge, the figures stored as `meta` variables without history entries.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { monotonicMs } from '../../agent/clock.js';
import { loadAgentConfig } from '../../agent/config.js';
import { MetaReporter, type ReportFigures } from '../../agent/report.js';
import { createLogger } from '../../lib/log.js';
import { MetaMessage } from '../../protocol/index.js';
import { LogSink, type TestAgent, startAgent } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

const log = createLogger({ level: 'silent', pretty: 'never', base: {}, destination: new LogSink() });

/** An `up/meta` publisher that records what it is given. */
class Recorder {
  connected = true;
  readonly sent: MetaMessage[] = [];
  publish(payload: MetaMessage): boolean {
    if (!this.connected) return false;
    this.sent.push(MetaMessage.parse(payload));
    return true;
  }
}

describe('MetaReporter', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  const figures: ReportFigures = { uptime: 12, pending: 3, queue: 1, rss: 45_000_000 };

  it('reports at connect, then every interval while connected', () => {
    vi.useFakeTimers();
    const out = new Recorder();
    const r = new MetaReporter({ intervalMs: 300_000, reporter: out, figures: () => figures, now: Date.now, log });
    expect(out.sent).toHaveLength(0);
    r.onConnected();
    expect(out.sent).toHaveLength(1);
    expect(out.sent[0]!.meta).toEqual({ uptime: '12', pending: '3', queue: '1', rss: '45000000' });
    vi.advanceTimersByTime(299_999);
    expect(out.sent).toHaveLength(1);
    vi.advanceTimersByTime(1);
    expect(out.sent).toHaveLength(2);
    // Disconnected: the snapshot is skipped, not queued.
    out.connected = false;
    vi.advanceTimersByTime(600_000);
    expect(out.sent).toHaveLength(2);
    // A reconnect reports at once, and counts the interval from there.
    out.connected = true;
    vi.advanceTimersByTime(100_000);
    r.onConnected();
    expect(out.sent).toHaveLength(3);
    vi.advanceTimersByTime(200_000);
    expect(out.sent).toHaveLength(3);
    vi.advanceTimersByTime(100_000);
    expect(out.sent).toHaveLength(4);
    expect(r.sent).toBe(4);
    r.stop();
    vi.advanceTimersByTime(3_000_000);
    r.onConnected();
    expect(out.sent).toHaveLength(4);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('never reports with an interval of 0', () => {
    vi.useFakeTimers();
    const out = new Recorder();
    const r = new MetaReporter({ intervalMs: 0, reporter: out, figures: () => figures, now: Date.now, log });
    r.onConnected();
    vi.advanceTimersByTime(86_400_000);
    expect(out.sent).toHaveLength(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('is configured by report.intervalSec, 300 by default, 0 to switch off', () => {
    const load = (flags: Record<string, unknown>) => loadAgentConfig({ flags: { stateDir: '/x', ...flags }, env: {} });
    expect(load({}).report.intervalSec).toBe(300);
    expect(load({ 'report.intervalSec': 0 }).report.intervalSec).toBe(0);
    expect(() => load({ 'report.intervalSec': -1 })).toThrow(/report\.intervalSec/);
    expect(() => load({ 'report.intervalSec': 1.5 })).toThrow(/report\.intervalSec/);
  });
});

describe('the report of a real agent', () => {
  let live: LiveBridge | undefined;
  let agent: TestAgent | undefined;

  afterEach(async () => {
    vi.useRealTimers();
    await agent?.stop();
    await live?.close();
    agent = live = undefined;
  });

  const metaOf = async (deviceId: string, name: string) => {
    const rec = await live!.bridge.store.devices.getVar(deviceId, 'meta', name);
    return rec?.value?.toString('utf8');
  };

  it('reaches the bridge at connect and at each interval, stored without history', async () => {
    live = await startLiveBridge();
    // A one-second interval on fake intervals, and the agent's monotonic clock (its uptime) moved with them: the
    // MQTT client's keepalive runs on intervals too, so a fake clock moved five minutes would drop the connection
    // (the default interval is tested on a fake clock above).
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    let moved = 0;
    agent = await startAgent({
      mqttUrl: live.mqttUrl,
      flags: { 'udp.enabled': false, 'report.intervalSec': 1 },
      monotonic: () => monotonicMs() + moved,
    });
    const id = agent.agent.identity.deviceId;
    const reports = () => agent!.sink.events('report.sent');
    await until(() => metaOf(id, 'rss'), 'the report at connect');
    expect(Number(await metaOf(id, 'rss'))).toBeGreaterThan(1_000_000);
    expect(await metaOf(id, 'queue')).toBe('0');
    const link = live.bridge.link;
    const received = link.received['up/meta'] ?? 0;
    const first = reports().length;
    expect(first).toBeGreaterThanOrEqual(1);

    // One interval later, the next report; the bridge holds the figures of the last one.
    moved += 1000;
    await vi.advanceTimersByTimeAsync(1000);
    await until(() => (link.received['up/meta'] ?? 0) > received, 'the next report at the bridge');
    expect(reports().length).toBeGreaterThan(first);
    await until(async () => {
      const last = reports().at(-1)!;
      for (const n of ['uptime', 'pending', 'queue', 'rss'])
        if ((await metaOf(id, n)) !== String(last[n])) return false;
      return true;
    }, 'the reported figures stored');
    expect(Number(await metaOf(id, 'uptime'))).toBeGreaterThanOrEqual(1);
    for (const name of ['uptime', 'pending', 'queue', 'rss']) {
      expect(await live.bridge.store.devices.history(id, 'meta', name, 10), name).toEqual([]);
    }
    // The other entries a device reports keep their history.
    expect(await live.bridge.store.devices.history(id, 'meta', 'fwversion', 10)).not.toEqual([]);
  });

  it('sends none with report.intervalSec 0', async () => {
    live = await startLiveBridge();
    agent = await startAgent({ mqttUrl: live.mqttUrl, flags: { 'udp.enabled': false, 'report.intervalSec': 0 } });
    const id = agent.agent.identity.deviceId;
    // A round trip through the bridge after the connect: a report at connect would have come before it.
    await agent.agent.vars.set('d', 'probe', Buffer.from('1'));
    await until(() => live!.bridge.store.devices.getVar(id, 'd', 'probe'), 'the variable at the bridge');
    await until(() => agent!.agent.vars.pending().pushes === 0 || undefined, 'the acknowledgement');
    for (const name of ['uptime', 'pending', 'queue', 'rss']) expect(await metaOf(id, name), name).toBeUndefined();
  });
});
