/**
 * `npm run bench -- agent-sync`: how fast the agent moves variables between a gateway application and a
 * durable cloud, how quickly it answers a cloud push, and how much memory it holds. The agent runs as the
 * service does (a child process from `dist/`), against a private broker in its own process; every figure is
 * judged against a bare-mqtt.js baseline taken in the same run on the same broker. See bench/README.md.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { LocalClient } from '../agent/local/client.js';
import { type VarItem, encode, messageId } from '../protocol/index.js';
import { BareEcho, bareThroughput } from './support/bare-mqtt.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { DurableCloud } from './support/durable-cloud.js';
import { flashSection } from './support/flash.js';
import {
  type AgentProcess,
  type BenchBrokerKind,
  ROOT,
  prepareAgent,
  readCpuMs,
  readRss,
  spawnAgentProcess,
  startBenchBroker,
} from './support/processes.js';
import { type Row, formatTable, mb, median, percentile, round } from './support/report.js';

const TARGET = {
  changesPerSec: 10_000,
  shareOfBare: 0.5,
  p50Factor: 2,
  p50SlackMs: 2,
  /** `VmHWM` over the whole run, the burst of `--rss-changes` included (issue 15). */
  peakBytes: 64 * 1024 * 1024,
  /** `VmRSS` once the agent has been idle `--settle-ms` after the burst. */
  settledBytes: 56 * 1024 * 1024,
};

interface Options {
  broker: BenchBrokerKind;
  changes: number;
  rounds: number;
  window: number;
  samples: number;
  warmup: number;
  rssChanges: number;
  settleMs: number;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
  flash:
    | {
        changes: number;
        warmup: number;
        paceMs: number;
        burst: number;
        names: number;
        settings: boolean;
        dir: string | undefined;
      }
    | undefined;
}

const USAGE = `options:
  --broker mosquitto|aedes   the broker, each in its own process (default mosquitto)
  --changes N                changes per device-to-cloud round (default 10000)
  --rounds N                 rounds of agent and bare, alternated; medians are reported (default 5)
  --window N                 most requests or publishes outstanding at once (default 256)
  --samples N                push round trips measured, after --warmup N more (default 1000, 100)
  --rss-changes N            changes before the second memory reading (default 100000)
  --settle-ms N              idle time after them before the last memory reading (default 10000)
  --tmp DIR                  where the agent's and the cloud's databases go (default the system's temp folder)
  --source                   run the agent from TypeScript through tsx instead of dist/
  --cpu-prof                 write a V8 CPU profile of the agent to .bench/profiles/
  --node-arg=ARG             pass ARG to node when starting the agent (repeatable; e.g. a V8 heap flag)
  --flash-changes N          flash: changes made one at a time, each acknowledged before the next (default 1000)
  --flash-pace-ms N          flash: pause after each of them, as on a gateway whose changes are apart (default 5)
  --flash-warmup N           flash: changes before them, so that SQLite's log is being written over (default 1100)
  --flash-burst N            flash: changes of the burst, --window outstanding (default 5000)
  --flash-vars N             flash: distinct variables the changes go to in turn (default 50)
  --flash-settings           flash: also the bare loop under other SQLite settings (a table of its own)
  --flash-dir DIR            flash: put the databases in DIR (default: a loop-mounted ext4 as root, else --tmp)
  --no-flash                 skip the flash figures`;

