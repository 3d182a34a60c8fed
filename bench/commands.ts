/**
 * `npm run bench -- commands`: how many commands a bridge and one connected agent carry end to end, and how
 * quickly an urgent command gets through while ordinary ones keep the device busy. Commands are posted through
 * the REST API (`POST /0/devices/<id>/`) to a real agent whose handler does nothing (the built-in `ping`), and
 * each counts once the bridge has recorded it `done`. The bridge and the agent run as the services do (child
 * processes from `dist/`, production settings); the baselines (the same MQTT messages through a bare broker,
 * one durable commit) are taken in the same run. See bench/README.md.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import Database from 'better-sqlite3';
import { LocalClient } from '../agent/local/client.js';
import { openDatabase } from '../lib/sqlite.js';
import { BridgeConfigSchema } from '../bridge/config.js';
import { encode, messageId } from '../protocol/index.js';
import { BareEcho, connectClient } from './support/bare-mqtt.js';
import { prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { seedUser } from './support/seed.js';
import { cookieOf, send } from './support/http-load.js';
import {
  type AgentProcess,
  ROOT,
  prepareAgent,
  readCpuMs,
  spawnAgentProcess,
  startBenchBroker,
} from './support/processes.js';
import { type Row, formatTable, median, percentile, round } from './support/report.js';

const TARGET = {
  /** Commands posted to one device and recorded `done` on the bridge, per second, first POST to last `done`. */
  commandsPerSec: 2000,
  /** p50 of one priority-2 command from its POST until the bridge records it `done`, while the queue is busy. */
  urgentP50Ms: 20,
};

/** The bridge's `commands.maxOpen` at its production default (decision 13): one more open command is refused. */
const MAX_OPEN = BridgeConfigSchema.parse({ dataDir: tmpdir() }).commands.maxOpen;
/** The handler that does nothing: answered inside the agent's transaction that takes it. */
const HANDLER = 'ping';
/** The executable handler of the extra row: a process that exits 0 at once. */
const EXEC_HANDLER = 'true';
const PASSWORD = 'bench-password-1';
const LOGIN = 'bench-commands@example.com';
/** The requests that set the run up; a bridge that does not answer them fails the run instead of holding it. */
const SETUP_TIMEOUT_MS = 30_000;
/** The longest one phase may wait for its last command to be recorded `done` before the run fails. */
const DRAIN_TIMEOUT_MS = 120_000;
/** Pause before a POST refused with a full queue is sent again. */
const FULL_RETRY_MS = 5;
const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

