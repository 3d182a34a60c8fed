/**
 * `npm run bench -- firmware`: one firmware update of a large image (100 MB by default) from the bridge to a real
 * agent — downloaded, verified and installed into a slot — against `curl` + `sha256sum` + `tar -x` of the same
 * file from the same bridge route in the same run, and the agent's resident size while it updates. The bridge
 * and the agent run as the services do (child processes from `dist/`); the image is signed with a fresh key and
 * added with `devcloud-bridge firmware add`. See bench/README.md.
 */
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { arch, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import Database from 'better-sqlite3';
import { LocalClient } from '../agent/local/client.js';
import { FirmwareJobStore } from '../bridge/firmware/jobs.js';
import { prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { seedUser } from './support/seed.js';
import { cookieOf, send } from './support/http-load.js';
import {
  type AgentProcess,
  type AgentRuntime,
  ROOT,
  prepareAgent,
  readRss,
  shebangNodeArgs,
  spawnAgentProcess,
} from './support/processes.js';
import { type Row, formatTable, mb, median, round } from './support/report.js';

const TARGET = {
  /** POST → `fwstate` done, over curl + sha256sum + tar -x of the same bytes from the same route. */
  ratio: 1.5,
  /** The agent's VmRSS, sampled while it updates. */
  rssBytes: 100 * 1024 * 1024,
};

const PASSWORD = 'bench-password-1';
const LOGIN = 'bench-firmware@example.com';
const IMAGE_NAME = 'bench/firmware';
const PLATFORM = `linux-${arch()}`;
const SETUP_TIMEOUT_MS = 30_000;
/** The longest one update (or one baseline step) may take before the run fails. */
const UPDATE_TIMEOUT_MS = 600_000;
/** How often the job's row and the agent's VmRSS are read while an update runs. */
const SAMPLE_MS = 10;
const MIB = 1024 * 1024;

interface Options {
  sizeMb: number;
  rounds: number;
  warmup: number;
  tmp: string;
  source: boolean;
  cpuProf: boolean;
  nodeArgs: string[];
}

const USAGE = `options:
  --size-mb N     random bytes in the image, in MiB (default 100)
  --rounds N      updates, and baseline downloads, measured; the median is reported (default 3)
  --warmup N      unmeasured updates and baseline downloads before the rounds (default 0)
  --tmp DIR       where the bridge's data, the agent's state and slots and the baseline's files go
                  (default the system's temp folder)
  --source        run the bridge and the agent from TypeScript through tsx instead of dist/
  --cpu-prof      write V8 CPU profiles of the bridge and the agent to .bench/profiles/
  --node-arg=ARG  pass ARG to node when starting the bridge and the agent (repeatable)`;

function parseOptions(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      strict: true,
      allowPositionals: false,
      options: {
        'size-mb': { type: 'string', default: '100' },
        rounds: { type: 'string', default: '3' },
        warmup: { type: 'string', default: '0' },
        tmp: { type: 'string' },
        source: { type: 'boolean', default: false },
        'cpu-prof': { type: 'boolean', default: false },
        'node-arg': { type: 'string', multiple: true, default: [] },
      },
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = (key: string, text: string, min: number, max: number) => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < min || n > max)
      throw new UsageError(`--${key} must be an integer from ${min} to ${max}\n${USAGE}`);
    return n;
  };
  return {
    sizeMb: int('size-mb', v['size-mb'], 1, 4096),
    rounds: int('rounds', v.rounds, 1, 100),
    warmup: int('warmup', v.warmup, 0, 100),
    tmp: v.tmp ?? tmpdir(),
    source: v.source,
    cpuProf: v['cpu-prof'],
    nodeArgs: v['node-arg'],
  };
}

/**
 * The image: `manifest.json`, a short README and `payload.bin` of random bytes (incompressible, so the tar.gz
 * is as large as its content and gzip cannot make either side's work smaller), compressed with `gzip -1` (the
 * level changes only how long building takes: random data is stored nearly as it is at any level).
 */
