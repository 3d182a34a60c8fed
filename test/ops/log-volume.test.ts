/**
 * The agent's log in production (docs/operations.md, "Reading the log"): an idle, connected gateway logs nothing
 * at `info` however long it runs, and the JSON lines it writes read well through `pino-pretty`, the command the
 * docs give for `journalctl -u devcloud-agent -o cat | pino-pretty`.
 *
 * The idle hour runs on vitest's fake clock (timers and `Date`: the agent's intervals, the MQTT keepalive); the
 * broker, the sockets, SQLite and `setImmediate` stay real, and a round trip through the broker after every step
 * lets their I/O happen.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  type AgentProcess,
  ROOT,
  type TestAgent,
  spawnAgent,
  startAgent,
  tempDir,
  waitForSocket,
} from '../support/agent.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { missing } from '../support/system.js';
import { until } from '../support/wait.js';

/** Captured before timers are faked: waiting on the real clock. */
const realSetTimeout = globalThis.setTimeout;
/** A device nobody listens for: the round trips between fake steps go there. */
const NOBODY = '00000000-0000-4000-8000-000000000000';
const SHOWN = new Set(['info', 'warn', 'error', 'fatal']);
/** Run as docs/operations.md runs it: through node, since a release has no `node_modules/.bin`. */
const PINO_PRETTY = join(ROOT, 'node_modules/pino-pretty/bin.js');
const pinoPretty = (args: string[], input: string) =>
  execFileSync(process.execPath, [PINO_PRETTY, ...args], { input, encoding: 'utf8', env: { PATH: process.env.PATH } });

describe.skipIf(missing('mosquitto'))('the agent log of an idle gateway', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent | undefined;

  /** Polls on the real clock (`performance.now`: `Date` is fake here). */
  async function waitFor(check: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (!check()) {
      if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => realSetTimeout(r, 10));
    }
  }

  beforeEach(async () => {
    broker = await startBroker('mosquitto');
    cloud = await FakeCloud.start(broker.url);
  });

  afterEach(async () => {
    vi.useRealTimers();
    await agent?.stop();
    agent = undefined;
    await cloud?.close();
    await broker?.close();
  });

  it('stays silent at info through an hour connected with nothing to do', async () => {
    // Faked before the agent starts, so that every timer it sets (sync retries, command pruning, status reports,
    // the MQTT keepalive) runs on the fake clock, and the monotonic clock the agent measures intervals and the
    // cloud's time with (process.hrtime) moves with it. Production defaults otherwise.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date', 'hrtime'] });
    agent = await startAgent({ mqttUrl: broker.url, level: 'debug' });
    const a = agent.agent;
    const id = a.identity.deviceId;
    await waitFor(() => a.uplink.connected && cloud.device(id).hellos.length === 1, 'the agent online');
    // Settled: the first full sync acknowledged, nothing left to send.
    await waitFor(() => {
      const p = a.vars.pending();
      return p.pushes + p.syncs === 0;
    }, 'the first sync acknowledged');
    // The cloud's clock learnt from the answer to the hello (logged once, at info, as it should be).
    await waitFor(() => a.clock.status().source === 'cloud', "the cloud's clock learnt");
    const before = agent.sink.lines.length;
    expect(vi.getTimerCount(), 'the agent has timers on the fake clock').toBeGreaterThan(0);

    const hourMs = 3_600_000;
    const stepMs = 5000;
    for (let t = 0; t < hourMs; t += stepMs) {
      await vi.advanceTimersByTimeAsync(stepMs);
      await cloud.publishRaw(NOBODY, 'down/cmd', 'tick');
    }

    const idle = agent.sink.lines.slice(before);
    const shown = idle.filter((l) => SHOWN.has(String(l.level))).map((l) => `${String(l.level)} ${String(l.event)}`);
    expect(shown, 'lines at info and above while idle').toEqual([]);
    expect(a.status().uptimeMs, 'the hour passed for the agent').toBeGreaterThanOrEqual(hourMs);
    // Connected all along: the keepalive held on the fake clock and nothing reconnected.
    expect(a.uplink.connected).toBe(true);
    expect(cloud.device(id).hellos.length).toBe(1);
  });
});

describe('the agent log through pino-pretty', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let p: AgentProcess | undefined;

  afterEach(async () => {
    await p?.kill9();
    p = undefined;
    await cloud?.close();
    await broker?.close();
  });

  it('turns every JSON line of a real agent into a readable one, and keeps other lines', async () => {
    broker = await startBroker('aedes');
    cloud = await FakeCloud.start(broker.url);
    const stateDir = tempDir();
    p = spawnAgent(['run', '--state-dir', stateDir, '--mqtt-url', broker.url, '--udp-port', '0']);
    const client = await waitForSocket(p.socket, 30_000);
    const { deviceId } = await client.status<{ deviceId: string }>();
    client.close();
    await cloud.until(() => cloud.device(deviceId).state === 'online', 'the agent online');
    // A warning: a message the agent cannot read.
    await cloud.publishRaw(deviceId, 'down/cmd', 'not json');
    await until(() => p!.output().includes('"mqtt.drop"'), 'the mqtt.drop line');
    p.proc.kill('SIGTERM');
    expect((await p.exited).code).toBe(0);

    // What `journalctl -o cat` gives: the agent's lines, with one line of the service manager among them.
    const journal = `${p.output().trimEnd()}\nStarted devcloud-agent.service - devcloud agent.\n`;
    const lines = journal.split('\n').filter((l) => l.startsWith('{'));
    const events = lines.map((l) => (JSON.parse(l) as { event: string }).event);
    expect(events).toEqual(expect.arrayContaining(['agent.started', 'mqtt.connected', 'mqtt.drop', 'agent.stopped']));

    // The plain command: a header line per event with its time and level, then its fields.
    const plain = pinoPretty([], journal);
    expect(plain).not.toContain('{"level"');
    expect(plain.match(/^\[\d\d:\d\d:\d\d\.\d{3}\] (INFO|WARN|ERROR|FATAL):/gm)).toHaveLength(lines.length);
    expect(plain).toMatch(/^\[[\d:.]+\] WARN:\n {4}service: "devcloud-agent"\n(.*\n)*? {4}event: "mqtt\.drop"/m);
    expect(plain).toContain(`deviceId: "${deviceId}"`);
    expect(plain).toContain('Started devcloud-agent.service - devcloud agent.\n');

    // The compact one of docs/operations.md: one line per event, its name first.
    const compact = pinoPretty(['--singleLine', '--messageFormat', '{event}', '--ignore', 'service,event'], journal);
    const shown = compact.split('\n').filter((l) => l.startsWith('['));
    expect(shown.map((l) => /^\[[\d:.]+\] [A-Z]+: (\S+)/.exec(l)?.[1])).toEqual(events);
    expect(shown.find((l) => l.includes('mqtt.drop'))).toMatch(/^\[[\d:.]+\] WARN: mqtt\.drop \{.*"reason":/);
  });
});
