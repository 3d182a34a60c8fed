/**
 * `npm run bench -- live`: the live channel (`GET /0/session/`, subprotocol `thsq-user`, docs/api.md) under load.
 * `--devices` users each own one device and hold one logged-in session; as many WebSocket clients (one per user,
 * support/live-clients.ts) watch their device while the devices, simulated over MQTT as in the fleet benchmark
 * (support/fleet-sim.ts), change a `d` variable at `--rate` changes a second in all. Each value carries the time its
 * push was due, and the client that receives it times it: publish → frame. The bridge runs as the service runs it,
 * a process of its own with its embedded broker and SQLite, or with `--engine postgres` on a database of its own
 * that the benchmark makes on a PostgreSQL server and drops (as the fleet benchmark's scenario b,
 * support/fleet-cloud.ts); clients and devices are processes of their own too.
 *
 * Baseline, in the same run: the same devices and clients against a bare `ws` server beside a bare broker
 * (support/live-echo-main.ts), which relays each push to the device's client as a frame of the bridge's own shape
 * and size. Memory: the bridge's resident size (and V8 heap) with the channels open and idle minus before them,
 * each after a full garbage collection forced through the inspector (support/inspector.ts). See bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { safeUrl } from '../lib/url.js';
import { PasswordHasher } from '../bridge/accounts/password.js';
import { ensureDefaultFrontend } from '../bridge/frontends/default.js';
import { newSessionId } from '../bridge/sessions/cookie.js';
import { openPostgresStore } from '../bridge/store/postgres/store.js';
import { SqliteStore } from '../bridge/store/sqlite.js';
import type { BridgeStore } from '../bridge/store/types.js';
import { freePort } from '../test/support/brokers.js';
import { LogTally, prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { checkLogLevel, intOption, storeEngine } from './support/options.js';
import { type BenchDatabase, DEFAULT_SERVER_URL, PostgresCpu, createBenchDatabase } from './support/fleet-cloud.js';
import { type SimDevice, SimFleet } from './support/fleet-sim.js';
import { type HeapFigures, type Inspector, attachInspector, inspectArg } from './support/inspector.js';
import {
  ID_MARK,
  type LiveClientSpec,
  LiveClients,
  type LiveConnectReport,
  type LiveEchoConfig,
  type LiveReport,
  VALUE_MARK,
  markFrame,
} from './support/live-clients.js';
import { ROOT, canConnect, readCpuMs, readRss, stopChild } from './support/processes.js';
import { type Row, formatTable, median, percentile, round } from './support/report.js';
import { provisionDevice } from './support/seed.js';

const TARGET = {
  /** Device publish → client frame, p99, ms. */
  p99Ms: 50,
  /** Bridge memory per idle open channel, bytes. */
  bytesPerChannel: 20 * 1024,
};
/** A cheap scrypt for the seeded users: nobody logs in, the sessions are written with them. */
const SCRYPT = { logN: 10, r: 8, p: 1 };
const PASSWORD = 'bench-password-1';
const KEEPALIVE_SEC = 30;

type Engine = 'sqlite' | 'postgres';

const ENGINES: Record<Engine, string> = { sqlite: 'SQLite', postgres: 'PostgreSQL' };

