/**
 * The health check that decides, after a firmware switch, whether the new image is committed or rolled back
 * (docs/decisions.md §7). It is either a command, run without a shell and healthy when it exits 0, or an HTTP URL,
 * healthy when a GET answers 2xx. Each attempt has a time limit; a failed attempt is repeated after an interval
 * up to `retries` times. The result carries a sentence for the job's error when the check does not pass.
 */
import { type RunInGroup, runInGroup } from '../../lib/process.js';

interface HealthTiming {
  /** The longest one attempt may take; a command still running then is killed with its process group. */
  timeoutMs: number;
  /** Attempts after the first one fails. */
  retries: number;
  /** Milliseconds between the end of a failed attempt and the start of the next. */
  intervalMs: number;
  /** Stops the check: a running command is killed, a request dropped, and no further attempt is made. */
  signal?: AbortSignal;
  /** What runs the command; `runInGroup` when not given (a test may give another). */
  run?: RunInGroup;
}

export type HealthCheckOptions = HealthTiming &
  ({ command: readonly string[]; url?: undefined; env?: NodeJS.ProcessEnv } | { url: string; command?: undefined });

export type HealthResult =
  { healthy: true; attempts: number } | { healthy: false; attempts: number; reason: string; aborted?: true };

type Attempt = { ok: true } | { ok: false; reason: string };

/** Bytes of a failing command's stderr from which the reason quotes the last line (the end of it). */
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

async function runCommand(
  command: readonly string[],
  opts: HealthTiming & { env?: NodeJS.ProcessEnv },
): Promise<Attempt> {
  const [file, ...args] = command;
  if (file === undefined) return { ok: false, reason: 'the health command is empty' };
  // In its own process group (runInGroup), so that a timeout or an abort kills whatever the check started too,
  // with SIGKILL at once.
  const r = await (opts.run ?? runInGroup)({
    file,
    args,
    env: opts.env ?? process.env,
    stderr: { maxBytes: STDERR_TAIL, keep: 'tail' },
    timeoutMs: opts.timeoutMs,
    signal: opts.signal,
  });
  if (r.kind === 'spawn-error')
    return { ok: false, reason: `${file} could not be run (${r.error.code ?? r.error.message})` };
  if (r.aborted) return { ok: false, reason: `${file} was stopped` };
  if (r.timedOut) return { ok: false, reason: `${file} timed out after ${opts.timeoutMs} ms` };
  if (r.code === 0) return { ok: true };
  const said = r.stderr.text.trim().split('\n').pop()?.trim();
  const how = r.code !== null ? `exited with status ${r.code}` : `was killed by ${r.signal ?? 'a signal'}`;
  return { ok: false, reason: `${file} ${how}${said ? `: ${said}` : ''}` };
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
