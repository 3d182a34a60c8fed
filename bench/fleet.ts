/**
 * `npm run bench -- fleet`: a fleet of simulated devices against the cloud. Devices speak `protocol/` from child
 * processes that hold many connections each (support/fleet-sim.ts); the cloud is one of the deployments of
 * `--scenario`:
 *
 * - `a`: one bridge as the service runs it (a child process from `dist/`) with SQLite and its embedded broker;
 * - `b`: one bridge with PostgreSQL and a private Mosquitto;
 * - `c`: two bridges with PostgreSQL and Mosquitto, in one MQTT 5 share group (docs/scaling.md); the same run
 *   measures `b` too, so that the ratio of two bridges to one is taken on the machine as it is at that moment.
 *
 * Every figure is taken against the baseline in the same run: the same simulator against a bare aedes broker
 * that answers hellos and pushes as the bridge does on the wire, with no work behind (support/fleet-echo-main.ts).
 * See bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { spawn } from 'node:child_process';
import { pino } from 'pino';
import { safeUrl } from '../lib/url.js';
import { PasswordHasher } from '../bridge/accounts/password.js';
import { ensureDefaultFrontend } from '../bridge/frontends/default.js';
import { openPostgresStore } from '../bridge/store/postgres/store.js';
import { SqliteStore } from '../bridge/store/sqlite.js';
import type { BridgeStore } from '../bridge/store/types.js';
import { freePort } from '../test/support/brokers.js';
import { LogTally, prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { checkLogLevel, intOption } from './support/options.js';
import {
  DEFAULT_SERVER_URL,
  PostgresCpu,
  createBenchDatabase,
  machineBusyMs,
  startFleetMosquitto,
} from './support/fleet-cloud.js';
import { type ConnectReport, type PushReport, type SimDevice, SimFleet } from './support/fleet-sim.js';
import { type ProbeRun, cookieOf, probe, send } from './support/http-load.js';
import { ROOT, canConnect, readCpuMs, readRss, stopChild } from './support/processes.js';
import { provisionDevice } from './support/seed.js';
import { type Row, formatTable, percentile, round } from './support/report.js';

const TARGET = {
  /** 10,000 devices connected in at most 10 s. */
  connectsPerSec: 1000,
  /** push → ack p99 at the steady rate, ms. */
  pushP99Ms: 50,
  /** `GET /0/devices/<id>` p99 while the fleet pushes, ms. */
  restP99Ms: 20,
  /** Bridge memory per idle connected device, bytes. */
  bytesPerDevice: 10 * 1024,
  /** The step search looks for the highest rate whose p99 stays under this, ms. */
  searchP99Ms: 100,
};
const LOGIN = 'fleet-owner@example.com';
const PASSWORD = 'bench-password-1';
/** A cheap scrypt for the one login: the figures are about devices (`accounts.scryptLogN` in the config). */
const SCRYPT = { logN: 10, r: 8, p: 1 };
/** The agent's default keepalive (agent/config.ts). */
const KEEPALIVE_SEC = 30;
const SETUP_TIMEOUT_MS = 30_000;

type Scenario = 'a' | 'b' | 'c';

const SCENARIOS: Record<Scenario, string> = {
  a: 'one bridge, SQLite, its embedded broker',
  b: 'one bridge, PostgreSQL, Mosquitto',
  c: 'two bridges, PostgreSQL, Mosquitto (and b in the same run, for the ratio)',
};

/** Devices by default: scenario a the issue's 10,000; b and c fewer, so that a run takes a few minutes. */
const DEFAULT_DEVICES: Record<Scenario, number> = { a: 10_000, b: 2_000, c: 2_000 };
/** The rate search's first step by default: b and c keep up with less than a. */
const DEFAULT_SEARCH_FROM: Record<Scenario, number> = { a: 500, b: 200, c: 200 };

interface Options {
  scenario: Scenario;
  devices: number;
  rate: number;
  durationS: number;
  warmupS: number;
  stepS: number;
  searchFrom: number;
  searchMax: number;
  search: boolean;
  baseline: boolean;
  probeRate: number;
  settleS: number;
  simProcs: number;
  connectWindow: number;
  own: number;
  logLevel: string;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
  /** The PostgreSQL server on which b and c make their database (and drop it). */
  databaseUrl: string;
  /** b and c: each bridge's `database.poolSize`; undefined leaves the bridge's default. */
  poolSize: number | undefined;
}

const USAGE = `options:
  --scenario a|b|c      a: one bridge, SQLite, embedded broker (default); b: one bridge, PostgreSQL, Mosquitto;
                        c: two bridges, PostgreSQL, Mosquitto, measured beside b in the same run
  --devices N           simulated devices (default 10000 for a, 2000 for b and c)
  --rate N              pushes per second, all devices together, in the steady phase (default 1000)
  --duration S          measured seconds of the steady phase (default 10)
  --warmup S            unmeasured seconds before it (default 2)
  --step-s S            measured seconds of each step of the rate search (default 4)
  --search-from N       the search's first rate (default 500 for a, 200 for b and c); each step is 1.5 times
                        the last
  --search-max N        the search's highest rate (default 8000)
  --no-search           skip the rate search
  --no-baseline         skip the bare broker (for profiling runs)
  --probe-rate N        GET /0/devices/<id> per second while measuring its latency (default 50)
  --settle-s S          idle seconds after connecting, before memory is read (default 5)
  --sim-procs N         simulator processes (default 2)
  --connect-window N    connection attempts in flight, in all (default 500)
  --own N               devices the REST user owns (default 10)
  --log-level LEVEL     the bridge's log level (default info, as the service runs)
  --tmp DIR             where the bridge's database goes (default the system's temp folder)
  --source              run the bridge from TypeScript through tsx instead of dist/
  --cpu-prof            write a V8 CPU profile of the bridge to .bench/profiles/
  --node-arg=ARG        pass ARG to node when starting the bridge (repeatable)
  --database-url URL    b and c: the PostgreSQL server where the benchmark makes its database and drops it
                        (default ${DEFAULT_SERVER_URL})
  --pool-size N         b and c: each bridge's database.poolSize (default: the bridge's own)`;