interface Options {
  engine: Engine;
  /** postgres: the server on which the benchmark makes its database (and drops it). */
  databaseUrl: string;
  devices: number;
  rate: number;
  durationS: number;
  warmupS: number;
  drainS: number;
  settleS: number;
  throttleMs: number;
  simProcs: number;
  clientProcs: number;
  connectWindow: number;
  gc: boolean;
  ingestOnly: boolean;
  bridge: boolean;
  baseline: boolean;
  logLevel: string;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --engine E          the bridge's database: sqlite (default) or postgres
  --database-url URL  postgres: the PostgreSQL server where the benchmark makes its database and drops it
                      (default ${DEFAULT_SERVER_URL}); given alone, it means --engine postgres
  --devices N         users, each with one device, one session and one WebSocket client (default 1000)
  --rate N            changes per second, all devices together (default 1000)
  --duration S        measured seconds (default 10)
  --warmup S          unmeasured seconds of changes before them (default 3)
  --drain-s S         how long to wait for the last frames after the last change (default 5)
  --settle-s S        idle seconds before each memory reading (default 3)
  --throttle-ms N     the throttletime the clients ask for (default 0)
  --sim-procs N       simulator processes for the devices (default 1)
  --client-procs N    processes for the WebSocket clients (default 1)
  --connect-window N  device connections and WebSocket handshakes in flight (default 200)
  --no-gc             read memory after settling only, without forcing a collection through the inspector
  --no-ingest-only    skip the pushes with no channel open (push → ack and CPU per change without the channel)
  --no-bridge         measure the baseline only (its frames then have a made-up shape of the bridge's size)
  --no-baseline       measure the bridge only
  --log-level LEVEL   the bridge's log level (default info, as the service runs)
  --tmp DIR           where the bridge's database goes (default the system's temp folder)
  --source            run the bridge from TypeScript through tsx instead of dist/
  --cpu-prof          write a V8 CPU profile of the bridge to .bench/profiles/
  --node-arg=ARG      pass ARG to node when starting the bridge (repeatable)`;

function parseOptions(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        engine: { type: 'string' },
        'database-url': { type: 'string' },
        devices: { type: 'string', default: '1000' },
        rate: { type: 'string', default: '1000' },
        duration: { type: 'string', default: '10' },
        warmup: { type: 'string', default: '3' },
        'drain-s': { type: 'string', default: '5' },
        'settle-s': { type: 'string', default: '3' },
        'throttle-ms': { type: 'string', default: '0' },
        'sim-procs': { type: 'string', default: '1' },
        'client-procs': { type: 'string', default: '1' },
        'connect-window': { type: 'string', default: '200' },
        'no-gc': { type: 'boolean', default: false },
        'no-ingest-only': { type: 'boolean', default: false },
        'no-bridge': { type: 'boolean', default: false },
        'no-baseline': { type: 'boolean', default: false },
        'log-level': { type: 'string', default: 'info' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
        'cpu-prof': { type: 'boolean', default: false },
        'node-arg': { type: 'string', multiple: true, default: [] },
      },
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = intOption(USAGE);
  checkLogLevel(v['log-level'], USAGE);
  if (v['no-bridge'] && v['no-baseline']) throw new UsageError(`nothing to measure\n${USAGE}`);
  const engine = storeEngine(v.engine, v['database-url'], USAGE);
  return {
    engine,
    databaseUrl: v['database-url'] ?? DEFAULT_SERVER_URL,
    // Two at least: the first channel is opened before memory is read, so that one-time costs are not counted.
    devices: int('devices', v.devices, 2),
    rate: int('rate', v.rate, 1),
    durationS: int('duration', v.duration, 1),
    warmupS: int('warmup', v.warmup, 0),
    drainS: int('drain-s', v['drain-s'], 1),
    settleS: int('settle-s', v['settle-s'], 0),
    throttleMs: int('throttle-ms', v['throttle-ms'], 0),
    simProcs: int('sim-procs', v['sim-procs'], 1),
    clientProcs: int('client-procs', v['client-procs'], 1),
    connectWindow: int('connect-window', v['connect-window'], 1),
    gc: !v['no-gc'],
    ingestOnly: !v['no-ingest-only'],
    bridge: !v['no-bridge'],
    baseline: !v['no-baseline'],
    logLevel: v['log-level'],
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---- users, devices, sessions ----

interface Seeded {
  fleet: SimDevice[];
  clients: LiveClientSpec[];
}

function makeUsers(n: number): Seeded & { sessionHashes: string[] } {
  const fleet: SimDevice[] = [];
  const clients: LiveClientSpec[] = [];
  const sessionHashes: string[] = [];
  for (let i = 0; i < n; i++) {
    const d = { id: randomUUID(), secret: randomBytes(32).toString('hex'), authcode: randomBytes(16).toString('hex') };
    const sid = newSessionId();
    fleet.push(d);
    clients.push({ cookie: sid.value, deviceId: d.id });
    sessionHashes.push(sid.hash);
  }
  return { fleet, clients, sessionHashes };
}

/**
 * The bridge's database before it starts, through its own store: the default frontend; per user a login, its
 * device (provisioned and claimed, as the fleet benchmark's) and a logged-in session whose cookie value only the
 * benchmark knows (the store holds its hash, as a login would have written it). One transaction.
 */
async function seedStore(store: BridgeStore, users: ReturnType<typeof makeUsers>): Promise<void> {
  const hasher = new PasswordHasher({ params: SCRYPT, maxConcurrent: 1, maxQueued: 0 });
  const passwordHash = await hasher.hash(PASSWORD);
  const now = Date.now();
  const frontend = await ensureDefaultFrontend(store, now);
  await store.write(async (tx) => {
    for (let i = 0; i < users.fleet.length; i++) {
      const user = await tx.createUser({
        frontendId: frontend.id,
        login: `live-${i}@example.com`,
        passwordHash,
        authcode: randomBytes(16).toString('hex'),
        now,
      });
      if (!user) throw new Error(`could not create user ${i}`);
      await provisionDevice(tx.devices, users.fleet[i]!, now - 60_000, user.id);
      await tx.createSession({
        idHash: users.sessionHashes[i]!,
        frontendId: frontend.id,
        userId: user.id,
        createdAt: now,
        lastSeenAt: now,
      });
    }
  });
}

/**
 * The bridge's data folder, with `bridge.yaml` setting a cheap scrypt and, for PostgreSQL, the database; the
 * database seeded through the engine's store (PostgreSQL's migrates the fresh database first).
 */
async function seedBridge(
  dataDir: string,
  databaseUrl: string | undefined,
  users: ReturnType<typeof makeUsers>,
): Promise<number> {
  const t0 = performance.now();
  mkdirSync(dataDir, { recursive: true });
  writeFileSync(
    join(dataDir, 'bridge.yaml'),
    JSON.stringify({
      accounts: { scryptLogN: SCRYPT.logN },
      ...(databaseUrl !== undefined && { database: { url: databaseUrl } }),
    }),
  );
  const store =
    databaseUrl === undefined
      ? new SqliteStore(dataDir)
      : await openPostgresStore(databaseUrl, pino({ level: 'warn' }), { dataDir, poolSize: 2 });
  try {
    await seedStore(store, users);
  } finally {
    await store.close();
  }
  return performance.now() - t0;
}

// ---- what is measured: the bridge, or the bare relay ----

interface Target {
  label: string;
  /** `ws://127.0.0.1:<port>` */
  ws: string;
  mqtt: { host: string; port: number };
  pid: number;
  inspectorPort: number | undefined;
  /** PostgreSQL's CPU for the bridge's database so far, ms (support/fleet-cloud.ts), when it runs on this machine. */
  databaseCpuMs?: () => number;
  output(): string;
  tally?: LogTally;
  stop(): Promise<void>;
}

