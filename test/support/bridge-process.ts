/**
 * The bridge as a real process (the built `devcloud-bridge run`, as the installed service runs it; the global setup,
 * test/support/dist.ts, has made sure that `dist/` is current), for tests that kill it with SIGKILL. Its
 * settings come from a config file written next to its data (scrypt at its cheapest, generous rate limits), and
 * nothing from the caller's environment or the machine's /etc/devcloud reaches it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from './agent.js';
import { HttpClient } from './bridge.js';

export interface BridgeProcessOptions {
  dataDir: string;
  httpPort: number;
  /** The embedded broker's port; left out for a bridge on an external broker (`mqtt.url` in `config`). */
  mqttPort?: number;
  /** More settings for the config file, merged at the top level. */
  config?: Record<string, unknown>;
}

export interface BridgeProcess {
  proc: ChildProcess;
  url: string;
  mqttUrl: string;
  /** What the process wrote so far (its log, JSON lines). */
  output(): string;
  /** A new HTTP client with an empty cookie jar. */
  client(): HttpClient;
  /** SIGKILL, and waits for the exit. */
  kill9(): Promise<void>;
  /** SIGTERM (a clean stop), then SIGKILL after a grace period. */
  stop(): Promise<void>;
}

/** An HTTP client over `fetch` for a bridge at `base`. */
export function httpClientFor(base: string): HttpClient {
  return new HttpClient(fetchSend(base));
}

/** Sends a request to the bridge at `base` over `fetch`. */
export function fetchSend(base: string): ConstructorParameters<typeof HttpClient>[0] {
  return async (req) => {
    const res = await fetch(new URL(req.path, base), {
      method: req.method,
      headers: req.headers,
      redirect: 'manual',
      ...(req.body === undefined ? {} : { body: req.body }),
    });
    return {
      status: res.status,
      body: await res.text(),
      contentType: res.headers.get('content-type') ?? '',
      setCookies: res.headers.getSetCookie(),
    };
  };
}

/** Starts the bridge on the given ports; resolves once it logged `bridge.started`. */
export async function spawnBridge(opts: BridgeProcessOptions): Promise<BridgeProcess> {
  const configFile = join(opts.dataDir, 'test-bridge.json');
  writeFileSync(
    configFile,
    JSON.stringify({
      accounts: { scryptLogN: 10 },
      rateLimits: { login: { limit: 1000 }, signup: { limit: 1000 } },
      // Open enrolment, for the agents the tests start, and no limit on their enrolments and hellos, unless the
      // test says otherwise.
      mqtt: {
        openEnrolment: true,
        enrolLimits: { perAddress: 100_000, total: 100_000 },
        rate: { hellosPerMinute: 100_000 },
      },
      ...opts.config,
    }),
  );
  const args = [
    'run',
    '--config',
    configFile,
    '--data-dir',
    opts.dataDir,
    '--http-port',
    String(opts.httpPort),
    ...(opts.mqttPort === undefined ? [] : ['--mqtt-port', String(opts.mqttPort)]),
    '--log-level',
    'info',
    '--log-pretty',
    'never',
  ];
  const proc = spawn(process.execPath, [join(ROOT, 'dist/bridge/main.js'), ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CONFIGURATION_DIRECTORY: opts.dataDir },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  const started = new Promise<void>((resolve, reject) => {
    const onData = (d: Buffer) => {
      // The tail only: a long test must not grow this process with the bridge's log.
      out = (out + d.toString()).slice(-256 * 1024);
      if (out.includes('"event":"bridge.started"')) resolve();
    };
    proc.stdout?.on('data', onData);
    proc.stderr?.on('data', onData);
    void exited.then(() => reject(new Error(`the bridge exited before it started:\n${out.slice(-4000)}`)));
  });
  const timeout = setTimeout(() => proc.kill('SIGKILL'), 30_000);
  try {
    await started;
  } finally {
    clearTimeout(timeout);
  }
  const url = `http://127.0.0.1:${opts.httpPort}`;
  const kill9 = async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await exited;
  };
  return {
    proc,
    url,
    mqttUrl:
      opts.mqttPort === undefined
        ? String((opts.config?.mqtt as { url?: string } | undefined)?.url)
        : `mqtt://127.0.0.1:${opts.mqttPort}`,
    output: () => out,
    client: () => httpClientFor(url),
    kill9,
    stop: async () => {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      proc.kill('SIGTERM');
      await exited;
      clearTimeout(timer);
    },
  };
}
