/**
 * `npm run bench -- retention`: what the history retention costs the API while it works. A bridge database is
 * seeded with a large history (by default a million entries over 60 days, on 40 devices of 10 variables), more
 * than the default limits keep (30 days, 1000 entries a variable), and copied for each round. In a pruning round
 * the bridge starts on its copy with the default limits, so that its first pass of the retention removes the
 * backlog while a device GET is probed at a steady rate; in a baseline round it starts with both limits off and
 * the same probe runs. Rounds alternate. The bridge runs as the service does (a child process), the probe in
 * this process. See bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { hashSecret } from '../bridge/broker.js';
import { BRIDGE_MIGRATIONS, SqliteStore } from '../bridge/store/sqlite.js';
import { openDatabase } from '../lib/sqlite.js';
import { type ServerProcess, prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { intOption } from './support/options.js';
import { cookieOf, probe, send } from './support/http-load.js';
import { type Row, formatTable, median, percentile, round } from './support/report.js';
import { seedUser } from './support/seed.js';

const TARGET = {
  /** p99 of a device GET while the retention removes the backlog, over the p99 without it, at most. */
  p99Factor: 2,
  /** ... or at most this many ms above it, whichever is more lenient (a p99 of 2 ms doubling is noise). */
  p99SlackMs: 10,
};

const DAY = 86_400_000;
const PASSWORD = 'bench-password-1';
const LOGIN = 'bench-retention@example.com';
const SETUP_TIMEOUT_MS = 30_000;
/** The retention's defaults, which the pruning rounds run with (bridge/config.ts). */
const KEEP_DAYS = 30;
const KEEP_PER_VARIABLE = 1000;

