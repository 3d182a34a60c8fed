/**
 * `npm run bench -- agent-restart`: how long a restart of an agent holding many acknowledged variables takes
 * until nothing is pending (docs/sync.md: a start resumes from the stamps). The agent runs as the service does
 * (a child process from `dist/`), against a private broker and a durable cloud. Baselines in the same run: the
 * start of an agent with an empty database (what any start costs), a bare SQLite read of every variable row, and
 * the full sync every start used to make (asked for with `resync`). See bench/README.md.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import Database from 'better-sqlite3';
import { LocalClient } from '../agent/local/client.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { DurableCloud } from './support/durable-cloud.js';
import {
  type AgentProcess,
  type BenchBrokerKind,
  prepareAgent,
  spawnAgentProcess,
  startBenchBroker,
} from './support/processes.js';
import { type Row, formatTable, median, round } from './support/report.js';

const TARGET_MS = 2000;

interface Options {
  broker: BenchBrokerKind;
  vars: number;
  rounds: number;
  window: number;
  tmp: string;
  source: boolean;
}

const USAGE = `options:
  --broker mosquitto|aedes   the broker, in its own process (default mosquitto)
  --vars N                   acknowledged variables the agent holds (default 45000)
  --rounds N                 restarts measured, alternated with empty starts; medians are reported (default 3)
  --window N                 most set requests outstanding while filling (default 256)
  --tmp DIR                  where the databases go (default the system's temp folder)
  --source                   run the agent from TypeScript through tsx instead of dist/`;

function parseOptions(args: string[]): Options {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        broker: { type: 'string', default: 'mosquitto' },
        vars: { type: 'string', default: '45000' },
        rounds: { type: 'string', default: '3' },
        window: { type: 'string', default: '256' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
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
    vars: int('vars', parsed.vars, 1),
    rounds: int('rounds', parsed.rounds, 1),
    window: int('window', parsed.window, 1),
    tmp: parsed.tmp ?? tmpdir(),
    source: parsed.source,
  };
}

interface AgentStatus {
  deviceId: string;
  state: string;
  pending: { pushes: number; syncs: number };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls every `everyMs`: each `status` call makes the agent count what is pending (a scan of its variables), so
 * polling too often would slow down the very start it measures.
 */
async function until(
  check: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 120_000,
  everyMs = 20,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

async function connectWhenUp(agent: AgentProcess): Promise<LocalClient> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      return await LocalClient.connect(agent.socket);
    } catch (err) {
      if (Date.now() > deadline)
        throw new Error(`the agent did not open its socket: ${agent.output()}`, { cause: err });
      await sleep(2);
    }
  }
}

interface StartRun {
  /** From spawning the process until it is connected, its hello is at the cloud and nothing is pending. */
  ms: number;
  /** Syncs the cloud received in that time. */
  syncs: number;
  agent: AgentProcess;
  client: LocalClient;
}

/**
 * Starts an agent on `stateDir` and times it until the cloud has its hello (from this process: a new
 * `bootTime`) and the agent reports nothing pending: every push and sync the start queued is acknowledged.
 */
async function timedStart(
  o: { runtime: 'dist' | 'source'; mqttUrl: string; stateDir: string },
  cloud: DurableCloud,
  cleanup: Cleanup,
): Promise<StartRun> {
  const syncs0 = cloud.counters.syncs;
  const started = performance.now();
  const agent = spawnAgentProcess({ runtime: o.runtime, mqttUrl: o.mqttUrl, stateDir: o.stateDir }, cleanup);
  const client = await connectWhenUp(agent);
  const { deviceId } = await client.status<AgentStatus>();
  const boot = cloud.helloBootTime(deviceId);
  await until(async () => {
    const s = await client.status<AgentStatus>();
    const hello = cloud.helloBootTime(deviceId);
    return (
      s.state === 'connected' &&
      hello !== undefined &&
      hello !== boot &&
      s.pending.pushes === 0 &&
      s.pending.syncs === 0
    );
  }, 'the agent to connect with nothing pending');
  return { ms: performance.now() - started, syncs: cloud.counters.syncs - syncs0, agent, client };
}

