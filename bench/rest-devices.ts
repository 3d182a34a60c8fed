/**
 * `npm run bench -- rest-devices`: what the bridge's device routes cost on a bridge holding 1,000 devices of 20
 * variables each: `GET /0/devices/<id>` and `GET /0/devices/` against a bare Fastify server answering the same
 * bytes from memory, `GET …?latest=10` on a variable with a short and with a long history, and a `POST` of a
 * `d` variable until a real agent's acknowledgement is recorded. The bridge runs as the service does (a child
 * process from `dist/`, production settings), its database seeded before it starts; the bare server and the
 * agent run in processes of their own; every figure is taken in the same run as its baseline. See
 * bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import Database from 'better-sqlite3';
import { LocalClient } from '../agent/local/client.js';
import { openDatabase } from '../lib/sqlite.js';
import { PasswordHasher } from '../bridge/accounts/password.js';
import { ensureDefaultFrontend } from '../bridge/frontends/default.js';
import { hashSecret } from '../bridge/broker.js';
import { BridgeConfigSchema } from '../bridge/config.js';
import type { SetBy } from '../bridge/devices/store.js';
import { BRIDGE_MIGRATIONS, SqliteStore } from '../bridge/store/sqlite.js';
import type { DeviceRepo } from '../bridge/store/types.js';
import { type ServerProcess, prepareBridge, spawnBareHttp, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { intOption } from './support/options.js';
import { type ProbeRun, type ThroughputRun, cookieOf, probe, send, throughput } from './support/http-load.js';
import { type AgentProcess, ROOT, prepareAgent, readCpuMs, spawnAgentProcess } from './support/processes.js';
import { type Row, formatTable, percentile, round } from './support/report.js';

const TARGET = {
  /** Requests/s of the bridge as a share of the bare server's, for a device and for the device list. */
  shareOfBare: 0.6,
  /** p99 of `?latest=10` on the long history as a multiple of the p99 on the short one. */
  historyP99Factor: 1.5,
  /** p50 of a `d` POST until the agent's acknowledgement is recorded, ms. */
  ackP50Ms: 10,
};

/** The bridge's devices, each with 20 variables: 10 `d`, 4 `s` and the 6 `meta` the bridge keeps itself. */
const DEVICES = 1000;
/** Devices of the user whose requests are measured; the other user owns the rest. */
const OWN_DEVICES = 10;
const D_NAMES = ['mode', 'setpoint', 'led', 'fan', 'relay1', 'relay2', 'interval', 'threshold', 'schedule', 'label'];
const S_NAMES = ['note', 'location', 'group', 'installed'];
/** The variable whose history is read (`d`, on two devices of the measured user, one per history length). */
const HISTORY_VAR = 'setpoint';
/** The `d` variable the POST figure sets on the agent's device. */
const POST_VAR = 'bench';
/** History rows per transaction while seeding. */
const SEED_BATCH = 50_000;
const PASSWORD = 'bench-password-1';
const MAIN_LOGIN = 'bench-main@example.com';
const FLEET_LOGIN = 'bench-fleet@example.com';
/** The requests that set the run up; a bridge that does not answer them fails the run instead of holding it. */
const SETUP_TIMEOUT_MS = 30_000;
/** The longest a POST may wait for its acknowledgement before the run fails. */
const ACK_TIMEOUT_MS = 10_000;

