/**
 * `npm run bench -- rest-session`: how much the bridge's session and user-data work costs on the two requests
 * an app makes most (`GET /0/user/`, `POST /0/session/` with its cookie), against a bare Fastify server that
 * answers the same bytes, and whether logins (production-cost scrypt) stall other requests. The bridge runs as
 * the service does (a child process from `dist/`, production settings); the bare server runs in another child
 * process; both are measured in the same run. See bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PasswordHasher } from '../bridge/accounts/password.js';
import { BridgeConfigSchema } from '../bridge/config.js';
import { SqliteStore } from '../bridge/store/sqlite.js';
import { ProductConfig } from '../bridge/store/types.js';
import { type ServerProcess, prepareBridge, spawnBareHttp, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { intOption } from './support/options.js';
import { type ProbeRun, type ThroughputRun, cookieOf, probe, send, throughput } from './support/http-load.js';
import { ROOT, readCpuMs } from './support/processes.js';
import { type Row, formatTable, percentile, round } from './support/report.js';

const TARGET = {
  /** Requests/s of the bridge as a share of the bare server's, for both cookie paths. */
  shareOfBare: 0.6,
  /** p99 of `GET /0/user/` while logins run, ms. */
  p99DuringLoginsMs: 20,
};

/**
 * Logins per user in one window: the bridge counts 10 attempts per login and minute (reset on success, but
 * queued logins succeed late), so the load is spread over enough users to stay below it.
 */
const LOGINS_PER_USER = 5;
/** Source addresses for the logins (127.0.0.2 ...): the bridge also limits attempts per address, 50 a minute. */
const LOGIN_ADDRESSES = 250;
const PASSWORD = 'bench-password-1';
/** The requests that set the run up; a bridge that does not answer them fails the run instead of holding it. */
const SETUP_TIMEOUT_MS = 30_000;

interface Options {
  connections: number;
  pipelining: number;
  durationS: number;
  rounds: number;
  warmupS: number;
  probeRate: number;
  quietS: number;
  loginsPerSec: number;
  loginS: number;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --connections N       autocannon connections for the throughput rounds (default 10)
  --pipelining N        requests in flight per connection (default 1)
  --duration S          seconds per throughput round (default 3)
  --rounds N            rounds per figure, bridge and bare alternated (default 2)
  --warmup S            seconds of unmeasured load on each server and route first (default 1)
  --probe-rate N        GET /0/user/ per second while measuring latency (default 200)
  --quiet-s S           seconds of latency probe without logins (default 5)
  --logins-per-sec N    logins started per second during the login window (default 20)
  --login-s S           length of the login window, seconds (default 10)
  --tmp DIR             where the bridge's database goes (default the system's temp folder)
  --source              run the bridge from TypeScript through tsx instead of dist/
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
        'probe-rate': { type: 'string', default: '200' },
        'quiet-s': { type: 'string', default: '5' },
        'logins-per-sec': { type: 'string', default: '20' },
        'login-s': { type: 'string', default: '10' },
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
  return {
    connections: int('connections', v.connections, 1),
    pipelining: int('pipelining', v.pipelining, 1),
    durationS: int('duration', v.duration, 1),
    rounds: int('rounds', v.rounds, 1),
    warmupS: int('warmup', v.warmup, 0),
    probeRate: int('probe-rate', v['probe-rate'], 1),
    quietS: int('quiet-s', v['quiet-s'], 1),
    loginsPerSec: int('logins-per-sec', v['logins-per-sec'], 1),
    loginS: int('login-s', v['login-s'], 1),
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
  };
}

const loginOf = (i: number) => `bench-${i}@example.com`;
const MAIN_LOGIN = 'bench-main@example.com';

/**
 * Creates the default frontend and the users in the bridge's database before it starts, through its own store
 * (and without loading its HTTP side): one production-cost hash shared by all users (the work of verifying it
 * does not depend on whose it is), so that setting up costs one hash instead of one per user and no signup
 * rate limit is involved.
 */