function buildImage(dir: string, sizeMb: number): string {
  const root = join(dir, 'image');
  mkdirSync(root, { recursive: true });
  writeText(join(root, 'manifest.json'), JSON.stringify({ name: IMAGE_NAME, version: 1 }));
  writeText(join(root, 'README'), 'devcloud firmware benchmark image: random bytes in payload.bin.\n');
  const fd = openSync(join(root, 'payload.bin'), 'w');
  try {
    for (let i = 0; i < sizeMb; i++) writeSync(fd, randomBytes(MIB));
  } finally {
    closeSync(fd);
  }
  const file = join(dir, 'image.tar.gz');
  const r = spawnSync('sh', ['-c', 'tar -cf - -C "$1" . | gzip -1 > "$2"', 'sh', root, file], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  if (r.status !== 0) throw new Error(`building the image failed: ${r.stderr?.toString()}`);
  rmSync(root, { recursive: true, force: true });
  return file;
}

function writeText(path: string, text: string): void {
  const fd = openSync(path, 'w');
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}

/** `devcloud-bridge ARGS` as a process, with nothing from the environment: the data folder is its config folder. */
function bridgeCli(runtime: AgentRuntime, dataDir: string, args: string[]): string {
  const script = join(ROOT, runtime === 'dist' ? 'dist/bridge/main.js' : 'bridge/main.ts');
  const entry = runtime === 'dist' ? [script] : ['--import', 'tsx', script];
  const r = spawnSync(process.execPath, [...shebangNodeArgs(script), ...entry, ...args, '--data-dir', dataDir], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CONFIGURATION_DIRECTORY: dataDir },
    encoding: 'utf8',
  });
  if (r.status !== 0) throw new Error(`devcloud-bridge ${args.join(' ')} failed (${r.status}): ${r.stderr}`);
  return r.stdout;
}