function parseOptions(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        scenario: { type: 'string', default: 'a' },
        devices: { type: 'string' },
        rate: { type: 'string', default: '1000' },
        duration: { type: 'string', default: '10' },
        warmup: { type: 'string', default: '2' },
        'step-s': { type: 'string', default: '4' },
        'search-from': { type: 'string' },
        'search-max': { type: 'string', default: '8000' },
        'no-search': { type: 'boolean', default: false },
        'no-baseline': { type: 'boolean', default: false },
        'probe-rate': { type: 'string', default: '50' },
        'settle-s': { type: 'string', default: '5' },
        'sim-procs': { type: 'string', default: '2' },
        'connect-window': { type: 'string', default: '500' },
        own: { type: 'string', default: '10' },
        'log-level': { type: 'string', default: 'info' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
        'cpu-prof': { type: 'boolean', default: false },
        'node-arg': { type: 'string', multiple: true, default: [] },
        'database-url': { type: 'string', default: DEFAULT_SERVER_URL },
        'pool-size': { type: 'string' },
      },
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = intOption(USAGE);
  const scenario = v.scenario;
  if (scenario !== 'a' && scenario !== 'b' && scenario !== 'c') throw new UsageError(`--scenario a|b|c\n${USAGE}`);
  checkLogLevel(v['log-level'], USAGE);
  const opts: Options = {
    scenario,
    devices: int('devices', v.devices ?? String(DEFAULT_DEVICES[scenario]), 1),
    rate: int('rate', v.rate, 1),
    durationS: int('duration', v.duration, 1),
    warmupS: int('warmup', v.warmup, 0),
    stepS: int('step-s', v['step-s'], 1),
    searchFrom: int('search-from', v['search-from'] ?? String(DEFAULT_SEARCH_FROM[scenario]), 1),
    searchMax: int('search-max', v['search-max'], 1),
    search: !v['no-search'],
    baseline: !v['no-baseline'],
    probeRate: int('probe-rate', v['probe-rate'], 1),
    settleS: int('settle-s', v['settle-s'], 0),
    simProcs: int('sim-procs', v['sim-procs'], 1),
    connectWindow: int('connect-window', v['connect-window'], 1),
    own: int('own', v.own, 1),
    logLevel: v['log-level'],
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
    databaseUrl: v['database-url'],
    poolSize: v['pool-size'] === undefined ? undefined : int('pool-size', v['pool-size'], 1),
  };
  if (opts.own > opts.devices) throw new UsageError(`--own must not exceed --devices\n${USAGE}`);
  return opts;
}

// ---- the fleet and the database ----

function makeFleet(n: number): SimDevice[] {
  return Array.from({ length: n }, () => ({
    id: randomUUID(),
    secret: randomBytes(32).toString('hex'),
    authcode: randomBytes(16).toString('hex'),
  }));
}

/**
 * The bridge's database before it starts, through its own store: the default frontend, the user whose REST
 * requests are measured (owner of the first `own` devices), and every device provisioned with its secret and
 * auth code and with the `meta` a device has after its first hello, marked disconnected: the fleet reconnects,
 * as after an outage or a restart of the bridge. The devices go in `chunks` transactions, `parallel` at a time
 * (one for SQLite, whose writes are one at a time anyway; several for PostgreSQL, whose round trips they hide).
 */
async function seedStore(
  store: BridgeStore,
  fleet: readonly SimDevice[],
  own: number,
  chunks: { size: number; parallel: number },
): Promise<void> {
  const hasher = new PasswordHasher({ params: SCRYPT, maxConcurrent: 1, maxQueued: 0 });
  const passwordHash = await hasher.hash(PASSWORD);
  const now = Date.now();
  const frontend = await ensureDefaultFrontend(store, now);
  const user = await store.write((tx) =>
    tx.createUser({
      frontendId: frontend.id,
      login: LOGIN,
      passwordHash,
      authcode: randomBytes(16).toString('hex'),
      now,
    }),
  );
  if (!user) throw new Error('could not create the user');
  const seedChunk = (from: number) =>
    store.write(async ({ devices }) => {
      for (let i = from; i < Math.min(fleet.length, from + chunks.size); i++) {
        const t = now - 60_000;
        await provisionDevice(devices, fleet[i]!, t, i < own ? user.id : undefined, t + i);
      }
    });
  let next = 0;
  const worker = async () => {
    while (next < fleet.length) {
      const from = next;
      next += chunks.size;
      await seedChunk(from);
    }
  };
  await Promise.all(Array.from({ length: chunks.parallel }, worker));
}

/** Scenario a: a data folder seeded through the SQLite store; the config file sets a cheap scrypt for the login. */
async function seedBridge(dataDir: string, fleet: readonly SimDevice[], own: number): Promise<number> {
  const t0 = performance.now();
  mkdirSync(dataDir, { recursive: true });
  writeFileSync(join(dataDir, 'bridge.yaml'), `accounts:\n  scryptLogN: ${SCRYPT.logN}\n`);
  const store = new SqliteStore(dataDir);
  try {
    await seedStore(store, fleet, own, { size: fleet.length, parallel: 1 });
  } finally {
    await store.close();
  }
  return performance.now() - t0;
}

