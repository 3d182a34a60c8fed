/**
 * The firmware health check: real processes (shell scripts in a temp folder) and a real HTTP server on port 0.
 */
import { chmodSync, existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { type Server, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { healthCheck } from '../../agent/fw/health.js';
import { tempDir } from '../support/agent.js';

const dir = tempDir('devcloud-fw-health-');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let scriptNo = 0;
function script(body: string): string {
  const path = join(dir, `check-${++scriptNo}.sh`);
  writeFileSync(path, `#!/bin/sh\n${body}\n`);
  chmodSync(path, 0o755);
  return path;
}

/** A killed process whose parent is gone stays a zombie until init reaps it; that counts as gone. */
function processAlive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}

const FAST = { timeoutMs: 2000, retries: 0, intervalMs: 10 };

describe('a health command', () => {
  it('is healthy when it exits 0', async () => {
    const result = await healthCheck({ command: [script('exit 0')], ...FAST });
    expect(result).toEqual({ healthy: true, attempts: 1 });
  });

  it('is run without a shell, with its arguments as given', async () => {
    const out = join(dir, 'args.txt');
    const check = script(`printf '%s|' "$@" > ${out}`);
    const result = await healthCheck({ command: [check, 'a b', '$HOME', ';true'], ...FAST });
    expect(result.healthy).toBe(true);
    expect(readFileSync(out, 'utf8')).toBe('a b|$HOME|;true|');
  });

  it('is tried again until it passes: failing twice then succeeding takes three attempts', async () => {
    const counter = join(dir, 'counter');
    const check = script(`n=$(cat ${counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > ${counter}; [ $n -ge 3 ]`);
    const result = await healthCheck({ command: [check], timeoutMs: 2000, retries: 3, intervalMs: 20 });
    expect(result).toEqual({ healthy: true, attempts: 3 });
    expect(readFileSync(counter, 'utf8').trim()).toBe('3');
  });

  it('reports the exit status and the last line of stderr when the retries are used up', async () => {
    const check = script('echo "starting" >&2; echo "database unreachable" >&2; exit 4');
    const result = await healthCheck({ command: [check], timeoutMs: 2000, retries: 2, intervalMs: 10 });
    expect(result.healthy).toBe(false);
    expect(result.attempts).toBe(3);
    if (result.healthy) return;
    expect(result.reason).toContain('after 3 attempt(s)');
    expect(result.reason).toContain('exited with status 4: database unreachable');
    expect(result.aborted).toBeUndefined();
  });

  it('reports a command killed by a signal', async () => {
    const result = await healthCheck({ command: [script('kill -TERM $$')], ...FAST });
    expect(result.healthy).toBe(false);
    if (!result.healthy) expect(result.reason).toContain('was killed by SIGTERM');
  });

  it('reports a command that cannot be run', async () => {
    const result = await healthCheck({ command: [join(dir, 'missing')], ...FAST });
    expect(result.healthy).toBe(false);
    if (!result.healthy) expect(result.reason).toMatch(/could not be run \(ENOENT\)/);
  });

  it('kills a command that hangs at the timeout, with what it started', async () => {
    const pidFile = join(dir, 'hang.pid');
    // The script starts a child that would outlive it, then waits.
    const check = script(`sleep 30 & echo $! > ${pidFile}; wait`);
    const started = Date.now();
    const result = await healthCheck({ command: [check], timeoutMs: 80, retries: 1, intervalMs: 10 });
    expect(Date.now() - started).toBeLessThan(5000);
    expect(result.healthy).toBe(false);
    expect(result.attempts).toBe(2);
    if (!result.healthy) expect(result.reason).toContain('timed out after 80 ms');
    const grandchild = Number(readFileSync(pidFile, 'utf8'));
    await until(() => !processAlive(grandchild));
  });

  it('stops at once when aborted, killing the running command, and says it was aborted', async () => {
    const marker = join(dir, 'abort-started');
    const check = script(`touch ${marker}; sleep 30`);
    const controller = new AbortController();
    const pending = healthCheck({
      command: [check],
      timeoutMs: 10_000,
      retries: 5,
      intervalMs: 10,
      signal: controller.signal,
    });
    await until(() => existsSync(marker));
    controller.abort();
    const result = await pending;
    expect(result).toMatchObject({ healthy: false, attempts: 1, aborted: true });
    if (!result.healthy) expect(result.reason).toContain('aborted');
  });

  it('makes no attempt when the signal is already aborted', async () => {
    const counter = join(dir, 'never');
    const result = await healthCheck({
      command: [script(`touch ${counter}`)],
      ...FAST,
      signal: AbortSignal.abort(),
    });
    expect(result).toMatchObject({ healthy: false, attempts: 0, aborted: true });
    expect(existsSync(counter)).toBe(false);
  });
});

describe('a health URL', () => {
  let server: Server | undefined;
  afterEach(async () => {
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
  });

  async function serve(handler: Parameters<typeof createServer>[1]): Promise<string> {
    server = createServer(handler);
    await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/health`;
  }

  it('is healthy on 2xx, after 503s are retried', async () => {
    let hits = 0;
    const url = await serve((_req, res) => {
      hits++;
      res.statusCode = hits <= 2 ? 503 : 204;
      res.end();
    });
    const result = await healthCheck({ url, timeoutMs: 2000, retries: 3, intervalMs: 20 });
    expect(result).toEqual({ healthy: true, attempts: 3 });
    expect(hits).toBe(3);
  });

  it('reports the HTTP status when the retries are used up', async () => {
    const url = await serve((_req, res) => {
      res.statusCode = 503;
      res.end('starting');
    });
    const result = await healthCheck({ url, timeoutMs: 2000, retries: 1, intervalMs: 10 });
    expect(result).toMatchObject({ healthy: false, attempts: 2 });
    if (!result.healthy) expect(result.reason).toContain('answered HTTP 503');
  });

  it('reports a refused connection', async () => {
    const url = await serve((_req, res) => res.end());
    await new Promise<void>((resolve) => server!.close(() => resolve()));
    server = undefined;
    const result = await healthCheck({ url, ...FAST });
    expect(result.healthy).toBe(false);
    if (!result.healthy) expect(result.reason).toContain('connection error (ECONNREFUSED)');
  });

  it('gives up on a server that does not answer within the timeout', async () => {
    const url = await serve(() => {
      // Never answers.
    });
    const result = await healthCheck({ url, timeoutMs: 60, retries: 1, intervalMs: 10 });
    expect(result).toMatchObject({ healthy: false, attempts: 2 });
    if (!result.healthy) expect(result.reason).toContain('timed out after 60 ms');
    server!.closeAllConnections();
  });

  it('stops waiting between attempts when aborted', async () => {
    let hits = 0;
    const url = await serve((_req, res) => {
      hits++;
      res.statusCode = 500;
      res.end();
    });
    const controller = new AbortController();
    // The pause before the second attempt is a 60 s timer, set once the first attempt has its answer: the abort
    // waits for it, so that it cuts the pause and not the first request (the server's hit comes before the
    // client has read the answer).
    const timers = vi.spyOn(globalThis, 'setTimeout');
    try {
      const pending = healthCheck({ url, timeoutMs: 2000, retries: 3, intervalMs: 60_000, signal: controller.signal });
      await until(() => timers.mock.calls.some((call) => call[1] === 60_000));
      const abortedAt = Date.now();
      controller.abort();
      const result = await pending;
      expect(Date.now() - abortedAt).toBeLessThan(5000);
      expect(hits).toBe(1);
      expect(result).toMatchObject({ healthy: false, attempts: 1, aborted: true });
      if (!result.healthy) expect(result.reason).toContain('HTTP 500');
    } finally {
      timers.mockRestore();
    }
  });
});