interface Options {
  connections: number;
  pipelining: number;
  durationS: number;
  rounds: number;
  warmupS: number;
  probeRate: number;
  probeS: number;
  shortHistory: number;
  longHistory: number;
  samples: number;
  ackWarmup: number;
  pollMs: number;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --connections N       autocannon connections for the throughput rounds (default 10)
  --pipelining N        requests in flight per connection (default 1)
  --duration S          seconds per throughput round (default 3)
  --rounds N            rounds per figure, bridge and bare alternated; also history probe rounds (default 2)
  --warmup S            seconds of unmeasured load on each server and route first (default 1)
  --probe-rate N        history requests per second while measuring their latency (default 500)
  --probe-s S           seconds per history probe round (default 4)
  --short-history N     entries of the short history (default 10000)
  --long-history N      entries of the long history (default 1000000)
  --samples N           POSTs timed until acknowledged, one at a time (default 500)
  --ack-warmup N        unmeasured POSTs before them (default 50)
  --poll-ms MS          pause between two reads of the acknowledgement stamp (default 0.1)
  --tmp DIR             where the bridge's and the agent's databases go (default the system's temp folder)
  --source              run the bridge and the agent from TypeScript through tsx instead of dist/
  --cpu-prof            write a V8 CPU profile of the bridge to .bench/profiles/
  --node-arg=ARG        pass ARG to node when starting the bridge (repeatable)`;

function parseOptions(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        connections: { type: 'string', default: '10' },
        pipelining: { type: 'string', default: '1' },
        duration: { type: 'string', default: '3' },
        rounds: { type: 'string', default: '2' },
        warmup: { type: 'string', default: '1' },
        'probe-rate': { type: 'string', default: '500' },
        'probe-s': { type: 'string', default: '4' },
        'short-history': { type: 'string', default: '10000' },
        'long-history': { type: 'string', default: '1000000' },
        samples: { type: 'string', default: '500' },
        'ack-warmup': { type: 'string', default: '50' },
        'poll-ms': { type: 'string', default: '0.1' },
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
  const pollMs = Number(v['poll-ms']);
  if (!(pollMs >= 0.01 && pollMs <= 10)) throw new UsageError(`--poll-ms must be between 0.01 and 10\n${USAGE}`);
  return {
    connections: int('connections', v.connections, 1),
    pipelining: int('pipelining', v.pipelining, 1),
    durationS: int('duration', v.duration, 1),
    rounds: int('rounds', v.rounds, 1),
    warmupS: int('warmup', v.warmup, 0),
    probeRate: int('probe-rate', v['probe-rate'], 1),
    probeS: int('probe-s', v['probe-s'], 1),
    shortHistory: int('short-history', v['short-history'], 10),
    longHistory: int('long-history', v['long-history'], 10),
    samples: int('samples', v.samples, 1),
    ackWarmup: int('ack-warmup', v['ack-warmup'], 0),
    pollMs,
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
  };
}

interface Seeded {
  /** The measured user's devices, in the order `GET /0/devices/` lists them. */
  own: string[];
  /** The devices whose `HISTORY_VAR` has the short and the long history. */
  shortDevice: string;
  longDevice: string;
  hashMs: number;
  seedMs: number;
}

/** The 20 variables of a seeded device, as a device with an agent would have them. */
async function seedVars(devices: DeviceRepo, id: string, i: number, t: number): Promise<void> {
  for (const [k, name] of D_NAMES.entries()) {
    const time = t + k;
    // Half were set by the user and acknowledged, half reported by the device.
    const origin = k % 2 === 0 ? ('cloud' as const) : ('device' as const);
    const value = Buffer.from(k === 0 ? 'auto' : `{"v":${(i * 7 + k) % 100},"unit":"C"}`);
    await devices.putVersion(
      id,
      { type: 'd', name, value, time, origin },
      time + 3,
      origin === 'cloud' ? 'user' : 'device',
    );
  }
  for (const [k, name] of S_NAMES.entries()) {
    const time = t + 20 + k;
    const value = Buffer.from(`building ${i % 17}, floor ${k}`);
    await devices.putVersion(id, { type: 's', name, value, time, origin: 'cloud' }, time, 'user');
  }
  await devices.setMeta(id, 'state', 'disconnected', t + 30, 'server');
  await devices.setMeta(id, 'lastactivity', String(t + 30), t + 30, 'server', false);
  await devices.setMeta(id, 'unique', id, t, 'device');
  await devices.setMeta(id, 'platform', 'linux-arm64', t, 'device');
  await devices.setMeta(id, 'fwversion', '2.4.1', t, 'device');
  await devices.setMeta(id, 'agentversion', '0.1.0', t, 'device');
}

const historyValue = (k: number) => Buffer.from(`{"target":${20 + (k % 50) / 10},"seq":${k}}`);

/**
 * Creates the default frontend, the two users and the devices in the bridge's database before it starts,
 * through its own store: devices, owners and variables through the transaction `store.write` gives, as the
 * bridge writes them. The two histories are bulk rows of the same shape, inserted through a prepared statement
 * on a second connection, one transaction per `SEED_BATCH`; their last version goes through the store again, so
 * that the variable holds it.
 */
async function seed(dataDir: string, opts: Options): Promise<Seeded> {
  const config = BridgeConfigSchema.parse({ dataDir });
  const a = config.accounts;
  const hasher = new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: 1,
    maxQueued: 0,
  });
  const h0 = performance.now();
  const passwordHash = await hasher.hash(PASSWORD);
  const hashMs = performance.now() - h0;
  const t0 = performance.now();
  mkdirSync(dataDir, { recursive: true });
  const store = new SqliteStore(dataDir);
  // History timestamps end now: nothing is old enough for the bridge's hourly pruning.
  const now = Date.now();
  const start = now - Math.max(opts.shortHistory, opts.longHistory) - 60_000;
  const ids = Array.from({ length: DEVICES }, () => randomUUID());
  const own = ids.slice(0, OWN_DEVICES);
  const [shortDevice, longDevice] = own as [string, string];
  const histories = [
    { device: shortDevice, entries: opts.shortHistory },
    { device: longDevice, entries: opts.longHistory },
  ];
  try {
    const frontend = await ensureDefaultFrontend(store, now);
    const [main, fleet] = await store.write(async (tx) => {
      const users = [];
      for (const login of [MAIN_LOGIN, FLEET_LOGIN]) {
        const user = await tx.createUser({
          frontendId: frontend.id,
          login,
          passwordHash,
          authcode: randomBytes(16).toString('hex'),
          now,
        });
        if (!user) throw new Error(`could not create ${login}`);
        users.push(user);
      }
      return users;
    });
    await store.write(async ({ devices }) => {
      for (const [i, id] of ids.entries()) {
        await devices.enroll(id, hashSecret(randomBytes(32).toString('hex')), start);
        await devices.setAuthcode(id, randomBytes(16).toString('hex'));
        await devices.claim(id, i < OWN_DEVICES ? main!.id : fleet!.id, start + i);
        await seedVars(devices, id, i, start);
      }
    });

    // The entries of each history between the first (the variable's seeded version) and the last, as bulk rows.
    const db = openDatabase(join(dataDir, 'bridge.db'), BRIDGE_MIGRATIONS);
    try {
      const insert = db.prepare(
        'INSERT INTO history (device_id, type, name, value, by, timestamp) VALUES (?, ?, ?, ?, ?, ?)',
      );
      for (const { device, entries } of histories) {
        const first = now - entries;
        for (let from = 1; from < entries - 1; from += SEED_BATCH) {
          db.transaction(() => {
            for (let k = from; k < Math.min(entries - 1, from + SEED_BATCH); k++) {
              const by: SetBy = k % 2 === 0 ? 'user' : 'device';
              insert.run(device, 'd', HISTORY_VAR, historyValue(k), by, first + k);
            }
          })();
        }
      }
    } finally {
      db.close();
    }
    await store.write(async (tx) => {
      for (const { device, entries } of histories) {
        const time = now - 1;
        const v = {
          type: 'd' as const,
          name: HISTORY_VAR,
          value: historyValue(entries - 1),
          time,
          origin: 'cloud' as const,
        };
        await tx.devices.putVersion(device, v, time + 3, 'user');
      }
    });
  } finally {
    await store.close();
  }
  return { own, shortDevice, longDevice, hashMs, seedMs: performance.now() - t0 };
}

function loginBody(login: string): string {
  return new URLSearchParams({ login, password: PASSWORD }).toString();
}

interface Measured extends ThroughputRun {
  /** CPU time of the server process per completed request, µs. */
  serverCpuUs: number;
  /** CPU time of this process (autocannon) per completed request, µs. */
  clientCpuUs: number;
}

async function measure(
  server: ServerProcess,
  path: string,
  cookie: string | undefined,
  opts: Options,
  durationS: number,
): Promise<Measured> {
  const cpu0 = readCpuMs(server.pid);
  const own0 = process.cpuUsage();
  const r = await throughput({
    url: `${server.url}${path}`,
    method: 'GET',
    ...(cookie ? { headers: { cookie } } : {}),
    connections: opts.connections,
    pipelining: opts.pipelining,
    durationS,
  });
  const own = process.cpuUsage(own0);
  const n = Math.max(1, r.completed);
  return {
    ...r,
    serverCpuUs: ((readCpuMs(server.pid) - cpu0) * 1000) / n,
    clientCpuUs: (own.user + own.system) / n,
  };
}

/** Fails the run when a server answered anything but 200: the figure would measure the wrong path. */
function expectOk(what: string, r: ThroughputRun): void {
  const other = Object.entries(r.statuses).filter(([code]) => code !== '200');
  if (other.length > 0 || r.errors > 0 || r.completed === 0) {
    throw new Error(`${what}: expected only 200, got ${JSON.stringify(r.statuses)}, ${r.errors} connection errors`);
  }
}

interface Pair {
  bridge: Measured[];
  bare: Measured[];
}

/**
 * `rounds` runs on each server, alternated (bare first in even rounds), so that both see the same machine. The
 * bare server may answer the same bytes on another path (`barePath`).
 */
async function pairRounds(
  bridge: ServerProcess,
  bare: ServerProcess,
  path: string,
  barePath: string,
  cookie: string,
  opts: Options,
): Promise<Pair> {
  const out: Pair = { bridge: [], bare: [] };
  const one = (which: 'bridge' | 'bare', seconds: number) =>
    which === 'bridge'
      ? measure(bridge, path, cookie, opts, seconds)
      : measure(bare, barePath, undefined, opts, seconds);
  if (opts.warmupS > 0) {
    await one('bare', opts.warmupS);
    await one('bridge', opts.warmupS);
  }
  for (let r = 0; r < opts.rounds; r++) {
    const order = r % 2 === 0 ? (['bare', 'bridge'] as const) : (['bridge', 'bare'] as const);
    for (const which of order) {
      const m = await one(which, opts.durationS);
      expectOk(`GET ${which === 'bridge' ? path : barePath} on the ${which} server`, m);
      out[which].push(m);
    }
  }
  return out;
}

/** Requests/s over all rounds together (total completed over total time), and mean CPU per request. */
function sum(runs: Measured[]): { perSec: number; serverCpuUs: number; clientCpuUs: number; rounds: number[] } {
  const completed = runs.reduce((s, r) => s + r.completed, 0);
  const seconds = runs.reduce((s, r) => s + r.durationS, 0);
  const w = (f: (r: Measured) => number) => runs.reduce((s, r) => s + f(r) * r.completed, 0) / Math.max(1, completed);
  return {
    perSec: completed / seconds,
    serverCpuUs: w((r) => r.serverCpuUs),
    clientCpuUs: w((r) => r.clientCpuUs),
    rounds: runs.map((r) => round(r.perSec)),
  };
}

function latencySummary(latencies: number[]): { p50: number; p99: number; max: number; samples: number } {
  return {
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    max: latencies.length > 0 ? Math.max(...latencies) : NaN,
    samples: latencies.length,
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A pause that blocks this thread without spinning: the ack poll has nothing else to do meanwhile. */
const pauseCell = new Int32Array(new SharedArrayBuffer(4));
const pauseSync = (ms: number) => Atomics.wait(pauseCell, 0, 0, ms);

/** Time of one durable commit (WAL, `synchronous=FULL`, one row) in `dir`: what each fsync costs here. */
function durableCommitMs(dir: string, n: number): number {
  const db = openDatabase(join(dir, 'floor.db'), [(d) => d.exec('CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)')]);
  try {
    const ins = db.prepare('INSERT INTO t (v) VALUES (?)');
    const times: number[] = [];
    for (let i = 0; i < n + 20; i++) {
      const t = performance.now();
      ins.run(`value ${i}`);
      if (i >= 20) times.push(performance.now() - t);
    }
    return percentile(times, 50);
  } finally {
    db.close();
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

/** Polls `check` on the real clock; a benchmark may wait like this, a test never does. */
async function until<T>(check: () => Promise<T | undefined>, what: string, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

interface AckSample {
  /** From sending the POST until its 200, ms. */
  answeredMs: number;
  /** From sending the POST until this process read `acked >= time` for the value it set, ms. */
  ackedMs: number;
  /** `acked - time` as the bridge stamped them (its clock, 1 ms resolution). */
  stampMs: number;
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const prepared = prepareBridge(opts.source);
  const preparedAgent = prepareAgent(opts.source);
  console.log(
    `rest-devices: bridge from ${prepared.runtime} (${prepared.note}), agent from ${preparedAgent.runtime} ` +
      `(${preparedAgent.note})`,
  );
  console.log('note: the machine may be shared; figures are noisy, compare ratios taken in the same run.');

  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }

  const dataDir = join(tmp, 'bridge');
  const seeded = await seed(dataDir, opts);
  console.log(
    `seeded ${DEVICES} devices × 20 variables, histories of ${opts.shortHistory} and ${opts.longHistory} ` +
      `entries, in ${round(seeded.seedMs / 1000)} s`,
  );

  const bridge = await spawnBridgeProcess(
    { runtime: prepared.runtime, dataDir, cpuProfDir, nodeArgs: opts.nodeArgs },
    cleanup,
  );
  console.log(`bridge at ${bridge.url}${bridge.nodeArgs.length > 0 ? `, node ${bridge.nodeArgs.join(' ')}` : ''}`);

  const login = async (who: string) => {
    const r = await send(`${bridge.url}/0/session/login`, {
      method: 'POST',
      body: loginBody(who),
      timeoutMs: SETUP_TIMEOUT_MS,
    }).done;
    const c = cookieOf(r);
    if (r.status !== 201 || !c) throw new Error(`login of ${who} failed: ${r.status} ${r.body}`);
    return c;
  };
  const cookie = await login(MAIN_LOGIN);
  const fleetCookie = await login(FLEET_LOGIN);
  const get = async (path: string, c: string) => {
    const r = await send(`${bridge.url}${path}`, { headers: { cookie: c }, timeoutMs: SETUP_TIMEOUT_MS }).done;
    if (r.status !== 200) throw new Error(`GET ${path} answered ${r.status} ${r.body.slice(0, 200)}`);
    return r;
  };

  // The paths measured, and the bytes the bridge answers on each: the bare server answers the same.
  const deviceId = seeded.own[2]!;
  const historyPath = (id: string) => `/0/devices/${id}/d/${HISTORY_VAR}`;
  const paths = {
    device: { bridge: `/0/devices/${deviceId}`, bare: `/0/devices/${deviceId}`, cookie },
    list: { bridge: '/0/devices/', bare: '/0/devices/', cookie },
    // The same route for another user: the bare server answers that list on a path of its own.
    fleet: { bridge: '/0/devices/', bare: '/0/fleet/devices/', cookie: fleetCookie },
    shortHistory: {
      bridge: `${historyPath(seeded.shortDevice)}?latest=10`,
      bare: `${historyPath(seeded.shortDevice)}?latest=10`,
      cookie,
    },
    longHistory: {
      bridge: `${historyPath(seeded.longDevice)}?latest=10`,
      bare: `${historyPath(seeded.longDevice)}?latest=10`,
      cookie,
    },
  };
  const bodies: Record<string, string> = {};
  const routes: Record<string, string> = {};
  for (const [key, p] of Object.entries(paths)) {
    const r = await get(p.bridge, p.cookie);
    bodies[key] = r.body;
    routes[p.bare.split('?', 1)[0]!] = r.body;
  }
  const listed = Object.keys(JSON.parse(bodies.list!) as object);
  const fleetListed = Object.keys(JSON.parse(bodies.fleet!) as object);
  if (listed.join() !== seeded.own.join() || fleetListed.length !== DEVICES - OWN_DEVICES) {
    throw new Error(`GET /0/devices/ lists ${listed.length} and ${fleetListed.length} devices`);
  }
  const deviceVars = JSON.parse(bodies.device!) as Record<string, object>;
  const varCount = Object.values(deviceVars).reduce((s, t) => s + Object.keys(t).length, 0);
  if (varCount !== 20) throw new Error(`the device has ${varCount} variables: ${bodies.device}`);
  for (const key of ['shortHistory', 'longHistory'] as const) {
    const entries = JSON.parse(bodies[key]!) as Array<{ value: string }>;
    const total = key === 'shortHistory' ? opts.shortHistory : opts.longHistory;
    if (entries.length !== 10 || entries[0]?.value !== historyValue(total - 1).toString()) {
      throw new Error(`${key}: unexpected answer ${bodies[key]!.slice(0, 300)}`);
    }
  }
  const routesFile = join(tmp, 'bare-routes.json');
  writeFileSync(routesFile, JSON.stringify(routes));
  const bare = await spawnBareHttp('{}', cleanup, routesFile);
  for (const [key, p] of Object.entries(paths)) {
    const b = await send(`${bare.url}${p.bare}`, { timeoutMs: SETUP_TIMEOUT_MS }).done;
    const r = await get(p.bridge, p.cookie);
    const same = (h: string) => b.headers[h] === r.headers[h];
    if (b.body !== bodies[key] || r.body !== bodies[key] || !same('content-type') || !same('cache-control')) {
      throw new Error(`the bare server answers other bytes than the bridge on ${p.bare}`);
    }
  }
  const size = (key: string) => `${round(Buffer.byteLength(bodies[key]!) / 1024)} KB`;
  console.log(`bare server at ${bare.url}; measuring (about two minutes)`);

  // 1. Throughput, bridge against bare.
  const device = await pairRounds(bridge, bare, paths.device.bridge, paths.device.bare, cookie, opts);
  const list = await pairRounds(bridge, bare, paths.list.bridge, paths.list.bare, cookie, opts);
  const fleet = await pairRounds(bridge, bare, paths.fleet.bridge, paths.fleet.bare, fleetCookie, opts);

  // 2. History latency at a steady rate: both lengths probed at the same time, so that a stall of the bridge or
  // of the machine (a garbage collection, another process) falls on both alike; the bare server's copy of the
  // short one too, at the same rate, to show what the machine alone did in the same windows.
  const probeHistories = (ms: number) => {
    const one = (url: string, headers: Record<string, string>) =>
      probe({ url, headers, rate: opts.probeRate, durationMs: ms });
    return Promise.all([
      one(`${bridge.url}${paths.shortHistory.bridge}`, { cookie }),
      one(`${bridge.url}${paths.longHistory.bridge}`, { cookie }),
      one(`${bare.url}${paths.shortHistory.bare}`, {}),
    ]);
  };
  await probeHistories(1000);
  const historyRuns = { short: [] as ProbeRun[], long: [] as ProbeRun[], bare: [] as ProbeRun[] };
  for (let r = 0; r < opts.rounds; r++) {
    const [short, long, bareRun] = await probeHistories(opts.probeS * 1000);
    for (const [which, run] of [
      ['short', short],
      ['long', long],
      ['bare', bareRun],
    ] as const) {
      const other = Object.keys(run.statuses).filter((c) => c !== '200');
      if (other.length > 0 || run.errors > 0)
        throw new Error(
          `GET ?latest=10 on the ${which} history: ${JSON.stringify(run.statuses)}, ${run.errors} errors`,
        );
      historyRuns[which].push(run);
    }
  }
  await bare.stop();

  // 3. POST of a `d` variable until a real agent's acknowledgement is recorded. The agent enrols with the
  // bridge's embedded broker and the measured user claims it through the API, with the device's auth code.
  const agentDir = join(tmp, 'agent');
  const agent = spawnAgentProcess(
    { runtime: preparedAgent.runtime, mqttUrl: bridge.mqttUrl, stateDir: agentDir },
    cleanup,
  );
  const client = await connectWhenUp(agent.socket, agent);
  cleanup.add('close the local client', () => client.close());
  await until(
    async () => ((await client.status<{ state: string }>()).state === 'connected' ? true : undefined),
    'the agent to connect',
  );
  const identity = JSON.parse(readFileSync(join(agentDir, 'identity.json'), 'utf8')) as {
    deviceId: string;
    authcode: string;
  };
  // The claim succeeds once the bridge has handled the agent's hello (which carries the auth code).
  await until(async () => {
    const r = await send(`${bridge.url}/0/devices/`, {
      method: 'POST',
      headers: { cookie },
      body: new URLSearchParams({ auth: identity.authcode }).toString(),
      timeoutMs: SETUP_TIMEOUT_MS,
    }).done;
    return r.status === 201 ? true : undefined;
  }, 'the claim of the agent');
  const floorMs = durableCommitMs(tmp, 200);

  // The acknowledgement is read where the bridge records it: its database, through a read-only connection of
  // this process, so that watching costs the bridge nothing.
  const watcher = new Database(join(dataDir, 'bridge.db'), { readonly: true, fileMustExist: true });
  cleanup.add('close the read-only connection', () => watcher.open && watcher.close());
  const stamp = watcher.prepare<[string, string], { value: Buffer | null; time: number; acked: number }>(
    "SELECT value, time, acked FROM vars WHERE device_id = ? AND type = 'd' AND name = ?",
  );
  const postPath = `/0/devices/${identity.deviceId}/d/${POST_VAR}`;
  const samples: AckSample[] = [];
  for (let i = 0; i < opts.ackWarmup + opts.samples; i++) {
    const value = `${i}`;
    const t0 = performance.now();
    const r = await send(`${bridge.url}${postPath}`, {
      method: 'POST',
      headers: { cookie },
      body: new URLSearchParams({ value }).toString(),
      timeoutMs: SETUP_TIMEOUT_MS,
    }).done;
    const answeredMs = performance.now() - t0;
    if (r.status !== 200) throw new Error(`POST ${postPath} answered ${r.status} ${r.body}`);
    for (;;) {
      const row = stamp.get(identity.deviceId, POST_VAR);
      const ackedMs = performance.now() - t0;
      if (row?.value?.toString() === value && row.acked >= row.time) {
        if (i >= opts.ackWarmup) samples.push({ answeredMs, ackedMs, stampMs: row.acked - row.time });
        break;
      }
      if (ackedMs > ACK_TIMEOUT_MS)
        throw new Error(`no acknowledgement of ${value} within ${ACK_TIMEOUT_MS} ms: ${agent.output()}`);
      pauseSync(opts.pollMs);
    }
  }
  watcher.close();
  // What the API shows agrees with what was read from the database.
  const last = JSON.parse((await get(postPath, cookie)).body) as { value: string; time: number; acked: number };
  if (last.value !== `${opts.ackWarmup + opts.samples - 1}` || last.acked < last.time) {
    throw new Error(`GET ${postPath} shows ${JSON.stringify(last)}`);
  }
  client.close();
  await agent.stop();
  await bridge.stop();
  const bridgeOutput = bridge
    .output()
    .split('\n')
    .filter((l) => l.trim().length > 0);

  // Figures.
  const d = { bridge: sum(device.bridge), bare: sum(device.bare) };
  const l = { bridge: sum(list.bridge), bare: sum(list.bare) };
  const fl = { bridge: sum(fleet.bridge), bare: sum(fleet.bare) };
  const ratios = {
    device: d.bridge.perSec / d.bare.perSec,
    list: l.bridge.perSec / l.bare.perSec,
    fleet: fl.bridge.perSec / fl.bare.perSec,
  };
  const hs = latencySummary(historyRuns.short.flatMap((r) => r.latencies));
  const hl = latencySummary(historyRuns.long.flatMap((r) => r.latencies));
  const historyRatio = hl.p99 / hs.p99;
  const hb = latencySummary(historyRuns.bare.flatMap((r) => r.latencies));
  const acked = latencySummary(samples.map((s) => s.ackedMs));
  const answered = latencySummary(samples.map((s) => s.answeredMs));
  const stampP50 = percentile(
    samples.map((s) => s.stampMs),
    50,
  );

  const met = {
    device: ratios.device >= TARGET.shareOfBare,
    list: ratios.list >= TARGET.shareOfBare,
    fleet: ratios.fleet >= TARGET.shareOfBare,
    history: historyRatio <= TARGET.historyP99Factor,
    ack: acked.p50 < TARGET.ackP50Ms,
  };
  const allMet = Object.values(met).every(Boolean);
  const f = (n: number) => String(round(n));
  const conn = `${opts.connections} conn × ${opts.pipelining}`;
  const share = `≥ ${TARGET.shareOfBare} × bare`;
  const rows: Row[] = [
    {
      figure: `GET /0/devices/<id> req/s (${size('device')}, ${conn})`,
      measured: String(Math.round(d.bridge.perSec)),
      baseline: `${Math.round(d.bare.perSec)} bare`,
      ratio: f(ratios.device),
      target: share,
      met: met.device,
    },
    {
      figure: `GET /0/devices/ req/s, user of ${OWN_DEVICES} devices (${size('list')})`,
      measured: String(Math.round(l.bridge.perSec)),
      baseline: `${Math.round(l.bare.perSec)} bare`,
      ratio: f(ratios.list),
      target: share,
      met: met.list,
    },
    {
      figure: `GET /0/devices/ req/s, user of ${DEVICES - OWN_DEVICES} devices (${size('fleet')})`,
      measured: String(Math.round(fl.bridge.perSec)),
      baseline: `${Math.round(fl.bare.perSec)} bare`,
      ratio: f(ratios.fleet),
      target: share,
      met: met.fleet,
    },
    {
      figure: 'server CPU per request (µs): device, 10, 990',
      measured: [d, l, fl].map((x) => f(x.bridge.serverCpuUs)).join(', '),
      baseline: `${[d, l, fl].map((x) => f(x.bare.serverCpuUs)).join(', ')} bare`,
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: `?latest=10 p50 at ${opts.probeRate}/s, ${opts.longHistory} entries (ms)`,
      measured: f(hl.p50),
      baseline: `${f(hs.p50)} at ${opts.shortHistory}`,
      ratio: f(hl.p50 / hs.p50),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: `?latest=10 p99 at ${opts.probeRate}/s, ${opts.longHistory} entries (ms)`,
      measured: f(hl.p99),
      baseline: `${f(hs.p99)} at ${opts.shortHistory}`,
      ratio: f(historyRatio),
      target: `≤ ${TARGET.historyP99Factor} × ${opts.shortHistory}`,
      met: met.history,
    },
    {
      figure: 'bare server p99, same windows (ms)',
      measured: f(hb.p99),
      baseline: `${f(hb.p50)} p50`,
      ratio: '',
      target: '(machine noise)',
      met: undefined,
    },
    {
      figure: 'POST d → agent ack recorded, p50 (ms)',
      measured: f(acked.p50),
      baseline: `${f(floorMs)} one fsync`,
      ratio: f(acked.p50 / floorMs),
      target: `< ${TARGET.ackP50Ms} ms`,
      met: met.ack,
    },
    {
      figure: 'POST d → agent ack recorded, p99 (ms)',
      measured: f(acked.p99),
      baseline: `${f(acked.max)} max`,
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'POST d answered 200, p50 and p99 (ms)',
      measured: `${f(answered.p50)}, ${f(answered.p99)}`,
      baseline: '',
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: "POST d: the bridge's acked − time, p50 (ms)",
      measured: f(stampP50),
      baseline: '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    `The measured user owns ${OWN_DEVICES} of the ${DEVICES} devices; another owns the other ` +
      `${DEVICES - OWN_DEVICES}, whose list the bare server answers on /0/fleet/devices/.`,
  );
  console.log(
    `Acknowledgements are read from the bridge's database every ${opts.pollMs} ms after the POST's answer; ` +
      `the path holds two durable commits (the bridge's, the agent's) and one without fsync.`,
  );
  if (!met.device || !met.list || !met.fleet) {
    console.log('a throughput target was missed: see "Finding out why" in bench/README.md.');
  }
  if (bridgeOutput.length > 0)
    console.log(`the bridge logged ${bridgeOutput.length} lines; last: ${bridgeOutput.at(-1)}`);
  if (cpuProfDir) console.log(`bridge CPU profile written to ${cpuProfDir}`);
  const throughputJson = (p: { bridge: ReturnType<typeof sum>; bare: ReturnType<typeof sum> }, ratio: number) => ({
    bridgePerSec: round(p.bridge.perSec),
    barePerSec: round(p.bare.perSec),
    ratio: round(ratio),
    bridgeRounds: p.bridge.rounds,
    bareRounds: p.bare.rounds,
    bridgeCpuUs: round(p.bridge.serverCpuUs),
    bareCpuUs: round(p.bare.serverCpuUs),
    clientCpuUsBridge: round(p.bridge.clientCpuUs),
    clientCpuUsBare: round(p.bare.clientCpuUs),
  });
  const lat = (s: ReturnType<typeof latencySummary>) => ({
    p50Ms: round(s.p50),
    p99Ms: round(s.p99),
    maxMs: round(s.max),
    samples: s.samples,
  });
  console.log(
    JSON.stringify({
      bench: 'rest-devices',
      bridgeRuntime: prepared.runtime,
      agentRuntime: preparedAgent.runtime,
      options: {
        connections: opts.connections,
        pipelining: opts.pipelining,
        durationS: opts.durationS,
        rounds: opts.rounds,
        warmupS: opts.warmupS,
        probeRate: opts.probeRate,
        probeS: opts.probeS,
        samples: opts.samples,
        ackWarmup: opts.ackWarmup,
        pollMs: opts.pollMs,
        tmp: opts.tmp,
      },
      bridgeNodeArgs: bridge.nodeArgs,
      data: {
        devices: DEVICES,
        varsPerDevice: 20,
        ownDevices: OWN_DEVICES,
        fleetDevices: DEVICES - OWN_DEVICES,
        shortHistory: opts.shortHistory,
        longHistory: opts.longHistory,
        seedMs: round(seeded.seedMs),
        bytes: Object.fromEntries(Object.entries(bodies).map(([k, b]) => [k, Buffer.byteLength(b)])),
      },
      getDevice: { ...throughputJson(d, ratios.device), target: TARGET.shareOfBare, met: met.device },
      listOwn: { ...throughputJson(l, ratios.list), target: TARGET.shareOfBare, met: met.list },
      listFleet: { ...throughputJson(fl, ratios.fleet), target: TARGET.shareOfBare, met: met.fleet },
      history: {
        probeRate: opts.probeRate,
        short: lat(hs),
        long: lat(hl),
        shortRoundsP99Ms: historyRuns.short.map((r) => round(percentile(r.latencies, 99))),
        longRoundsP99Ms: historyRuns.long.map((r) => round(percentile(r.latencies, 99))),
        bare: lat(hb),
        p99Ratio: round(historyRatio),
        target: TARGET.historyP99Factor,
        met: met.history,
      },
      postAck: {
        acked: lat(acked),
        answered: lat(answered),
        stampP50Ms: stampP50,
        durableCommitP50Ms: round(floorMs),
        pollMs: opts.pollMs,
        target: { p50Ms: TARGET.ackP50Ms },
        met: met.ack,
      },
      bridgeLogLines: bridgeOutput.length,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