/** Scenarios b and c: the same through the PostgreSQL store, which migrates the fresh database first. */
async function seedPostgres(url: string, dataDir: string, fleet: readonly SimDevice[], own: number): Promise<number> {
  const t0 = performance.now();
  mkdirSync(dataDir, { recursive: true });
  const store = await openPostgresStore(url, pino({ level: 'warn' }), { dataDir, poolSize: 4 });
  try {
    await seedStore(store, fleet, own, { size: 250, parallel: 4 });
  } finally {
    await store.close();
  }
  return performance.now() - t0;
}

// ---- deployments ----

/** What the simulator runs against: where devices connect, the REST API, and the processes measured. */
interface Deployment {
  label: string;
  mqtt: Array<{ host: string; port: number }>;
  /** Base URLs of the bridges; none for the baseline. */
  http: string[];
  /** The processes whose CPU and memory are the figures: the bridges (the bare broker for the baseline). */
  pids: number[];
  /** What else works for the cloud on this machine, reported beside: Mosquitto, PostgreSQL. */
  others: Array<{ label: string; cpuMs: () => number; rss?: () => number }>;
  /** The tail of what the bridges logged, for a failure. */
  output(): string;
  /** The bridges' warnings and errors; none for the baseline. */
  tally?: LogTally;
  stop(): Promise<void>;
}

function endpointOf(url: string): { host: string; port: number } {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port) };
}

/** The baseline: aedes in a process of its own, answering hellos and pushes with no work behind. */
async function startEcho(cleanup: Cleanup): Promise<Deployment> {
  const port = await freePort();
  const proc = spawn(
    process.execPath,
    ['--import', 'tsx', join(ROOT, 'bench/support/fleet-echo-main.ts'), String(port)],
    {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-8192)));
  const stop = () => stopChild(proc, 2000);
  cleanup.add('stop the bare broker', stop);
  const deadline = Date.now() + 20_000;
  while (!(await canConnect(port))) {
    if (proc.exitCode !== null) throw new Error(`the bare broker exited: ${stderr}`);
    if (Date.now() > deadline) throw new Error(`the bare broker did not listen on ${port}: ${stderr}`);
    await sleep(25);
  }
  return {
    label: 'bare aedes',
    mqtt: [{ host: '127.0.0.1', port }],
    http: [],
    pids: [proc.pid!],
    others: [],
    output: () => stderr,
    stop,
  };
}

/** Scenario a: one bridge from `dist/` with SQLite and its embedded broker, on a seeded data folder. */
async function startScenarioA(dataDir: string, opts: Options, cleanup: Cleanup): Promise<Deployment> {
  const prepared = prepareBridge(opts.source);
  console.log(`bridge from ${prepared.runtime} (${prepared.note})`);
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }
  const tally = new LogTally();
  const bridge = await spawnBridgeProcess(
    {
      runtime: prepared.runtime,
      dataDir,
      cpuProfDir,
      nodeArgs: opts.nodeArgs,
      // Provisioned devices only; the log as the service writes it unless told otherwise.
      args: ['--open-enrolment', 'false', '--log-level', opts.logLevel],
      onOutput: tally.feed,
    },
    cleanup,
  );
  return {
    label: 'bridge',
    mqtt: [endpointOf(bridge.mqttUrl)],
    http: [bridge.url],
    pids: [bridge.pid],
    others: [],
    output: () => bridge.output(),
    tally,
    stop: () => bridge.stop(),
  };
}

/**
 * Scenarios b and c: `count` bridges from `dist/` on one fresh PostgreSQL database (made, seeded and at the end
 * dropped here) and one private Mosquitto, each with its own data folder and `mqtt.clientId`; with more than one,
 * in one share group (docs/scaling.md). Devices connect to Mosquitto; the REST API is each bridge's.
 */
async function startPostgresCloud(
  count: number,
  tmp: string,
  fleet: readonly SimDevice[],
  opts: Options,
  cleanup: Cleanup,
): Promise<{ deployment: Deployment; seedMs: number }> {
  const db = await createBenchDatabase(opts.databaseUrl, cleanup);
  const seedMs = await seedPostgres(db.url, join(tmp, `seed-${db.name}`), fleet, opts.own);
  console.log(`database ${db.name}: seeded ${fleet.length} provisioned devices in ${round(seedMs / 1000)} s`);
  // Every device's messages of a few seconds at the highest rate searched, for a bridge that falls behind.
  const mosquitto = await startFleetMosquitto(fleet.length, Math.max(100_000, opts.searchMax * 20), cleanup);
  const prepared = prepareBridge(opts.source);
  console.log(
    `${count} bridge${count > 1 ? 's' : ''} from ${prepared.runtime} (${prepared.note}), Mosquitto ${mosquitto.url}`,
  );
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }
  const group = `bench${randomBytes(3).toString('hex')}`;
  const tally = new LogTally();
  const bridges = await Promise.all(
    Array.from({ length: count }, async (_, i) => {
      const dataDir = join(tmp, `bridge-${db.name}-${i}`);
      mkdirSync(dataDir, { recursive: true });
      const mqtt: Record<string, unknown> = { url: mosquitto.url, clientId: `bench-bridge-${i}` };
      // A lone bridge runs without a group, as docs/scaling.md advises; a lost member's share moves on after 10 s.
      if (count > 1) Object.assign(mqtt, { shareGroup: group, sessionExpirySec: 10 });
      writeFileSync(
        join(dataDir, 'bridge.yaml'),
        JSON.stringify({
          accounts: { scryptLogN: SCRYPT.logN },
          database: { url: db.url, ...(opts.poolSize !== undefined && { poolSize: opts.poolSize }) },
          mqtt,
        }),
      );
      return spawnBridgeProcess(
        {
          runtime: prepared.runtime,
          dataDir,
          cpuProfDir,
          nodeArgs: opts.nodeArgs,
          args: ['--open-enrolment', 'false', '--log-level', opts.logLevel],
          externalMqttUrl: mosquitto.url,
          onOutput: tally.feed,
        },
        cleanup,
      );
    }),
  );
  const pg = db.postmasterPid === undefined ? undefined : new PostgresCpu(db.postmasterPid, db.name);
  const others: Deployment['others'] = [
    { label: 'Mosquitto', cpuMs: () => readCpuMs(mosquitto.pid), rss: () => readRss(mosquitto.pid).rss },
  ];
  if (pg) others.push({ label: 'PostgreSQL', cpuMs: () => pg.cpuMs() });
  else console.log('PostgreSQL runs elsewhere: its CPU is not measured');
  return {
    seedMs,
    deployment: {
      label: count > 1 ? `${count} bridges` : 'bridge',
      mqtt: [endpointOf(mosquitto.url)],
      http: bridges.map((b) => b.url),
      pids: bridges.map((b) => b.pid),
      others,
      tally,
      output: () => bridges.map((b, i) => (count > 1 ? `bridge ${i}:\n` : '') + b.output()).join('\n'),
      stop: async () => {
        await Promise.all(bridges.map((b) => b.stop()));
        pg?.stop();
        await mosquitto.stop();
        await db.drop();
      },
    },
  };
}

