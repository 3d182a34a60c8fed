/**
 * Runs a program as a job in its own process group: one function for every child process the agent waits on (the
 * command runner, the firmware health check, installers and restart commands, the `tar` runs of the slots
 * installer, the change hook, the reboot command).
 *
 * - The program runs without a shell, `detached`: it leads a new process group whose id is its pid, so that a
 *   timeout or an abort reaches everything it started, not only the program itself.
 * - At the timeout the group gets SIGTERM, then SIGKILL `graceMs` later (at once when `graceMs` is 0). The SIGKILL
 *   goes to the group even if the program itself ended on the SIGTERM: what it started may ignore SIGTERM. An abort
 *   sends SIGKILL to the group at once.
 * - The job is over when the program has exited and its stdout and stderr are closed. Once the group has had its
 *   SIGKILL, a process that left the group (`setsid`) and still holds a pipe is not waited for beyond a short drain.
 * - Only a bounded part of each output stream is kept: its start or its end, cut at a UTF-8 character boundary,
 *   with a `truncated` flag.
 * - It never rejects: a program that could not be started is a result too (`spawn-error`).
 *
 * The agent's command runner adds, through `launcher` and `onSpawn`, what makes a handler die with the agent
 * (docs/agent.md, the command runner: `setpriv --pdeathsig KILL`, and its process recorded before it may start).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import type { Writable } from 'node:stream';

/** What is kept of an output stream. */
export interface OutputBound {
  /** The most bytes kept (`Infinity`: all of it). */
  maxBytes: number;
  /** Which end is kept when the stream is longer: its first bytes or its last. */
  keep: 'head' | 'tail';
}

/** What was kept of an output stream. */
export interface Output {
  /** The bytes kept, decoded as UTF-8; a character cut by the bound is left out. */
  text: string;
  /** The bytes kept (at most the bound). */
  bytes: Buffer;
  /** How many bytes the stream carried in all. */
  total: number;
  /** Some of it was not kept: `total` is more than `bytes.length`. */
  truncated: boolean;
}

/** What the program is started as, before `onSpawn` may see it. */
export interface Spawned {
  pid: number;
  /** The id of its process group: its pid, since it leads the group. */
  pgid: number;
  /** Its standard input when `stdin` is `'pipe'`, for the caller to write and end; `null` otherwise. */
  stdin: Writable | null;
}

export interface RunOptions {
  /** The program, found on the `PATH` of `env` when it has no slash; run without a shell. */
  file: string;
  args?: readonly string[];
  /** Its whole environment; the agent's own (`process.env`) when not given. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /**
   * A program that starts `file` in its place (`launcher.file launcher.args... file args...`) and keeps its pid,
   * as `setpriv --pdeathsig KILL -- ... sh -c 'exec "$0" "$@"'` does (agent/commands/procs.ts).
   */
  launcher?: { file: string; args: readonly string[] };
  /**
   * Standard input: nothing (`'ignore'`, the default), these bytes then end of file, or a pipe the caller writes
   * through `onSpawn` (`'pipe'`). A program that exits without reading it is no error.
   */
  stdin?: 'ignore' | 'pipe' | Uint8Array;
  /** What is kept of stdout; discarded when not given. */
  stdout?: OutputBound;
  /** What is kept of stderr; discarded when not given. `'stdout'`: into stdout's, in the order they come. */
  stderr?: OutputBound | 'stdout';
  /** The longest the job may run, in milliseconds; no limit when not given. */
  timeoutMs?: number;
  /** Milliseconds between the SIGTERM at the timeout and the SIGKILL; 0 (the default): SIGKILL at once. */
  graceMs?: number;
  /** Ends the job: SIGKILL to the group at once. Already aborted: the program is not started. */
  signal?: AbortSignal;
  /** Called once the program is started, before any output is read: where its pid can be recorded. */
  onSpawn?: (spawned: Spawned) => void;
}

interface RunCommon {
  stdout: Output;
  stderr: Output;
  /** Milliseconds from the start to the end of the job. */
  durationMs: number;
  /** The timeout ended it. */
  timedOut: boolean;
  /** `signal` ended it, or kept it from starting. */
  aborted: boolean;
}