function parseOptions(args: string[]): Options {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        broker: { type: 'string', default: 'mosquitto' },
        changes: { type: 'string', default: '10000' },
        rounds: { type: 'string', default: '5' },
        window: { type: 'string', default: '256' },
        samples: { type: 'string', default: '1000' },
        warmup: { type: 'string', default: '100' },
        'rss-changes': { type: 'string', default: '100000' },
        'settle-ms': { type: 'string', default: '10000' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
        'cpu-prof': { type: 'boolean', default: false },
        'node-arg': { type: 'string', multiple: true, default: [] },
        'flash-changes': { type: 'string', default: '1000' },
        'flash-pace-ms': { type: 'string', default: '5' },
        'flash-warmup': { type: 'string', default: '1100' },
        'flash-burst': { type: 'string', default: '5000' },
        'flash-vars': { type: 'string', default: '50' },
        'flash-settings': { type: 'boolean', default: false },
        'flash-dir': { type: 'string' },
        'no-flash': { type: 'boolean', default: false },
      },
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = (key: string, v: string, min: number) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min)
      throw new UsageError(`--${key} must be an integer of at least ${min}\n${USAGE}`);
    return n;
  };
  if (parsed.broker !== 'mosquitto' && parsed.broker !== 'aedes') {
    throw new UsageError(`--broker must be mosquitto or aedes\n${USAGE}`);
  }
  return {
    broker: parsed.broker,
    changes: int('changes', parsed.changes, 1),
    rounds: int('rounds', parsed.rounds, 1),
    window: int('window', parsed.window, 1),
    samples: int('samples', parsed.samples, 1),
    warmup: int('warmup', parsed.warmup, 0),
    rssChanges: int('rss-changes', parsed['rss-changes'], 1),
    settleMs: int('settle-ms', parsed['settle-ms'], 0),
    tmp: parsed.tmp ?? tmpdir(),
    source: parsed.source,
    cpuProf: parsed['cpu-prof'],
    nodeArgs: parsed['node-arg'],
    flash: parsed['no-flash']
      ? undefined
      : {
          changes: int('flash-changes', parsed['flash-changes'], 1),
          warmup: int('flash-warmup', parsed['flash-warmup'], 0),
          paceMs: int('flash-pace-ms', parsed['flash-pace-ms'], 0),
          burst: int('flash-burst', parsed['flash-burst'], 1),
          names: int('flash-vars', parsed['flash-vars'], 1),
          settings: parsed['flash-settings'],
          dir: parsed['flash-dir'],
        },
  };
}