// ---- measuring ----

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function cpuOf(pids: readonly number[]): number {
  return pids.reduce((s, pid) => s + readCpuMs(pid), 0);
}

/** Fails with what the target wrote last when one of its processes has exited (a crash under load). */
function alive(target: Deployment): void {
  for (const pid of target.pids) {
    if (!existsSync(`/proc/${pid}`)) {
      throw new Error(`${target.label}: process ${pid} exited; its last output:\n${target.output().slice(-2000)}`);
    }
  }
}

function rssOf(pids: readonly number[]): number {
  return pids.reduce((s, pid) => s + readRss(pid).rss, 0);
}

interface Lat {
  p50: number;
  p99: number;
  max: number;
  n: number;
}

function lat(samples: readonly number[]): Lat {
  return {
    p50: round(percentile(samples, 50)),
    p99: round(percentile(samples, 99)),
    max: samples.length > 0 ? round(samples.reduce((a, b) => Math.max(a, b), -Infinity)) : NaN,
    n: samples.length,
  };
}

interface PushFigures {
  rate: number;
  latency: Lat;
  sent: number;
  acked: number;
  /** CPU of the measured processes per acknowledged push (warm-up included), µs. */
  cpuUsPerPush: number;
  /** The simulator's CPU over the phase, as a share of one core. */
  simCores: number;
  simLagP99Ms: number;
  lost: number;
  downItems: number;
  /** Mosquitto's and PostgreSQL's CPU per acknowledged push (scenarios b and c), µs. */
  othersCpuUsPerPush: Record<string, number>;
  /** Cores busy over the phase: the measured processes, the others, the simulator, the whole machine. */
  cores: Record<string, number>;
}

/** A cloud busier than this (cores, the bridges and what is beside them) is still working off a backlog. */
const IDLE_CORES = 0.15;
const IDLE_WAIT_MS = 180_000;

/**
 * Waits until the cloud is idle: a phase it did not keep up with leaves messages queued at the broker and in the
 * bridge, which would otherwise be worked off during the next phase and count against it.
 */
async function waitIdle(target: Deployment): Promise<void> {
  const busy = () => cpuOf(target.pids) + target.others.reduce((s, o) => s + o.cpuMs(), 0);
  const t0 = performance.now();
  for (;;) {
    const b0 = busy();
    await sleep(1000);
    if (busy() - b0 < IDLE_CORES * 1000) break;
    if (performance.now() - t0 > IDLE_WAIT_MS) {
      console.log(`  ${target.label}: still busy after ${IDLE_WAIT_MS / 1000} s; going on`);
      return;
    }
  }
  const waited = performance.now() - t0;
  if (waited > 1500) console.log(`  ${target.label}: waited ${round(waited / 1000)} s for its backlog`);
}

async function pushPhase(
  sim: SimFleet,
  target: Deployment,
  rate: number,
  warmupMs: number,
  durationMs: number,
): Promise<PushFigures> {
  await waitIdle(target);
  alive(target);
  const cpu0 = cpuOf(target.pids);
  const others0 = target.others.map((o) => o.cpuMs());
  const machine0 = machineBusyMs();
  const sim0 = sim.cpuMs();
  const t0 = performance.now();
  const r: PushReport = await sim.push(rate, warmupMs, durationMs, 5000);
  const wall = performance.now() - t0;
  alive(target);
  const cpu = cpuOf(target.pids) - cpu0;
  const others = target.others.map((o, i) => ({ label: o.label, ms: o.cpuMs() - others0[i]! }));
  const simMs = sim.cpuMs() - sim0;
  const acked = Math.max(1, r.ackedTotal);
  return {
    rate,
    latency: lat(r.latencies),
    sent: r.sent,
    acked: r.acked,
    cpuUsPerPush: round((cpu * 1000) / acked),
    simCores: round(simMs / wall),
    simLagP99Ms: round(r.lagP99Ms),
    lost: r.lost,
    downItems: r.downItems,
    othersCpuUsPerPush: Object.fromEntries(others.map((o) => [o.label, round((o.ms * 1000) / acked)])),
    cores: {
      [target.label]: round(cpu / wall),
      ...Object.fromEntries(others.map((o) => [o.label, round(o.ms / wall)])),
      simulator: round(simMs / wall),
      machine: round((machineBusyMs() - machine0) / wall),
    },
  };
}

