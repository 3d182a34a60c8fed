/**
 * `npm run bench -- rules`: what notification rules (docs/notifications.md) cost the bridge that evaluates them,
 * and how long a fired event takes to reach its user's live channel. `--devices` devices, owned by `--users` users,
 * carry `--rules-per-device` rules each (most of them thresholds on the `d` variable `temp`, the one the devices
 * change, so that every change is really evaluated); the devices, simulated over MQTT as in the fleet benchmark
 * (support/fleet-sim.ts), change `temp` at `--rate` changes a second in all, and a share (`--fire-fraction`) of the
 * values are spikes that cross a threshold and fire a rule.
 *
 * Two bridges run side by side as the service runs them (processes of their own, embedded broker, SQLite, or with
 * `--engine postgres` a database of their own each), seeded alike through their own stores, except that only one
 * has the rules: the baseline in the same run. Each round gives the same changes to the bridge without rules alone,
 * to the one with them alone, then to both at once; the bridges' process CPU over the measured window per change is
 * compared in the phases where both got their changes at once, so that whatever else the machine does falls on both
 * alike (the phases alone are noisier by as much as the figure). Every user watches its live channel (a WebSocket in
 * this process); the device records when each spike was due, the channel when its `user-event` frame came, matched
 * by device and value: the latency is that of the phases alone. With `--cpu-prof`, the rule engine's own time is
 * read from each bridge's profile as well (support/cpu-profile.ts).
 * See bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import WebSocket from 'ws';
import { safeUrl } from '../lib/url.js';
import { PasswordHasher } from '../bridge/accounts/password.js';
import { ensureDefaultFrontend } from '../bridge/frontends/default.js';
import { formatTrigger, forMsOf, parseTrigger } from '../bridge/rules/trigger.js';
import { newSessionId } from '../bridge/sessions/cookie.js';
import { openPostgresStore } from '../bridge/store/postgres/store.js';
import { SqliteStore } from '../bridge/store/sqlite.js';
import type { BridgeStore } from '../bridge/store/types.js';
import { LogTally, prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { checkLogLevel, intOption, storeEngine } from './support/options.js';
import {
  type BenchDatabase,
  DEFAULT_SERVER_URL,
  PostgresCpu,
  createBenchDatabase,
  machineBusyMs,
} from './support/fleet-cloud.js';
import { type ProfileShare, profileShare, readProfileOf } from './support/cpu-profile.js';
import { type SimDevice, SimFleet, type SpikeMark, type SpikeSpec } from './support/fleet-sim.js';
import { ROOT, readCpuMs } from './support/processes.js';
import { type Row, formatTable, percentile, round } from './support/report.js';
import { provisionDevice } from './support/seed.js';
import { wsText } from './support/ws-text.js';

const TARGET = {
  /** Bridge CPU a change costs more with the rules than without, µs. */
  addedUsPerChange: 20,
  /** Device publish → `user-event` frame, p99, ms. */
  p99Ms: 50,
};
/** A cheap scrypt for the seeded users: nobody logs in, the sessions are written with them. */
const SCRYPT = { logN: 10, r: 8, p: 1 };
const PASSWORD = 'bench-password-1';
const KEEPALIVE_SEC = 30;
/**
 * The values the devices push (support/fleet-sim.ts, `SpikeSpec`): `20.<n>` holds no rule; a high spike `35.<n>`
 * crosses `d.temp > 30` only, a low one `-5.<n>` `d.temp < 0` only (the other thresholds are further out), so that
 * each spike fires exactly one rule of its device: the one it crosses, or, after the other kind of spike, the other
 * one's falls back and its own fires.
 */
const VALUES = { normal: 20, high: 35, low: -5 };
const HIGH_FROM = 30;
const LOW_FROM = 0;
const PROFILE_DIR = join(ROOT, '.bench/profiles');

type Engine = 'sqlite' | 'postgres';
const ENGINES: Record<Engine, string> = { sqlite: 'SQLite', postgres: 'PostgreSQL' };