async function waitPort(port: number, what: string, exited: () => boolean, output: () => string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await canConnect(port))) {
    if (exited()) throw new Error(`${what} exited: ${output()}`);
    if (Date.now() > deadline) throw new Error(`${what} did not listen on ${port}: ${output()}`);
    await sleep(25);
  }
}

async function startBridge(
  dataDir: string,
  db: BenchDatabase | undefined,
  opts: Options,
  cleanup: Cleanup,
): Promise<Target> {
  const prepared = prepareBridge(opts.source);
  console.log(`bridge from ${prepared.runtime} (${prepared.note})`);
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }
  const inspectorPort = opts.gc ? await freePort() : undefined;
  const tally = new LogTally();
  const bridge = await spawnBridgeProcess(
    {
      runtime: prepared.runtime,
      dataDir,
      cpuProfDir,
      nodeArgs: [...(inspectorPort === undefined ? [] : [inspectArg(inspectorPort)]), ...opts.nodeArgs],
      args: ['--open-enrolment', 'false', '--log-level', opts.logLevel],
      onOutput: tally.feed,
    },
    cleanup,
  );
  const u = new URL(bridge.mqttUrl);
  const pgCpu = db?.postmasterPid === undefined ? undefined : new PostgresCpu(db.postmasterPid, db.name);
  if (db && !pgCpu) console.log('PostgreSQL runs elsewhere: its CPU is not measured');
  return {
    label: 'bridge',
    ...(pgCpu && { databaseCpuMs: () => pgCpu.cpuMs() }),
    ws: bridge.url.replace(/^http/, 'ws'),
    mqtt: { host: u.hostname, port: Number(u.port) },
    pid: bridge.pid,
    inspectorPort,
    output: () => bridge.output(),
    tally,
    stop: async () => {
      await bridge.stop();
      pgCpu?.stop();
    },
  };
}

async function startRelay(configFile: string, opts: Options, cleanup: Cleanup): Promise<Target> {
  const mqttPort = await freePort();
  const httpPort = await freePort();
  const inspectorPort = opts.gc ? await freePort() : undefined;
  const proc = spawn(
    process.execPath,
    [
      ...(inspectorPort === undefined ? [] : [inspectArg(inspectorPort)]),
      '--import',
      'tsx',
      join(ROOT, 'bench/support/live-echo-main.ts'),
      String(mqttPort),
      String(httpPort),
      configFile,
    ],
    { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-8192)));
  const stop = () => stopChild(proc, 2000);
  cleanup.add('stop the bare relay', stop);
  const exited = () => proc.exitCode !== null || proc.signalCode !== null;
  await waitPort(mqttPort, 'the bare relay', exited, () => stderr);
  await waitPort(httpPort, 'the bare relay', exited, () => stderr);
  return {
    label: 'bare ws relay',
    ws: `ws://127.0.0.1:${httpPort}`,
    mqtt: { host: '127.0.0.1', port: mqttPort },
    pid: proc.pid!,
    inspectorPort,
    output: () => stderr,
    stop,
  };
}

// ---- measuring ----

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

interface MemoryReading {
  rss: number;
  heap: HeapFigures | undefined;
}

