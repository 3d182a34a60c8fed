/**
 * runInGroup with real, short processes (`sh`): how they end, the timeout and its grace over a whole process group,
 * an abort, the output bounds, standard input, and programs that cannot be started.
 */
import { existsSync, mkdtempSync, readFileSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type RunEnded, type RunOptions, type RunResult, runInGroup } from '../../lib/process.js';
import { until } from '../support/wait.js';

const dir = mkdtempSync(join(tmpdir(), 'devcloud-process-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Runs a shell script (`sh -c`), its extra words as `$0 $1 ...`. */
function sh(script: string, opts: Omit<RunOptions, 'file' | 'args'> = {}, ...words: string[]): Promise<RunResult> {
  return runInGroup({ file: 'sh', args: ['-c', script, ...words], ...opts });
}

function ended(r: RunResult): RunEnded {
  if (r.kind !== 'ended') throw new Error(`expected the program to run, got ${r.kind}: ${r.error.message}`);
  return r;
}

/** Running: not gone, and not a zombie (a killed process whose parent is gone may wait for a reaper). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return false;
  }
}

/** The process group of a live process, from /proc. */
function groupOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
}

const pidIn = (file: string): number | undefined => {
  const n = existsSync(file) ? Number(readFileSync(file, 'utf8').trim()) : NaN;
  return n > 0 ? n : undefined;
};

describe('how a program ends', () => {
  it('gives the exit status, without a shell of its own: arguments and environment as given', async () => {
    const ok = ended(
      await runInGroup({
        file: 'sh',
        args: ['-c', 'printf "%s|" "$@" "$WHO" "$(pwd -P)"', 'sh', 'a b', '$HOME', ';true'],
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', WHO: 'me' },
        cwd: dir,
        stdout: { maxBytes: 1000, keep: 'tail' },
      }),
    );
    expect(ok).toMatchObject({ code: 0, signal: null, timedOut: false, aborted: false, kind: 'ended' });
    expect(ok.stdout.text).toBe(`a b|$HOME|;true|me|${realpathSync(dir)}|`);
    expect(ok.pid).toBeGreaterThan(0);
    expect(ok.pgid).toBe(ok.pid);
    expect(ok.durationMs).toBeGreaterThan(0);

    const three = ended(await sh('exit 3'));
    expect(three).toMatchObject({ code: 3, signal: null, timedOut: false });
  });

  it('gives the signal that ended it', async () => {
    const r = ended(await sh('kill -USR1 $$; sleep 5'));
    expect(r).toMatchObject({ code: null, signal: 'SIGUSR1', timedOut: false, aborted: false });
  });

  it('leads a process group of its own, known to onSpawn before it ends', async () => {
    let seen: { pid: number; pgid: number; group: number } | undefined;
    const r = ended(
      await sh('read _', {
        stdin: 'pipe',
        onSpawn: ({ pid, pgid, stdin }) => {
          seen = { pid, pgid, group: groupOf(pid) };
          stdin!.end('\n');
        },
      }),
    );
    expect(r.code).toBe(0);
    expect(seen).toEqual({ pid: r.pid, pgid: r.pid, group: r.pid });
    expect(r.pgid).not.toBe(groupOf(process.pid));
  });

  it('starts the program through a launcher that keeps its pid', async () => {
    const r = ended(
      await runInGroup({
        file: 'sh',
        args: ['-c', 'echo $$'],
        launcher: { file: '/bin/sh', args: ['-c', 'echo launched >&2; exec "$0" "$@"'] },
        stdout: { maxBytes: 100, keep: 'tail' },
        stderr: { maxBytes: 100, keep: 'tail' },
      }),
    );
    expect(r.stderr.text).toBe('launched\n');
    expect(Number(r.stdout.text)).toBe(r.pid);
  });

  it('is a result, not a rejection, when the program cannot be started', async () => {
    const missing = await runInGroup({ file: join(dir, 'missing'), stdout: { maxBytes: 10, keep: 'tail' } });
    expect(missing).toMatchObject({ kind: 'spawn-error', timedOut: false, aborted: false });
    if (missing.kind !== 'spawn-error') return;
    expect(missing.error.code).toBe('ENOENT');
    expect(missing.stdout).toMatchObject({ text: '', total: 0, truncated: false });
  });
});

describe('the timeout', () => {
  it('sends SIGTERM to the whole group, and SIGKILL after the grace to what ignored it', async () => {
    const pidFile = join(dir, 'stubborn.pid');
    // A grandchild that ignores SIGTERM and holds stdout: the job ends only once the SIGKILL has come.
    const r = ended(
      await sh(`(trap '' TERM; exec sleep 30) & echo $! > ${pidFile}; wait`, {
        stdout: { maxBytes: 100, keep: 'tail' },
        timeoutMs: 100,
        graceMs: 300,
      }),
    );
    expect(r).toMatchObject({ timedOut: true, aborted: false, signal: 'SIGTERM', code: null });
    expect(r.durationMs).toBeGreaterThanOrEqual(380);
    const grandchild = pidIn(pidFile)!;
    await until(() => !alive(grandchild), 'the grandchild to be killed', 3000);
  });

  it('kills what ignored SIGTERM after the grace even when the job ended before', async () => {
    const pidFile = join(dir, 'quiet.pid');
    // The grandchild's output goes elsewhere: the job ends with its leader, at the SIGTERM.
    const r = ended(
      await sh(`(trap '' TERM; exec sleep 30) >/dev/null 2>&1 & echo $! > ${pidFile}; wait`, {
        stdout: { maxBytes: 100, keep: 'tail' },
        timeoutMs: 100,
        graceMs: 1000,
      }),
    );
    expect(r).toMatchObject({ timedOut: true, signal: 'SIGTERM' });
    expect(r.durationMs).toBeLessThan(1000);
    const grandchild = pidIn(pidFile)!;
    expect(alive(grandchild)).toBe(true);
    await until(() => !alive(grandchild), 'the grandchild to be killed after the grace', 3000);
  });

  it('sends SIGKILL at once without a grace, and keeps what came before', async () => {
    const r = ended(await sh('echo started; sleep 30', { stdout: { maxBytes: 100, keep: 'tail' }, timeoutMs: 100 }));
    expect(r).toMatchObject({ timedOut: true, signal: 'SIGKILL', code: null });
    expect(r.stdout.text).toBe('started\n');
  });

  it('does not wait for a pipe held by a process that left the group', async () => {
    const pidFile = join(dir, 'escaped.pid');
    const r = ended(
      await sh(`setsid sleep 30 & echo $! > ${pidFile}; wait`, {
        stdout: { maxBytes: 100, keep: 'tail' },
        timeoutMs: 100,
      }),
    );
    expect(r).toMatchObject({ timedOut: true, signal: 'SIGKILL' });
    expect(r.durationMs).toBeLessThan(2000);
    const escaped = pidIn(pidFile)!;
    expect(alive(escaped)).toBe(true);
    process.kill(escaped, 'SIGKILL');
  });
});

describe('an abort', () => {
  it('kills the whole group at once', async () => {
    const pidFile = join(dir, 'aborted.pid');
    const stop = new AbortController();
    const pending = sh(`sleep 30 & echo $! > ${pidFile}; wait`, {
      signal: stop.signal,
      timeoutMs: 10_000,
      graceMs: 5000,
    });
    const child = await until(() => pidIn(pidFile), 'the child to start', 3000);
    stop.abort();
    const r = ended(await pending);
    expect(r).toMatchObject({ aborted: true, timedOut: false, signal: 'SIGKILL' });
    expect(r.durationMs).toBeLessThan(3000);
    await until(() => !alive(child), 'the child to be killed', 3000);
  });

  it('keeps the program from starting when it came first', async () => {
    const marker = join(dir, 'never');
    const r = await sh(`touch ${marker}`, { signal: AbortSignal.abort() });
    expect(r).toMatchObject({ kind: 'spawn-error', aborted: true, timedOut: false });
    expect(existsSync(marker)).toBe(false);
  });
});

describe('output', () => {
  const full = Array.from({ length: 3000 }, (_, i) => `${i + 1}\n`).join('');

  it('keeps the end or the start within the bound, and says it was cut', async () => {
    const tail = ended(await sh('seq 1 3000', { stdout: { maxBytes: 100, keep: 'tail' } })).stdout;
    expect(tail).toMatchObject({ total: Buffer.byteLength(full), truncated: true });
    expect(tail.bytes.length).toBe(100);
    expect(tail.text).toBe(full.slice(-100));

    const head = ended(await sh('seq 1 3000', { stdout: { maxBytes: 100, keep: 'head' } })).stdout;
    expect(head).toMatchObject({ total: Buffer.byteLength(full), truncated: true, text: full.slice(0, 100) });

    const all = ended(await sh('seq 1 3000', { stdout: { maxBytes: Infinity, keep: 'head' } })).stdout;
    expect(all).toMatchObject({ text: full, truncated: false });

    const fits = ended(await sh('echo small', { stdout: { maxBytes: 100, keep: 'tail' } })).stdout;
    expect(fits).toMatchObject({ text: 'small\n', total: 6, truncated: false });
  });

  it('cuts at a character boundary', async () => {
    // Ten three-byte characters: 30 bytes; ten of them cut a character at either end.
    const euros = `i=0; while [ $i -lt 10 ]; do printf '€'; i=$((i+1)); done`;
    const tail = ended(await sh(euros, { stdout: { maxBytes: 10, keep: 'tail' } })).stdout;
    expect(tail).toMatchObject({ text: '€€€', truncated: true, total: 30 });
    const head = ended(await sh(euros, { stdout: { maxBytes: 10, keep: 'head' } })).stdout;
    expect(head).toMatchObject({ text: '€€€', truncated: true, total: 30 });
  });

  it('keeps stderr apart, merges it into stdout in the order it came, or discards it', async () => {
    const script = 'echo out1; sleep 0.05; echo err1 >&2; sleep 0.05; echo out2';
    const apart = ended(
      await sh(script, { stdout: { maxBytes: 100, keep: 'tail' }, stderr: { maxBytes: 100, keep: 'head' } }),
    );
    expect([apart.stdout.text, apart.stderr.text]).toEqual(['out1\nout2\n', 'err1\n']);
    const merged = ended(await sh(script, { stdout: { maxBytes: 100, keep: 'tail' }, stderr: 'stdout' }));
    expect([merged.stdout.text, merged.stderr.text]).toEqual(['out1\nerr1\nout2\n', '']);
    const none = ended(await sh(script));
    expect([none.stdout.total, none.stderr.total, none.code]).toEqual([0, 0, 0]);
  });

  it('writes bytes given as stdin, then end of file; a program that does not read them is no error', async () => {
    const bytes = Buffer.from([0, 1, 2, 0xff, 10]);
    const echoed = ended(await sh('cat', { stdin: bytes, stdout: { maxBytes: 100, keep: 'tail' } }));
    expect(echoed.stdout.bytes.equals(bytes)).toBe(true);
    const ignored = ended(await sh('exit 0', { stdin: Buffer.alloc(1 << 20) }));
    expect(ignored.code).toBe(0);
  });
});
