/**
 * The processes a benchmark measures or needs: the agent as the installed service runs it (compiled JS,
 * built here when `dist/` is missing or older than the source), and a broker in its own process.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { connect as netConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../test/support/brokers.js';
import type { Cleanup } from './cleanup.js';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** The source the agent is compiled from; `dist/agent/main.js` older than any of it is stale. */
const AGENT_SOURCES = ['agent', 'lib', 'protocol'];

function newestMtime(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) newest = Math.max(newest, newestMtime(path));
    else if (entry.name.endsWith('.ts')) newest = Math.max(newest, statSync(path).mtimeMs);
  }
  return newest;
}

export type AgentRuntime = 'dist' | 'source';

/**
 * Makes sure the compiled agent is current and says how to run it. A build that reports type errors
 * elsewhere in the tree still emits JavaScript; that output is used with a warning, and the source (through
 * tsx) only when there is no output at all.
 */
export function prepareAgent(preferSource: boolean): { runtime: AgentRuntime; note: string } {
  return prepareDist('dist/agent/main.js', AGENT_SOURCES, preferSource);
}

/**
 * The same for any compiled entry point (relative to the repository) built from the `.ts` files under
 * `sources`: `npm run build` when the entry is missing or older than any of them.
 */
export function prepareDist(
  entry: string,
  sources: readonly string[],
  preferSource: boolean,
): { runtime: AgentRuntime; note: string } {
  if (preferSource) return { runtime: 'source', note: 'running the TypeScript source through tsx (--source)' };
  const main = join(ROOT, entry);
  const sourceTime = Math.max(...sources.map((d) => newestMtime(join(ROOT, d))));
  if (existsSync(main) && statSync(main).mtimeMs >= sourceTime) return { runtime: 'dist', note: 'dist/ is current' };
  console.error(existsSync(main) ? 'dist/ is older than the source: npm run build' : 'no dist/: npm run build');
  const build = spawnSync('npm', ['run', 'build'], { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'] });
  if (existsSync(main) && statSync(main).mtimeMs >= sourceTime) {
    return build.status === 0
      ? { runtime: 'dist', note: 'built dist/ for this run' }
      : { runtime: 'dist', note: 'npm run build reported errors; using the JavaScript it emitted' };
  }
  return { runtime: 'source', note: `npm run build produced no ${entry}; running the source through tsx` };
}

/**
 * The node options in the entry point's `#!/usr/bin/env -S node ...` line. The installed service starts the
 * agent through that line; the benchmark starts node itself (to choose the entry and add its own options), so
 * it passes the same ones.
 */
export function shebangNodeArgs(entry: string): string[] {
  const first = readFileSync(entry, 'utf8').split('\n', 1)[0] ?? '';
  const m = /^#!\S*\benv -S node\b(.*)$/.exec(first);
  return m ? m[1]!.trim().split(/\s+/).filter(Boolean) : [];
}

export interface AgentProcess {
  pid: number;
  /** The options node was started with (from the entry's shebang, then the benchmark's own). */
  nodeArgs: string[];
  socket: string;
  output(): string;
  /** SIGTERM, then SIGKILL if it has not exited within 10 s. */
  stop(): Promise<void>;
}

export interface AgentProcessOptions {
  runtime: AgentRuntime;
  mqttUrl: string;
  stateDir: string;
  /** Folder for a V8 CPU profile of the agent, written when it exits. */
  cpuProfDir?: string | undefined;
  /** More options for node, before the script (V8 flags, for experiments). */
  nodeArgs?: string[];
}

export function spawnAgentProcess(opts: AgentProcessOptions, cleanup: Cleanup): AgentProcess {
  const script = join(ROOT, opts.runtime === 'dist' ? 'dist/agent/main.js' : 'agent/main.ts');
  const nodeArgs = [...shebangNodeArgs(script), ...(opts.nodeArgs ?? [])];
  if (opts.cpuProfDir) nodeArgs.push('--cpu-prof', '--cpu-prof-dir', opts.cpuProfDir);
  const entry = opts.runtime === 'dist' ? [script] : ['--import', 'tsx', script];
  const args = [
    'run',
    '--state-dir',
    opts.stateDir,
    '--mqtt-url',
    opts.mqttUrl,
    '--udp-port',
    '0',
    '--log-level',
    'warn',
    '--log-pretty',
    'never',
  ];
  mkdirSync(opts.stateDir, { recursive: true });
  const proc = spawn(process.execPath, [...nodeArgs, ...entry, ...args], {
    cwd: ROOT,
    // Nothing from the caller's environment or the machine may redirect the socket, the state or the config
    // (RUNTIME_DIRECTORY, DEVCLOUD_*, /etc/devcloud/agent.yaml): the config folder is the empty state folder.
    // MALLOC_ARENA_MAX as systemd/devcloud-agent.service sets it, so that memory is measured as on a gateway.
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      CONFIGURATION_DIRECTORY: opts.stateDir,
      MALLOC_ARENA_MAX: '2',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const keep = (d: Buffer) => {
    // The agent logs at warn; keep the tail only, so a chatty failure cannot grow this process.
    out = (out + d.toString()).slice(-64 * 1024);
  };
  proc.stdout?.on('data', keep);
  proc.stderr?.on('data', keep);
  const stop = () => stopChild(proc, 10_000);
  cleanup.add('stop the agent', stop);
  return { pid: proc.pid!, nodeArgs, socket: join(opts.stateDir, 'agent.sock'), output: () => out, stop };
}

/** SIGTERM, then SIGKILL if the child has not exited within `graceMs`. */
export async function stopChild(proc: ChildProcess, graceMs: number): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise<void>((res) => proc.once('exit', () => res()));
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

/** Resident set size now and at its peak, from `/proc/<pid>/status`, in bytes. */
export function readRss(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key: string) => {
    const m = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status);
    if (!m) throw new Error(`no ${key} in /proc/${pid}/status`);
    return Number(m[1]) * 1024;
  };
  return { rss: kb('VmRSS'), peak: kb('VmHWM') };
}

const CLOCK_TICKS = (() => {
  const r = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
  const n = Number(r.stdout?.trim());
  return Number.isInteger(n) && n > 0 ? n : 100;
})();

/** CPU time (user + system) a process has used so far, in milliseconds, from `/proc/<pid>/stat`. */
export function readCpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name may hold spaces; the fields after its closing parenthesis do not.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
}

export type BenchBrokerKind = 'mosquitto' | 'aedes';

export interface BenchBroker {
  kind: BenchBrokerKind;
  url: string;
}

/**
 * A private broker in its own process, so that it does not share the benchmark's event loop. Both send every
 * packet at once (`TCP_NODELAY`): with Nagle's algorithm a QoS 1 round trip waits for delayed ACKs (about
 * 40 ms on Linux) and measures the kernel's timers, not the software.
 */
export async function startBenchBroker(kind: BenchBrokerKind, cleanup: Cleanup): Promise<BenchBroker> {
  const dir = mkdtempSync(join(tmpdir(), 'devcloud-bench-broker-'));
  cleanup.add('remove the broker folder', () => rmSync(dir, { recursive: true, force: true }));
  const port = await freePort();
  let proc: ChildProcess;
  if (kind === 'mosquitto') {
    const conf = join(dir, 'mosquitto.conf');
    writeFileSync(
      conf,
      [
        `listener ${port} 127.0.0.1`,
        'allow_anonymous true',
        'persistence false',
        'set_tcp_nodelay true',
        'log_dest stderr',
        'log_type error',
        'max_inflight_messages 0',
        'max_queued_messages 1000000',
        '',
      ].join('\n'),
    );
    proc = spawn('mosquitto', ['-c', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
  } else {
    proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'bench/support/aedes-main.ts'), String(port)], {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
  }
  cleanup.add(`stop ${kind}`, () => stopChild(proc, 2000));
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-8192)));
  const deadline = Date.now() + 20_000;
  while (!(await canConnect(port))) {
    if (proc.exitCode !== null) throw new Error(`${kind} exited: ${stderr}`);
    if (Date.now() > deadline) throw new Error(`${kind} did not listen on ${port}: ${stderr}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return { kind, url: `mqtt://127.0.0.1:${port}` };
}

/** Whether something accepts TCP connections on 127.0.0.1:`port`. */
export function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = netConnect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