/** VmRSS and RssAnon (the private part: without the node binary's and libraries' file pages), in bytes. */
function readMemory(pid: number): { rss: number; anon: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), anon: kb('RssAnon') };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` on the real clock; a benchmark may wait like this, a test never does. */
async function until<T>(check: () => Promise<T | undefined> | T | undefined, what: string, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
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
      await sleep(50);
    }
  }
}

/** What the bridge recorded, read through a read-only connection of this process (WAL: no lock the bridge waits for). */
class Watcher {
  private readonly db: Database.Database;
  private readonly s;

  constructor(path: string) {
    this.db = new Database(path, { readonly: true, fileMustExist: true });
    this.s = {
      variable: this.db.prepare<[string, string, string], { value: Buffer | null; time: number }>(
        'SELECT value, time FROM vars WHERE device_id = ? AND type = ? AND name = ?',
      ),
      openJob: this.db.prepare<[string], { id: string }>('SELECT id FROM fw_jobs WHERE device_id = ? AND open = 1'),
      job: this.db.prepare<[string], { open: number; outcome: string | null; ended_at: number | null }>(
        'SELECT open, outcome, ended_at FROM fw_jobs WHERE id = ?',
      ),
      fwHistory: this.db.prepare<[string, number], { value: Buffer | null; timestamp: number }>(
        `SELECT value, timestamp FROM history
         WHERE device_id = ? AND type = 'meta' AND name = 'fwstate' AND id > ? ORDER BY id`,
      ),
      lastHistory: this.db.prepare<[], number>('SELECT coalesce(max(id), 0) FROM history').pluck(),
    };
  }

  value(deviceId: string, type: string, name: string): string | undefined {
    return this.s.variable.get(deviceId, type, name)?.value?.toString('utf8');
  }

  openJob(deviceId: string): string | undefined {
    return this.s.openJob.get(deviceId)?.id;
  }

  job(id: string): { open: boolean; outcome: string | null } | undefined {
    const r = this.s.job.get(id);
    return r && { open: r.open === 1, outcome: r.outcome };
  }

  lastHistoryId(): number {
    return this.s.lastHistory.get() ?? 0;
  }

  /** The `fwstate` values the bridge recorded after history row `after`, oldest first, with its stamps. */
  fwStates(deviceId: string, after: number): Array<{ state: string; at: number }> {
    return this.s.fwHistory
      .all(deviceId, after)
      .map((r) => ({ state: r.value?.toString('utf8') ?? '(deleted)', at: r.timestamp }));
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}

/** The agent's saved steps of one job, as `devcloud-agent fw status --json` shows them. */
interface FwStatus {
  state: string;
  job: { id: string; error: string; steps: Array<{ state: string; at: number; error: string }> } | null;
  activeSlot: string | null;
  slotsDir: string | null;
}

/** Agent states whose time is reported on its own; the rest (switching … committing) is summed as `commit`. */
const PHASES = ['downloading', 'verifying', 'installing'] as const;

interface UpdateRun {
  ms: number;
  /** POST sent → the agent stored the job (its `downloading` step), wall clock. */
  deliverMs: number;
  /** Time in each state, from the agent's steps (ms, its clock). */
  phases: Record<(typeof PHASES)[number] | 'commit', number>;
  /** The last state reported → the bridge saw the job end, as this process read it. */
  reportMs: number;
  peakRss: number;
  /** The highest sampled VmRSS while the agent was in each state. */
  peakRssBy: Record<(typeof PHASES)[number] | 'commit', number>;
  rssBefore: number;
  /** The highest sampled RssAnon. */
  peakAnon: number;
  bridgeStates: string[];
}

interface BaselineRun {
  ms: number;
  curlMs: number;
  sha256Ms: number;
  tarMs: number;
  /** Not in `ms`: what the agent does that the baseline does not, timed on the baseline's file. */
  extra: { fsyncMs: number; listMs: number; listVerboseMs: number };
}

interface Ctx {
  bridgeUrl: string;
  deviceId: string;
  cookie: string;
  agent: AgentProcess;
  client: LocalClient;
  watcher: Watcher;
  slotsDir: string;
  /** The tar.gz, as the catalog holds it. */
  sizeBytes: number;
  /** `payload.bin` once unpacked. */
  payloadBytes: number;
  sha256: string;
}

/** POST the update, then wait until the bridge has the job ended; VmRSS of the agent sampled all the while. */
async function update(c: Ctx): Promise<UpdateRun> {
  const historyFrom = c.watcher.lastHistoryId();
  const before = readMemory(c.agent.pid);
  const rssBefore = before.rss;
  let peakRss = rssBefore;
  let peakAnon = before.anon;
  const samples: Array<{ at: number; rss: number }> = [];
  const sampleRss = () => {
    try {
      const { rss, anon } = readMemory(c.agent.pid);
      samples.push({ at: Date.now(), rss });
      peakRss = Math.max(peakRss, rss);
      peakAnon = Math.max(peakAnon, anon);
    } catch {
      // The agent has gone; the wait below says so.
    }
  };
  const sampler = setInterval(sampleRss, SAMPLE_MS);
  try {
    const wallStart = Date.now();
    const start = performance.now();
    const r = await send(`${c.bridgeUrl}/0/devices/${c.deviceId}/fw/${IMAGE_NAME}`, {
      method: 'POST',
      headers: { cookie: c.cookie },
      timeoutMs: SETUP_TIMEOUT_MS,
    }).done;
    if (r.status !== 200) throw new Error(`POST …/fw/${IMAGE_NAME}: ${r.status} ${r.body}`);
    // The job is stored before the answer, so it is there to be read now.
    const jobId = c.watcher.openJob(c.deviceId);
    if (!jobId) throw new Error('the bridge answered 200 but has no open job');
    let outcome: string | null = null;
    let end = 0;
    let endWall = 0;
    const deadline = start + UPDATE_TIMEOUT_MS;
    for (;;) {
      const job = c.watcher.job(jobId);
      if (job && !job.open) {
        end = performance.now();
        endWall = Date.now();
        outcome = job.outcome;
        break;
      }
      if (performance.now() > deadline) throw new Error(`the update did not end within ${UPDATE_TIMEOUT_MS} ms`);
      await sleep(SAMPLE_MS);
    }
    sampleRss();
    const fwstate = c.watcher.value(c.deviceId, 'meta', 'fwstate');
    const status = (await c.client.fwStatus()) as unknown as FwStatus;
    if (outcome !== 'done' || fwstate !== 'done') {
      throw new Error(
        `the update ended ${outcome ?? '?'} (fwstate ${fwstate ?? '?'}): ${status.job?.error ?? ''}\n${c.agent.output()}`,
      );
    }
    const steps = status.job?.id === jobId ? status.job.steps : [];
    const at = (state: string) => steps.find((s) => s.state === state)?.at;
    const doneAt = at('done');
    const startAt = at('downloading');
    if (doneAt === undefined || startAt === undefined)
      throw new Error(`the agent's steps lack downloading or done: ${JSON.stringify(steps)}`);
    const phases = { downloading: 0, verifying: 0, installing: 0, commit: 0 };
    const peakRssBy = { downloading: 0, verifying: 0, installing: 0, commit: 0 };
    for (let i = 0; i + 1 < steps.length; i++) {
      const s = steps[i]!;
      const next = steps[i + 1]!.at;
      const phase = (PHASES as readonly string[]).includes(s.state) ? (s.state as (typeof PHASES)[number]) : 'commit';
      phases[phase] += next - s.at;
      for (const x of samples) if (x.at >= s.at && x.at <= next) peakRssBy[phase] = Math.max(peakRssBy[phase], x.rss);
    }
    checkSlot(c, status);
    return {
      ms: end - start,
      deliverMs: startAt - wallStart,
      phases,
      reportMs: endWall - doneAt,
      peakRss,
      peakRssBy,
      rssBefore,
      peakAnon,
      bridgeStates: c.watcher.fwStates(c.deviceId, historyFrom).map((s) => s.state),
    };
  } finally {
    clearInterval(sampler);
  }
}