interface Figures {
  label: string;
  open: { seconds: number; perSec: number; snapshot: Lat; extensions: string; protocol: string };
  memory: {
    before: MemoryReading;
    open: MemoryReading;
    channels: number;
    rssPerChannel: number;
    /** V8 heap used plus external memory (buffers) per channel, when a collection was forced. */
    heapPerChannel: number | undefined;
    gc: boolean;
  };
  load: {
    rate: number;
    sent: number;
    delivered: number;
    undelivered: number;
    /** Devices whose client did not hold the device's last value at the end (after the drain). */
    stale: number;
    latency: Lat;
    /**
     * From the device's acknowledgement (sent by the bridge after its commit) to the client's frame, for the values
     * that had both, ms: the live channel's own share of the latency. Negative when the frame came first.
     */
    ackToFrame: Lat;
    /** p99 of the values due in each second of the measured window, ms: a stall shows as one bad second. */
    p99BySecond: number[];
    duplicates: number;
    outOfOrder: number;
    foreign: number;
    framesPerValue: number;
    valueFrameBytes: number;
    bytesPerSec: number;
    closedByServer: Record<string, number>;
    /** CPU of the target process per change (warm-up included), µs; cores busy over the phase. */
    cpuUsPerChange: number;
    /** PostgreSQL's CPU per change, µs (its cores are in `cores.database`), when measured. */
    databaseCpuUsPerChange: number | undefined;
    cores: { target: number; clients: number; simulator: number; database?: number };
    simLagP99Ms: number;
    pushAckP99Ms: number;
    /** Device connections the server closed since they connected, and pushes acknowledged in the window. */
    devicesLost: number;
    acked: number;
  };
  samples: { snapshot: LiveConnectReport['sampleSnapshot']; delta: LiveReport['sampleDelta'] };
  /** The same pushes before any channel was open (`--no-ingest-only` skips them). */
  ingestOnly:
    | {
        pushAck: Lat;
        acked: number;
        sent: number;
        cpuUsPerChange: number;
        cores: number;
        databaseCpuUsPerChange: number | undefined;
      }
    | undefined;
}

async function readMemory(pid: number, inspector: Inspector | undefined, settleMs: number): Promise<MemoryReading> {
  await sleep(settleMs);
  if (!inspector) return { rss: readRss(pid).rss, heap: undefined };
  await inspector.gc();
  // Let the allocator hand back what the collection freed before the resident size is read.
  await sleep(200);
  const heap = await inspector.memory();
  return { rss: readRss(pid).rss, heap };
}

function alive(target: Target): void {
  if (!existsSync(`/proc/${target.pid}`)) {
    throw new Error(`${target.label}: process ${target.pid} exited; its last output:\n${target.output().slice(-2000)}`);
  }
}