async function seedUsers(dataDir: string, users: number): Promise<{ params: string; hashMs: number }> {
  const config = BridgeConfigSchema.parse({ dataDir });
  const a = config.accounts;
  const hasher = new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: 1,
    maxQueued: 0,
  });
  const t0 = performance.now();
  const passwordHash = await hasher.hash(PASSWORD);
  const hashMs = performance.now() - t0;
  mkdirSync(dataDir, { recursive: true });
  const store = new SqliteStore(dataDir);
  try {
    // The bridge adopts a default frontend it finds instead of making one.
    const frontend = {
      id: randomUUID(),
      name: 'default',
      config: ProductConfig.parse({}),
      isDefault: true,
      createdAt: Date.now(),
    };
    await store.createFrontend(frontend);
    await store.write(async (tx) => {
      for (const login of [MAIN_LOGIN, ...Array.from({ length: users }, (_, i) => loginOf(i))]) {
        await tx.createUser({
          frontendId: frontend.id,
          login,
          passwordHash,
          // The shape the bridge makes (decision 17: 128 random bits in lowercase hex).
          authcode: randomBytes(16).toString('hex'),
          now: Date.now(),
        });
      }
    });
  } finally {
    await store.close();
  }
  return { params: `N=2^${a.scryptLogN}, r=${a.scryptR}, p=${a.scryptP}`, hashMs };
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