interface Options {
  engine: Engine;
  databaseUrl: string;
  devices: number;
  users: number;
  rulesPerDevice: number;
  rate: number;
  durationS: number;
  warmupS: number;
  drainS: number;
  rounds: number;
  paired: boolean;
  fireFraction: number;
  throttleMs: number;
  simProcs: number;
  connectWindow: number;
  logLevel: string;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --engine E            the bridges' database: sqlite (default) or postgres
  --database-url URL    postgres: the PostgreSQL server where the benchmark makes its databases and drops them
                        (default ${DEFAULT_SERVER_URL}); given alone, it means --engine postgres
  --devices N           devices (default 1000)
  --users N             users, who own the devices in turn and hold one live channel each (default 50)
  --rules-per-device N  rules on each device, at least 2 (default 10)
  --rate N              changes per second, all devices together (default 1000)
  --duration S          measured seconds of each phase (default 20)
  --warmup S            unmeasured seconds of changes before them (default 5)
  --drain-s S           how long to wait for the last acknowledgements and events (default 5)
  --rounds N            rounds, each: the bridge without rules alone, the one with rules alone, then both at
                        once (default 2)
  --no-paired           leave out the phases with both at once; the CPU figure is then that of each alone
  --fire-fraction F     share of the changes that cross a threshold and fire a rule (default 0.01)
  --throttle-ms N       the throttletime the live channels ask for (default 1000)
  --sim-procs N         simulator processes per bridge (default 1)
  --connect-window N    device connections in flight (default 200)
  --log-level LEVEL     the bridges' log level (default info, as the service runs)
  --tmp DIR             where the bridges' databases go (default the system's temp folder)
  --source              run the bridges from TypeScript through tsx instead of dist/
  --cpu-prof            write a V8 CPU profile of each bridge to .bench/profiles/
  --node-arg=ARG        pass ARG to node when starting the bridges (repeatable)`;

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
        users: { type: 'string', default: '50' },
        'rules-per-device': { type: 'string', default: '10' },
        rate: { type: 'string', default: '1000' },
        duration: { type: 'string', default: '20' },
        warmup: { type: 'string', default: '5' },
        'drain-s': { type: 'string', default: '5' },
        rounds: { type: 'string', default: '2' },
        'no-paired': { type: 'boolean', default: false },
        'fire-fraction': { type: 'string', default: '0.01' },
        'throttle-ms': { type: 'string', default: '1000' },
        'sim-procs': { type: 'string', default: '1' },
        'connect-window': { type: 'string', default: '200' },
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
  const engine = storeEngine(v.engine, v['database-url'], USAGE);
  const fraction = Number(v['fire-fraction']);
  if (!(fraction > 0 && fraction <= 0.5))
    throw new UsageError(`--fire-fraction must be above 0, at most 0.5\n${USAGE}`);
  const devices = int('devices', v.devices, 1);
  const users = int('users', v.users, 1);
  if (users > devices) throw new UsageError(`--users must not exceed --devices (each user owns a device)\n${USAGE}`);
  return {
    engine,
    databaseUrl: v['database-url'] ?? DEFAULT_SERVER_URL,
    devices,
    users,
    rulesPerDevice: int('rules-per-device', v['rules-per-device'], 2),
    rate: int('rate', v.rate, 1),
    durationS: int('duration', v.duration, 1),
    warmupS: int('warmup', v.warmup, 0),
    drainS: int('drain-s', v['drain-s'], 1),
    rounds: int('rounds', v.rounds, 1),
    paired: !v['no-paired'],
    fireFraction: fraction,
    throttleMs: int('throttle-ms', v['throttle-ms'], 0),
    simProcs: int('sim-procs', v['sim-procs'], 1),
    connectWindow: int('connect-window', v['connect-window'], 1),
    logLevel: v['log-level'],
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** The clock the simulator stamps its pushes with: epoch ms, sub-millisecond, the same in every process. */
const now = () => performance.timeOrigin + performance.now();

// ---- users, devices, rules ----

/**
 * The triggers of each device's rules: thresholds on `d.temp` alternately above and below the normal values, each
 * pair further out (`> 30`, `< 0`, `> 40`, `< -20`, …), and, from 4 rules on, the last two on variables the devices
 * do not change (`d.humidity`, `s.mode`): evaluated rules, and rules a change of `temp` only looks past.
 */
export function ruleTriggers(perDevice: number): string[] {
  const others = perDevice >= 4 ? ['d.humidity > 80', 's.mode == "eco"'] : [];
  const out: string[] = [];
  for (let k = 0; k < perDevice - others.length; k++) {
    const step = Math.floor(k / 2);
    out.push(k % 2 === 0 ? `d.temp > ${HIGH_FROM + 10 * step}` : `d.temp < ${LOW_FROM - 20 * step}`);
  }
  return [...out, ...others];
}

interface Seeded {
  fleet: SimDevice[];
  /** Per user: the session cookie's value (the store holds its hash). */
  cookies: string[];
  sessionHashes: string[];
}

function makeFleet(devices: number, users: number): Seeded {
  const fleet: SimDevice[] = [];
  for (let i = 0; i < devices; i++) {
    fleet.push({
      id: randomUUID(),
      secret: randomBytes(32).toString('hex'),
      authcode: randomBytes(16).toString('hex'),
    });
  }
  const cookies: string[] = [];
  const sessionHashes: string[] = [];
  for (let u = 0; u < users; u++) {
    const sid = newSessionId();
    cookies.push(sid.value);
    sessionHashes.push(sid.hash);
  }
  return { fleet, cookies, sessionHashes };
}

/**
 * One bridge's database before it starts, through its own store, in one transaction: the default frontend; the
 * users, each with a logged-in session; the devices, device `i` provisioned (as the fleet benchmark's) and claimed by
 * user `i mod users`; and, with `triggers`, those rules on every device, owned by the device's owner, written with
 * the same repository call as `POST /0/user/event/` (canonical trigger, its `for`, armed, no webhook or e-mail).
 */
async function seedStore(store: BridgeStore, seeded: Seeded, triggers: string[]): Promise<void> {
  const hasher = new PasswordHasher({ params: SCRYPT, maxConcurrent: 1, maxQueued: 0 });
  const passwordHash = await hasher.hash(PASSWORD);
  const t = Date.now();
  const frontend = await ensureDefaultFrontend(store, t);
  const parsed = triggers.map((text) => {
    const p = parseTrigger(text);
    if (!p.ok) throw new Error(`bad trigger ${text}: ${p.error.message}`);
    return p.trigger;
  });
  await store.write(async (tx) => {
    const userIds: number[] = [];
    for (let u = 0; u < seeded.cookies.length; u++) {
      const user = await tx.createUser({
        frontendId: frontend.id,
        login: `rules-${u}@example.com`,
        passwordHash,
        authcode: randomBytes(16).toString('hex'),
        now: t,
      });
      if (!user) throw new Error(`could not create user ${u}`);
      userIds.push(user.id);
      await tx.createSession({
        idHash: seeded.sessionHashes[u]!,
        frontendId: frontend.id,
        userId: user.id,
        createdAt: t,
        lastSeenAt: t,
      });
    }
    for (let i = 0; i < seeded.fleet.length; i++) {
      const d = seeded.fleet[i]!;
      const owner = userIds[i % userIds.length]!;
      await provisionDevice(tx.devices, d, t - 60_000, owner);
      for (let k = 0; k < parsed.length; k++) {
        await tx.rules.create({
          userId: owner,
          deviceId: d.id,
          name: `rule ${k}`,
          message: '',
          trigger: formatTrigger(parsed[k]!),
          forMs: forMsOf(parsed[k]!),
          email: false,
          webhookUrl: null,
          webhookSecret: null,
          createdAt: t,
          lastValue: null,
        });
      }
    }
  });
}

/** Rules one user holds: those of the devices it owns (device `i` is user `i mod users`'s). */
function rulesOfUser(u: number, opts: Options): number {
  return Math.ceil((opts.devices - u) / opts.users) * opts.rulesPerDevice;
}

/**
 * A bridge's data folder with `bridge.yaml`: a cheap scrypt, the per-user rule limit raised to what the busiest user
 * holds, no per-rule interval (a rule fires at every crossing) and a per-user event limit the run cannot reach; the
 * same for both bridges, so that only the rules differ. Then its database, seeded through the engine's store.
 */
async function seedBridge(
  dataDir: string,
  databaseUrl: string | undefined,
  seeded: Seeded,
  triggers: string[],
  opts: Options,
): Promise<void> {
  mkdirSync(dataDir, { recursive: true });
  writeFileSync(
    join(dataDir, 'bridge.yaml'),
    JSON.stringify({
      accounts: { scryptLogN: SCRYPT.logN },
      notifications: {
        rulesPerUser: Math.max(100, rulesOfUser(0, opts)),
        ruleMinIntervalMs: 0,
        userEventsLimit: 1_000_000,
      },
      ...(databaseUrl !== undefined && { database: { url: databaseUrl } }),
    }),
  );
  const store =
    databaseUrl === undefined
      ? new SqliteStore(dataDir)
      : await openPostgresStore(databaseUrl, pino({ level: 'warn' }), { dataDir, poolSize: 2 });
  try {
    await seedStore(store, seeded, triggers);
  } finally {
    await store.close();
  }
}

// ---- the live channels ----

/**
 * One WebSocket per user on `GET /0/session/` (subprotocol `thsq-user`, the session cookie, a delta request as the
 * official client sends it), ready once its `devices` snapshot came. It notes when each `user-event` frame arrived,
 * by device and value; other frames (the deltas of the user's devices) are only counted, not parsed.
 */
class EventWatchers {
  /** `<device> <value>` → arrival of each frame that carried it (epoch ms). */
  arrivals = new Map<string, number[]>();
  frames = 0;
  eventFrames = 0;
  closedByServer: Record<string, number> = {};
  private constructor(private readonly sockets: WebSocket[]) {}

  static async open(base: string, cookies: string[], throttleMs: number, timeoutMs: number): Promise<EventWatchers> {
    const w = new EventWatchers([]);
    const one = (cookie: string) =>
      new Promise<WebSocket>((resolve, reject) => {
        const ws = new WebSocket(`${base}/0/session/`, 'thsq-user', {
          headers: { cookie: `sid=${cookie}` },
          handshakeTimeout: timeoutMs,
        });
        let ready = false;
        const timer = setTimeout(() => {
          ws.terminate();
          reject(new Error(`no devices snapshot within ${timeoutMs} ms`));
        }, timeoutMs);
        ws.on('open', () => ws.send(JSON.stringify({ delta: true, throttletime: throttleMs })));
        ws.on('message', (data) => {
          const at = now();
          const text = wsText(data);
          if (!ready) {
            if (!text.startsWith('{"devices"')) return;
            ready = true;
            clearTimeout(timer);
            resolve(ws);
            return;
          }
          w.onFrame(text, at);
        });
        ws.on('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode} instead of an upgrade`)));
        ws.on('error', reject);
        ws.on('close', (code, reason) => {
          clearTimeout(timer);
          if (!ready) reject(new Error(`closed ${code} ${reason.toString()}`));
          else if (w.sockets.includes(ws)) {
            const key = `${code} ${reason.toString()}`.trim();
            w.closedByServer[key] = (w.closedByServer[key] ?? 0) + 1;
          }
        });
      });
    for (let i = 0; i < cookies.length; i += 50) {
      w.sockets.push(...(await Promise.all(cookies.slice(i, i + 50).map(one))));
    }
    return w;
  }

  private onFrame(text: string, at: number): void {
    this.frames++;
    // `{"events":{…}}` (bridge/rules/view.ts, userEventFrame): the only frames worth parsing here.
    if (!text.startsWith('{"events"')) return;
    let msg: { events?: Record<string, { type?: string; deviceid?: string; value?: unknown }> };
    try {
      msg = JSON.parse(text) as typeof msg;
    } catch {
      return;
    }
    for (const e of Object.values(msg.events ?? {})) {
      if (e.type !== 'user-event' || typeof e.value !== 'string') continue;
      this.eventFrames++;
      const key = `${e.deviceid} ${e.value}`;
      const list = this.arrivals.get(key);
      if (list) list.push(at);
      else this.arrivals.set(key, [at]);
    }
  }

  /** Forgets what came so far: a phase begins. */
  reset(): void {
    this.arrivals = new Map();
    this.frames = 0;
    this.eventFrames = 0;
  }

  close(): void {
    const sockets = this.sockets.splice(0);
    for (const ws of sockets) ws.close(1000);
  }
}