interface AgentStatus {
  deviceId: string;
  state: string;
  pending: { pushes: number; syncs: number };
  sync: Record<string, number>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` on the real clock; a benchmark may wait like this, a test never does. */
async function until(check: () => boolean | Promise<boolean>, what: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

async function connectWhenUp(path: string, agent: AgentProcess): Promise<LocalClient> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      return await LocalClient.connect(path);
    } catch (err) {
      if (Date.now() > deadline)
        throw new Error(`the agent did not open its socket: ${agent.output()}`, { cause: err });
      await sleep(50);
    }
  }
}

const valueOf = (i: number) => `{"temp":21.5,"seq":${i}}`;
const nameOf = (prefix: string, i: number) => `${prefix}.v${i}`;

interface AgentRun {
  /** From the first request until every change is acknowledged by the durable cloud, in ms. */
  ms: number;
  /** From the first request until the last one was answered (committed on the gateway), in ms. */
  localMs: number;
  /** CPU time the agent process used during the run, in ms. */
  agentCpuMs: number;
  /** CPU time this process (the driver and the cloud) used during the run, in ms. */
  driverCpuMs: number;
}

/**
 * Sets `n` variables through the local socket with at most `window` requests outstanding, then waits until
 * the agent has recorded every change as acknowledged (`pending.pushes` is 0), which the cloud sends only after
 * its commit.
 */
async function agentThroughput(
  client: LocalClient,
  agent: AgentProcess,
  cloud: DurableCloud,
  deviceId: string,
  prefix: string,
  n: number,
  window: number,
): Promise<AgentRun> {
  const cpu0 = readCpuMs(agent.pid);
  const driver0 = process.cpuUsage();
  const started = performance.now();
  await new Promise<void>((resolve, reject) => {
    let next = 0;
    let done = 0;
    const launch = () => {
      while (next < n && next - done < window) {
        const i = next++;
        client.set('d', nameOf(prefix, i), valueOf(i)).then(() => {
          if (++done === n) resolve();
          else launch();
        }, reject);
      }
    };
    launch();
  });
  const localMs = performance.now() - started;
  await until(
    async () => (await client.status<AgentStatus>()).pending.pushes === 0,
    `the agent to record ${n} acks (${prefix})`,
  );
  const ms = performance.now() - started;
  const driver = process.cpuUsage(driver0);
  const agentCpuMs = readCpuMs(agent.pid) - cpu0;
  const committed = cloud.committedCount(deviceId, `${prefix}.`);
  if (committed !== n) throw new Error(`the cloud committed ${committed} of ${n} changes (${prefix})`);
  return { ms, localMs, agentCpuMs, driverCpuMs: (driver.user + driver.system) / 1000 };
}

/** The bytes the baseline publishes per change: a vars message with the same item the agent would send. */
function barePayloads(prefix: string, n: number): Buffer[] {
  const time = Date.now();
  return Array.from({ length: n }, (_, i) => {
    const item: VarItem = {
      kind: 'push',
      type: 'd',
      name: nameOf(prefix, i),
      value: valueOf(i),
      time,
      origin: 'device',
    };
    return encode('up/vars', { id: messageId(), items: [item] });
  });
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const prepared = prepareAgent(opts.source);
  console.log(`agent-sync: agent from ${prepared.runtime} (${prepared.note}), broker ${opts.broker}`);
  console.log('note: the machine may be shared; figures are noisy, compare ratios taken in the same run.');

  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }

  const broker = await startBenchBroker(opts.broker, cleanup);
  const cloud = await DurableCloud.start(broker.url, join(tmp, 'cloud/cloud.db'));
  cleanup.add('close the cloud', () => cloud.close());
  const agent = spawnAgentProcess(
    {
      runtime: prepared.runtime,
      mqttUrl: broker.url,
      stateDir: join(tmp, 'agent'),
      cpuProfDir,
      nodeArgs: opts.nodeArgs,
    },
    cleanup,
  );
  console.log(`agent: node ${agent.nodeArgs.join(' ')}`.trimEnd());
  const client = await connectWhenUp(agent.socket, agent);
  cleanup.add('close the local client', () => client.close());
  const { deviceId } = await client.status<AgentStatus>();
  await until(async () => (await client.status<AgentStatus>()).state === 'connected', 'the agent to connect');
  await until(() => cloud.hasHello(deviceId), 'the hello');
  const rssStart = readRss(agent.pid);

  // Warm-up of both paths (JIT, SQLite caches, TCP), not measured: one round's worth, since shorter warm-ups
  // left the first measured rounds of both visibly slower.
  const warm = opts.changes;
  await bareThroughput(broker.url, barePayloads('warm', warm), opts.window);
  await agentThroughput(client, agent, cloud, deviceId, 'warm', warm, opts.window);

  // 1. Device to cloud: agent and bare alternated, so that both see the same load from the rest of the machine.
  const agentRuns: AgentRun[] = [];
  const bareRates: number[] = [];
  for (let r = 0; r < opts.rounds; r++) {
    const payloads = barePayloads(`b${r}`, opts.changes);
    const doBare = async () =>
      bareRates.push(opts.changes / ((await bareThroughput(broker.url, payloads, opts.window)) / 1000));
    const doAgent = async () =>
      agentRuns.push(await agentThroughput(client, agent, cloud, deviceId, `r${r}`, opts.changes, opts.window));
    if (r % 2 === 0) {
      await doBare();
      await doAgent();
    } else {
      await doAgent();
      await doBare();
    }
  }
  const agentRates = agentRuns.map((x) => opts.changes / (x.ms / 1000));
  const agentRate = median(agentRates);
  const bareRate = median(bareRates);
  const rateRatio = agentRate / bareRate;
  const agentCpuPerChangeUs = median(agentRuns.map((x) => (x.agentCpuMs * 1000) / opts.changes));
  const driverCpuPerChangeUs = median(agentRuns.map((x) => (x.driverCpuMs * 1000) / opts.changes));
  const localShare = median(agentRuns.map((x) => x.localMs / x.ms));
  const rssAfterRounds = readRss(agent.pid);

  // 2. Cloud to device: one push at a time, alternated with a bare round trip of the same bytes.
  const echo = await BareEcho.start(broker.url);
  cleanup.add('close the echo clients', () => echo.close());
  const payload = DurableCloud.pushPayload('lat', valueOf(0));
  const agentLat: number[] = [];
  const bareLat: number[] = [];
  for (let i = 0; i < opts.warmup + opts.samples; i++) {
    const measure = i >= opts.warmup;
    const one = async (which: 'agent' | 'bare') => {
      const ms = which === 'agent' ? await cloud.push(deviceId, 'lat', valueOf(i)) : await echo.once(payload);
      if (measure) (which === 'agent' ? agentLat : bareLat).push(ms);
    };
    await one(i % 2 === 0 ? 'agent' : 'bare');
    await one(i % 2 === 0 ? 'bare' : 'agent');
  }
  const lat = {
    agentP50: percentile(agentLat, 50),
    agentP99: percentile(agentLat, 99),
    bareP50: percentile(bareLat, 50),
    bareP99: percentile(bareLat, 99),
  };
  const p50Limit = TARGET.p50Factor * lat.bareP50 + TARGET.p50SlackMs;

  // 3. Memory after many changes.
  const rssRun = await agentThroughput(client, agent, cloud, deviceId, 'm', opts.rssChanges, opts.window);
  const rssAfter = readRss(agent.pid);
  // What a gateway keeps once the burst is over: V8 returns memory after some seconds of low allocation.
  const settled: number[] = [];
  for (let t = 0; t < opts.settleMs; t += 1000) {
    await sleep(1000);
    settled.push(readRss(agent.pid).rss);
  }
  const rssSettled = settled.at(-1) ?? rssAfter.rss;
  // VmHWM now: the highest resident size of the whole run, start, rounds, pushes, burst and settling.
  const rssPeak = readRss(agent.pid).peak;
  const status = await client.status<AgentStatus>();
  const totalChanges = warm + opts.rounds * opts.changes + opts.rssChanges;

  client.close();
  await agent.stop();
  const warnings = agent
    .output()
    .split('\n')
    .filter((l) => l.trim().length > 0);

  // 4. Flash: bytes written per change by a fresh agent, against a bare SQLite loop (bench/support/flash.ts).
  const flash = opts.flash
    ? await flashSection(
        { ...opts.flash, window: opts.window },
        {
          runtime: prepared.runtime,
          mqttUrl: broker.url,
          hasHello: (id) => cloud.hasHello(id),
          nodeArgs: opts.nodeArgs,
        },
        tmp,
        cleanup,
      )
    : undefined;

  const met = {
    throughput: agentRate >= TARGET.changesPerSec && rateRatio >= TARGET.shareOfBare,
    pushP50: lat.agentP50 <= p50Limit,
    rssPeak: rssPeak <= TARGET.peakBytes,
    rssSettled: rssSettled <= TARGET.settledBytes,
    flash: flash?.met ?? true,
  };
  const allMet = Object.values(met).every(Boolean);
  const f = (n: number) => String(round(n));
  const rows: Row[] = [
    {
      figure: `device→cloud changes/s (median of ${opts.rounds})`,
      measured: String(Math.round(agentRate)),
      baseline: `${Math.round(bareRate)} bare`,
      ratio: f(rateRatio),
      target: `≥ ${TARGET.changesPerSec} and ≥ ${TARGET.shareOfBare} × bare`,
      met: met.throughput,
    },
    {
      figure: 'agent CPU per change (µs)',
      measured: f(agentCpuPerChangeUs),
      baseline: `${f(driverCpuPerChangeUs)} driver+cloud`,
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: 'cloud→device push p50 (ms)',
      measured: f(lat.agentP50),
      baseline: `${f(lat.bareP50)} bare`,
      ratio: f(lat.agentP50 / lat.bareP50),
      target: `≤ 2 × bare + 2 = ${f(p50Limit)}`,
      met: met.pushP50,
    },
    {
      figure: 'cloud→device push p99 (ms)',
      measured: f(lat.agentP99),
      baseline: `${f(lat.bareP99)} bare`,
      ratio: f(lat.agentP99 / lat.bareP99),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'agent RSS after start',
      measured: mb(rssStart.rss),
      baseline: '',
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: `agent RSS after ${opts.rssChanges} changes`,
      measured: mb(rssAfter.rss),
      baseline: '',
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      // With --settle-ms 0 this is the reading right after the burst, judged all the same.
      figure: opts.settleMs > 0 ? `agent RSS ${opts.settleMs / 1000} s later, idle` : 'agent RSS settled (no wait)',
      measured: mb(rssSettled),
      baseline: '',
      ratio: '',
      target: `≤ ${mb(TARGET.settledBytes)}`,
      met: met.rssSettled,
    },
    {
      figure: 'agent RSS peak of the run (VmHWM)',
      measured: mb(rssPeak),
      baseline: '',
      ratio: '',
      target: `≤ ${mb(TARGET.peakBytes)}`,
      met: met.rssPeak,
    },
  ];
  if (flash) rows.push(...flash.rows);
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  if (flash && flash.settingsRows.length > 0) {
    console.log('flash: bytes per change of the bare loop under other SQLite settings (write_bytes; device)');
    console.log(formatTable(flash.settingsRows));
    console.log('');
  }
  if (warnings.length > 0) console.log(`the agent logged ${warnings.length} warning lines; last: ${warnings.at(-1)}`);
  if (cpuProfDir) console.log(`agent CPU profile written to ${cpuProfDir}`);
  console.log(
    JSON.stringify({
      bench: 'agent-sync',
      broker: opts.broker,
      agentRuntime: prepared.runtime,
      options: {
        changes: opts.changes,
        rounds: opts.rounds,
        window: opts.window,
        samples: opts.samples,
        warmup: opts.warmup,
        rssChanges: opts.rssChanges,
        settleMs: opts.settleMs,
        tmp: opts.tmp,
      },
      agentNodeArgs: agent.nodeArgs,
      deviceToCloud: {
        agentChangesPerSec: round(agentRate),
        bareChangesPerSec: round(bareRate),
        ratio: round(rateRatio),
        agentRounds: agentRates.map((x) => round(x)),
        bareRounds: bareRates.map((x) => round(x)),
        localCommitShare: round(localShare),
        agentCpuPerChangeUs: round(agentCpuPerChangeUs),
        driverCpuPerChangeUs: round(driverCpuPerChangeUs),
        target: { changesPerSec: TARGET.changesPerSec, shareOfBare: TARGET.shareOfBare },
        met: met.throughput,
      },
      push: {
        agentP50Ms: round(lat.agentP50),
        agentP99Ms: round(lat.agentP99),
        bareP50Ms: round(lat.bareP50),
        bareP99Ms: round(lat.bareP99),
        p50Ratio: round(lat.agentP50 / lat.bareP50),
        p99Ratio: round(lat.agentP99 / lat.bareP99),
        p50LimitMs: round(p50Limit),
        met: met.pushP50,
      },
      rss: {
        afterStartBytes: rssStart.rss,
        afterRoundsBytes: rssAfterRounds.rss,
        afterChangesBytes: rssAfter.rss,
        settledBytes: rssSettled,
        settledSeries: settled,
        peakBytes: rssPeak,
        peakAfterChangesBytes: rssAfter.peak,
        changes: opts.rssChanges,
        totalChanges,
        longRunChangesPerSec: round(opts.rssChanges / (rssRun.ms / 1000)),
        longRunAgentCpuPerChangeUs: round((rssRun.agentCpuMs * 1000) / opts.rssChanges),
        target: { peakBytes: TARGET.peakBytes, settledBytes: TARGET.settledBytes },
        peakMet: met.rssPeak,
        settledMet: met.rssSettled,
        met: met.rssPeak && met.rssSettled,
      },
      agentCounters: status.sync,
      cloudCounters: cloud.counters,
      cloudCommits: cloud.commitStats,
      flash: flash?.json ?? null,
      agentWarnings: warnings.length,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