/** One autocannon run against `server`, with the CPU both sides spent. */
async function measure(
  server: ServerProcess,
  path: string,
  method: 'GET' | 'POST',
  cookie: string | undefined,
  opts: Options,
  durationS: number,
): Promise<Measured> {
  const cpu0 = readCpuMs(server.pid);
  const own0 = process.cpuUsage();
  const r = await throughput({
    url: `${server.url}${path}`,
    method,
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

/** Fails the run when a server answered anything but `expected`: the figure would measure the wrong path. */
function expectOnly(what: string, r: ThroughputRun, expected: number): void {
  const other = Object.entries(r.statuses).filter(([code]) => Number(code) !== expected);
  if (other.length > 0 || r.errors > 0 || r.completed === 0) {
    throw new Error(
      `${what}: expected only ${expected}, got ${JSON.stringify(r.statuses)}, ${r.errors} connection errors`,
    );
  }
}

interface Pair {
  bridge: Measured[];
  bare: Measured[];
}

/** `rounds` runs on each server, alternated (bare first in even rounds), so that both see the same machine. */
async function pairRounds(
  bridge: ServerProcess,
  bare: ServerProcess,
  path: string,
  method: 'GET' | 'POST',
  cookie: string,
  expected: number,
  opts: Options,
): Promise<Pair> {
  const out: Pair = { bridge: [], bare: [] };
  if (opts.warmupS > 0) {
    await measure(bare, path, method, cookie, opts, opts.warmupS);
    await measure(bridge, path, method, cookie, opts, opts.warmupS);
  }
  for (let r = 0; r < opts.rounds; r++) {
    const order = r % 2 === 0 ? (['bare', 'bridge'] as const) : (['bridge', 'bare'] as const);
    for (const which of order) {
      const m = await measure(which === 'bridge' ? bridge : bare, path, method, cookie, opts, opts.durationS);
      expectOnly(`${method} ${path} on the ${which} server`, m, expected);
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

interface LoginAttempt {
  startedAt: number;
  ms?: number;
  status?: number;
  error?: string;
}

/**
 * Starts `perSec` logins a second for `seconds`, each on its own connection from its own loopback address and
 * without waiting for earlier ones, cycling over the users. Resolves when the last one has been started; the
 * attempts fill in as answers arrive.
 */
function paceLogins(
  url: string,
  perSec: number,
  seconds: number,
  users: number,
): { attempts: LoginAttempt[]; started: Promise<void>; abortAll(): void } {
  const attempts: LoginAttempt[] = [];
  const aborts: Array<() => void> = [];
  const total = perSec * seconds;
  const interval = 1000 / perSec;
  const started = new Promise<void>((resolve) => {
    const t0 = performance.now();
    let next = 0;
    const tick = () => {
      const now = performance.now();
      while (next < total && t0 + next * interval <= now) {
        const i = next++;
        const a: LoginAttempt = { startedAt: performance.now() };
        attempts.push(a);
        const req = send(`${url}/0/session/login`, {
          method: 'POST',
          body: loginBody(loginOf(i % users)),
          localAddress: `127.0.0.${2 + (i % LOGIN_ADDRESSES)}`,
        });
        aborts.push(() => req.abort());
        req.done.then(
          (reply) => {
            a.status = reply.status;
            a.ms = performance.now() - a.startedAt;
          },
          (err: unknown) => {
            if (a.status === undefined) a.error = err instanceof Error ? err.message : String(err);
          },
        );
      }
      if (next < total) setTimeout(tick, Math.max(0, t0 + next * interval - performance.now()));
      else resolve();
    };
    tick();
  });
  return { attempts, started, abortAll: () => aborts.forEach((abort) => abort()) };
}

function latencySummary(r: ProbeRun): { p50: number; p99: number; max: number; samples: number } {
  return {
    p50: percentile(r.latencies, 50),
    p99: percentile(r.latencies, 99),
    max: r.latencies.length > 0 ? Math.max(...r.latencies) : NaN,
    samples: r.latencies.length,
  };
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const prepared = prepareBridge(opts.source);
  console.log(`rest-session: bridge from ${prepared.runtime} (${prepared.note})`);
  console.log('note: the machine may be shared; figures are noisy, compare ratios taken in the same run.');

  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }

  const totalLogins = opts.loginsPerSec * opts.loginS;
  const users = Math.max(1, Math.ceil(totalLogins / LOGINS_PER_USER));
  const dataDir = join(tmp, 'bridge');
  const seeded = await seedUsers(dataDir, users);
  console.log(
    `seeded ${users + 1} users; one scrypt hash (${seeded.params}) took ${Math.round(seeded.hashMs)} ms here`,
  );

  const bridge = await spawnBridgeProcess(
    { runtime: prepared.runtime, dataDir, cpuProfDir, nodeArgs: opts.nodeArgs },
    cleanup,
  );
  console.log(`bridge at ${bridge.url}${bridge.nodeArgs.length > 0 ? `, node ${bridge.nodeArgs.join(' ')}` : ''}`);

  // A real login for the cookie every request below carries.
  const login = await send(`${bridge.url}/0/session/login`, {
    method: 'POST',
    body: loginBody(MAIN_LOGIN),
    timeoutMs: SETUP_TIMEOUT_MS,
  }).done;
  const cookie = cookieOf(login);
  if (login.status !== 201 || !cookie) throw new Error(`login failed: ${login.status} ${login.body}`);
  const user = await send(`${bridge.url}/0/user/`, { headers: { cookie }, timeoutMs: SETUP_TIMEOUT_MS }).done;
  if (user.status !== 200) throw new Error(`GET /0/user/ answered ${user.status} ${user.body}`);

  const bare = await spawnBareHttp(user.body, cleanup);
  const bareUser = await send(`${bare.url}/0/user/`, { timeoutMs: SETUP_TIMEOUT_MS }).done;
  const same = (h: string) => bareUser.headers[h] === user.headers[h];
  if (bareUser.body !== user.body || !same('content-type') || !same('cache-control')) {
    throw new Error(`the bare server answers other bytes: ${bareUser.body}`);
  }
  console.log(`bare server at ${bare.url}; measuring (about a minute)`);

  // 1 and 2: throughput of the two cookie paths, bridge against bare.
  const get = await pairRounds(bridge, bare, '/0/user/', 'GET', cookie, 200, opts);
  const post = await pairRounds(bridge, bare, '/0/session/', 'POST', cookie, 200, opts);
  // For information: a new (anonymous) session per request, each written durably before the answer.
  const fresh = await measure(bridge, '/0/session/', 'POST', undefined, opts, opts.durationS);
  expectOnly('POST /0/session/ without a cookie', fresh, 201);

  // 3: GET /0/user/ latency at a steady rate, first alone, then while logins run. The bare server is probed at
  // the same time, at the same rate: what it sees is the machine (other processes, this one), not the bridge.
  const probeOne = (server: ServerProcess, seconds: number) =>
    probe({ url: `${server.url}/0/user/`, headers: { cookie }, rate: opts.probeRate, durationMs: seconds * 1000 });
  const probeBoth = (seconds: number) => Promise.all([probeOne(bridge, seconds), probeOne(bare, seconds)]);
  const [quiet, quietBare] = await probeBoth(opts.quietS);
  const cpuBeforeLogins = readCpuMs(bridge.pid);
  const logins = paceLogins(bridge.url, opts.loginsPerSec, opts.loginS, users);
  const windowStart = performance.now();
  const [busy, busyBare] = await probeBoth(opts.loginS);
  await logins.started;
  const windowMs = performance.now() - windowStart;
  const bridgeCpuDuringLoginsMs = readCpuMs(bridge.pid) - cpuBeforeLogins;
  // What has not been answered by now is still queued for the hashing pool; the run does not wait for it.
  const attempts = logins.attempts.map((a) => ({ ...a }));
  logins.abortAll();
  for (const [what, r] of [
    ['without logins', quiet],
    ['during logins', busy],
    ['on the bare server', quietBare],
    ['on the bare server', busyBare],
  ] as const) {
    const other = Object.keys(r.statuses).filter((c) => c !== '200');
    if (other.length > 0 || r.errors > 0)
      throw new Error(`GET /0/user/ ${what}: ${JSON.stringify(r.statuses)}, ${r.errors} errors`);
  }

  await bridge.stop();
  await bare.stop();
  const bridgeOutput = bridge
    .output()
    .split('\n')
    .filter((l) => l.trim().length > 0);

  // Figures.
  const g = { bridge: sum(get.bridge), bare: sum(get.bare) };
  const p = { bridge: sum(post.bridge), bare: sum(post.bare) };
  const getRatio = g.bridge.perSec / g.bare.perSec;
  const postRatio = p.bridge.perSec / p.bare.perSec;
  const freeRatio = fresh.perSec / p.bare.perSec;
  const lq = latencySummary(quiet);
  const lb = latencySummary(busy);
  const bq = latencySummary(quietBare);
  const bb = latencySummary(busyBare);
  const answered = attempts.filter((a) => a.status !== undefined);
  const ok = answered.filter((a) => a.status === 201);
  const refused = answered.filter((a) => a.status === 429 || a.status === 503);
  const failed = answered.filter((a) => a.status !== 201 && a.status !== 429 && a.status !== 503);
  const unfinished = attempts.filter((a) => a.status === undefined).length;
  const okMs = ok.map((a) => a.ms!);
  const loginStats = {
    started: attempts.length,
    ok: ok.length,
    refused: refused.length,
    otherStatus: failed.length,
    unfinished,
    okPerSec: ok.length / (windowMs / 1000),
    p50: percentile(okMs, 50),
    p99: percentile(okMs, 99),
    hashOnePerSec: 1000 / seeded.hashMs,
  };

  const met = {
    get: getRatio >= TARGET.shareOfBare,
    post: postRatio >= TARGET.shareOfBare,
    stall: lb.p99 < TARGET.p99DuringLoginsMs,
  };
  const allMet = Object.values(met).every(Boolean);
  const f = (n: number) => String(round(n));
  const conn = `${opts.connections} conn × ${opts.pipelining}`;
  const rows: Row[] = [
    {
      figure: `GET /0/user/ req/s, logged in (${conn})`,
      measured: String(Math.round(g.bridge.perSec)),
      baseline: `${Math.round(g.bare.perSec)} bare`,
      ratio: f(getRatio),
      target: `≥ ${TARGET.shareOfBare} × bare`,
      met: met.get,
    },
    {
      figure: 'POST /0/session/ req/s, with cookie (200)',
      measured: String(Math.round(p.bridge.perSec)),
      baseline: `${Math.round(p.bare.perSec)} bare`,
      ratio: f(postRatio),
      target: `≥ ${TARGET.shareOfBare} × bare`,
      met: met.post,
    },
    {
      figure: 'POST /0/session/ req/s, no cookie (201, durable)',
      measured: String(Math.round(fresh.perSec)),
      baseline: `${Math.round(p.bare.perSec)} bare`,
      ratio: f(freeRatio),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'server CPU per GET /0/user/ (µs)',
      measured: f(g.bridge.serverCpuUs),
      baseline: `${f(g.bare.serverCpuUs)} bare`,
      ratio: f(g.bridge.serverCpuUs / g.bare.serverCpuUs),
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: 'server CPU per POST /0/session/ (µs)',
      measured: `${f(p.bridge.serverCpuUs)}; ${f(fresh.serverCpuUs)} new`,
      baseline: `${f(p.bare.serverCpuUs)} bare`,
      ratio: f(p.bridge.serverCpuUs / p.bare.serverCpuUs),
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: `GET /0/user/ p50 at ${opts.probeRate}/s, logins (ms)`,
      measured: f(lb.p50),
      baseline: `${f(lq.p50)} without`,
      ratio: f(lb.p50 / lq.p50),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: `GET /0/user/ p99 at ${opts.probeRate}/s, logins (ms)`,
      measured: f(lb.p99),
      baseline: `${f(lq.p99)} without`,
      ratio: f(lb.p99 / lq.p99),
      target: `< ${TARGET.p99DuringLoginsMs} ms`,
      met: met.stall,
    },
    {
      figure: 'bare server p99, same windows (ms)',
      measured: f(bb.p99),
      baseline: `${f(bq.p99)} without`,
      ratio: f(bb.p99 / bq.p99),
      target: '(machine noise)',
      met: undefined,
    },
    {
      figure: `logins answered 201 in ${f(windowMs / 1000)} s`,
      measured: `${ok.length} of ${attempts.length}`,
      baseline: `${refused.length} refused, ${unfinished} queued`,
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'login p50, p99 of those answered (ms)',
      measured: `${f(loginStats.p50)}, ${f(loginStats.p99)}`,
      baseline: `${Math.round(seeded.hashMs)} one hash`,
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  if (unfinished > 0) {
    console.log(
      `${unfinished} logins were still waiting for the hashing pool when the window closed: the bridge completes ` +
        `about ${f(loginStats.okPerSec)} a second here, fewer than the ${opts.loginsPerSec} offered.`,
    );
  }
  if (!met.get || !met.post) {
    console.log(
      `the bridge used ${f(g.bridge.serverCpuUs)} µs of CPU per GET /0/user/ against ${f(g.bare.serverCpuUs)} µs ` +
        'for the bare server: see "Finding out why" in bench/README.md.',
    );
  }
  if (!met.stall && bb.p99 >= TARGET.p99DuringLoginsMs) {
    console.log(
      `the bare server's p99 in the same window was ${f(bb.p99)} ms as well: the machine was busy; run it again.`,
    );
  }
  if (failed.length > 0)
    console.log(`${failed.length} logins answered ${[...new Set(failed.map((a) => String(a.status)))].join(', ')}`);
  if (bridgeOutput.length > 0)
    console.log(`the bridge logged ${bridgeOutput.length} lines; last: ${bridgeOutput.at(-1)}`);
  if (cpuProfDir) console.log(`bridge CPU profile written to ${cpuProfDir}`);
  console.log(
    JSON.stringify({
      bench: 'rest-session',
      bridgeRuntime: prepared.runtime,
      options: {
        connections: opts.connections,
        pipelining: opts.pipelining,
        durationS: opts.durationS,
        rounds: opts.rounds,
        warmupS: opts.warmupS,
        probeRate: opts.probeRate,
        quietS: opts.quietS,
        loginsPerSec: opts.loginsPerSec,
        loginS: opts.loginS,
        tmp: opts.tmp,
      },
      bridgeNodeArgs: bridge.nodeArgs,
      scrypt: { params: seeded.params, oneHashMs: round(seeded.hashMs) },
      getUser: {
        bridgePerSec: round(g.bridge.perSec),
        barePerSec: round(g.bare.perSec),
        ratio: round(getRatio),
        bridgeRounds: g.bridge.rounds,
        bareRounds: g.bare.rounds,
        bridgeCpuUs: round(g.bridge.serverCpuUs),
        bareCpuUs: round(g.bare.serverCpuUs),
        clientCpuUsBridge: round(g.bridge.clientCpuUs),
        clientCpuUsBare: round(g.bare.clientCpuUs),
        target: TARGET.shareOfBare,
        met: met.get,
      },
      postSession: {
        bridgePerSec: round(p.bridge.perSec),
        barePerSec: round(p.bare.perSec),
        ratio: round(postRatio),
        bridgeRounds: p.bridge.rounds,
        bareRounds: p.bare.rounds,
        bridgeCpuUs: round(p.bridge.serverCpuUs),
        bareCpuUs: round(p.bare.serverCpuUs),
        clientCpuUsBridge: round(p.bridge.clientCpuUs),
        clientCpuUsBare: round(p.bare.clientCpuUs),
        target: TARGET.shareOfBare,
        met: met.post,
      },
      newSession: {
        bridgePerSec: round(fresh.perSec),
        ratioToBarePost: round(freeRatio),
        bridgeCpuUs: round(fresh.serverCpuUs),
        created: fresh.completed,
      },
      loginStall: {
        probeRate: opts.probeRate,
        quiet: { p50Ms: round(lq.p50), p99Ms: round(lq.p99), maxMs: round(lq.max), samples: lq.samples },
        duringLogins: { p50Ms: round(lb.p50), p99Ms: round(lb.p99), maxMs: round(lb.max), samples: lb.samples },
        p99Ratio: round(lb.p99 / lq.p99),
        bareQuiet: { p50Ms: round(bq.p50), p99Ms: round(bq.p99), maxMs: round(bq.max), samples: bq.samples },
        bareDuringLogins: { p50Ms: round(bb.p50), p99Ms: round(bb.p99), maxMs: round(bb.max), samples: bb.samples },
        bridgeCpuDuringLoginsMs: round(bridgeCpuDuringLoginsMs),
        windowMs: round(windowMs),
        target: { p99Ms: TARGET.p99DuringLoginsMs },
        met: met.stall,
      },
      logins: {
        perSecOffered: opts.loginsPerSec,
        started: loginStats.started,
        ok: loginStats.ok,
        refused: loginStats.refused,
        otherStatus: loginStats.otherStatus,
        unfinished: loginStats.unfinished,
        okPerSec: round(loginStats.okPerSec),
        okP50Ms: round(loginStats.p50),
        okP99Ms: round(loginStats.p99),
        users,
      },
      bridgeLogLines: bridgeOutput.length,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