interface SearchFigures {
  /** The highest rate tried whose p99 stayed under the limit with every push acknowledged. */
  best: number | undefined;
  steps: Array<{
    rate: number;
    p50: number;
    p99: number;
    acked: string;
    cpuUsPerPush: number;
    simCores: number;
    cores: Record<string, number>;
    ok: boolean;
  }>;
}

/** Steps of 1.5 times from `--search-from` until p99 reaches the limit, then one step between the last two. */
async function searchRate(sim: SimFleet, target: Deployment, opts: Options): Promise<SearchFigures> {
  const steps: SearchFigures['steps'] = [];
  const tryRate = async (rate: number) => {
    const f = await pushPhase(sim, target, rate, 1000, opts.stepS * 1000);
    const ok = f.latency.p99 < TARGET.searchP99Ms && f.acked === f.sent && f.sent > 0;
    steps.push({
      rate,
      p50: f.latency.p50,
      p99: f.latency.p99,
      acked: `${f.acked}/${f.sent}`,
      cpuUsPerPush: f.cpuUsPerPush,
      simCores: f.simCores,
      cores: f.cores,
      ok,
    });
    const cores = Object.entries(f.cores)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    console.log(
      `  ${target.label} at ${rate}/s: p50 ${f.latency.p50} ms, p99 ${f.latency.p99} ms, ${f.acked}/${f.sent} acked; cores: ${cores}`,
    );
    return ok;
  };
  let good: number | undefined;
  let bad: number | undefined;
  for (let rate = opts.searchFrom; rate <= opts.searchMax; rate = Math.round(rate * 1.5)) {
    if (await tryRate(rate)) good = rate;
    else {
      bad = rate;
      break;
    }
  }
  if (good !== undefined && bad !== undefined) {
    const mid = Math.round((good + bad) / 2);
    if (mid > good && mid < bad && (await tryRate(mid))) good = mid;
  } else if (good === undefined && bad !== undefined) {
    // Even the first step was too much: steps of a third of it, three at most, down to 5/s.
    for (let low = Math.round(bad / 3), tries = 0; low >= 5 && tries < 3; low = Math.round(low / 3), tries++) {
      if (await tryRate(low)) {
        good = low;
        break;
      }
    }
  }
  return { best: good, steps };
}

interface TargetFigures {
  label: string;
  connect: {
    report: Omit<ConnectReport, 'connackMs' | 'readyMs'>;
    seconds: number;
    perSec: number;
    connack: Lat;
    ready: Lat;
    cpuUsPerDevice: number;
    /** Mosquitto's and PostgreSQL's CPU per device connected (b and c), µs. */
    othersCpuUsPerDevice: Record<string, number>;
    simCores: number;
  };
  rss: { before: number; connected: number; settled: number; bytesPerDevice: number };
  /** Mosquitto's resident size per idle connected device, the same way (b and c), bytes. */
  othersBytesPerDevice: Record<string, number>;
  restIdle: Lat | undefined;
  restDuring: Lat | undefined;
  restErrors: number;
  /** Answers of the probe while pushing, by status (`failed`: no answer). */
  restStatuses: Record<string, number>;
  /** Scenario c's one bridge: what it logged at warn and above (the two bridges' are the JSON's own). */
  warnings?: { count: number; byEvent: Record<string, number> };
  steady: PushFigures;
  search: SearchFigures | undefined;
}

function restLat(run: ProbeRun): { lat: Lat; errors: number; statuses: Record<string, number> } {
  const other = Object.entries(run.statuses)
    .filter(([code]) => code !== '200')
    .reduce((s, [, n]) => s + n, 0);
  const statuses = { ...run.statuses, ...(run.errors > 0 && { failed: run.errors }) };
  return { lat: lat(run.latencies), errors: other + run.errors, statuses };
}