/** The update really landed: the active slot holds the image's payload, whole. */
function checkSlot(c: Ctx, status: FwStatus): void {
  const slot = status.activeSlot;
  if (slot !== 'a' && slot !== 'b') throw new Error(`the agent reports no active slot: ${JSON.stringify(status)}`);
  const dir = join(c.slotsDir, slot);
  const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as { name?: string };
  const payload = statSync(join(dir, 'payload.bin')).size;
  if (manifest.name !== IMAGE_NAME || payload !== c.payloadBytes)
    throw new Error(`slot ${slot} does not hold the image (manifest ${manifest.name}, payload ${payload} bytes)`);
}

/** Runs a program to its end; its time in ms. Fails on a non-zero exit. */
function timed(file: string, args: string[]): Promise<{ ms: number; stdout: string }> {
  return new Promise((resolve, reject) => {
    const start = performance.now();
    const child = spawn(file, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr = (stderr + s).slice(-4096)));
    const timer = setTimeout(() => child.kill('SIGKILL'), UPDATE_TIMEOUT_MS);
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      const ms = performance.now() - start;
      if (code === 0) resolve({ ms, stdout });
      else reject(new Error(`${file} ${args.join(' ')} failed (${code ?? signal}): ${stderr}`));
    });
  });
}

/**
 * The baseline: `curl -o` of the image from the bridge's image route, with the token of a job the benchmark adds
 * for the same device through the bridge's own job store (and ends right after), then `sha256sum` of the file
 * and `tar -xzf` of it into an empty folder: the same server, route, token check and bytes as the agent's.
 */
async function baseline(c: Ctx, jobs: FirmwareJobStore, tmp: string, n: number): Promise<BaselineRun> {
  const token = randomBytes(32).toString('base64url');
  const jobId = randomUUID();
  const now = Date.now();
  const url = `${c.bridgeUrl}/0/firmware/jobs/${jobId}/image`;
  jobs.add({
    id: jobId,
    deviceId: c.deviceId,
    name: IMAGE_NAME,
    sha256: c.sha256,
    size: c.sizeBytes,
    token,
    tokenExpires: now + 3_600_000,
    createdAt: now,
    url,
  });
  const dir = join(tmp, `baseline-${n}`);
  const slot = join(dir, 'slot');
  mkdirSync(slot, { recursive: true });
  const file = join(dir, 'image.tar.gz');
  try {
    const curl = await timed('curl', ['-sS', '-f', '-o', file, '-H', `Authorization: Bearer ${token}`, url]);
    // Outside the baseline's time: the fsync the agent's download ends with, on what curl has just written.
    const syncStart = performance.now();
    const fd = openSync(file, 'r+');
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    const fsyncMs = performance.now() - syncStart;
    const sum = await timed('sha256sum', [file]);
    if (sum.stdout.split(' ', 1)[0] !== c.sha256) throw new Error(`sha256sum: ${sum.stdout.trim()}, not ${c.sha256}`);
    const tar = await timed('tar', ['-xzf', file, '-C', slot]);
    if (statSync(join(slot, 'payload.bin')).size !== c.payloadBytes) throw new Error('tar -x left a short payload');
    // Outside the baseline's time: the two listings the slot installer makes before it unpacks (member checks).
    const list = await timed('tar', ['-tzf', file]);
    const listVerbose = await timed('tar', ['-tvzf', file]);
    return {
      ms: curl.ms + sum.ms + tar.ms,
      curlMs: curl.ms,
      sha256Ms: sum.ms,
      tarMs: tar.ms,
      extra: { fsyncMs, listMs: list.ms, listVerboseMs: listVerbose.ms },
    };
  } finally {
    // Over once the baseline has the image; no device ever ran it.
    jobs.end(jobId, 'abandoned', Date.now());
    rmSync(dir, { recursive: true, force: true });
  }
}