async function fill(client: LocalClient, n: number, window: number): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    let next = 0;
    let done = 0;
    const launch = () => {
      while (next < n && next - done < window) {
        const i = next++;
        client.set('d', `sensor.v${i}`, `{"temp":21.5,"seq":${i}}`).then(() => {
          if (++done === n) resolve();
          else launch();
        }, reject);
      }
    };
    launch();
  });
  await until(async () => (await client.status<AgentStatus>()).pending.pushes === 0, `${n} acknowledgements`);
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const prepared = prepareAgent(opts.source);
  console.log(`agent-restart: agent from ${prepared.runtime} (${prepared.note}), broker ${opts.broker}`);
  console.log('note: the machine may be shared; figures are noisy, compare ratios taken in the same run.');
  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  const broker = await startBenchBroker(opts.broker, cleanup);
  const cloud = await DurableCloud.start(broker.url, join(tmp, 'cloud/cloud.db'));
  cleanup.add('close the cloud', () => cloud.close());
  const stateDir = join(tmp, 'agent');
  const o = { runtime: prepared.runtime, mqttUrl: broker.url, stateDir };

  // The gateway's variables, every one acknowledged by the durable cloud.
  const first = await timedStart(o, cloud, cleanup);
  const fillStart = performance.now();
  await fill(first.client, opts.vars, opts.window);
  console.log(`filled ${opts.vars} variables in ${Math.round(performance.now() - fillStart)} ms`);
  first.client.close();
  await first.agent.stop();

  // Restarts of that agent, alternated with starts of an empty one.
  const restarts: StartRun[] = [];
  const empties: number[] = [];
  const readMs: number[] = [];
  for (let r = 0; r < opts.rounds; r++) {
    const emptyDir = join(tmp, `empty-${r}`);
    const empty = await timedStart({ ...o, stateDir: emptyDir }, cloud, cleanup);
    empties.push(empty.ms);
    empty.client.close();
    await empty.agent.stop();

    const restart = await timedStart(o, cloud, cleanup);
    restarts.push(restart);
    restart.client.close();
    await restart.agent.stop();

    // A bare read of every row, on the database the agent just closed.
    const db = new Database(join(stateDir, 'agent.db'), { readonly: true });
    const t = performance.now();
    const rows = db.prepare('SELECT * FROM vars').all().length;
    readMs.push(performance.now() - t);
    db.close();
    if (rows < opts.vars) throw new Error(`the agent's database holds ${rows} variables, expected ${opts.vars}`);
  }

  // The full sync every start used to make: asked for with `resync`, timed until every sync is acknowledged.
  const last = await timedStart(o, cloud, cleanup);
  const syncs0 = cloud.counters.syncs;
  const t0 = performance.now();
  cloud.requestResync((await last.client.status<AgentStatus>()).deviceId);
  await until(async () => {
    const s = await last.client.status<AgentStatus>();
    return cloud.counters.syncs - syncs0 >= opts.vars && s.pending.syncs === 0;
  }, 'the full sync');
  const fullSyncMs = performance.now() - t0;
  last.client.close();
  await last.agent.stop();

  const restartMs = restarts.map((x) => x.ms);
  const restartMedian = median(restartMs);
  const emptyMedian = median(empties);
  const syncsSent = restarts.map((x) => x.syncs);
  const met = restartMedian < TARGET_MS && syncsSent.every((n) => n === 0);
  const f = (n: number) => String(round(n, 1));
  const rows: Row[] = [
    {
      figure: `restart with ${opts.vars} acknowledged vars until nothing pending (ms, median of ${opts.rounds})`,
      measured: `${f(restartMedian)} (${f(Math.min(...restartMs))}–${f(Math.max(...restartMs))})`,
      baseline: `${f(emptyMedian)} empty start`,
      ratio: f(restartMedian / emptyMedian),
      target: `< ${TARGET_MS} ms, no syncs`,
      met,
    },
    {
      figure: 'restart minus empty start, same round (ms, median)',
      measured: f(median(restarts.map((x, i) => x.ms - empties[i]!))),
      baseline: '',
      ratio: '',
      target: '(reported: what the variables add)',
      met: undefined,
    },
    {
      figure: 'syncs sent by each restart',
      measured: syncsSent.join(', '),
      baseline: '',
      ratio: '',
      target: '0',
      met: syncsSent.every((n) => n === 0),
    },
    {
      figure: `bare SQLite read of ${opts.vars} rows (ms)`,
      measured: f(median(readMs)),
      baseline: '',
      ratio: '',
      target: '(baseline)',
      met: undefined,
    },
    {
      figure: `full sync of ${opts.vars} vars, as every start made before (ms)`,
      measured: f(fullSyncMs),
      baseline: '',
      ratio: f(fullSyncMs / restartMedian),
      target: '(baseline)',
      met: undefined,
    },
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    JSON.stringify({
      bench: 'agent-restart',
      broker: opts.broker,
      agentRuntime: prepared.runtime,
      options: { vars: opts.vars, rounds: opts.rounds, window: opts.window, tmp: opts.tmp },
      restartMs: restartMs.map((x) => round(x, 1)),
      restartMedianMs: round(restartMedian, 1),
      emptyStartMs: empties.map((x) => round(x, 1)),
      emptyStartMedianMs: round(emptyMedian, 1),
      restartMinusEmptyMs: restarts.map((x, i) => round(x.ms - empties[i]!, 1)),
      syncsSentByRestarts: syncsSent,
      bareReadMs: readMs.map((x) => round(x, 1)),
      fullSyncMs: round(fullSyncMs, 1),
      targetMs: TARGET_MS,
      met,
    }),
  );
  return met ? 0 : 1;
}
