/**
 * The bridge as the installed service runs it (`node dist/bridge/main.js run`, rebuilt first when stale), and
 * the baseline for its HTTP figures: a bare Fastify server that answers the same bytes with no work behind
 * them. Each runs in its own process, so that neither shares an event loop with the load generator.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../../test/support/brokers.js';
import type { Cleanup } from './cleanup.js';
import { type AgentRuntime, ROOT, canConnect, prepareDist, shebangNodeArgs, stopChild } from './processes.js';

/** The source `dist/bridge/main.js` is compiled from; an older entry is stale. */
const BRIDGE_SOURCES = ['bridge', 'lib', 'protocol'];

export function prepareBridge(preferSource: boolean): { runtime: AgentRuntime; note: string } {
  return prepareDist('dist/bridge/main.js', BRIDGE_SOURCES, preferSource);
}

export interface ServerProcess {
  pid: number;
  url: string;
  /** The options node was started with. */
  nodeArgs: string[];
  /** The tail of what the process wrote to stdout and stderr. */
  output(): string;
  /** SIGTERM, then SIGKILL after a grace period. */
  stop(): Promise<void>;
}

export interface BridgeProcessOptions {
  runtime: AgentRuntime;
  dataDir: string;
  /** Folder for a V8 CPU profile of the bridge, written when it exits. */
  cpuProfDir?: string | undefined;
  /** More options for node, before the script. */
  nodeArgs?: string[];
  /** More options for `devcloud-bridge run`. */
  args?: string[];
  /**
   * The external broker the bridge is a client of (`mqtt.url`, set in the config file of `dataDir` or in `args`):
   * then no embedded broker's port is given, and this is the returned `mqttUrl`.
   */
  externalMqttUrl?: string;
  /** Sees everything the bridge writes to stdout and stderr (the log), not only the tail `output()` keeps. */
  onOutput?: (chunk: Buffer) => void;
}

function keepTail(proc: ChildProcess): () => string {
  let out = '';
  // Keep the tail only, so that a chatty failure cannot grow the benchmark's process.
  const keep = (d: Buffer) => (out = (out + d.toString()).slice(-64 * 1024));
  proc.stdout?.on('data', keep);
  proc.stderr?.on('data', keep);
  return () => out;
}

async function waitForPort(proc: ChildProcess, port: number, what: string, output: () => string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await canConnect(port))) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`${what} exited: ${output()}`);
    if (Date.now() > deadline) throw new Error(`${what} did not listen on ${port}: ${output()}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/**
 * `devcloud-bridge run` on free ports with a fresh data folder, every other setting at its production default
 * (scrypt N=2^17, one hash at a time, the rate limits), logging at warn. Resolves once the HTTP port accepts
 * connections.
 */
export async function spawnBridgeProcess(
  opts: BridgeProcessOptions,
  cleanup: Cleanup,
): Promise<ServerProcess & { mqttUrl: string }> {
  const script = join(ROOT, opts.runtime === 'dist' ? 'dist/bridge/main.js' : 'bridge/main.ts');
  const nodeArgs = [...shebangNodeArgs(script), ...(opts.nodeArgs ?? [])];
  if (opts.cpuProfDir) nodeArgs.push('--cpu-prof', '--cpu-prof-dir', opts.cpuProfDir);
  const entry = opts.runtime === 'dist' ? [script] : ['--import', 'tsx', script];
  const httpPort = await freePort();
  const mqttPort = opts.externalMqttUrl === undefined ? await freePort() : undefined;
  const args = [
    'run',
    '--data-dir',
    opts.dataDir,
    '--http-port',
    String(httpPort),
    ...(mqttPort === undefined ? [] : ['--mqtt-port', String(mqttPort)]),
    // The benchmarks' agents make their own identities: open enrolment, which `run` has off by default.
    '--open-enrolment',
    'true',
    '--log-level',
    'warn',
    '--log-pretty',
    'never',
    ...(opts.args ?? []),
  ];
  mkdirSync(opts.dataDir, { recursive: true });
  const proc = spawn(process.execPath, [...nodeArgs, ...entry, ...args], {
    cwd: ROOT,
    // Nothing from the caller's environment or the machine may change the settings (DEVCLOUD_*,
    // /etc/devcloud/bridge.yaml): the config folder is the fresh data folder, which holds no bridge.yaml.
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CONFIGURATION_DIRECTORY: opts.dataDir },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output = keepTail(proc);
  if (opts.onOutput) {
    proc.stdout?.on('data', opts.onOutput);
    proc.stderr?.on('data', opts.onOutput);
  }
  // The bridge waits up to 5 s for open requests before it exits on SIGTERM (a profile is written then).
  const stop = () => stopChild(proc, 15_000);
  cleanup.add('stop the bridge', stop);
  await waitForPort(proc, httpPort, 'the bridge', output);
  return {
    pid: proc.pid!,
    url: `http://127.0.0.1:${httpPort}`,
    mqttUrl: opts.externalMqttUrl ?? `mqtt://127.0.0.1:${mqttPort}`,
    nodeArgs,
    output,
    stop,
  };
}

/** The warnings and errors in a bridge's log (JSON lines, levels warn to fatal), counted as they come. */
export class LogTally {
  count = 0;
  readonly byEvent: Record<string, number> = {};
  last: string | undefined;
  private partial = '';

  readonly feed = (chunk: Buffer): void => {
    const lines = (this.partial + chunk.toString()).split('\n');
    this.partial = lines.pop() ?? '';
    for (const line of lines) {
      // The bridge writes the level's label (lib/log.ts); pino's own numbers as well, for another logger.
      if (!/"level":(?:40|50|60|"warn"|"error"|"fatal")[,}]/.test(line)) continue;
      this.count++;
      const event = /"event":"([^"]*)"/.exec(line)?.[1] ?? '(no event)';
      this.byEvent[event] = (this.byEvent[event] ?? 0) + 1;
      this.last = line.slice(0, 600);
    }
  };
}

/**
 * The bare Fastify server (`bare-http-main.ts`), answering `userBody` on `GET /0/user/`, and the routes of
 * `routesFile` (a JSON object of path and body) when given.
 */
export async function spawnBareHttp(userBody: string, cleanup: Cleanup, routesFile?: string): Promise<ServerProcess> {
  const port = await freePort();
  const nodeArgs = ['--import', 'tsx'];
  const proc = spawn(
    process.execPath,
    [
      ...nodeArgs,
      join(ROOT, 'bench/support/bare-http-main.ts'),
      String(port),
      Buffer.from(userBody).toString('base64'),
      ...(routesFile ? [routesFile] : []),
    ],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const output = keepTail(proc);
  const stop = () => stopChild(proc, 2000);
  cleanup.add('stop the bare server', stop);
  await waitForPort(proc, port, 'the bare server', output);
  return { pid: proc.pid!, url: `http://127.0.0.1:${port}`, nodeArgs, output, stop };
}