/** Connects the fleet to a deployment and takes every figure. */
async function measure(
  target: Deployment,
  devicesFile: string,
  fleet: readonly SimDevice[],
  opts: Options,
  cleanup: Cleanup,
  rest?: { cookie: string; path: string },
): Promise<TargetFigures> {
  console.log(`${target.label}: ${opts.devices} devices from ${opts.simProcs} simulator processes`);
  const sim = SimFleet.start(
    { procs: opts.simProcs, devicesFile, endpoints: target.mqtt, keepaliveSec: KEEPALIVE_SEC },
    cleanup,
  );
  // Memory before: the process idle, no device connected.
  await sleep(1000);
  const rssBefore = rssOf(target.pids);
  const withRss = target.others.filter((o) => o.rss);
  const othersRssBefore = withRss.map((o) => o.rss!());
  const cpu0 = cpuOf(target.pids);
  const others0 = target.others.map((o) => o.cpuMs());
  const sim0 = sim.cpuMs();
  const c = await sim.connect(opts.connectWindow, 60_000, 3);
  const seconds = (c.lastReady - c.firstStart) / 1000;
  const connectCpu = cpuOf(target.pids) - cpu0;
  const othersConnectCpu = target.others.map((o, i) => [o.label, o.cpuMs() - others0[i]!] as const);
  const connectSim = sim.cpuMs() - sim0;
  if (c.connected < fleet.length) {
    throw new Error(
      `${target.label}: ${c.failed} of ${fleet.length} devices did not connect\n${target.output().slice(-2000)}`,
    );
  }
  console.log(`  connected ${c.connected} in ${round(seconds)} s (${Math.round(c.connected / seconds)}/s)`);
  const rssConnected = rssOf(target.pids);
  await sleep(opts.settleS * 1000);
  const rssSettled = rssOf(target.pids);
  const othersRssSettled = withRss.map((o) => o.rss!());

  let restIdle: Lat | undefined;
  let restDuring: Lat | undefined;
  let restErrors = 0;
  let restStatuses: Record<string, number> = {};
  // With several bridges, the probe's rate is shared among them (round robin, in effect), its samples merged.
  const probeFor = async (ms: number): Promise<ProbeRun> => {
    const runs = await Promise.all(
      target.http.map((base) =>
        probe({
          url: `${base}${rest!.path}`,
          headers: { cookie: rest!.cookie },
          rate: opts.probeRate / target.http.length,
          durationMs: ms,
        }),
      ),
    );
    if (runs.length === 1) return runs[0]!;
    const statuses: Record<string, number> = {};
    for (const r of runs) for (const [k, n] of Object.entries(r.statuses)) statuses[k] = (statuses[k] ?? 0) + n;
    return {
      latencies: runs.flatMap((r) => r.latencies),
      sent: runs.reduce((s, r) => s + r.sent, 0),
      statuses,
      errors: runs.reduce((s, r) => s + r.errors, 0),
    };
  };
  if (rest) {
    // Warm the route, then the baseline of the REST figure: the same bridge and fleet, connected and quiet.
    await probeFor(1000);
    const idle = restLat(await probeFor(opts.durationS * 1000));
    restIdle = idle.lat;
    restErrors += idle.errors;
  }
  const warmupMs = opts.warmupS * 1000;
  const durationMs = opts.durationS * 1000;
  const [steady, during] = await Promise.all([
    pushPhase(sim, target, opts.rate, warmupMs, durationMs),
    rest ? sleep(warmupMs + 10).then(() => probeFor(durationMs)) : Promise.resolve(undefined),
  ]);
  if (during) {
    const d = restLat(during);
    restDuring = d.lat;
    restErrors += d.errors;
    restStatuses = d.statuses;
  }
  console.log(
    `  steady ${opts.rate}/s: p50 ${steady.latency.p50} ms, p99 ${steady.latency.p99} ms` +
      (restDuring ? `; GET p99 ${restDuring.p99} ms (quiet ${restIdle!.p99} ms)` : ''),
  );
  const search = opts.search ? await searchRate(sim, target, opts) : undefined;
  await sim.disconnect();
  await sim.stop();
  const { connackMs, readyMs, ...report } = c;
  return {
    label: target.label,
    connect: {
      report,
      seconds: round(seconds),
      perSec: round(c.connected / seconds),
      connack: lat(connackMs),
      ready: lat(readyMs),
      cpuUsPerDevice: round((connectCpu * 1000) / c.connected),
      othersCpuUsPerDevice: Object.fromEntries(
        othersConnectCpu.map(([label, ms]) => [label, round((ms * 1000) / c.connected)]),
      ),
      simCores: round(connectSim / (seconds * 1000)),
    },
    rss: {
      before: rssBefore,
      connected: rssConnected,
      settled: rssSettled,
      bytesPerDevice: round((rssSettled - rssBefore) / c.connected),
    },
    othersBytesPerDevice: Object.fromEntries(
      withRss.map((o, i) => [o.label, round((othersRssSettled[i]! - othersRssBefore[i]!) / c.connected)]),
    ),
    restIdle,
    restDuring,
    restErrors,
    restStatuses,
    steady,
    search,
  };
}

async function login(base: string): Promise<string> {
  const r = await send(`${base}/0/session/login`, {
    method: 'POST',
    body: new URLSearchParams({ login: LOGIN, password: PASSWORD }).toString(),
    timeoutMs: SETUP_TIMEOUT_MS,
  }).done;
  const cookie = cookieOf(r);
  if (r.status !== 201 || !cookie) throw new Error(`login failed: ${r.status} ${r.body}`);
  return cookie;
}