interface Options {
  devices: number;
  vars: number;
  entries: number;
  spanDays: number;
  rate: number;
  warmupS: number;
  probeS: number;
  rounds: number;
  tmp: string;
  source: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --devices N        devices with history (default 40)
  --vars N           variables with history per device (default 10)
  --entries N        history entries per variable (default 2500)
  --span-days N      days the entries of a variable spread over, ending now (default 60)
  --rate N           device GETs per second while measuring (default 200)
  --warmup S         seconds of the same requests first, not measured (default 2)
  --probe-s S        seconds of probing per round (default 6)
  --rounds N         rounds of each kind, alternated (default 2)
  --tmp DIR          where the databases go (default the system's temp folder)
  --source           run the bridge from TypeScript through tsx instead of dist/
  --node-arg=ARG     pass ARG to node when starting the bridge (repeatable)`;

function parseOptions(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        devices: { type: 'string', default: '40' },
        vars: { type: 'string', default: '10' },
        entries: { type: 'string', default: '2500' },
        'span-days': { type: 'string', default: '60' },
        rate: { type: 'string', default: '200' },
        warmup: { type: 'string', default: '2' },
        'probe-s': { type: 'string', default: '6' },
        rounds: { type: 'string', default: '2' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
        'node-arg': { type: 'string', multiple: true, default: [] },
      },
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = intOption(USAGE);
  return {
    devices: int('devices', v.devices, 1),
    vars: int('vars', v.vars, 1),
    entries: int('entries', v.entries, 1),
    spanDays: int('span-days', v['span-days'], 1),
    rate: int('rate', v.rate, 1),
    warmupS: int('warmup', v.warmup, 0),
    probeS: int('probe-s', v['probe-s'], 1),
    rounds: int('rounds', v.rounds, 1),
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    nodeArgs: v['node-arg'],
  };
}

interface Seeded {
  /** The device the probe reads (owned by the user, with 20 variables, no history backlog). */
  probeDevice: string;
  rows: number;
  /** What the default limits remove: by age, then by count. */
  expectAge: number;
  expectCount: number;
  seedMs: number;
}

/**
 * The user, the probed device and the devices with history, through the bridge's store; the history rows in
 * bulk through a prepared statement on a second connection, in time order.
 */
async function seed(dataDir: string, opts: Options): Promise<Seeded> {
  const t0 = performance.now();
  await seedUser(dataDir, LOGIN, PASSWORD);
  const store = new SqliteStore(dataDir);
  const now = Date.now();
  const probeDevice = randomUUID();
  const fleet = Array.from({ length: opts.devices }, () => randomUUID());
  try {
    const [frontend] = await store.frontends();
    const user = (await store.userByLogin(frontend!.id, LOGIN))!;
    await store.write(async ({ devices }) => {
      for (const id of [probeDevice, ...fleet]) {
        await devices.enroll(id, hashSecret(randomBytes(32).toString('hex')), now);
        await devices.setAuthcode(id, randomBytes(16).toString('hex'));
      }
      await devices.claim(probeDevice, user.id, now);
      for (let k = 0; k < 20; k++) {
        const v = {
          type: 'd' as const,
          name: `v${k}`,
          value: Buffer.from(`{"v":${k}}`),
          time: now,
          origin: 'cloud' as const,
        };
        await devices.putVersion(probeDevice, v, now, 'user', false);
      }
      for (const id of fleet) {
        for (let k = 0; k < opts.vars; k++) {
          const v = {
            type: 'd' as const,
            name: `h${k}`,
            value: Buffer.from('0'),
            time: now,
            origin: 'device' as const,
          };
          await devices.putVersion(id, v, now, 'device', false);
        }
      }
    });
  } finally {
    await store.close();
  }
  const db = openDatabase(join(dataDir, 'bridge.db'), BRIDGE_MIGRATIONS);
  const step = (opts.spanDays * DAY) / opts.entries;
  const cutoff = now - KEEP_DAYS * DAY;
  let expectAge = 0;
  let expectCount = 0;
  try {
    const insert = db.prepare(
      'INSERT INTO history (device_id, type, name, value, by, timestamp) VALUES (?, ?, ?, ?, ?, ?)',
    );
    // In time order across all variables, as a running bridge appends them: ids grow with timestamps.
    let old = 0;
    for (let e0 = 0; e0 < opts.entries; e0 += 100) {
      db.transaction(() => {
        for (let e = e0; e < Math.min(opts.entries, e0 + 100); e++) {
          const t = Math.round(now - opts.spanDays * DAY + e * step);
          if (t < cutoff) old++;
          const value = Buffer.from(`{"target":${20 + (e % 50) / 10},"seq":${e}}`);
          for (const id of fleet) for (let k = 0; k < opts.vars; k++) insert.run(id, 'd', `h${k}`, value, 'device', t);
        }
      })();
    }
    const variables = opts.devices * opts.vars;
    expectAge = old * variables;
    expectCount = Math.max(0, opts.entries - old - KEEP_PER_VARIABLE) * variables;
    db.pragma('wal_checkpoint(TRUNCATE)');
  } finally {
    db.close();
  }
  return {
    probeDevice,
    rows: opts.devices * opts.vars * opts.entries,
    expectAge,
    expectCount,
    seedMs: performance.now() - t0,
  };
}

interface Round {
  kind: 'pruning' | 'baseline';
  latencies: number[];
  errors: number;
  /** Entries the retention had removed when the probe started and when it ended. */
  removedAtStart: number;
  removedAtEnd: number;
  /** The share of the probe's time during which the retention was still removing (1: all of it). */
  coverage: number;
  /** When it had removed everything over the limits, s after the bridge started; `undefined`: not yet. */
  doneAfterS: number | undefined;
}

/** One scrape of the bridge's figure of removed history. */
async function prunedSoFar(url: string): Promise<number> {
  const r = await send(`${url}/metrics`, { timeoutMs: SETUP_TIMEOUT_MS }).done;
  let n = 0;
  for (const m of r.body.matchAll(/^devcloud_history_pruned_total\{limit="(?:age|count)"\} (\d+)$/gm))
    n += Number(m[1]);
  return n;
}

async function oneRound(
  kind: Round['kind'],
  template: string,
  tmp: string,
  i: number,
  seeded: Seeded,
  opts: Options,
  runtime: Parameters<typeof spawnBridgeProcess>[0]['runtime'],
  cleanup: Cleanup,
): Promise<Round> {
  const dataDir = join(tmp, `${kind}-${i}`);
  mkdirSync(dataDir, { recursive: true });
  copyFileSync(join(template, 'bridge.db'), join(dataDir, 'bridge.db'));
  const limits = kind === 'pruning' ? { days: KEEP_DAYS, perVar: KEEP_PER_VARIABLE } : { days: 0, perVar: 0 };
  writeFileSync(
    join(dataDir, 'bridge.yaml'),
    `devices:\n  historyDays: ${limits.days}\n  historyPerVariable: ${limits.perVar}\n`,
  );
  const started = performance.now();
  let bridge: ServerProcess | undefined;
  try {
    bridge = await spawnBridgeProcess({ runtime, dataDir, nodeArgs: opts.nodeArgs }, cleanup);
    const url = bridge.url;
    const login = await send(`${url}/0/session/login`, {
      method: 'POST',
      body: new URLSearchParams({ login: LOGIN, password: PASSWORD }).toString(),
      timeoutMs: SETUP_TIMEOUT_MS,
    }).done;
    const cookie = cookieOf(login);
    if (login.status !== 201 || !cookie) throw new Error(`login failed: ${login.status} ${login.body}`);
    const target = `${url}/0/devices/${seeded.probeDevice}`;
    if (opts.warmupS > 0)
      await probe({ url: target, headers: { cookie }, rate: opts.rate, durationMs: opts.warmupS * 1000 });
    // Watch the retention's progress from outside, at a rate that costs the bridge nothing to speak of.
    const total = seeded.expectAge + seeded.expectCount;
    let doneAt: number | undefined;
    let watching = true;
    const removedAtStart = await prunedSoFar(url);
    const probeStart = performance.now();
    if (kind === 'pruning' && removedAtStart >= total) doneAt = probeStart;
    const watch = (async () => {
      while (watching) {
        await new Promise((r) => setTimeout(r, 250));
        const n = await prunedSoFar(url);
        if (kind === 'pruning' && n >= total && doneAt === undefined) doneAt = performance.now();
      }
    })();
    const run = await probe({ url: target, headers: { cookie }, rate: opts.rate, durationMs: opts.probeS * 1000 });
    const probeEnd = performance.now();
    watching = false;
    await watch;
    const removedAtEnd = await prunedSoFar(url);
    const bad = Object.entries(run.statuses).filter(([code]) => code !== '200');
    if (bad.length > 0) throw new Error(`the probe got ${JSON.stringify(run.statuses)}`);
    const coverage =
      kind === 'baseline' ? 0 : Math.max(0, Math.min(1, ((doneAt ?? probeEnd) - probeStart) / (probeEnd - probeStart)));
    return {
      kind,
      latencies: run.latencies,
      errors: run.errors,
      removedAtStart,
      removedAtEnd,
      coverage,
      doneAfterS: doneAt === undefined ? undefined : (doneAt - started) / 1000,
    };
  } finally {
    await bridge?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  const prepared = prepareBridge(opts.source);
  console.log(`retention: bridge from ${prepared.runtime} (${prepared.note})`);
  console.log('note: the machine may be shared; figures are noisy, compare ratios taken in the same run.');
  const tmp = mkdtempSync(join(opts.tmp, 'devcloud-bench-'));
  cleanup.add('remove the temporary folder', () => rmSync(tmp, { recursive: true, force: true }));
  const template = join(tmp, 'template');
  const seeded = await seed(template, opts);
  console.log(
    `seeded ${seeded.rows} history entries in ${round(seeded.seedMs / 1000, 1)} s; the default limits remove ` +
      `${seeded.expectAge} by age and ${seeded.expectCount} by count`,
  );

  const rounds: Round[] = [];
  for (let i = 0; i < opts.rounds; i++) {
    const order = i % 2 === 0 ? (['baseline', 'pruning'] as const) : (['pruning', 'baseline'] as const);
    for (const kind of order) {
      const r = await oneRound(kind, template, tmp, i, seeded, opts, prepared.runtime, cleanup);
      console.log(
        `round ${i + 1} ${kind}: p50 ${round(percentile(r.latencies, 50), 2)} ms, p99 ` +
          `${round(percentile(r.latencies, 99), 2)} ms, max ${round(Math.max(...r.latencies), 1)} ms` +
          (kind === 'pruning'
            ? `; retention removed ${r.removedAtStart} before the probe, ${r.removedAtEnd} by its end, ` +
              `everything ${r.doneAfterS === undefined ? 'not yet' : `${round(r.doneAfterS, 1)} s after start`}, ` +
              `busy ${Math.round(r.coverage * 100)}% of the probe`
            : ''),
      );
      rounds.push(r);
    }
  }

  const all = (kind: Round['kind']) => rounds.filter((r) => r.kind === kind).flatMap((r) => r.latencies);
  const pruning = all('pruning');
  const baseline = all('baseline');
  const p = (xs: number[], q: number) => percentile(xs, q);
  const p99 = p(pruning, 99);
  const p99Base = p(baseline, 99);
  const limit = Math.max(p99Base * TARGET.p99Factor, p99Base + TARGET.p99SlackMs);
  const met = p99 <= limit;
  const pruningRounds = rounds.filter((r) => r.kind === 'pruning');
  // The figure means something only if the retention was at work while the probe ran.
  const coverage = Math.min(...pruningRounds.map((r) => r.coverage));
  const covered = coverage >= 0.9;
  const rows: Row[] = [
    {
      figure: 'device GET p50, ms',
      measured: String(round(p(pruning, 50), 2)),
      baseline: String(round(p(baseline, 50), 2)),
      ratio: String(round(p(pruning, 50) / p(baseline, 50), 2)),
      target: '—',
      met: undefined,
    },
    {
      figure: 'device GET p99, ms',
      measured: String(round(p99, 2)),
      baseline: String(round(p99Base, 2)),
      ratio: String(round(p99 / p99Base, 2)),
      target: `≤ ${TARGET.p99Factor} × bare or bare + ${TARGET.p99SlackMs} ms`,
      met,
    },
    {
      figure: 'device GET max, ms',
      measured: String(round(Math.max(...pruning), 1)),
      baseline: String(round(Math.max(...baseline), 1)),
      ratio: '',
      target: '—',
      met: undefined,
    },
    {
      figure: 'retention busy during the probe',
      measured: pruningRounds.map((r) => `${Math.round(r.coverage * 100)}%`).join(', '),
      baseline: '—',
      ratio: '',
      target: '≥ 90% (else: more --entries)',
      met: covered,
    },
    {
      figure: 'rows removed per s while probed',
      measured: pruningRounds
        .map((r) => String(Math.round((r.removedAtEnd - r.removedAtStart) / (r.coverage * opts.probeS || opts.probeS))))
        .join(', '),
      baseline: '—',
      ratio: '',
      target: '—',
      met: undefined,
    },
  ];
  console.log(`\nbaseline: the same bridge and database with both retention limits off (nothing removed)\n`);
  console.log(formatTable(rows));
  console.log(
    JSON.stringify({
      benchmark: 'retention',
      rows: seeded.rows,
      removeByAge: seeded.expectAge,
      removeByCount: seeded.expectCount,
      rate: opts.rate,
      probeS: opts.probeS,
      rounds: opts.rounds,
      pruning: { p50: round(p(pruning, 50), 3), p99: round(p99, 3), max: round(Math.max(...pruning), 3) },
      baseline: { p50: round(p(baseline, 50), 3), p99: round(p99Base, 3), max: round(Math.max(...baseline), 3) },
      p99Ratio: round(p99 / p99Base, 3),
      retentionCoverage: pruningRounds.map((r) => round(r.coverage, 3)),
      removedDuringProbe: pruningRounds.map((r) => r.removedAtEnd - r.removedAtStart),
      roundsP99: rounds.map((r) => ({ kind: r.kind, p99: round(percentile(r.latencies, 99), 3) })),
      medianOfRoundP99: {
        pruning: round(median(pruningRounds.map((r) => percentile(r.latencies, 99))), 3),
        baseline: round(median(rounds.filter((r) => r.kind === 'baseline').map((r) => percentile(r.latencies, 99))), 3),
      },
    }),
  );
  return met && covered ? 0 : 1;
}