/** The program ran and ended: `code` when it exited, `signal` when a signal ended it. */
export interface RunEnded extends RunCommon {
  kind: 'ended';
  pid: number;
  pgid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** The program could not be started (`ENOENT`, `EACCES`, ...), or `signal` was aborted before it was. */
export interface RunSpawnError extends RunCommon {
  kind: 'spawn-error';
  error: NodeJS.ErrnoException;
}

export type RunResult = RunEnded | RunSpawnError;

/** The runner as the parts that start processes take it, so that a test can give them another. */
export type RunInGroup = (opts: RunOptions) => Promise<RunResult>;

/**
 * How long the pipes may stay open once the program has exited and its group has had SIGKILL: only a process that
 * left the group can hold them then.
 */
const DRAIN_MS = 250;

const EMPTY: Output = { text: '', bytes: Buffer.alloc(0), total: 0, truncated: false };

/** Keeps the start or the end of a stream, within its bound. */
class Collector {
  private chunks: Buffer[] = [];
  private kept = 0;
  private total = 0;

  constructor(private readonly bound: OutputBound) {}

  add(chunk: Buffer): void {
    this.total += chunk.length;
    const { maxBytes } = this.bound;
    if (this.bound.keep === 'head') {
      const room = maxBytes - this.kept;
      if (room <= 0) return;
      const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
      this.chunks.push(part);
      this.kept += part.length;
      return;
    }
    this.chunks.push(chunk);
    this.kept += chunk.length;
    // The end is cut down now and then, not at every chunk: at most twice the bound is held.
    if (this.kept > maxBytes * 2) this.compact();
  }

  private compact(): void {
    const all = Buffer.concat(this.chunks);
    const kept = all.subarray(Math.max(0, all.length - this.bound.maxBytes));
    this.chunks = [kept];
    this.kept = kept.length;
  }

  output(): Output {
    if (this.kept > this.bound.maxBytes) this.compact();
    const bytes = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
    const truncated = this.total > bytes.length;
    return { text: decode(bytes, truncated ? this.bound.keep : undefined), bytes, total: this.total, truncated };
  }
}

/** UTF-8 text of `bytes`, without the part of a character the bound cut at the end it was cut (`cut`). */
function decode(bytes: Buffer, cut: 'head' | 'tail' | undefined): string {
  let b = bytes;
  if (cut === 'tail') {
    // The end was kept: continuation bytes at its start belong to a character whose first byte was dropped.
    let i = 0;
    while (i < 3 && i < b.length && (b[i]! & 0xc0) === 0x80) i++;
    b = b.subarray(i);
  } else if (cut === 'head') {
    // The start was kept: a character begun at its end may miss its last bytes.
    let i = b.length - 1;
    let continuation = 0;
    while (i >= 0 && continuation < 3 && (b[i]! & 0xc0) === 0x80) {
      i--;
      continuation++;
    }
    if (i >= 0) {
      const lead = b[i]!;
      const length = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      if (length > continuation + 1) b = b.subarray(0, i);
    }
  }
  return b.toString('utf8');
}

function notStarted(error: NodeJS.ErrnoException, aborted: boolean, durationMs: number): RunSpawnError {
  return { kind: 'spawn-error', error, stdout: EMPTY, stderr: EMPTY, durationMs, timedOut: false, aborted };
}

function abortError(): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error('The operation was aborted');
  err.name = 'AbortError';
  err.code = 'ABORT_ERR';
  return err;
}