interface Options {
  commands: number;
  rounds: number;
  warmup: number;
  window: number;
  connections: number;
  samples: number;
  urgentWarmup: number;
  busyShare: number;
  execCommands: number;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --commands N       commands per throughput round (default 10000)
  --rounds N         throughput rounds, alternated with bare rounds of as many messages (default 2)
  --warmup N         unmeasured commands before the first round (default 1000)
  --window N         most commands open at once (posted, not yet recorded done); below ${MAX_OPEN} (default 900)
  --connections N    HTTP connections posting, each with one request in flight (default 16)
  --samples N        urgent commands timed one at a time in each series: idle, steady load, full speed (default 200)
  --urgent-warmup N  unmeasured urgent commands before each series (default 20)
  --busy-share X     ordinary commands/s beside the urgent ones, as a share of the measured rate (default 0.5)
  --exec-commands N  commands for the executable handler (${EXEC_HANDLER}) in an extra round; 0 skips it (default 500)
  --tmp DIR          where the bridge's and the agent's databases go (default the system's temp folder)
  --source           run the bridge and the agent from TypeScript through tsx instead of dist/
  --cpu-prof         write V8 CPU profiles of the bridge and the agent to .bench/profiles/
  --node-arg=ARG     pass ARG to node when starting the bridge and the agent (repeatable)`;

function parseOptions(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        commands: { type: 'string', default: '10000' },
        rounds: { type: 'string', default: '2' },
        warmup: { type: 'string', default: '1000' },
        window: { type: 'string', default: '900' },
        connections: { type: 'string', default: '16' },
        samples: { type: 'string', default: '200' },
        'urgent-warmup': { type: 'string', default: '20' },
        'busy-share': { type: 'string', default: '0.5' },
        'exec-commands': { type: 'string', default: '500' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
        'cpu-prof': { type: 'boolean', default: false },
        'node-arg': { type: 'string', multiple: true, default: [] },
      },
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = (key: string, text: string, min: number, max = Number.MAX_SAFE_INTEGER) => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < min || n > max)
      throw new UsageError(`--${key} must be an integer from ${min} to ${max}\n${USAGE}`);
    return n;
  };
  const busyShare = Number(v['busy-share']);
  if (!(busyShare > 0 && busyShare <= 1)) throw new UsageError(`--busy-share must be above 0, at most 1\n${USAGE}`);
  return {
    commands: int('commands', v.commands, 1),
    rounds: int('rounds', v.rounds, 1),
    warmup: int('warmup', v.warmup, 0),
    window: int('window', v.window, 1, MAX_OPEN - 1),
    connections: int('connections', v.connections, 1, 256),
    samples: int('samples', v.samples, 1),
    urgentWarmup: int('urgent-warmup', v['urgent-warmup'], 0),
    busyShare,
    execCommands: int('exec-commands', v['exec-commands'], 0),
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

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

/** A command's times as the bridge recorded them (ms, one clock: the bridge's and the agent's run here). */
interface Stamps {
  created: number;
  sent: number | null;
  /** The agent's stamp of its `queued` report: when it stored the command. */
  delivered: number | null;
  finished: number | null;
}

/**
 * The bridge's commands as it recorded them, read through a read-only connection of this process (WAL: the
 * reads take no lock the bridge waits for), so that watching costs the bridge nothing but the page cache.
 */
class Watcher {
  private readonly db: Database.Database;
  private readonly s;

  constructor(path: string, deviceId: string) {
    this.db = new Database(path, { readonly: true, fileMustExist: true });
    const open = this.db
      .prepare<[string], number>(
        "SELECT count(*) FROM commands WHERE device_id = ? AND state IN ('queued', 'sent', 'running')",
      )
      .pluck();
    const state = this.db.prepare<[string], string>('SELECT state FROM commands WHERE id = ?').pluck();
    const lastSeq = this.db.prepare<[], number>('SELECT coalesce(max(seq), 0) FROM commands').pluck();
    const states = this.db.prepare<[string, number], { state: string; output: string | null; n: number }>(
      'SELECT state, output, count(*) AS n FROM commands WHERE device_id = ? AND seq > ? GROUP BY state, output',
    );
    // Ordinary commands that were posted before an urgent one and that the device finished after it (its clock,
    // whole ms: ties do not count).
    const overtaken = this.db
      .prepare<[string], number>(
        `SELECT count(*) FROM commands o, commands u
         WHERE u.id = ? AND o.device_id = u.device_id AND o.priority = 0 AND o.seq < u.seq
           AND o.finished_at > u.finished_at`,
      )
      .pluck();
    const stamps = this.db.prepare<[string], Stamps>(
      `SELECT created_at AS created, sent_at AS sent, delivered_at AS delivered, finished_at AS finished
       FROM commands WHERE id = ?`,
    );
    this.s = {
      stamps: (id: string) => stamps.get(id),
      open: () => open.get(deviceId) ?? 0,
      state: (id: string) => state.get(id),
      lastSeq: () => lastSeq.get() ?? 0,
      states: (after: number) => states.all(deviceId, after),
      overtaken: (id: string) => overtaken.get(id) ?? 0,
    };
  }

  /** Commands of the device not finished: what the bridge counts against `maxOpen`. */
  openCount(): number {
    return this.s.open();
  }

  state(id: string): string | undefined {
    return this.s.state(id);
  }

  lastSeq(): number {
    return this.s.lastSeq();
  }

  /** The device's commands after `seq`, counted by state and output. */
  states(after: number): Array<{ state: string; output: string | null; n: number }> {
    return this.s.states(after);
  }

  overtaken(id: string): number {
    return this.s.overtaken(id);
  }

  stamps(id: string): Stamps | undefined {
    return this.s.stamps(id);
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}

interface Reply {
  status: number;
  body: string;
}

/** POSTs of commands to one device over a pool of keep-alive connections, with a logged-in user's cookie. */
class Poster {
  private readonly agent: Agent;
  private readonly url: URL;

  constructor(
    bridgeUrl: string,
    deviceId: string,
    private readonly cookie: string,
    connections: number,
  ) {
    this.agent = new Agent({ keepAlive: true, maxSockets: connections });
    this.url = new URL(`${bridgeUrl}/0/devices/${deviceId}/`);
  }

  post(command: string, priority: 0 | 1 | 2): Promise<Reply> {
    const body = `command=${encodeURIComponent(command)}&priority=${priority}`;
    return new Promise((resolve, reject) => {
      const req = request(
        this.url,
        {
          method: 'POST',
          agent: this.agent,
          headers: {
            cookie: this.cookie,
            'content-type': 'application/x-www-form-urlencoded',
            'content-length': Buffer.byteLength(body),
          },
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.once('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
          res.once('error', reject);
        },
      );
      req.setTimeout(SETUP_TIMEOUT_MS, () => req.destroy(new Error(`no answer to POST ${this.url.pathname}`)));
      req.once('error', reject);
      req.end(body);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

const newFlow = (): Flow => ({ posted: 0, refused: 0, answeredAt: 0, peakOpen: 0 });

interface Flow {
  /** POSTs answered 200. */
  posted: number;
  /** POSTs answered 400 `device-fail` and sent again after a pause (a full queue). */
  refused: number;
  /** When the last POST was answered (performance.now()). */
  answeredAt: number;
  /** Most commands open at once, as this process counted them (the bridge's count, plus POSTs in flight). */
  peakOpen: number;
}

/**
 * Posts `count` commands (or until `stop.now`), at `rate` when given, with at most `connections` in flight and never more than
 * `window` open on the bridge: before a POST goes, the bridge's open commands (read every millisecond), the
 * POSTs answered since that reading and those in flight must stay below `window`. That keeps the device under
 * `maxOpen`; should a POST still be refused, it is sent again after `FULL_RETRY_MS` and counted.
 */
function drive(
  poster: Poster,
  watcher: Watcher,
  o: {
    count: number;
    window: number;
    connections: number;
    command: (i: number) => { command: string; priority: 0 | 1 | 2 };
    /** Commands per second, each sent when it falls due (within the other limits); none: as fast as they allow. */
    rate?: number;
    stop?: { now: boolean };
    /** Filled in as the POSTs are answered. */
    flow?: Flow;
  },
): Promise<Flow> {
  return new Promise((resolve, reject) => {
    const flow: Flow = o.flow ?? newFlow();
    let next = 0;
    let inflight = 0;
    let open = watcher.openCount();
    let sinceRead = 0;
    let settled = false;
    const retry: number[] = [];
    const finish = (err?: unknown) => {
      if (settled) return;
      settled = true;
      clearInterval(timer);
      if (err) reject(err instanceof Error ? err : new Error('a POST failed', { cause: err }));
      else resolve(flow);
    };
    const stopped = () => o.stop?.now === true;
    const start = performance.now();
    const due = () =>
      o.rate === undefined ? o.count : Math.min(o.count, Math.floor(((performance.now() - start) * o.rate) / 1000) + 1);
    const launch = () => {
      if (settled) return;
      while (
        (retry.length > 0 || (next < due() && !stopped())) &&
        inflight < o.connections &&
        open + sinceRead + inflight < o.window
      ) {
        const i = retry.shift() ?? next++;
        const c = o.command(i);
        inflight++;
        flow.peakOpen = Math.max(flow.peakOpen, open + sinceRead + inflight);
        poster.post(c.command, c.priority).then((r) => {
          inflight--;
          if (r.status === 200 && UUID_RE.test(r.body)) {
            flow.posted++;
            sinceRead++;
            flow.answeredAt = performance.now();
          } else if (r.status === 400 && r.body === 'device-fail' && flow.refused < o.count) {
            flow.refused++;
            setTimeout(() => {
              retry.push(i);
              launch();
            }, FULL_RETRY_MS);
          } else {
            finish(new Error(`POST of ${c.command} answered ${r.status} ${r.body.slice(0, 200)}`));
            return;
          }
          if (inflight === 0 && retry.length === 0 && (flow.posted === o.count || stopped())) finish();
          else launch();
        }, finish);
      }
    };
    const timer = setInterval(() => {
      try {
        open = watcher.openCount();
      } catch (err) {
        finish(err);
        return;
      }
      sinceRead = 0;
      if (stopped() && inflight === 0 && retry.length === 0) finish();
      else launch();
    }, 1);
    launch();
  });
}

/** Reads the bridge's open count every millisecond until it is 0; resolves with that moment. */
async function drained(watcher: Watcher, what: string): Promise<number> {
  const deadline = performance.now() + DRAIN_TIMEOUT_MS;
  for (;;) {
    const t = performance.now();
    if (watcher.openCount() === 0) return t;
    if (t > deadline)
      throw new Error(`${what}: ${watcher.openCount()} commands still open after ${DRAIN_TIMEOUT_MS} ms`);
    await sleep(1);
  }
}

/** Every command after `seq` must be done with the handler's output; anything else fails the run. */
function expectDone(watcher: Watcher, after: number, count: number, output: string, what: string): void {
  const rows = watcher.states(after);
  const good = rows.find((r) => r.state === 'done' && r.output === output)?.n ?? 0;
  if (good !== count || rows.length !== 1) {
    throw new Error(
      `${what}: expected ${count} commands done with output ${JSON.stringify(output)}, got ${JSON.stringify(rows)}`,
    );
  }
}

/** 70 % priority 0, 20 % priority 1, 10 % priority 2, interleaved. */
const mixedPriority = (i: number): 0 | 1 | 2 => (i % 10 < 7 ? 0 : i % 10 < 9 ? 1 : 2);

interface RoundRun {
  count: number;
  /** From the first POST until the bridge's last `done` was read, ms. */
  ms: number;
  /** From the first POST until the last POST was answered, ms. */
  postedMs: number;
  refused: number;
  peakOpen: number;
  bridgeCpuMs: number;
  agentCpuMs: number;
  /** This process: the HTTP client and the reads of the bridge's database. */
  driverCpuMs: number;
}

async function commandRound(
  poster: Poster,
  watcher: Watcher,
  pids: { bridge: number; agent: number },
  count: number,
  handler: string,
  output: string,
  opts: Options,
  what: string,
): Promise<RoundRun> {
  await drained(watcher, `before ${what}`);
  const after = watcher.lastSeq();
  const cpu0 = { bridge: readCpuMs(pids.bridge), agent: readCpuMs(pids.agent), driver: process.cpuUsage() };
  const t0 = performance.now();
  const flow = await drive(poster, watcher, {
    count,
    window: opts.window,
    connections: opts.connections,
    command: (i) => ({ command: handler, priority: mixedPriority(i) }),
  });
  const end = await drained(watcher, what);
  const driver = process.cpuUsage(cpu0.driver);
  const run: RoundRun = {
    count,
    ms: end - t0,
    postedMs: flow.answeredAt - t0,
    refused: flow.refused,
    peakOpen: flow.peakOpen,
    bridgeCpuMs: readCpuMs(pids.bridge) - cpu0.bridge,
    agentCpuMs: readCpuMs(pids.agent) - cpu0.agent,
    driverCpuMs: (driver.user + driver.system) / 1000,
  };
  expectDone(watcher, after, count, output, what);
  return run;
}

interface UrgentRun {
  /** POST → `done` recorded, ms. */
  latencies: number[];
  /** POST → 200, ms. */
  answered: number[];
  /** Open commands of the device (ordinary ones) when each urgent POST went. */
  openAt: number[];
  /** Ordinary commands posted before each urgent one that finished after it. */
  overtook: number[];
  /**
   * Where each urgent command's time went, from the stamps (whole ms): POST sent → handed to the broker (bridge),
   * → stored by the agent (down), → done on the agent (agent), → read here as done on the bridge (up).
   */
  stages: { bridge: number[]; down: number[]; agent: number[]; up: number[] };
  /** Ordinary POSTs answered while the series ran, per second. */
  ordinaryPerSec: number;
}

/**
 * Urgent (priority 2) commands one at a time, each timed from sending its POST (on a connection of its own)
 * until the bridge's database says `done` (read every millisecond). With `ordinaryRate`, ordinary (priority 0)
 * commands are posted beside them all the while, at that rate (`Infinity`: as fast as the throughput rounds
 * post them), within `--connections` and `--window`.
 */
async function urgentSeries(
  poster: Poster,
  urgentPoster: Poster,
  watcher: Watcher,
  opts: Options,
  ordinaryRate: number | undefined,
): Promise<UrgentRun> {
  await drained(watcher, 'before the urgent commands');
  const stop = { now: false };
  const after = watcher.lastSeq();
  const flow = newFlow();
  let load: Promise<Flow> | undefined;
  if (ordinaryRate !== undefined) {
    load = drive(poster, watcher, {
      count: Number.MAX_SAFE_INTEGER,
      window: opts.window,
      connections: opts.connections,
      command: () => ({ command: HANDLER, priority: 0 }),
      ...(Number.isFinite(ordinaryRate) ? { rate: ordinaryRate } : {}),
      stop,
      flow,
    });
    let failed: unknown;
    load.catch((err: unknown) => (failed = err));
    // The ordinary stream is under way once a few hundred have been accepted.
    await until(() => {
      if (failed !== undefined) return Promise.reject(failed instanceof Error ? failed : new Error('load failed'));
      return Promise.resolve(flow.posted >= Math.min(500, ordinaryRate) ? true : undefined);
    }, 'the ordinary commands to flow');
  }
  const out: UrgentRun = {
    latencies: [],
    answered: [],
    openAt: [],
    overtook: [],
    stages: { bridge: [], down: [], agent: [], up: [] },
    ordinaryPerSec: 0,
  };
  const ids: string[] = [];
  const t0 = performance.now();
  const posted0 = flow.posted;
  try {
    for (let i = 0; i < opts.urgentWarmup + opts.samples; i++) {
      const openAt = watcher.openCount();
      const sent = performance.now();
      const sentWall = Date.now();
      const r = await urgentPoster.post(HANDLER, 2);
      const answered = performance.now() - sent;
      if (r.status !== 200 || !UUID_RE.test(r.body)) throw new Error(`urgent POST answered ${r.status} ${r.body}`);
      for (;;) {
        const state = watcher.state(r.body);
        const at = performance.now() - sent;
        if (state === 'done') {
          const seenWall = Date.now();
          const st = watcher.stamps(r.body);
          if (i >= opts.urgentWarmup && st?.sent && st.delivered && st.finished) {
            out.stages.bridge.push(st.sent - sentWall);
            out.stages.down.push(st.delivered - st.sent);
            out.stages.agent.push(st.finished - st.delivered);
            out.stages.up.push(seenWall - st.finished);
          }
          if (i >= opts.urgentWarmup) {
            out.latencies.push(at);
            out.answered.push(answered);
            out.openAt.push(openAt);
            ids.push(r.body);
          }
          break;
        }
        if (state === 'failed' || state === 'expired') throw new Error(`urgent command ${r.body} ${state}`);
        if (at > DRAIN_TIMEOUT_MS) throw new Error(`urgent command ${r.body} not done after ${DRAIN_TIMEOUT_MS} ms`);
        await sleep(1);
      }
    }
  } finally {
    stop.now = true;
  }
  out.ordinaryPerSec = (flow.posted - posted0) / ((performance.now() - t0) / 1000);
  if (load) await load;
  await drained(watcher, 'the urgent series');
  expectDone(watcher, after, opts.urgentWarmup + opts.samples + flow.posted, 'pong', 'the urgent series');
  out.overtook = ids.map((id) => watcher.overtaken(id));
  return out;
}

/**
 * The transport alone: `count` messages of a `down/cmd`'s size published at QoS 1 by one client (the cloud's
 * side) with at most `window` unanswered, each answered by a second client (the device's side) with the two
 * reports the agent sends for an instant command (`queued`, `done`) at QoS 1; timed until the last `done`
 * arrives. The same MQTT messages as the measured path, without HTTP, SQLite or either program.
 */
async function bareRoundTrips(url: string, count: number, window: number): Promise<number> {
  const root = `bench/bare/${messageId().slice(0, 8)}`;
  const cloud = await connectClient('cmd-cloud', url);
  const device = await connectClient('cmd-device', url);
  try {
    const now = Date.now();
    const cmd = randomUUID();
    const down = encode('down/cmd', {
      id: messageId(),
      cmd,
      command64: Buffer.from(HANDLER).toString('base64'),
      priority: 0,
      created: now,
      expires: now + 86_400_000,
    });
    const queued = encode('up/cmd', { id: messageId(), cmd, state: 'queued', at: now });
    const done = encode('up/cmd', { id: messageId(), cmd, state: 'done', at: now, exitCode: 0, output: 'pong' });
    device.on('message', () => {
      device.publish(`${root}/up`, queued, { qos: 1 });
      device.publish(`${root}/up`, done, { qos: 1 });
    });
    await device.subscribeAsync(`${root}/down`, { qos: 1 });
    await cloud.subscribeAsync(`${root}/up`, { qos: 1 });
    const started = performance.now();
    await new Promise<void>((resolve, reject) => {
      let sent = 0;
      let reports = 0;
      const launch = () => {
        while (sent < count && sent - Math.floor(reports / 2) < window) {
          sent++;
          cloud.publish(`${root}/down`, down, { qos: 1 }, (err) => err && reject(err));
        }
      };
      cloud.on('message', () => {
        reports++;
        if (reports === 2 * count) resolve();
        else if (reports % 2 === 0) launch();
      });
      launch();
    });
    return performance.now() - started;
  } finally {
    await Promise.all([cloud.endAsync(true), device.endAsync(true)]);
  }
}

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

/** The median of each stage of the urgent commands (whole ms; see UrgentRun). */
function stagesP50(u: UrgentRun): { bridge: number; down: number; agent: number; up: number } {
  return {
    bridge: median(u.stages.bridge),
    down: median(u.stages.down),
    agent: median(u.stages.agent),
    up: median(u.stages.up),
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

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const prepared = prepareBridge(opts.source);
  const preparedAgent = prepareAgent(opts.source);
  console.log(
    `commands: bridge from ${prepared.runtime} (${prepared.note}), agent from ${preparedAgent.runtime} ` +
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
  await seedUser(dataDir, LOGIN, PASSWORD);
  const bridge = await spawnBridgeProcess(
    { runtime: prepared.runtime, dataDir, cpuProfDir, nodeArgs: opts.nodeArgs },
    cleanup,
  );
  console.log(`bridge at ${bridge.url}${bridge.nodeArgs.length > 0 ? `, node ${bridge.nodeArgs.join(' ')}` : ''}`);

  // The agent with its production settings but for a commands folder holding the executable handler: the
  // agent's config folder is its state folder (see spawnAgentProcess), so the setting goes in agent.yaml there.
  const agentDir = join(tmp, 'agent');
  const handlers = join(tmp, 'handlers');
  mkdirSync(handlers, { recursive: true });
  mkdirSync(agentDir, { recursive: true });
  const trueBin = ['/bin/true', '/usr/bin/true'].find((p) => existsSync(p));
  if (!trueBin) throw new Error('no /bin/true or /usr/bin/true for the executable handler');
  symlinkSync(trueBin, join(handlers, EXEC_HANDLER));
  writeFileSync(join(agentDir, 'agent.yaml'), `commands:\n  dir: ${JSON.stringify(handlers)}\n`);
  const agent = spawnAgentProcess(
    {
      runtime: preparedAgent.runtime,
      mqttUrl: bridge.mqttUrl,
      stateDir: agentDir,
      cpuProfDir,
      nodeArgs: opts.nodeArgs,
    },
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

  const login = await send(`${bridge.url}/0/session/login`, {
    method: 'POST',
    body: new URLSearchParams({ login: LOGIN, password: PASSWORD }).toString(),
    timeoutMs: SETUP_TIMEOUT_MS,
  }).done;
  const cookie = cookieOf(login);
  if (login.status !== 201 || !cookie) throw new Error(`login failed: ${login.status} ${login.body}`);
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

  const watcher = new Watcher(join(dataDir, 'bridge.db'), identity.deviceId);
  cleanup.add('close the read-only connection', () => watcher.close());
  const poster = new Poster(bridge.url, identity.deviceId, cookie, opts.connections);
  cleanup.add('close the HTTP connections', () => poster.close());
  const urgentPoster = new Poster(bridge.url, identity.deviceId, cookie, 1);
  cleanup.add('close the urgent connection', () => urgentPoster.close());
  const pids = { bridge: bridge.pid, agent: agent.pid };

  // The baselines' broker: aedes, the bridge's embedded broker, in a process of its own without the bridge's
  // hooks, so that two plain clients may talk through it.
  const bareBroker = await startBenchBroker('aedes', cleanup);
  const echo = await BareEcho.start(bareBroker.url);
  cleanup.add('close the echo clients', () => echo.close());
  console.log(`device ${identity.deviceId} claimed; measuring (about a minute)`);

  // Warm-up of every path (JIT, SQLite caches, connections), not measured.
  if (opts.warmup > 0) {
    await commandRound(poster, watcher, pids, opts.warmup, HANDLER, 'pong', opts, 'the warm-up');
    await bareRoundTrips(bareBroker.url, opts.warmup, opts.window);
  }

  // 1. Throughput: the bare round trips and the commands alternated, so that both see the same machine.
  const rounds: RoundRun[] = [];
  const bareRates: number[] = [];
  for (let r = 0; r < opts.rounds; r++) {
    const doBare = async () =>
      bareRates.push(opts.commands / ((await bareRoundTrips(bareBroker.url, opts.commands, opts.window)) / 1000));
    const doCommands = async () =>
      rounds.push(await commandRound(poster, watcher, pids, opts.commands, HANDLER, 'pong', opts, `round ${r + 1}`));
    if (r % 2 === 0) {
      await doBare();
      await doCommands();
    } else {
      await doCommands();
      await doBare();
    }
  }
  const rates = rounds.map((x) => x.count / (x.ms / 1000));
  const rate = median(rates);
  const bareRate = median(bareRates);
  const perCommandUs = (f: (x: RoundRun) => number) => median(rounds.map((x) => (f(x) * 1000) / x.count));

  // 2. Urgent commands: alone, among ordinary ones at a steady share of the measured rate, and among ordinary
  // ones posted as fast as they go; bare echoes and durable commits beside them.
  const busyRate = opts.busyShare * rate;
  const idle = await urgentSeries(poster, urgentPoster, watcher, opts, undefined);
  const busy = await urgentSeries(poster, urgentPoster, watcher, opts, busyRate);
  const full = await urgentSeries(poster, urgentPoster, watcher, opts, Infinity);
  const echoes: number[] = [];
  const echoPayload = encode('down/cmd', {
    id: messageId(),
    cmd: randomUUID(),
    command64: Buffer.from(HANDLER).toString('base64'),
    priority: 2,
    created: Date.now(),
    expires: Date.now() + 86_400_000,
  });
  for (let i = 0; i < opts.urgentWarmup + opts.samples; i++) {
    const ms = await echo.once(echoPayload);
    if (i >= opts.urgentWarmup) echoes.push(ms);
  }
  const fsyncMs = durableCommitMs(tmp, 200);

  // 3. The executable handler: a process per command.
  const exec =
    opts.execCommands > 0
      ? await commandRound(poster, watcher, pids, opts.execCommands, EXEC_HANDLER, '', opts, 'the executable handler')
      : undefined;

  // What the API shows agrees with what was read from the database.
  const check = await send(`${bridge.url}/0/devices/${identity.deviceId}/commands/?latest=1`, {
    headers: { cookie },
    timeoutMs: SETUP_TIMEOUT_MS,
  }).done;
  const [latest] = JSON.parse(check.body) as Array<{ state: string; command: string }>;
  if (check.status !== 200 || latest?.state !== 'done') throw new Error(`GET …/commands/?latest=1: ${check.body}`);

  watcher.close();
  poster.close();
  urgentPoster.close();
  await echo.close();
  client.close();
  await agent.stop();
  await bridge.stop();
  const logged = (p: { output(): string }) =>
    p
      .output()
      .split('\n')
      .filter((l) => l.trim().length > 0);
  const bridgeOutput = logged(bridge);
  const agentOutput = logged(agent);

  // Figures.
  const ib = latencySummary(idle.latencies);
  const ub = latencySummary(busy.latencies);
  const fb = latencySummary(full.latencies);
  const eb = latencySummary(echoes);
  // The urgent command's path holds three durable commits (the bridge's on POST, the agent's on receipt, the
  // agent's taking it) and one MQTT round trip (down/cmd out, the done report back).
  const floorMs = eb.p50 + 3 * fsyncMs;
  const execRate = exec ? exec.count / (exec.ms / 1000) : undefined;
  const met = {
    throughput: rate >= TARGET.commandsPerSec,
    urgent: ub.p50 < TARGET.urgentP50Ms,
  };
  const allMet = Object.values(met).every(Boolean);
  const f = (n: number) => String(round(n));
  const refused = rounds.reduce((s, x) => s + x.refused, 0);
  const rows: Row[] = [
    {
      figure: `${HANDLER} commands/s, POST → done on the bridge (${opts.commands}, median of ${opts.rounds})`,
      measured: String(Math.round(rate)),
      baseline: `${Math.round(bareRate)} bare MQTT`,
      ratio: f(rate / bareRate),
      target: `≥ ${TARGET.commandsPerSec}`,
      met: met.throughput,
    },
    {
      figure: `  of that, until the last POST was answered (s)`,
      measured: f(median(rounds.map((x) => x.postedMs / 1000))),
      baseline: `${f(median(rounds.map((x) => x.ms / 1000)))} in all`,
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: 'CPU per command (µs): bridge, agent',
      measured: `${f(perCommandUs((x) => x.bridgeCpuMs))}, ${f(perCommandUs((x) => x.agentCpuMs))}`,
      baseline: `${f(perCommandUs((x) => x.driverCpuMs))} driver`,
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: `urgent ${HANDLER} POST → done p50, ordinary ones at ${Math.round(busy.ordinaryPerSec)}/s (ms)`,
      measured: f(ub.p50),
      baseline: `${f(floorMs)} echo + 3 fsyncs`,
      ratio: f(ub.p50 / floorMs),
      target: `< ${TARGET.urgentP50Ms} ms`,
      met: met.urgent,
    },
    {
      figure: `urgent ${HANDLER} POST → done p99, ordinary ones at ${Math.round(busy.ordinaryPerSec)}/s (ms)`,
      measured: f(ub.p99),
      baseline: `${f(ub.max)} max`,
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: '  p50 of its stages: bridge, down, agent, up (ms)',
      measured: Object.values(stagesP50(busy)).join(', '),
      baseline: `${Object.values(stagesP50(idle)).join(', ')} idle`,
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  open when it was posted, ordinary ones it overtook (medians)',
      measured: `${f(median(busy.openAt))}, ${f(median(busy.overtook))}`,
      baseline: '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: `urgent ${HANDLER} POST → done p50, p99, ordinary ones at full speed (ms)`,
      measured: `${f(fb.p50)}, ${f(fb.p99)}`,
      baseline: `${Math.round(full.ordinaryPerSec)}/s, ${f(median(full.openAt))} open`,
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    {
      figure: `urgent ${HANDLER} POST → done p50, p99, idle device (ms)`,
      measured: `${f(ib.p50)}, ${f(ib.p99)}`,
      baseline: `${f(eb.p50)}, ${f(eb.p99)} echo`,
      ratio: f(ib.p50 / eb.p50),
      target: '(reported)',
      met: undefined,
    },
    {
      figure: 'urgent POST answered 200, p50: idle, steady, full speed (ms)',
      measured: [idle, busy, full].map((x) => f(percentile(x.answered, 50))).join(', '),
      baseline: `${f(fsyncMs)} one fsync`,
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
    ...(exec && execRate !== undefined
      ? [
          {
            figure: `executable ${trueBin} commands/s (${exec.count}, a process each)`,
            measured: String(Math.round(execRate)),
            baseline: `${Math.round(rate)} ${HANDLER}`,
            ratio: f(execRate / rate),
            target: '(not the target)',
            met: undefined,
          },
        ]
      : []),
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    `Handler: the agent's built-in ${HANDLER}, answered inside the transaction that takes it (output "pong"). ` +
      `Priorities 70 % 0, 20 % 1, 10 % 2; at most ${opts.window} open (maxOpen ${MAX_OPEN}), ` +
      `${opts.connections} connections posting; ${refused} POSTs refused as full and sent again.`,
  );
  console.log(
    `Bare MQTT: aedes in its own process, a down/cmd at QoS 1 answered by the queued and done reports at QoS 1, ` +
      `at most ${opts.window} unanswered. States are read from the bridge's database every millisecond.`,
  );
  if (!met.throughput || !met.urgent) console.log('a target was missed: see "Finding out why" in bench/README.md.');
  if (bridgeOutput.length > 0)
    console.log(`the bridge logged ${bridgeOutput.length} lines; last: ${bridgeOutput.at(-1)}`);
  if (agentOutput.length > 0) console.log(`the agent logged ${agentOutput.length} lines; last: ${agentOutput.at(-1)}`);
  if (cpuProfDir) console.log(`bridge and agent CPU profiles written to ${cpuProfDir}`);
  const lat = (s: ReturnType<typeof latencySummary>) => ({
    p50Ms: round(s.p50),
    p99Ms: round(s.p99),
    maxMs: round(s.max),
    samples: s.samples,
  });
  const roundJson = (x: RoundRun) => ({
    count: x.count,
    perSec: round(x.count / (x.ms / 1000)),
    ms: round(x.ms),
    postedMs: round(x.postedMs),
    refused: x.refused,
    peakOpen: x.peakOpen,
    bridgeCpuUs: round((x.bridgeCpuMs * 1000) / x.count),
    agentCpuUs: round((x.agentCpuMs * 1000) / x.count),
    driverCpuUs: round((x.driverCpuMs * 1000) / x.count),
  });
  console.log(
    JSON.stringify({
      bench: 'commands',
      bridgeRuntime: prepared.runtime,
      agentRuntime: preparedAgent.runtime,
      handler: HANDLER,
      options: {
        commands: opts.commands,
        rounds: opts.rounds,
        warmup: opts.warmup,
        window: opts.window,
        connections: opts.connections,
        samples: opts.samples,
        urgentWarmup: opts.urgentWarmup,
        busyShare: opts.busyShare,
        execCommands: opts.execCommands,
        tmp: opts.tmp,
      },
      bridgeNodeArgs: bridge.nodeArgs,
      agentNodeArgs: agent.nodeArgs,
      throughput: {
        perSec: round(rate),
        bareRoundTripsPerSec: round(bareRate),
        ratio: round(rate / bareRate),
        rounds: rounds.map(roundJson),
        bareRounds: bareRates.map((x) => round(x)),
        maxOpen: MAX_OPEN,
        target: TARGET.commandsPerSec,
        met: met.throughput,
      },
      urgent: {
        busy: {
          ...lat(ub),
          answeredP50Ms: round(percentile(busy.answered, 50)),
          openAtPostP50: median(busy.openAt),
          overtookP50: median(busy.overtook),
          stagesP50Ms: stagesP50(busy),
          ordinaryRate: round(busyRate),
          ordinaryPerSec: round(busy.ordinaryPerSec),
        },
        fullSpeed: {
          ...lat(fb),
          answeredP50Ms: round(percentile(full.answered, 50)),
          openAtPostP50: median(full.openAt),
          overtookP50: median(full.overtook),
          stagesP50Ms: stagesP50(full),
          ordinaryPerSec: round(full.ordinaryPerSec),
        },
        idle: { ...lat(ib), answeredP50Ms: round(percentile(idle.answered, 50)), stagesP50Ms: stagesP50(idle) },
        bareEcho: lat(eb),
        durableCommitP50Ms: round(fsyncMs),
        floorMs: round(floorMs),
        target: { p50Ms: TARGET.urgentP50Ms },
        met: met.urgent,
      },
      exec: exec ? { handler: trueBin, ...roundJson(exec) } : null,
      bridgeLogLines: bridgeOutput.length,
      agentLogLines: agentOutput.length,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