async function measure(
  target: Target,
  files: { devices: string; clients: string },
  n: number,
  opts: Options,
  cleanup: Cleanup,
): Promise<Figures> {
  console.log(`${target.label}: ${n} devices, ${n} WebSocket clients`);
  const sim = SimFleet.start(
    { procs: opts.simProcs, devicesFile: files.devices, endpoints: [target.mqtt], keepaliveSec: KEEPALIVE_SEC },
    cleanup,
  );
  const c = await sim.connect(opts.connectWindow, 60_000, 3);
  if (c.connected < n) {
    throw new Error(`${target.label}: ${c.failed} of ${n} devices did not connect\n${target.output().slice(-2000)}`);
  }
  console.log(`  devices connected in ${round((c.lastReady - c.firstStart) / 1000)} s`);
  // The same pushes with no channel open: what the device's path costs by itself, for the bridge's CPU and ack.
  let ingestOnly: Figures['ingestOnly'];
  if (opts.ingestOnly) {
    const cpu0 = readCpuMs(target.pid);
    const db0 = target.databaseCpuMs?.();
    const t = performance.now();
    const r = await sim.push(opts.rate, opts.warmupS * 1000, opts.durationS * 1000, opts.drainS * 1000);
    const cpu = readCpuMs(target.pid) - cpu0;
    const dbCpu = db0 === undefined ? undefined : target.databaseCpuMs!() - db0;
    ingestOnly = {
      databaseCpuUsPerChange: dbCpu === undefined ? undefined : round((dbCpu * 1000) / Math.max(1, r.sentTotal)),
      pushAck: lat(r.latencies),
      acked: r.acked,
      sent: r.sent,
      cpuUsPerChange: round((cpu * 1000) / Math.max(1, r.sentTotal)),
      cores: round(cpu / (performance.now() - t)),
    };
    console.log(
      `  no channel open, ${opts.rate}/s: push → ack p50 ${ingestOnly.pushAck.p50} ms, p99 ${ingestOnly.pushAck.p99} ms`,
    );
  }
  const clients = LiveClients.start(
    { procs: opts.clientProcs, clientsFile: files.clients, url: target.ws, throttleMs: opts.throttleMs },
    cleanup,
  );
  const inspector = target.inspectorPort === undefined ? undefined : await attachInspector(target.inspectorPort);
  cleanup.add('close the inspector session', () => inspector?.close());
  const check = (r: LiveConnectReport, expected: number) => {
    if (r.connected < expected) {
      throw new Error(
        `${target.label}: ${r.failed} of ${expected} WebSocket clients got no snapshot; first: ${r.firstError}\n` +
          target.output().slice(-2000),
      );
    }
  };
  // The first channel before memory is read: what the first one costs once (code, caches) is not a channel's.
  check(await clients.connect(0, 1, 1, 30_000), 1);
  const before = await readMemory(target.pid, inspector, opts.settleS * 1000);
  const t0 = performance.now();
  const opened = await clients.connect(1, n, opts.connectWindow, 30_000);
  const openSeconds = (performance.now() - t0) / 1000;
  check(opened, n - 1);
  console.log(
    `  ${n - 1} more channels open in ${round(openSeconds)} s; extensions "${opened.extensions}", protocol ` +
      `"${opened.protocol}"`,
  );
  const open = await readMemory(target.pid, inspector, opts.settleS * 1000);
  const channels = n - 1;
  const heapOf = (m: MemoryReading) => (m.heap ? m.heap.heapUsed + m.heap.external : 0);
  alive(target);

  // The load: every device changes `d` `temp` in turn, each value stamped with when it was due.
  await clients.start();
  const cpu0 = readCpuMs(target.pid);
  const db0 = target.databaseCpuMs?.();
  const clientCpu0 = clients.cpuMs();
  const sim0 = sim.cpuMs();
  const tLoad = performance.now();
  const r = await sim.push(opts.rate, opts.warmupS * 1000, opts.durationS * 1000, opts.drainS * 1000, true);
  // The pushes are acknowledged; the frames may still be on their way.
  const deadline = performance.now() + opts.drainS * 1000;
  let last = -1;
  let still = 0;
  for (;;) {
    const s = await clients.stats();
    if (s.delivered >= r.sent || performance.now() > deadline) break;
    if (s.delivered === last && ++still >= 10) break;
    if (s.delivered !== last) still = 0;
    last = s.delivered;
    await sleep(100);
  }
  const wall = performance.now() - tLoad;
  const cpu = readCpuMs(target.pid) - cpu0;
  const dbCpu = db0 === undefined ? undefined : target.databaseCpuMs!() - db0;
  const clientCpu = clients.cpuMs() - clientCpu0;
  const simCpu = sim.cpuMs() - sim0;
  const rep = await clients.stop();
  alive(target);
  await clients.close();
  await clients.exit();
  await sim.disconnect();
  await sim.stop();
  inspector?.close();
  const latency = lat(rep.latencies);
  const said = target.tally
    ? ''
    : target
        .output()
        .split('\n')
        .filter((l) => l.trim() && !/^(Debugger |For help, see)/.test(l))
        .join('\n');
  if (said) console.log(`  ${target.label} wrote:\n${said.slice(-2000)}`);
  console.log(
    `  ${opts.rate}/s: p50 ${latency.p50} ms, p99 ${latency.p99} ms, max ${latency.max} ms; ` +
      `${rep.delivered}/${r.sent} delivered, ${r.acked} acknowledged` +
      (r.lost > 0 ? `, ${r.lost} device connections lost` : ''),
  );
  const pushAck = lat(r.latencies);
  const ackToFrame: number[] = [];
  rep.keys.forEach((key, i) => {
    const acked = r.ackedAt?.[key];
    if (acked !== undefined) ackToFrame.push(rep.dues[i]! + rep.latencies[i]! - acked);
  });
  const lastSent = r.lastValues ?? {};
  const stale = Object.entries(lastSent).filter(([id, key]) => rep.lastValues[id] !== key).length;
  const first = Math.min(...rep.dues);
  const seconds: number[][] = [];
  rep.dues.forEach((due, i) => (seconds[Math.floor((due - first) / 1000)] ??= []).push(rep.latencies[i]!));
  return {
    label: target.label,
    open: {
      seconds: round(openSeconds),
      perSec: round(channels / openSeconds),
      snapshot: lat(opened.snapshotMs),
      extensions: opened.extensions,
      protocol: opened.protocol,
    },
    memory: {
      before,
      open,
      channels,
      rssPerChannel: round((open.rss - before.rss) / channels),
      heapPerChannel: inspector ? round((heapOf(open) - heapOf(before)) / channels) : undefined,
      gc: inspector !== undefined,
    },
    load: {
      rate: opts.rate,
      sent: r.sent,
      delivered: rep.delivered,
      undelivered: Math.max(0, r.sent - rep.delivered),
      stale,
      latency,
      ackToFrame: lat(ackToFrame),
      p99BySecond: Array.from(seconds, (xs) => round(percentile(xs ?? [], 99))),
      duplicates: rep.duplicates,
      outOfOrder: rep.outOfOrder,
      foreign: rep.foreign,
      framesPerValue: round(rep.frames / Math.max(1, rep.valueFrames)),
      valueFrameBytes: round(median(rep.valueFrameBytes)),
      bytesPerSec: round((rep.bytes * 1000) / wall),
      closedByServer: rep.closedByServer,
      cpuUsPerChange: round((cpu * 1000) / Math.max(1, r.sentTotal)),
      databaseCpuUsPerChange: dbCpu === undefined ? undefined : round((dbCpu * 1000) / Math.max(1, r.sentTotal)),
      cores: {
        target: round(cpu / wall),
        clients: round(clientCpu / wall),
        simulator: round(simCpu / wall),
        ...(dbCpu !== undefined && { database: round(dbCpu / wall) }),
      },
      simLagP99Ms: round(r.lagP99Ms),
      pushAckP99Ms: pushAck.p99,
      devicesLost: r.lost,
      acked: r.acked,
    },
    samples: { snapshot: opened.sampleSnapshot, delta: rep.sampleDelta },
    ingestOnly,
  };
}

