/**
 * The health check that decides, after a firmware switch, whether the new image is committed or rolled back
 * (DESIGN section 7). It is either a command, run without a shell and healthy when it exits 0, or an HTTP URL,
 * healthy when a GET answers 2xx. Each attempt has a time limit; a failed attempt is repeated after an interval
 * up to `retries` times. The result carries a sentence for the job's error when the check does not pass.
 */
import { spawn } from 'node:child_process';

interface HealthTiming {
  /** The longest one attempt may take; a command still running then is killed with its process group. */
  timeoutMs: number;
  /** Attempts after the first one fails. */
  retries: number;
  /** Milliseconds between the end of a failed attempt and the start of the next. */
  intervalMs: number;
  /** Stops the check: a running command is killed, a request dropped, and no further attempt is made. */
  signal?: AbortSignal;
}

export type HealthCheckOptions = HealthTiming &
  ({ command: readonly string[]; url?: undefined; env?: NodeJS.ProcessEnv } | { url: string; command?: undefined });

export type HealthResult =
  { healthy: true; attempts: number } | { healthy: false; attempts: number; reason: string; aborted?: true };

type Attempt = { ok: true } | { ok: false; reason: string };

/** Bytes of a failing command's stderr quoted in the reason (its end). */
const STDERR_TAIL = 200;

/** Runs the check until it passes, the retries are used up, or `signal` aborts it. Never rejects. */
export async function healthCheck(opts: HealthCheckOptions): Promise<HealthResult> {
  const { signal } = opts;
  let attempts = 0;
  let last = 'no attempt made';
  for (;;) {
    if (signal?.aborted) return { healthy: false, attempts, reason: `health check aborted (${last})`, aborted: true };
    attempts++;
    const result = opts.command !== undefined ? await runCommand(opts.command, opts) : await probeUrl(opts.url, opts);
    if (result.ok) return { healthy: true, attempts };
    last = result.reason;
    if (signal?.aborted) return { healthy: false, attempts, reason: `health check aborted (${last})`, aborted: true };
    if (attempts > opts.retries) {
      return { healthy: false, attempts, reason: `health check failed after ${attempts} attempt(s): ${last}` };
    }
    await pause(opts.intervalMs, signal);
  }
}

function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}

function runCommand(command: readonly string[], opts: HealthTiming & { env?: NodeJS.ProcessEnv }): Promise<Attempt> {
  const [file, ...args] = command;
  if (file === undefined) return Promise.resolve({ ok: false, reason: 'the health command is empty' });
  const name = file;
  return new Promise((resolve) => {
    let stderr = '';
    let stopped: 'timeout' | 'aborted' | undefined;
    let settled = false;
    const child = spawn(file, args, {
      // Its own process group, so that a timeout stops whatever the check started too.
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: opts.env ?? process.env,
    });
    const finish = (attempt: Attempt): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      child.stderr?.destroy();
      resolve(attempt);
    };
    const killGroup = (why: 'timeout' | 'aborted'): void => {
      stopped = why;
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // The group is already gone.
      }
    };
    const onAbort = (): void => killGroup('aborted');
    const timer = setTimeout(() => killGroup('timeout'), opts.timeoutMs);
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      stderr = (stderr + chunk).slice(-STDERR_TAIL);
    });
    child.once('error', (err) => {
      finish({ ok: false, reason: `${name} could not be run (${(err as NodeJS.ErrnoException).code ?? err.message})` });
    });
    const onEnd = (code: number | null, sig: NodeJS.Signals | null): void => {
      if (stopped === 'timeout') finish({ ok: false, reason: `${name} timed out after ${opts.timeoutMs} ms` });
      else if (stopped === 'aborted') finish({ ok: false, reason: `${name} was stopped` });
      else if (code === 0) finish({ ok: true });
      else {
        const said = stderr.trim().split('\n').pop()?.trim();
        const how = code !== null ? `exited with status ${code}` : `was killed by ${sig ?? 'a signal'}`;
        finish({ ok: false, reason: `${name} ${how}${said ? `: ${said}` : ''}` });
      }
    };
    // `close` waits for stderr to drain; after a kill, `exit` is enough (a stray process may hold the pipe).
    child.once('close', onEnd);
    child.once('exit', (code, sig) => {
      if (stopped !== undefined) onEnd(code, sig);
    });
  });
}

async function probeUrl(url: string, opts: HealthTiming): Promise<Attempt> {
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, opts.timeoutMs);
  const onAbort = (): void => controller.abort();
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  try {
    const res = await fetch(url, { signal: controller.signal, redirect: 'follow' });
    await res.body?.cancel();
    if (res.status >= 200 && res.status < 300) return { ok: true };
    return { ok: false, reason: `GET ${url} answered HTTP ${res.status}` };
  } catch (err) {
    if (timedOut) return { ok: false, reason: `GET ${url} timed out after ${opts.timeoutMs} ms` };
    if (opts.signal?.aborted) return { ok: false, reason: `GET ${url} was stopped` };
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    const detail = cause?.code ?? cause?.message ?? (err as Error).message;
    return { ok: false, reason: `GET ${url} failed: connection error (${detail})` };
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onAbort);
  }
}
