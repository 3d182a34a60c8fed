/**
 * Agents for tests: in-process (for fake timers and direct inspection) or as a real child process (for
 * `kill -9`). Both use a fresh state directory and a free UDP port unless told otherwise. The CLI runs in-process
 * too where the process boundary is not what a test is about.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Writable } from 'node:stream';
import { Agent } from '../../agent/agent.js';
import { runCli } from '../../agent/cli/index.js';
import { type AgentConfig, loadAgentConfig } from '../../agent/config.js';
import { LocalClient } from '../../agent/local/client.js';
import { createLogger, type Logger } from '../../lib/log.js';

export const ROOT = resolve(import.meta.dirname, '../..');
/**
 * The built `devcloud-agent`, as the installed service runs it; the global setup (test/support/dist.ts) has made
 * sure that it is current.
 */
export const AGENT_MAIN = join(ROOT, 'dist/agent/main.js');

export function tempDir(prefix = 'devcloud-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** Log lines captured from an in-process agent, parsed. */
export class LogSink extends Writable {
  readonly lines: Array<Record<string, unknown>> = [];
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: () => void): void {
    for (const line of chunk.toString('utf8').split('\n')) {
      if (line.trim()) this.lines.push(JSON.parse(line) as Record<string, unknown>);
    }
    cb();
  }
  events(name: string): Array<Record<string, unknown>> {
    return this.lines.filter((l) => l.event === name);
  }
  /** Every line as text, to check that a secret never appears. */
  text(): string {
    return this.lines.map((l) => JSON.stringify(l)).join('\n');
  }
}

export interface TestAgentOptions {
  mqttUrl: string;
  stateDir?: string;
  /** Extra config, merged over the test defaults. */
  flags?: Record<string, unknown>;
  level?: 'info' | 'debug' | 'warn';
  /** Called once the agent has stopped for its own restart (firmware `restart: agent`), instead of exiting. */
  onRestart?: () => void;
  /** The agent's monotonic clock (intervals, and its time once it knows the cloud's); the real one by default. */
  monotonic?: () => number;
}

export interface TestAgent {
  agent: Agent;
  config: AgentConfig;
  log: Logger;
  sink: LogSink;
  socket: string;
  client(): Promise<LocalClient>;
  stop(): Promise<void>;
}

/** Test defaults: quick reconnects and retries, a free UDP port, the socket in the state directory. */
export function testFlags(
  mqttUrl: string,
  stateDir: string,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    stateDir,
    'mqtt.url': mqttUrl,
    'mqtt.backoffMinMs': 50,
    'mqtt.backoffMaxMs': 500,
    'udp.port': 0,
    'log.pretty': 'never',
    ...extra,
  };
}

export async function startAgent(opts: TestAgentOptions): Promise<TestAgent> {
  const stateDir = opts.stateDir ?? tempDir();
  const config = loadAgentConfig({ flags: testFlags(opts.mqttUrl, stateDir, opts.flags), env: {} });
  const sink = new LogSink();
  const log = createLogger({
    level: opts.level ?? 'debug',
    pretty: 'never',
    base: { service: 'devcloud-agent' },
    destination: sink,
  });
  const agent = await Agent.start({
    config,
    log,
    env: {},
    ...(opts.onRestart ? { onRestart: opts.onRestart } : {}),
    ...(opts.monotonic ? { monotonic: opts.monotonic } : {}),
  });
  const socket = join(stateDir, 'agent.sock');
  return {
    agent,
    config,
    log,
    sink,
    socket,
    client: () => LocalClient.connect(socket),
    stop: () => agent.stop(),
  };
}

export interface AgentProcess {
  proc: ChildProcess;
  stateDir: string;
  socket: string;
  output: () => string;
  /** Resolves with the exit code or signal. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill9(): Promise<void>;
}

/** Runs the built `devcloud-agent` as a real process, as systemd runs it. */
export function spawnAgent(args: string[], env: NodeJS.ProcessEnv = {}): AgentProcess {
  const stateDirIdx = args.indexOf('--state-dir');
  const stateDir = stateDirIdx >= 0 ? args[stateDirIdx + 1]! : '';
  const proc = spawn(process.execPath, [AGENT_MAIN, ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once('exit', (code, signal) => resolve({ code, signal })),
  );
  return {
    proc,
    stateDir,
    socket: join(stateDir, 'agent.sock'),
    output: () => out,
    exited,
    kill9: async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
}

/** Waits until the process's local socket answers. */
export async function waitForSocket(path: string, timeoutMs = 20_000): Promise<LocalClient> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await LocalClient.connect(path);
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

export interface CliResult {
  code: number;
  /** What the command printed, each line ended by a newline as on a terminal. */
  stdout: string;
  stderr: string;
}

/**
 * `devcloud-agent ARGS` in this process, through the CLI's own entry (`runCli`, which agent/main.ts calls with
 * the process's argv and exits with its result). The environment is the one a shell gives a spawned CLI (PATH and
 * HOME) plus `env`, never the test's own.
 */
export async function agentCli(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliResult> {
  let stdout = '';
  let stderr = '';
  const io = { out: (s: string) => (stdout += `${s}\n`), err: (s: string) => (stderr += `${s}\n`) };
  const code = await runCli(args, io, { PATH: process.env.PATH, HOME: process.env.HOME, ...env });
  return { code, stdout, stderr };
}