// ---- the baseline's frames ----

/** The bridge's frames with the device and the value marked; made up in the bridge's shape when it was not run. */
function templates(bridge: Figures | undefined): { snapshot: string; delta: string } {
  const snap = bridge?.samples.snapshot;
  const delta = bridge?.samples.delta;
  if (snap && delta) {
    return { snapshot: markFrame(snap.text, snap.deviceId), delta: markFrame(delta.text, delta.deviceId, delta.value) };
  }
  const t = Date.now();
  const meta = (name: string, value: string) => `"${name}":{"value":${JSON.stringify(value)},"time":${t}}`;
  const metas = [
    meta('unique', ID_MARK),
    meta('platform', 'linux-arm64'),
    meta('fwversion', '2.4.1'),
    meta('agentversion', '0.1.0'),
    meta('fwstate', 'idle'),
    meta('fwprogress', '0'),
    meta('fwname', ''),
    meta('fwerror', ''),
    meta('fwerrorcode', ''),
    meta('state', 'connected'),
    meta('lastactivity', String(t)),
  ].join(',');
  return {
    snapshot: `{"devices":{"${ID_MARK}":{"d":{},"s":{},"meta":{${metas}}}}}`,
    delta: `{"delta":{"${ID_MARK}":{"d":{"temp":{"value":"${VALUE_MARK}","time":${t},"acked":0,"synced":${t},"syncacked":0}}}}}`,
  };
}