// ---- the bridges ----

type Label = 'no rules' | 'rules';

interface Side {
  label: Label;
  /** `http://127.0.0.1:<port>` */
  url: string;
  pid: number;
  sim: SimFleet;
  watchers: EventWatchers;
  tally: LogTally;
  databaseCpuMs: (() => number) | undefined;
  output(): string;
  stop(): Promise<void>;
}

async function startSide(
  label: Label,
  dataDir: string,
  db: BenchDatabase | undefined,
  files: { devices: string },
  seeded: Seeded,
  opts: Options,
  cleanup: Cleanup,
): Promise<Side> {
  const prepared = prepareBridge(opts.source);
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = PROFILE_DIR;
    mkdirSync(cpuProfDir, { recursive: true });
  }
  const tally = new LogTally();
  const bridge = await spawnBridgeProcess(
    {
      runtime: prepared.runtime,
      dataDir,
      cpuProfDir,
      nodeArgs: opts.nodeArgs,
      args: ['--open-enrolment', 'false', '--log-level', opts.logLevel],
      onOutput: tally.feed,
    },
    cleanup,
  );
  console.log(`bridge ${label}: pid ${bridge.pid}, from ${prepared.runtime} (${prepared.note})`);
  const pgCpu = db?.postmasterPid === undefined ? undefined : new PostgresCpu(db.postmasterPid, db.name);
  // What the bridge holds, asked through its own API: the first user's rules.
  const listed = await fetch(`${bridge.url}/0/user/event/`, { headers: { cookie: `sid=${seeded.cookies[0]}` } });
  if (listed.status !== 200) throw new Error(`${label}: GET /0/user/event/ answered ${listed.status}`);
  const rules = ((await listed.json()) as unknown[]).length;
  const expected = label === 'rules' ? rulesOfUser(0, opts) : 0;
  if (rules !== expected) throw new Error(`${label}: the first user has ${rules} rules, not ${expected}`);
  const u = new URL(bridge.mqttUrl);
  const sim = SimFleet.start(
    {
      procs: opts.simProcs,
      devicesFile: files.devices,
      endpoints: [{ host: u.hostname, port: Number(u.port) }],
      keepaliveSec: KEEPALIVE_SEC,
    },
    cleanup,
  );
  const c = await sim.connect(opts.connectWindow, 60_000, 3);
  if (c.connected < opts.devices) {
    throw new Error(
      `${label}: ${c.failed} of ${opts.devices} devices did not connect\n${bridge.output().slice(-2000)}`,
    );
  }
  const watchers = await EventWatchers.open(bridge.url.replace(/^http/, 'ws'), seeded.cookies, opts.throttleMs, 30_000);
  cleanup.add('close the live channels', () => watchers.close());
  console.log(
    `  ${opts.devices} devices connected in ${round((c.lastReady - c.firstStart) / 1000)} s, ` +
      `${seeded.cookies.length} live channels open; the first user lists ${rules} rules`,
  );
  return {
    label,
    url: bridge.url,
    pid: bridge.pid,
    sim,
    watchers,
    tally,
    databaseCpuMs: pgCpu && (() => pgCpu.cpuMs()),
    output: () => bridge.output(),
    stop: async () => {
      watchers.close();
      await sim.disconnect();
      await sim.stop();
      await bridge.stop();
      pgCpu?.stop();
    },
  };
}