function requireTools(): void {
  for (const [tool, arg] of [
    ['curl', '--version'],
    ['sha256sum', '--version'],
    ['tar', '--version'],
    ['gzip', '--version'],
  ] as const) {
    const r = spawnSync(tool, [arg], { stdio: 'ignore' });
    if (r.status !== 0) throw new Error(`the baseline needs ${tool} on the PATH`);
  }
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = parseOptions(args);
  requireTools();
  const prepared = prepareBridge(opts.source);
  const preparedAgent = prepareAgent(opts.source);
  console.log(
    `firmware: bridge from ${prepared.runtime} (${prepared.note}), agent from ${preparedAgent.runtime} ` +
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

  // The image, a fresh key pair, and the catalog entry, all before the bridge starts.
  const buildStart = performance.now();
  const imageFile = buildImage(tmp, opts.sizeMb);
  const sizeBytes = statSync(imageFile).size;
  console.log(
    `image: ${mb(sizeBytes)} tar.gz (${opts.sizeMb} MiB of random bytes), built in ` +
      `${round((performance.now() - buildStart) / 1000)} s`,
  );
  const dataDir = join(tmp, 'bridge');
  await seedUser(dataDir, LOGIN, PASSWORD);
  const keysDir = join(tmp, 'keys');
  bridgeCli(prepared.runtime, dataDir, ['firmware', 'keygen', '--out', keysDir]);
  const added = JSON.parse(
    bridgeCli(prepared.runtime, dataDir, [
      'firmware',
      'add',
      imageFile,
      '--name',
      IMAGE_NAME,
      '--platform',
      PLATFORM,
      '--version',
      '1',
      '--from',
      PLATFORM,
      '--sign-key',
      join(keysDir, 'signing.key'),
      '--json',
    ]),
  ) as { sha256: string; size: number };
  if (added.size !== sizeBytes) throw new Error(`the catalog holds ${added.size} bytes, the image is ${sizeBytes}`);
  // The bridge keeps its own copy; this one is not needed any more.
  rmSync(imageFile, { force: true });

  const bridge = await spawnBridgeProcess(
    { runtime: prepared.runtime, dataDir, cpuProfDir, nodeArgs: opts.nodeArgs },
    cleanup,
  );
  console.log(`bridge at ${bridge.url}${bridge.nodeArgs.length > 0 ? `, node ${bridge.nodeArgs.join(' ')}` : ''}`);

  // The agent with production settings but for the firmware section: the fresh public key, the slots in the
  // temporary folder; no health check (committed at once) and no restart, as the defaults are.
  const agentDir = join(tmp, 'agent');
  const slotsDir = join(tmp, 'slots');
  mkdirSync(agentDir, { recursive: true });
  writeText(
    join(agentDir, 'agent.yaml'),
    [
      `platform: ${JSON.stringify(PLATFORM)}`,
      'firmware:',
      `  publicKeys: [${JSON.stringify(join(keysDir, 'signing.pub'))}]`,
      `  slotsDir: ${JSON.stringify(slotsDir)}`,
      '',
    ].join('\n'),
  );
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
  const client = await connectWhenUp(agent);
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

  const watcher = new Watcher(join(dataDir, 'bridge.db'));
  cleanup.add('close the read-only connection', () => watcher.close());
  // An update starts only on a device in `d` mode `connected` whose presence and platform the bridge has.
  await client.set('d', 'mode', 'connected');
  await until(
    () =>
      watcher.value(identity.deviceId, 'd', 'mode') === 'connected' &&
      watcher.value(identity.deviceId, 'meta', 'state') === 'connected' &&
      watcher.value(identity.deviceId, 'meta', 'platform') === PLATFORM
        ? true
        : undefined,
    'the bridge to see the device connected',
  );
  // The baseline's jobs go in through the bridge's own job store, on a connection of this process.
  const rw = new Database(join(dataDir, 'bridge.db'), { fileMustExist: true });
  rw.pragma('busy_timeout = 5000');
  cleanup.add('close the job connection', () => rw.close());
  const jobs = new FirmwareJobStore(rw);

  const c: Ctx = {
    bridgeUrl: bridge.url,
    deviceId: identity.deviceId,
    cookie,
    agent,
    client,
    watcher,
    slotsDir,
    sizeBytes,
    payloadBytes: opts.sizeMb * MIB,
    sha256: added.sha256,
  };
  console.log(`device ${identity.deviceId} claimed; ${opts.warmup + opts.rounds} updates of ${mb(sizeBytes)}`);

  for (let i = 0; i < opts.warmup; i++) {
    await update(c);
    await baseline(c, jobs, tmp, -1 - i);
  }
  // Alternated, so that both sides see the machine alike (and the page cache warmed by the other).
  const updates: UpdateRun[] = [];
  const baselines: BaselineRun[] = [];
  for (let r = 0; r < opts.rounds; r++) {
    if (r % 2 === 0) {
      baselines.push(await baseline(c, jobs, tmp, r));
      updates.push(await update(c));
    } else {
      updates.push(await update(c));
      baselines.push(await baseline(c, jobs, tmp, r));
    }
    const u = updates.at(-1)!;
    const b = baselines.at(-1)!;
    console.log(
      `round ${r + 1}: agent ${round(u.ms / 1000)} s (peak ${mb(u.peakRss)}), baseline ${round(b.ms / 1000)} s`,
    );
  }
  const hwm = readRss(agent.pid).peak;

  rw.close();
  watcher.close();
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

  const agentMs = median(updates.map((u) => u.ms));
  const baseMs = median(baselines.map((b) => b.ms));
  const ratio = agentMs / baseMs;
  const peakRss = Math.max(...updates.map((u) => u.peakRss));
  const met = { time: ratio <= TARGET.ratio, rss: peakRss <= TARGET.rssBytes };
  const allMet = met.time && met.rss;
  const f = (n: number) => String(round(n));
  const s = (ms: number) => f(ms / 1000);
  const med = (g: (u: UpdateRun) => number) => median(updates.map(g));
  const bmed = (g: (b: BaselineRun) => number) => median(baselines.map(g));
  const rate = (ms: number) => `${f(sizeBytes / MIB / (ms / 1000))} MiB/s`;
  const rows: Row[] = [
    {
      figure: `${mb(sizeBytes)} image, POST → fwstate done (s, median of ${opts.rounds})`,
      measured: s(agentMs),
      baseline: `${s(baseMs)} curl+sha256sum+tar`,
      ratio: f(ratio),
      target: `≤ ${TARGET.ratio} × baseline`,
      met: met.time,
    },
    {
      figure: 'agent VmRSS peak during the update (sampled)',
      measured: mb(peakRss),
      baseline: `${mb(updates[0]!.rssBefore)} before the first`,
      ratio: '',
      target: `≤ ${mb(TARGET.rssBytes)}`,
      met: met.rss,
    },
    {
      figure: "  of that, RssAnon (private, without the binary's file pages)",
      measured: mb(Math.max(...updates.map((u) => u.peakAnon))),
      baseline: '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  VmRSS peak while downloading, verifying, installing',
      measured: PHASES.map((p) => mb(Math.max(...updates.map((u) => u.peakRssBy[p])))).join(', '),
      baseline: '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  download (s): agent downloading, curl -o',
      measured: s(med((u) => u.phases.downloading)),
      baseline: s(bmed((b) => b.curlMs)),
      ratio: f(med((u) => u.phases.downloading) / bmed((b) => b.curlMs)),
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  download rate: agent, curl',
      measured: rate(med((u) => u.phases.downloading)),
      baseline: rate(bmed((b) => b.curlMs)),
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  verify (s): agent verifying, sha256sum',
      measured: s(med((u) => u.phases.verifying)),
      baseline: s(bmed((b) => b.sha256Ms)),
      ratio: f(med((u) => u.phases.verifying) / bmed((b) => b.sha256Ms)),
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  install (s): agent installing, tar -xzf',
      measured: s(med((u) => u.phases.installing)),
      baseline: s(bmed((b) => b.tarMs)),
      ratio: f(med((u) => u.phases.installing) / bmed((b) => b.tarMs)),
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: "  the agent's extra work, on the baseline's file: fsync; tar -tzf; tar -tvzf (s)",
      measured: [bmed((b) => b.extra.fsyncMs), bmed((b) => b.extra.listMs), bmed((b) => b.extra.listVerboseMs)]
        .map(s)
        .join('; '),
      baseline: '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: '  switching → done; POST → job stored; done → job ended on the bridge (s)',
      measured: `${s(med((u) => u.phases.commit))}; ${s(med((u) => u.deliverMs))}; ${s(med((u) => u.reportMs))}`,
      baseline: '',
      ratio: '',
      target: '(diagnostic)',
      met: undefined,
    },
    {
      figure: 'agent VmHWM at the end (whole life)',
      measured: mb(hwm),
      baseline: '',
      ratio: '',
      target: '(reported)',
      met: undefined,
    },
  ];
  console.log('');
  console.log(formatTable(rows));
  console.log('');
  console.log(
    `Image: manifest.json, README and ${opts.sizeMb} MiB of random bytes, tar | gzip -1, signed with a fresh ` +
      `Ed25519 key and added with devcloud-bridge firmware add. Baseline: curl -o, sha256sum, tar -xzf of the ` +
      `same bytes from the bridge's image route, with the token of a job the benchmark adds for the purpose.`,
  );
  console.log(`bridge recorded fwstate (last update): ${updates.at(-1)!.bridgeStates.join(' → ')}`);
  if (!allMet) console.log('a target was missed: see "Finding out why" in bench/README.md.');
  if (bridgeOutput.length > 0)
    console.log(`the bridge logged ${bridgeOutput.length} lines; last: ${bridgeOutput.at(-1)}`);
  if (agentOutput.length > 0) console.log(`the agent logged ${agentOutput.length} lines; last: ${agentOutput.at(-1)}`);
  if (cpuProfDir) console.log(`bridge and agent CPU profiles written to ${cpuProfDir}`);
  const ms = (n: number) => round(n);
  console.log(
    JSON.stringify({
      bench: 'firmware',
      bridgeRuntime: prepared.runtime,
      agentRuntime: preparedAgent.runtime,
      options: { sizeMb: opts.sizeMb, rounds: opts.rounds, warmup: opts.warmup, tmp: opts.tmp },
      imageBytes: sizeBytes,
      bridgeNodeArgs: bridge.nodeArgs,
      agentNodeArgs: agent.nodeArgs,
      update: {
        medianMs: ms(agentMs),
        baselineMedianMs: ms(baseMs),
        ratio: round(ratio),
        target: TARGET.ratio,
        met: met.time,
        rounds: updates.map((u) => ({
          ms: ms(u.ms),
          deliverMs: u.deliverMs,
          reportMs: u.reportMs,
          phasesMs: u.phases,
          peakRssBytes: u.peakRss,
          peakRssByStateBytes: u.peakRssBy,
          peakRssAnonBytes: u.peakAnon,
          rssBeforeBytes: u.rssBefore,
          bridgeStates: u.bridgeStates,
        })),
        baselineRounds: baselines.map((b) => ({
          ms: ms(b.ms),
          curlMs: ms(b.curlMs),
          sha256Ms: ms(b.sha256Ms),
          tarMs: ms(b.tarMs),
          fsyncMs: ms(b.extra.fsyncMs),
          tarListMs: ms(b.extra.listMs),
          tarListVerboseMs: ms(b.extra.listVerboseMs),
        })),
      },
      rss: {
        peakBytes: peakRss,
        peakAnonBytes: Math.max(...updates.map((u) => u.peakAnon)),
        hwmBytes: hwm,
        targetBytes: TARGET.rssBytes,
        sampleMs: SAMPLE_MS,
        met: met.rss,
      },
      bridgeLogLines: bridgeOutput.length,
      agentLogLines: agentOutput.length,
      allMet,
    }),
  );
  return allMet ? 0 : 1;
}