// ---- the run ----

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const n = opts.devices;
  console.log(
    `live: ${n} users with a device and a WebSocket client each, ${opts.rate} changes/s; the bridge on ${ENGINES[opts.engine]}`,
  );
  console.log('note: the machine may be shared; figures are noisy, compare with the baseline taken in the same run.');
  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-live-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  const users = makeUsers(n);
  const files = { devices: join(tmp, 'devices.json'), clients: join(tmp, 'clients.json') };
  writeFileSync(files.devices, JSON.stringify(users.fleet));
  writeFileSync(files.clients, JSON.stringify(users.clients));

  // 1. The bridge first: its frames are the baseline's.
  let bridge: Figures | undefined;
  let tally: LogTally | undefined;
  let seedMs = 0;
  if (opts.bridge) {
    const dataDir = join(tmp, 'bridge');
    const db = opts.engine === 'postgres' ? await createBenchDatabase(opts.databaseUrl, cleanup, 'live') : undefined;
    seedMs = await seedBridge(dataDir, db?.url, users);
    console.log(
      `seeded ${n} users, devices and sessions in ${round(seedMs / 1000)} s` +
        (db ? ` in the PostgreSQL database ${db.name} on ${safeUrl(opts.databaseUrl)}` : ' in SQLite'),
    );
    const target = await startBridge(dataDir, db, opts, cleanup);
    tally = target.tally;
    bridge = await measure(target, files, n, opts, cleanup);
    await target.stop();
    await db?.drop();
  }

  // 2. The baseline: the same clients and devices, the bridge's frames relayed by a bare ws server.
  let bare: Figures | undefined;
  if (opts.baseline) {
    const configFile = join(tmp, 'relay.json');
    const config: LiveEchoConfig = {
      clients: users.clients,
      ...templates(bridge),
      deflate: bridge ? bridge.open.extensions.includes('permessage-deflate') : false,
    };
    writeFileSync(configFile, JSON.stringify(config));
    const relay = await startRelay(configFile, opts, cleanup);
    bare = await measure(relay, files, n, opts, cleanup);
    await relay.stop();
  }

  // 3. Figures.
  const main = bridge ?? bare!;
  const f = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? 'n/a' : String(round(x)));
  const ratio = (a: number | undefined, b: number | undefined) =>
    a === undefined || b === undefined || b === 0 || !bridge ? '' : f(a / b);
  const kb = (x: number | undefined) => (x === undefined ? 'n/a' : f(x / 1024));
  const clean = (x: Figures) =>
    x.load.undelivered === 0 &&
    x.load.stale === 0 &&
    x.load.duplicates === 0 &&
    x.load.outOfOrder === 0 &&
    x.load.foreign === 0;
  const met = {
    latency: main.load.latency.p99 < TARGET.p99Ms && clean(main),
    memory: main.memory.rssPerChannel <= TARGET.bytesPerChannel,
  };
  const allMet = Object.values(met).every(Boolean);
  const b = bridge ? bare : undefined;
  const rows: Row[] = [
    {
      figure: "the bridge's database",
      measured: bridge ? ENGINES[opts.engine] : 'not run',
      baseline: b ? 'none' : '',
      ratio: '',
      target: '',
      met: undefined,
    },
    {
      figure: `open ${n - 1} channels: s (per s)`,
      measured: `${f(main.open.seconds)} (${Math.round(main.open.perSec)})`,
      baseline: b ? `${f(b.open.seconds)} (${Math.round(b.open.perSec)})` : '',
      ratio: ratio(main.open.seconds, b?.open.seconds),
      target: '',
      met: undefined,
    },
    {
      figure: 'open → devices snapshot p50 / p99 (ms)',
      measured: `${f(main.open.snapshot.p50)} / ${f(main.open.snapshot.p99)}`,
      baseline: b ? `${f(b.open.snapshot.p50)} / ${f(b.open.snapshot.p99)}` : '',
      ratio: '',
      target: '',
      met: undefined,
    },
    {
      figure: `publish → frame p50 at ${opts.rate}/s (ms)`,
      measured: f(main.load.latency.p50),
      baseline: b ? f(b.load.latency.p50) : '',
      ratio: ratio(main.load.latency.p50, b?.load.latency.p50),
      target: '',
      met: undefined,
    },
    {
      figure: `publish → frame p99 at ${opts.rate}/s (ms)`,
      measured: f(main.load.latency.p99),
      baseline: b ? f(b.load.latency.p99) : '',
      ratio: ratio(main.load.latency.p99, b?.load.latency.p99),
      target: `< ${TARGET.p99Ms} ms`,
      met: met.latency,
    },
    {
      figure: 'ack → frame p50 / p99 (ms)',
      measured: `${f(main.load.ackToFrame.p50)} / ${f(main.load.ackToFrame.p99)}`,
      baseline: b ? `${f(b.load.ackToFrame.p50)} / ${f(b.load.ackToFrame.p99)}` : '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: 'publish → frame max (ms)',
      measured: f(main.load.latency.max),
      baseline: b ? f(b.load.latency.max) : '',
      ratio: '',
      target: '',
      met: undefined,
    },
    {
      figure: 'changes never delivered (of sent)',
      measured: `${main.load.undelivered} (of ${main.load.sent})`,
      baseline: b ? `${b.load.undelivered} (of ${b.load.sent})` : '',
      ratio: '',
      target: '0',
      met: main.load.undelivered === 0,
    },
    {
      figure: "devices whose client missed the device's last value",
      measured: String(main.load.stale),
      baseline: b ? String(b.load.stale) : '',
      ratio: '',
      target: '0',
      met: main.load.stale === 0,
    },
    {
      figure: 'duplicated, out of order, other device',
      measured: `${main.load.duplicates}, ${main.load.outOfOrder}, ${main.load.foreign}`,
      baseline: b ? `${b.load.duplicates}, ${b.load.outOfOrder}, ${b.load.foreign}` : '',
      ratio: '',
      target: '0',
      met: main.load.duplicates === 0 && main.load.outOfOrder === 0 && main.load.foreign === 0,
    },
    {
      figure: 'frames per change; bytes of a value frame',
      measured: `${f(main.load.framesPerValue)}; ${f(main.load.valueFrameBytes)}`,
      baseline: b ? `${f(b.load.framesPerValue)}; ${f(b.load.valueFrameBytes)}` : '',
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'memory per idle channel, RSS (KB)',
      measured: kb(main.memory.rssPerChannel),
      baseline: b ? kb(b.memory.rssPerChannel) : '',
      ratio: ratio(main.memory.rssPerChannel, b?.memory.rssPerChannel),
      target: `≤ ${TARGET.bytesPerChannel / 1024} KB`,
      met: met.memory,
    },
    {
      figure: 'memory per idle channel, heap + external (KB)',
      measured: kb(main.memory.heapPerChannel),
      baseline: b ? kb(b.memory.heapPerChannel) : '',
      ratio: ratio(main.memory.heapPerChannel, b?.memory.heapPerChannel),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'CPU per change (µs)',
      measured: f(main.load.cpuUsPerChange),
      baseline: b ? f(b.load.cpuUsPerChange) : '',
      ratio: ratio(main.load.cpuUsPerChange, b?.load.cpuUsPerChange),
      target: '(reported)',
      met: undefined,
    },
    ...(main.load.databaseCpuUsPerChange === undefined
      ? []
      : [
          {
            figure: 'PostgreSQL CPU per change, with / no channel open (µs)',
            measured: `${f(main.load.databaseCpuUsPerChange)} / ${f(main.ingestOnly?.databaseCpuUsPerChange)}`,
            baseline: '',
            ratio: '',
            target: '(diagnostic)',
            met: undefined,
          },
        ]),
    {
      figure: 'no channel open: push → ack p50 / p99 (ms)',
      measured: main.ingestOnly ? `${f(main.ingestOnly.pushAck.p50)} / ${f(main.ingestOnly.pushAck.p99)}` : 'not run',
      baseline: b?.ingestOnly ? `${f(b.ingestOnly.pushAck.p50)} / ${f(b.ingestOnly.pushAck.p99)}` : '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: 'no channel open: CPU per change (µs)',
      measured: main.ingestOnly ? f(main.ingestOnly.cpuUsPerChange) : 'not run',
      baseline: b?.ingestOnly ? f(b.ingestOnly.cpuUsPerChange) : '',
      ratio: ratio(main.ingestOnly?.cpuUsPerChange, b?.ingestOnly?.cpuUsPerChange),
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: `cores busy: server, clients, simulator${main.load.cores.database === undefined ? '' : '; PostgreSQL'}`,
      measured:
        `${f(main.load.cores.target)}, ${f(main.load.cores.clients)}, ${f(main.load.cores.simulator)}` +
        (main.load.cores.database === undefined ? '' : `; ${f(main.load.cores.database)}`),
      baseline: b ? `${f(b.load.cores.target)}, ${f(b.load.cores.clients)}, ${f(b.load.cores.simulator)}` : '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: "simulator's send lag p99; push → ack p99 (ms)",
      measured: `${f(main.load.simLagP99Ms)}; ${f(main.load.pushAckP99Ms)}`,
      baseline: b ? `${f(b.load.simLagP99Ms)}; ${f(b.load.pushAckP99Ms)}` : '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
  ];
  console.log('');
  if (!bridge) console.log('--no-bridge: the measured column is the baseline.');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    `Baseline: the same devices and clients against a bare ws server beside a bare broker, relaying each change as ` +
      `a frame of the bridge's shape and size. Memory: ${main.memory.gc ? 'after a full collection, ' : ''}` +
      `${opts.settleS} s after opening ${n - 1} channels minus before (one channel already open), per channel.`,
  );
  const verdict = (ok: boolean, what: string, value: string, target: string, margin: string) =>
    console.log(`${ok ? 'PASS' : 'MISS'} ${what}: ${value} (target ${target}; margin ${margin})`);
  verdict(
    met.latency,
    'publish → frame p99',
    `${f(main.load.latency.p99)} ms, ${main.load.undelivered} undelivered`,
    `< ${TARGET.p99Ms} ms, all delivered`,
    `${f(TARGET.p99Ms - main.load.latency.p99)} ms`,
  );
  verdict(
    met.memory,
    'memory per idle channel',
    `${kb(main.memory.rssPerChannel)} KB`,
    `≤ ${TARGET.bytesPerChannel / 1024} KB`,
    `${kb(TARGET.bytesPerChannel - main.memory.rssPerChannel)} KB`,
  );
  for (const x of [bridge, bare]) {
    if (x) console.log(`p99 second by second, ${x.label} (ms): ${x.load.p99BySecond.join(', ')}`);
  }
  if (Object.keys(main.load.closedByServer).length > 0) {
    console.log(`channels the server closed under load: ${JSON.stringify(main.load.closedByServer)}`);
  }
  if (tally && tally.count > 0) {
    console.log(
      `the bridge logged ${tally.count} warnings or errors: ${JSON.stringify(tally.byEvent)}; last: ${tally.last}`,
    );
  }
  if (opts.cpuProf) console.log(`bridge CPU profile written to ${join(ROOT, '.bench/profiles')}`);
  const strip = (x: Figures | undefined) => (x ? { ...x, samples: undefined } : null);
  console.log(
    JSON.stringify({
      bench: 'live',
      engine: opts.engine,
      options: {
        engine: opts.engine,
        ...(opts.engine === 'postgres' && { databaseUrl: safeUrl(opts.databaseUrl) }),
        devices: n,
        rate: opts.rate,
        durationS: opts.durationS,
        warmupS: opts.warmupS,
        throttleMs: opts.throttleMs,
        settleS: opts.settleS,
        simProcs: opts.simProcs,
        clientProcs: opts.clientProcs,
        gc: opts.gc,
        ingestOnly: opts.ingestOnly,
        logLevel: opts.logLevel,
      },
      seedMs: round(seedMs),
      bridge: strip(bridge),
      bare: strip(bare),
      bridgeWarnings: tally?.count ?? 0,
      bridgeWarningsByEvent: tally?.byEvent ?? {},
      target: TARGET,
      met,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