const OUTCOMES = ['evaluated', 'fired', 'suppressed', 'failed'] as const;
type EngineCounts = Record<(typeof OUTCOMES)[number], number>;

/** The rule engine's counters, from the bridge's `GET /metrics` (`devcloud_rules_events_total`). */
async function engineCounts(url: string): Promise<EngineCounts> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = { evaluated: 0, fired: 0, suppressed: 0, failed: 0 };
  for (const o of OUTCOMES) {
    const m = new RegExp(`^devcloud_rules_events_total\\{outcome="${o}"\\} (\\S+)$`, 'm').exec(text);
    if (!m) throw new Error(`no devcloud_rules_events_total{outcome="${o}"} in ${url}/metrics`);
    out[o] = Number(m[1]);
  }
  return out;
}

// ---- one phase: the load into one bridge, or into both at once ----

interface Lat {
  p50: number;
  p95: number;
  p99: number;
  max: number;
  n: number;
}

function lat(samples: readonly number[]): Lat {
  return {
    p50: round(percentile(samples, 50)),
    p95: round(percentile(samples, 95)),
    p99: round(percentile(samples, 99)),
    max: samples.length > 0 ? round(samples.reduce((a, b) => Math.max(a, b), -Infinity)) : NaN,
    n: samples.length,
  };
}

/** `alone`: the other bridge idles; `paired`: both get the same changes at the same time. */
type Mode = 'alone' | 'paired';

interface PhaseFigures {
  label: Label;
  mode: Mode;
  round: number;
  /** Changes due in the measured window, and all of the phase (warm-up included). */
  sent: number;
  sentTotal: number;
  acked: number;
  ackedTotal: number;
  /** Bridge CPU over the measured window per change due in it, µs; and over the whole phase per change. */
  cpuUsPerChange: number;
  phaseCpuUsPerChange: number;
  databaseCpuUsPerChange: number | undefined;
  /** Over the measured window: the bridge's cores, its simulator's, and the whole machine's busy cores. */
  cores: { bridge: number; simulator: number; machine: number; database?: number };
  pushAck: Lat;
  simLagP99Ms: number;
  engine: EngineCounts;
  /** Spikes pushed in the phase, and in its measured window. */
  spikes: number;
  measuredSpikes: number;
  /** Without rules no event is due: `received` and `missing` are 0, any frame counts as unexpected. */
  events: { received: number; missing: number; duplicates: number; unexpected: number; frames: number };
  /** Per measured spike whose frame came: when it was due, due → frame, and acknowledgement → frame (ms). */
  dues: number[];
  latencies: number[];
  ackToEvent: number[];
  warnings: number;
}