/** Runs a program in its own process group until it ends, its timeout, or an abort. Never rejects. */
export const runInGroup: RunInGroup = (opts) =>
  new Promise<RunResult>((resolve) => {
    const started = performance.now();
    const elapsed = (): number => performance.now() - started;
    if (opts.signal?.aborted) {
      resolve(notStarted(abortError(), true, elapsed()));
      return;
    }
    const out = opts.stdout ? new Collector(opts.stdout) : undefined;
    const errBound = opts.stderr === 'stdout' ? undefined : opts.stderr;
    const err = errBound ? new Collector(errBound) : opts.stderr === 'stdout' ? out : undefined;
    const stdinMode = opts.stdin === undefined || opts.stdin === 'ignore' ? 'ignore' : 'pipe';
    const launcher = opts.launcher;
    const file = launcher ? launcher.file : opts.file;
    const args = launcher ? [...launcher.args, opts.file, ...(opts.args ?? [])] : [...(opts.args ?? [])];
    let child: ChildProcess;
    try {
      child = spawn(file, args, {
        cwd: opts.cwd,
        env: opts.env ?? process.env,
        stdio: [stdinMode, out ? 'pipe' : 'ignore', err ? 'pipe' : 'ignore'],
        // Its own process group, which it leads: the timeout and an abort reach what it started.
        detached: true,
      });
    } catch (error) {
      // Arguments Node refuses before it tries (a NUL byte in an argument or in the environment).
      resolve(notStarted(error as NodeJS.ErrnoException, false, elapsed()));
      return;
    }

    let settled = false;
    let timedOut = false;
    let aborted = false;
    /** The group has had SIGKILL: from then on, the pipes are not waited for beyond the drain. */
    let killed = false;
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    let timer: NodeJS.Timeout | undefined;
    let graceTimer: NodeJS.Timeout | undefined;
    let drainTimer: NodeJS.Timeout | undefined;
    const pid = child.pid;

    const signalGroup = (sig: NodeJS.Signals): void => {
      if (pid === undefined) return;
      try {
        process.kill(-pid, sig);
      } catch {
        // The group is gone.
      }
      if (sig === 'SIGKILL') {
        killed = true;
        clearTimeout(graceTimer);
        drainIfDone();
      }
    };
    const drainIfDone = (): void => {
      if (!killed || exit === undefined || settled || drainTimer !== undefined) return;
      drainTimer = setTimeout(() => {
        child.stdout?.destroy();
        child.stderr?.destroy();
        end(exit!.code, exit!.signal);
      }, DRAIN_MS);
    };
    const onAbort = (): void => {
      aborted = true;
      signalGroup('SIGKILL');
    };
    const cleanUp = (): void => {
      settled = true;
      clearTimeout(timer);
      clearTimeout(drainTimer);
      opts.signal?.removeEventListener('abort', onAbort);
    };
    const end = (code: number | null, signal: NodeJS.Signals | null): void => {
      if (settled) return;
      cleanUp();
      // After a SIGTERM at the timeout, the SIGKILL still comes at the end of the grace, for what ignored it; the
      // group's id cannot be given to another process while the group has members.
      resolve({
        kind: 'ended',
        pid: pid!,
        pgid: pid!,
        code,
        signal,
        stdout: out?.output() ?? EMPTY,
        stderr: err && err !== out ? err.output() : EMPTY,
        durationMs: elapsed(),
        timedOut,
        aborted,
      });
    };

    child.on('error', (error: NodeJS.ErrnoException) => {
      // Only a program that could not be started: the group is never signalled through `child.kill`.
      if (settled || pid !== undefined) return;
      cleanUp();
      resolve(notStarted(error, aborted, elapsed()));
    });
    if (pid === undefined) return;

    child.stdout?.on('data', (chunk: Buffer) => out!.add(chunk));
    child.stderr?.on('data', (chunk: Buffer) => err!.add(chunk));
    child.stdin?.on('error', () => undefined);
    child.once('exit', (code, signal) => {
      exit = { code, signal };
      drainIfDone();
    });
    child.once('close', (code: number | null, signal: NodeJS.Signals | null) => end(code, signal));

    if (opts.timeoutMs !== undefined) {
      const graceMs = opts.graceMs ?? 0;
      timer = setTimeout(() => {
        timedOut = true;
        if (graceMs <= 0) {
          signalGroup('SIGKILL');
          return;
        }
        signalGroup('SIGTERM');
        graceTimer = setTimeout(() => signalGroup('SIGKILL'), graceMs);
        graceTimer.unref();
      }, opts.timeoutMs);
    }
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    if (opts.stdin instanceof Uint8Array) child.stdin?.end(opts.stdin);
    opts.onSpawn?.({ pid, pgid: pid, stdin: opts.stdin === 'pipe' ? child.stdin : null });
  });