// ---- the run ----

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  console.log(`fleet: scenario ${opts.scenario} (${SCENARIOS[opts.scenario]}), ${opts.devices} devices`);
  console.log('note: the machine may be shared; figures are noisy, compare with the baseline taken in the same run.');
  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-fleet-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  const fleet = makeFleet(opts.devices);
  const devicesFile = join(tmp, 'devices.json');
  writeFileSync(devicesFile, JSON.stringify(fleet));

  // 1. The baseline: the same simulator against a bare broker.
  let bare: TargetFigures | undefined;
  if (opts.baseline) {
    const echo = await startEcho(cleanup);
    bare = await measure(echo, devicesFile, fleet, opts, cleanup);
    await echo.stop();
  }

  // 2. The cloud: for c, one bridge (b) first, then two, each on a fresh database and Mosquitto.
  const restPath = `/0/devices/${fleet[0]!.id}`;
  const measureCloud = async (deployment: Deployment) => {
    const cookie = await login(deployment.http[0]!);
    // The session made on one bridge is good on every bridge: the store is shared.
    for (const base of deployment.http) {
      const check = await send(`${base}${restPath}`, { headers: { cookie }, timeoutMs: SETUP_TIMEOUT_MS }).done;
      if (check.status !== 200) throw new Error(`GET ${restPath} answered ${check.status} ${check.body.slice(0, 200)}`);
    }
    const figures = await measure(deployment, devicesFile, fleet, opts, cleanup, { cookie, path: restPath });
    await deployment.stop();
    return { figures, warnings: deployment.tally! };
  };
  let seedMs: number;
  let single: TargetFigures;
  let logLines: LogTally;
  if (opts.scenario === 'a') {
    const dataDir = join(tmp, 'bridge');
    seedMs = await seedBridge(dataDir, fleet, opts.own);
    console.log(`seeded ${opts.devices} provisioned devices in ${round(seedMs / 1000)} s`);
    ({ figures: single, warnings: logLines } = await measureCloud(await startScenarioA(dataDir, opts, cleanup)));
  } else {
    const one = await startPostgresCloud(1, tmp, fleet, opts, cleanup);
    seedMs = one.seedMs;
    ({ figures: single, warnings: logLines } = await measureCloud(one.deployment));
  }
  let bridge = single;
  let two: TargetFigures | undefined;
  if (opts.scenario === 'c') {
    const c = await startPostgresCloud(2, tmp, fleet, opts, cleanup);
    const m = await measureCloud(c.deployment);
    two = bridge = m.figures;
    // The figures are the two bridges'; so are the warnings (the one bridge's are in its own figures).
    single.warnings = { count: logLines.count, byEvent: logLines.byEvent };
    logLines = m.warnings;
  }

  // 3. Figures.
  const f = (n: number | undefined) => (n === undefined || Number.isNaN(n) ? 'n/a' : String(round(n)));
  const ratio = (a: number | undefined, b: number | undefined) =>
    a === undefined || b === undefined || b === 0 ? '' : f(a / b);
  const met = {
    connect: bridge.connect.perSec >= TARGET.connectsPerSec,
    push: bridge.steady.latency.p99 < TARGET.pushP99Ms && bridge.steady.acked === bridge.steady.sent,
    rest: bridge.restDuring !== undefined && bridge.restDuring.p99 < TARGET.restP99Ms && bridge.restErrors === 0,
    memory: bridge.rss.bytesPerDevice <= TARGET.bytesPerDevice,
  };
  const allMet = Object.values(met).every(Boolean);
  const n = opts.devices;
  const perOther = (rec: Record<string, number>, scale = 1) =>
    Object.entries(rec)
      .map(([k, v]) => `${k} ${f(v / scale)}`)
      .join(', ');
  const rows: Row[] = [
    {
      figure: `connect ${n} devices: s (per s)`,
      measured: `${f(bridge.connect.seconds)} (${Math.round(bridge.connect.perSec)})`,
      baseline: bare ? `${f(bare.connect.seconds)} (${Math.round(bare.connect.perSec)})` : '',
      ratio: ratio(bridge.connect.seconds, bare?.connect.seconds),
      target: `≥ ${TARGET.connectsPerSec}/s`,
      met: met.connect,
    },
    {
      figure: 'connect → hello answered, p50 / p99 (ms)',
      measured: `${f(bridge.connect.ready.p50)} / ${f(bridge.connect.ready.p99)}`,
      baseline: bare ? `${f(bare.connect.ready.p50)} / ${f(bare.connect.ready.p99)}` : '',
      ratio: '',
      target: '',
      met: undefined,
    },
    {
      figure: `push → ack p50 at ${opts.rate}/s (ms)`,
      measured: f(bridge.steady.latency.p50),
      baseline: bare ? f(bare.steady.latency.p50) : '',
      ratio: ratio(bridge.steady.latency.p50, bare?.steady.latency.p50),
      target: '',
      met: undefined,
    },
    {
      figure: `push → ack p99 at ${opts.rate}/s (ms)`,
      measured: `${f(bridge.steady.latency.p99)} (${bridge.steady.acked}/${bridge.steady.sent} acked)`,
      baseline: bare ? f(bare.steady.latency.p99) : '',
      ratio: ratio(bridge.steady.latency.p99, bare?.steady.latency.p99),
      target: `< ${TARGET.pushP99Ms} ms`,
      met: met.push,
    },
    {
      figure: `highest rate with p99 < ${TARGET.searchP99Ms} ms (/s)`,
      measured: bridge.search ? f(bridge.search.best) : 'not searched',
      baseline: bare?.search ? `${f(bare.search.best)}${bare.search.best === opts.searchMax ? ' (max)' : ''}` : '',
      ratio: ratio(bridge.search?.best, bare?.search?.best),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'CPU per push (µs), per connect (µs)',
      measured: `${f(bridge.steady.cpuUsPerPush)}, ${f(bridge.connect.cpuUsPerDevice)}`,
      baseline: bare ? `${f(bare.steady.cpuUsPerPush)}, ${f(bare.connect.cpuUsPerDevice)}` : '',
      ratio: ratio(bridge.steady.cpuUsPerPush, bare?.steady.cpuUsPerPush),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'memory per idle connected device (KB)',
      measured: f(bridge.rss.bytesPerDevice / 1024),
      baseline: bare ? f(bare.rss.bytesPerDevice / 1024) : '',
      ratio: ratio(bridge.rss.bytesPerDevice, bare?.rss.bytesPerDevice),
      target: `≤ ${TARGET.bytesPerDevice / 1024} KB`,
      met: met.memory,
    },
    {
      figure: `GET /0/devices/<id> p99 while pushing (ms)`,
      measured:
        `${f(bridge.restDuring?.p99)}` +
        (bridge.restErrors > 0
          ? ` (${bridge.restErrors} not 200: ${Object.entries(bridge.restStatuses)
              .filter(([k]) => k !== '200')
              .map(([k, n]) => `${k} ×${n}`)
              .join(', ')})`
          : ''),
      baseline: `${f(bridge.restIdle?.p99)} quiet`,
      ratio: ratio(bridge.restDuring?.p99, bridge.restIdle?.p99),
      target: `< ${TARGET.restP99Ms} ms`,
      met: met.rest,
    },
    ...(Object.keys(bridge.steady.othersCpuUsPerPush).length > 0
      ? [
          {
            figure: 'beside: CPU per push (µs)',
            measured: perOther(bridge.steady.othersCpuUsPerPush),
            baseline: '',
            ratio: '',
            target: '(reported)',
            met: undefined,
          },
          {
            figure: 'beside: CPU per connect (µs)',
            measured: perOther(bridge.connect.othersCpuUsPerDevice),
            baseline: '',
            ratio: '',
            target: '(reported)',
            met: undefined,
          },
          {
            figure: 'beside: memory per idle connected device (KB)',
            measured: perOther(bridge.othersBytesPerDevice, 1024),
            baseline: '',
            ratio: '',
            target: '(reported)',
            met: undefined,
          },
        ]
      : []),
    ...(two
      ? [
          {
            figure: `2 bridges / 1: highest rate with p99 < ${TARGET.searchP99Ms} ms`,
            measured: two.search ? f(two.search.best) : 'not searched',
            baseline: single.search ? `${f(single.search.best)} one bridge` : '',
            ratio: ratio(two.search?.best, single.search?.best),
            target: '(reported)',
            met: undefined,
          },
          {
            figure: `2 bridges / 1: push → ack p99 at ${opts.rate}/s (ms)`,
            measured: f(two.steady.latency.p99),
            baseline: `${f(single.steady.latency.p99)} one bridge`,
            ratio: ratio(two.steady.latency.p99, single.steady.latency.p99),
            target: '(reported)',
            met: undefined,
          },
          {
            figure: '2 bridges / 1: bridge CPU per push (µs)',
            measured: f(two.steady.cpuUsPerPush),
            baseline: `${f(single.steady.cpuUsPerPush)} one bridge`,
            ratio: ratio(two.steady.cpuUsPerPush, single.steady.cpuUsPerPush),
            target: '(reported)',
            met: undefined,
          },
        ]
      : []),
    {
      figure: 'simulator CPU (cores): connect, steady',
      measured: `${f(bridge.connect.simCores)}, ${f(bridge.steady.simCores)}`,
      baseline: bare ? `${f(bare.connect.simCores)}, ${f(bare.steady.simCores)}` : '',
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: "simulator's send lag p99 (ms)",
      measured: f(bridge.steady.simLagP99Ms),
      baseline: bare ? f(bare.steady.simLagP99Ms) : '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    `Baseline: the same simulator against a bare aedes broker answering hellos and pushes (no authentication, ` +
      `validation or database). Memory is resident size after ${opts.settleS} s idle minus before connecting, per device.`,
  );
  if (bridge.search) {
    console.log(
      `rate search, bridge: ${bridge.search.steps.map((s) => `${s.rate}/s p99 ${s.p99}${s.ok ? '' : ' ✗'}`).join(', ')}`,
    );
  }
  if (two && single.search) {
    console.log(
      `rate search, 1 bridge: ${single.search.steps.map((s) => `${s.rate}/s p99 ${s.p99}${s.ok ? '' : ' ✗'}`).join(', ')}`,
    );
  }
  // What limits the cloud: where the CPU went at the first rate it did not keep up with (or the highest tried).
  for (const [label, t] of two
    ? ([
        ['one bridge', single],
        ['two bridges', two],
      ] as const)
    : ([['bridge', bridge]] as const)) {
    const steps = t.search?.steps ?? [];
    const at = steps.find((s) => !s.ok) ?? steps.at(-1);
    if (!at) continue;
    const cores = Object.entries(at.cores)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    console.log(`cores busy, ${label} at ${at.rate}/s (p99 ${at.p99} ms${at.ok ? '' : ', too slow'}): ${cores}`);
  }
  if (bare?.search) {
    console.log(
      `rate search, bare:   ${bare.search.steps.map((s) => `${s.rate}/s p99 ${s.p99}${s.ok ? '' : ' ✗'}`).join(', ')}`,
    );
  }
  if (single.warnings && single.warnings.count > 0) {
    console.log(
      `one bridge logged ${single.warnings.count} warnings or errors: ${JSON.stringify(single.warnings.byEvent)}`,
    );
  }
  if (logLines.count > 0) {
    console.log(
      `the bridge${two ? 's' : ''} logged ${logLines.count} warnings or errors: ${JSON.stringify(logLines.byEvent)}; ` +
        `last: ${logLines.last}`,
    );
  }
  if (opts.cpuProf) console.log(`bridge CPU profile written to ${join(ROOT, '.bench/profiles')}`);
  console.log(
    JSON.stringify({
      bench: 'fleet',
      scenario: opts.scenario,
      options: {
        devices: opts.devices,
        rate: opts.rate,
        durationS: opts.durationS,
        warmupS: opts.warmupS,
        stepS: opts.stepS,
        searchFrom: opts.searchFrom,
        searchMax: opts.searchMax,
        probeRate: opts.probeRate,
        settleS: opts.settleS,
        simProcs: opts.simProcs,
        connectWindow: opts.connectWindow,
        own: opts.own,
        logLevel: opts.logLevel,
        tmp: opts.tmp,
        ...(opts.scenario !== 'a' && { databaseUrl: safeUrl(opts.databaseUrl), poolSize: opts.poolSize ?? null }),
      },
      seedMs: round(seedMs),
      bridge,
      ...(two && {
        oneBridge: single,
        twoToOne: {
          highestRate: two.search?.best && single.search?.best ? round(two.search.best / single.search.best) : null,
          pushP99: round(two.steady.latency.p99 / single.steady.latency.p99),
          cpuPerPush: round(two.steady.cpuUsPerPush / single.steady.cpuUsPerPush),
        },
      }),
      bare: bare ?? null,
      bridgeWarnings: logLines.count,
      bridgeWarningsByEvent: logLines.byEvent,
      target: TARGET,
      met,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