interface Reading {
  cpu: number;
  sim: number;
  machine: number;
  db: number | undefined;
  t: number;
}

function reading(side: Side): Reading {
  return {
    cpu: readCpuMs(side.pid),
    sim: side.sim.cpuMs(),
    machine: machineBusyMs(),
    db: side.databaseCpuMs?.(),
    t: performance.now(),
  };
}

/** Readings of each side at `ms` from now; none for a side that could not be read (its bridge exited). */
function readAt(sides: Side[], ms: number): Promise<Array<Reading | undefined>> {
  return new Promise((resolve) =>
    setTimeout(
      () =>
        resolve(
          sides.map((side) => {
            try {
              return reading(side);
            } catch {
              return undefined;
            }
          }),
        ),
      ms,
    ),
  );
}

async function phase(
  sides: Side[],
  mode: Mode,
  roundNo: number,
  opts: Options,
  spikes: SpikeSpec,
): Promise<PhaseFigures[]> {
  for (const side of sides) {
    if (!existsSync(`/proc/${side.pid}`)) {
      throw new Error(`${side.label}: the bridge exited; its last output:\n${side.output().slice(-2000)}`);
    }
  }
  const e0 = await Promise.all(sides.map((side) => engineCounts(side.url)));
  const warnings0 = sides.map((side) => side.tally.count);
  for (const side of sides) side.watchers.reset();
  const warmupMs = opts.warmupS * 1000;
  const durationMs = opts.durationS * 1000;
  const cpu0 = sides.map((side) => readCpuMs(side.pid));
  // The measured window's readings, taken when the simulators' window begins and ends (it starts 10 ms after the
  // request, support/fleet-sim-main.ts). The last push is due just before it ends, and may be acknowledged sooner.
  const readings = Promise.all([readAt(sides, 10 + warmupMs), readAt(sides, 10 + warmupMs + durationMs)]);
  const pushed = await Promise.all(
    sides.map((side) => side.sim.push(opts.rate, warmupMs, durationMs, opts.drainS * 1000, false, spikes)),
  );
  const [at0, at1] = await readings;
  const key = (s: SpikeMark) => `${s.deviceId} ${s.value}`;
  // Acknowledged: the events may still be on their way.
  const deadline = performance.now() + opts.drainS * 1000;
  const waiting = () =>
    sides.some(
      (side, i) =>
        side.label === 'rules' &&
        (pushed[i]!.spikes ?? []).some((s) => s.measured && !side.watchers.arrivals.has(key(s))),
    );
  while (performance.now() < deadline && waiting()) await sleep(50);
  const cpuPhase = sides.map((side, i) => readCpuMs(side.pid) - cpu0[i]!);
  const e1 = await Promise.all(sides.map((side) => engineCounts(side.url)));

  return sides.map((side, i) => {
    const r = pushed[i]!;
    const w0 = at0[i];
    const w1 = at1[i];
    if (!w0 || !w1) throw new Error(`${side.label}: the bridge's CPU could not be read\n${side.output().slice(-2000)}`);
    const wall = w1.t - w0.t;
    const cpu = w1.cpu - w0.cpu;
    const dbCpu = w0.db === undefined || w1.db === undefined ? undefined : w1.db - w0.db;
    const marks: SpikeMark[] = r.spikes ?? [];
    const measured = marks.filter((s) => s.measured);
    const dues: number[] = [];
    const latencies: number[] = [];
    const ackToEvent: number[] = [];
    let missing = 0;
    let duplicates = 0;
    for (const s of side.label === 'rules' ? measured : []) {
      const got = side.watchers.arrivals.get(key(s));
      if (!got) {
        missing++;
        continue;
      }
      duplicates += got.length - 1;
      dues.push(s.due);
      latencies.push(got[0]! - s.due);
      if (s.acked !== undefined) ackToEvent.push(got[0]! - s.acked);
    }
    const known = new Set(side.label === 'rules' ? marks.map(key) : []);
    let unexpected = 0;
    for (const [k, list] of side.watchers.arrivals) if (!known.has(k)) unexpected += list.length;
    const before = e0[i]!;
    const after = e1[i]!;
    const engine = {
      evaluated: after.evaluated - before.evaluated,
      fired: after.fired - before.fired,
      suppressed: after.suppressed - before.suppressed,
      failed: after.failed - before.failed,
    };
    const f: PhaseFigures = {
      label: side.label,
      mode,
      round: roundNo,
      sent: r.sent,
      sentTotal: r.sentTotal,
      acked: r.acked,
      ackedTotal: r.ackedTotal,
      cpuUsPerChange: round((cpu * 1000) / Math.max(1, r.sent)),
      phaseCpuUsPerChange: round((cpuPhase[i]! * 1000) / Math.max(1, r.sentTotal)),
      databaseCpuUsPerChange: dbCpu === undefined ? undefined : round((dbCpu * 1000) / Math.max(1, r.sent)),
      cores: {
        bridge: round(cpu / wall),
        simulator: round((w1.sim - w0.sim) / wall),
        machine: round((w1.machine - w0.machine) / wall),
        ...(dbCpu !== undefined && { database: round(dbCpu / wall) }),
      },
      pushAck: lat(r.latencies),
      simLagP99Ms: round(r.lagP99Ms),
      engine,
      spikes: marks.length,
      measuredSpikes: measured.length,
      events: { received: latencies.length, missing, duplicates, unexpected, frames: side.watchers.frames },
      dues,
      latencies,
      ackToEvent,
      warnings: side.tally.count - warnings0[i]!,
    };
    const l = lat(latencies);
    console.log(
      `  round ${roundNo}, ${side.label}${mode === 'paired' ? ' (both at once)' : ''}: ${r.sent} changes in ` +
        `${opts.durationS} s (${r.acked} acknowledged), bridge CPU ${f.cpuUsPerChange} µs/change (${f.cores.bridge} ` +
        `cores; machine ${f.cores.machine}), push → ack p50 ${f.pushAck.p50} ms, p99 ${f.pushAck.p99} ms` +
        (side.label === 'rules'
          ? `; ${engine.fired} fired of ${marks.length} spikes, ${f.events.received}/${measured.length} events, ` +
            `p50 ${l.p50} ms, p99 ${l.p99} ms`
          : ''),
    );
    return f;
  });
}

// ---- the run ----

/** The median: the middle value, or the mean of the middle two. */
function mid(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const h = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[h]! : (s[h - 1]! + s[h]!) / 2;
}

/** What a bridge's CPU profile says of the rule engine (bridge/rules/engine.ts, and what it calls). */
interface EngineProfile {
  label: Label;
  /** Main-thread time with the engine on the stack, per change pushed to the bridge over the run, µs. */
  engineUsPerChange: number;
  /** Its share of the bridge's busy (not idle) sampled time. */
  engineShare: number;
  top: ProfileShare['top'];
}

function engineProfile(dir: string, side: Side, changes: number): EngineProfile | undefined {
  const profile = readProfileOf(dir, side.pid);
  if (!profile) return undefined;
  const share = profileShare(profile, (url) => /\/bridge\/rules\/engine\.[jt]s$/.test(url));
  return {
    label: side.label,
    engineUsPerChange: round((share.matchedMs * 1000) / Math.max(1, changes)),
    engineShare: round(share.matchedMs / Math.max(1e-9, share.totalMs - share.idleMs)),
    top: share.top.map((t) => ({ name: t.name, selfMs: round(t.selfMs) })),
  };
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const triggers = ruleTriggers(opts.rulesPerDevice);
  const totalRules = opts.devices * opts.rulesPerDevice;
  console.log(
    `rules: ${totalRules} rules (${opts.rulesPerDevice} per device) over ${opts.devices} devices of ${opts.users} ` +
      `users, ${opts.rate} changes/s, ${opts.fireFraction * 100} % of them firing; the bridges on ${ENGINES[opts.engine]}`,
  );
  console.log(`each device's rules: ${triggers.join(' | ')}`);
  console.log('note: the machine may be shared; figures are noisy, compare with the baseline taken in the same run.');
  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-rules-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  const seeded = makeFleet(opts.devices, opts.users);
  const files = { devices: join(tmp, 'devices.json') };
  writeFileSync(files.devices, JSON.stringify(seeded.fleet));

  // 1. Two data folders (and databases), alike but for the rules.
  const t0 = performance.now();
  const dbs: Partial<Record<Label, BenchDatabase>> = {};
  for (const label of ['no rules', 'rules'] as const) {
    const db = opts.engine === 'postgres' ? await createBenchDatabase(opts.databaseUrl, cleanup, 'rules') : undefined;
    if (db) dbs[label] = db;
    const dir = join(tmp, label === 'rules' ? 'rules' : 'plain');
    await seedBridge(dir, db?.url, seeded, label === 'rules' ? triggers : [], opts);
  }
  const seedMs = performance.now() - t0;
  console.log(
    `seeded both bridges in ${round(seedMs / 1000)} s, through their stores` +
      (opts.engine === 'postgres' ? ` (PostgreSQL ${safeUrl(opts.databaseUrl)})` : ' (SQLite)'),
  );

  // 2. Both bridges, their devices and live channels; then the rounds: each bridge alone, then both at once.
  const plain = await startSide('no rules', join(tmp, 'plain'), dbs['no rules'], files, seeded, opts, cleanup);
  const ruled = await startSide('rules', join(tmp, 'rules'), dbs.rules, files, seeded, opts, cleanup);
  const phases: PhaseFigures[] = [];
  for (let r = 1; r <= opts.rounds; r++) {
    // The same spikes for every phase of a round.
    const spikes: SpikeSpec = { fraction: opts.fireFraction, ...VALUES, seed: 1000 * r };
    phases.push(...(await phase([plain], 'alone', r, opts, spikes)));
    phases.push(...(await phase([ruled], 'alone', r, opts, spikes)));
    if (opts.paired) phases.push(...(await phase([plain, ruled], 'paired', r, opts, spikes)));
  }
  const tallies = { plain: plain.tally, ruled: ruled.tally };
  const closed = { ...plain.watchers.closedByServer, ...ruled.watchers.closedByServer };
  await plain.stop();
  await ruled.stop();
  for (const db of Object.values(dbs)) await db.drop();
  let profiles: EngineProfile[] = [];
  if (opts.cpuProf) {
    const changesOf = (label: Label) => phases.filter((p) => p.label === label).reduce((s, p) => s + p.sentTotal, 0);
    profiles = [plain, ruled].flatMap((side) => engineProfile(PROFILE_DIR, side, changesOf(side.label)) ?? []);
  }

  // 3. Figures.
  const of = (label: Label, mode: Mode) => phases.filter((p) => p.label === label && p.mode === mode);
  const alone = { base: of('no rules', 'alone'), rules: of('rules', 'alone') };
  const paired = { base: of('no rules', 'paired'), rules: of('rules', 'paired') };
  const cpuOf = (xs: PhaseFigures[]) => mid(xs.map((p) => p.cpuUsPerChange));
  const diffs = (x: { base: PhaseFigures[]; rules: PhaseFigures[] }) =>
    x.rules.map((p, i) => p.cpuUsPerChange - x.base[i]!.cpuUsPerChange);
  // The figure judged: both bridges at once, so that the machine's moods fall on both alike; else each alone.
  const judged = opts.paired ? paired : alone;
  const cpuBase = cpuOf(judged.base);
  const cpuRules = cpuOf(judged.rules);
  const added = mid(diffs(judged));
  const latency = lat(alone.rules.flatMap((p) => p.latencies));
  const ackToEvent = lat(alone.rules.flatMap((p) => p.ackToEvent));
  const pairedLatency = lat(paired.rules.flatMap((p) => p.latencies));
  const allRules = phases.filter((p) => p.label === 'rules');
  const sum = (xs: PhaseFigures[], f: (p: PhaseFigures) => number) => xs.reduce((s, p) => s + f(p), 0);
  const events = {
    spikes: sum(allRules, (p) => p.spikes),
    fired: sum(allRules, (p) => p.engine.fired),
    suppressed: sum(allRules, (p) => p.engine.suppressed),
    failed: sum(allRules, (p) => p.engine.failed),
    expected: sum(allRules, (p) => p.measuredSpikes),
    received: sum(allRules, (p) => p.events.received),
    missing: sum(allRules, (p) => p.events.missing),
    duplicates: sum(allRules, (p) => p.events.duplicates),
    unexpected: sum(phases, (p) => p.events.unexpected),
  };
  const clean = events.missing === 0 && events.duplicates === 0 && events.unexpected === 0 && events.expected > 0;
  const met = {
    cpu: added < TARGET.addedUsPerChange,
    latency: latency.p99 < TARGET.p99Ms && clean,
  };
  const allMet = Object.values(met).every(Boolean);

  const f = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? 'n/a' : String(round(x)));
  const list = (xs: PhaseFigures[], g: (p: PhaseFigures) => number) => xs.map((p) => f(g(p))).join(', ');
  const cores = (xs: PhaseFigures[]) =>
    xs.map((p) => `${f(p.cores.bridge)}, ${f(p.cores.simulator)}, ${f(p.cores.machine)}`).join('; ');
  const pushAck = (xs: PhaseFigures[]) => xs.map((p) => `${f(p.pushAck.p50)} / ${f(p.pushAck.p99)}`).join(', ');
  const row = (figure: string, measured: string, baseline = '', target = '', ok?: boolean, ratio = ''): Row => ({
    figure,
    measured,
    baseline,
    ratio,
    target,
    met: ok,
  });
  const rows: Row[] = [
    row("the bridges' database", ENGINES[opts.engine]),
    row(
      'rules (per device); per user',
      `${totalRules} (${opts.rulesPerDevice}); ${rulesOfUser(opts.users - 1, opts)}–${rulesOfUser(0, opts)}`,
      '0',
    ),
    row(
      `changes in each measured window (${opts.durationS} s at ${opts.rate}/s), acknowledged`,
      allRules.map((p) => `${p.sent} (${p.acked})`).join(', '),
      phases
        .filter((p) => p.label === 'no rules')
        .map((p) => `${p.sent} (${p.acked})`)
        .join(', '),
    ),
    row(
      'bridge CPU per change, each alone, per round (µs)',
      list(alone.rules, (p) => p.cpuUsPerChange),
      list(alone.base, (p) => p.cpuUsPerChange),
    ),
    ...(opts.paired
      ? [
          row(
            'bridge CPU per change, both at once, per round (µs)',
            list(paired.rules, (p) => p.cpuUsPerChange),
            list(paired.base, (p) => p.cpuUsPerChange),
          ),
        ]
      : []),
    row(
      `bridge CPU per change, median of ${opts.rounds}${opts.paired ? ', both at once' : ''} (µs)`,
      f(cpuRules),
      f(cpuBase),
      '',
      undefined,
      f(cpuRules / cpuBase),
    ),
    row(
      `added by the rules per change (µs): median; per round${opts.paired ? ', both at once' : ''}`,
      `${f(added)}; ${diffs(judged).map(f).join(', ')}`,
      '',
      `< ${TARGET.addedUsPerChange} µs`,
      met.cpu,
    ),
    ...(opts.paired
      ? [
          row(
            'the same, each alone (µs)',
            `${f(mid(diffs(alone)))}; ${diffs(alone).map(f).join(', ')}`,
            '',
            '(diagnostic)',
          ),
        ]
      : []),
    ...profiles.map((p) =>
      row(
        `rule engine's own time per change, CPU profile: ${p.label} (µs)`,
        `${f(p.engineUsPerChange)} (${f(p.engineShare * 100)} % of busy)`,
        '',
        '(diagnostic)',
      ),
    ),
    row(
      'spikes pushed; rules fired (suppressed, failed)',
      `${events.spikes}; ${events.fired} (${events.suppressed}, ${events.failed})`,
      `${sum(
        phases.filter((p) => p.label === 'no rules'),
        (p) => p.spikes,
      )}; 0`,
      'fired = spikes',
      events.fired === events.spikes && events.suppressed === 0 && events.failed === 0,
    ),
    row(
      'user-event frames received (of spikes in the windows)',
      `${events.received} (of ${events.expected})`,
      '',
      'all',
      events.missing === 0 && events.expected > 0,
    ),
    row(
      'duplicated, unexpected events',
      `${events.duplicates}, ${events.unexpected}`,
      '',
      '0',
      events.duplicates === 0 && events.unexpected === 0,
    ),
    row('change → user-event p50 / p95, alone (ms)', `${f(latency.p50)} / ${f(latency.p95)}`),
    row('change → user-event p99, alone (ms)', f(latency.p99), '', `< ${TARGET.p99Ms} ms`, latency.p99 < TARGET.p99Ms),
    row('change → user-event max, alone (ms)', f(latency.max)),
    row('ack → user-event p50 / p99, alone (ms)', `${f(ackToEvent.p50)} / ${f(ackToEvent.p99)}`, '', '(diagnostic)'),
    row('push → ack p50 / p99, alone, per round (ms)', pushAck(alone.rules), pushAck(alone.base), '(diagnostic)'),
    ...(opts.paired
      ? [
          row(
            'change → user-event p50 / p99, both at once (ms)',
            `${f(pairedLatency.p50)} / ${f(pairedLatency.p99)}`,
            '',
            '(diagnostic)',
          ),
          row(
            'push → ack p50 / p99, both at once, per round (ms)',
            pushAck(paired.rules),
            pushAck(paired.base),
            '(diagnostic)',
          ),
        ]
      : []),
    row(
      'bridge CPU per change over the whole phase, alone (µs)',
      list(alone.rules, (p) => p.phaseCpuUsPerChange),
      list(alone.base, (p) => p.phaseCpuUsPerChange),
      '(diagnostic)',
    ),
    ...(allRules[0]?.databaseCpuUsPerChange === undefined
      ? []
      : [
          row(
            'PostgreSQL CPU per change, alone, per round (µs)',
            list(alone.rules, (p) => p.databaseCpuUsPerChange ?? NaN),
            list(alone.base, (p) => p.databaseCpuUsPerChange ?? NaN),
            '(diagnostic)',
          ),
        ]),
    row('cores busy: bridge, simulator, machine; alone', cores(alone.rules), cores(alone.base), '(diagnostic)'),
    ...(opts.paired ? [row('the same, both at once', cores(paired.rules), cores(paired.base), '(diagnostic)')] : []),
    row(
      "simulator's send lag p99, alone (ms)",
      list(alone.rules, (p) => p.simLagP99Ms),
      list(alone.base, (p) => p.simLagP99Ms),
      '(diagnostic)',
    ),
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    'Baseline: a second bridge seeded alike (users, devices, sessions, live channels, config) but without rules, ' +
      'given the same changes. CPU: user + system of the bridge process over the measured window, per change due in ' +
      `it${opts.paired ? '; judged on the phases where both bridges get their changes at once' : ''}.`,
  );
  const verdict = (ok: boolean, what: string, value: string, target: string, margin: string) =>
    console.log(`${ok ? 'PASS' : 'MISS'} ${what}: ${value} (target ${target}; margin ${margin})`);
  verdict(
    met.cpu,
    'bridge CPU added by the rules per change',
    `${f(added)} µs (${f(cpuRules)} with, ${f(cpuBase)} without)`,
    `< ${TARGET.addedUsPerChange} µs`,
    `${f(TARGET.addedUsPerChange - added)} µs`,
  );
  verdict(
    met.latency,
    'change → user-event p99',
    `${f(latency.p99)} ms, ${events.received} of ${events.expected} received`,
    `< ${TARGET.p99Ms} ms, all received once`,
    `${f(TARGET.p99Ms - latency.p99)} ms`,
  );
  for (const p of alone.rules) {
    const seconds: number[][] = [];
    const first = Math.min(...p.dues);
    p.dues.forEach((due, i) => (seconds[Math.floor((due - first) / 1000)] ??= []).push(p.latencies[i]!));
    console.log(
      `change → user-event p99 second by second, round ${p.round} (ms): ` +
        Array.from(seconds, (xs) => f(percentile(xs ?? [], 99))).join(', '),
    );
  }
  for (const p of profiles) {
    console.log(
      `the engine's time in the bridge ${p.label}, by function (self ms): ` +
        p.top.map((t) => `${t.name} ${f(t.selfMs)}`).join('; '),
    );
  }
  for (const [name, t] of Object.entries(tallies)) {
    if (t.count > 0) {
      console.log(
        `the bridge ${name} logged ${t.count} warnings or errors: ${JSON.stringify(t.byEvent)}; last: ${t.last}`,
      );
    }
  }
  if (Object.keys(closed).length > 0) console.log(`live channels the bridges closed: ${JSON.stringify(closed)}`);
  if (opts.cpuProf) console.log(`bridge CPU profiles written to ${PROFILE_DIR}`);
  const strip = (p: PhaseFigures) => ({ ...p, dues: undefined, latencies: undefined, ackToEvent: undefined });
  console.log(
    JSON.stringify({
      bench: 'rules',
      engine: opts.engine,
      options: {
        ...opts,
        databaseUrl: opts.engine === 'postgres' ? safeUrl(opts.databaseUrl) : undefined,
        tmp: undefined,
      },
      rules: { total: totalRules, perDevice: opts.rulesPerDevice, users: opts.users, triggers },
      seedMs: round(seedMs),
      cpu: {
        judged: opts.paired ? 'paired' : 'alone',
        baselineUsPerChange: round(cpuBase),
        rulesUsPerChange: round(cpuRules),
        addedUsPerChange: round(added),
        addedPerRound: diffs(judged).map((x) => round(x)),
        aloneAddedUsPerChange: round(mid(diffs(alone))),
        aloneAddedPerRound: diffs(alone).map((x) => round(x)),
      },
      latency,
      ackToEvent,
      pairedLatency,
      events,
      profiles,
      phases: phases.map(strip),
      bridgeWarnings: tallies.plain.count + tallies.ruled.count,
      bridgeWarningsByEvent: { 'no rules': tallies.plain.byEvent, rules: tallies.ruled.byEvent },
      target: TARGET,
      met,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
