/**
 * `devcloud-bridge` as an operator runs it: its exit codes, what it prints and logs, the frontend commands on a
 * real database (through `runCli`, in this process, as `bridge/main.ts` calls it), and a real process from source
 * that answers HTTP and stops on SIGTERM.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { type Server, createServer } from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { runCli } from '../../bridge/cli.js';
import { ROOT, tempDir } from '../support/agent.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function dataDir(): string {
  const dir = tempDir('devcloud-bridge-cli-');
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The environment of a clean host: no DEVCLOUD_* variables and no installed config file. */
function cleanEnv(): NodeJS.ProcessEnv {
  const confDir = tempDir('devcloud-bridge-conf-');
  cleanups.push(() => rmSync(confDir, { recursive: true, force: true }));
  return { PATH: process.env.PATH, HOME: process.env.HOME, CONFIGURATION_DIRECTORY: confDir };
}

/** `devcloud-bridge` as a real process from source. */
function start(args: string[]): ChildProcess {
  const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'bridge/main.ts'), ...args], {
    cwd: ROOT,
    env: cleanEnv(),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  cleanups.push(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
  });
  return proc;
}

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

function collect(proc: ChildProcess): Promise<Result & { signal: NodeJS.Signals | null }> {
  let stdout = '';
  let stderr = '';
  proc.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
  proc.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => proc.once('close', (code, signal) => resolve({ code, signal, stdout, stderr })));
}

/**
 * Runs the CLI to completion in this process, on a clean host's environment. What the process would print to
 * stdout, its output and its log (JSON lines), is `stdout`.
 */
async function bridge(...args: string[]): Promise<Result> {
  let stdout = '';
  let stderr = '';
  const log = new Writable({
    write(chunk: Buffer, _enc, done) {
      stdout += chunk.toString();
      done();
    },
  });
  const code = await runCli(
    args,
    { out: (s) => (stdout += `${s}\n`), err: (s) => (stderr += `${s}\n`), log },
    cleanEnv(),
  );
  return { code, stdout, stderr };
}

/** The non-empty lines of some output. */
const lines = (s: string) => s.split('\n').filter((l) => l.trim() !== '');

/** A TCP port held by another listener for the rest of the test. */
async function occupiedPort(): Promise<number> {
  const server: Server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as { port: number }).port;
}

describe('devcloud-bridge usage and configuration', () => {
  it('--help lists the options and exits 0', async () => {
    const r = await bridge('--help');
    expect(r.code).toBe(0);
    for (const flag of ['--config', '--data-dir', '--host', '--http-port', '--mqtt-url', '--mqtt-port', '--help']) {
      expect(r.stdout).toContain(flag);
    }
    expect(r.stdout).toMatch(/frontend create/);
    expect(r.stderr).toBe('');
  });

  it('a bad option value exits 2 naming the key and the flag', async () => {
    const r = await bridge('--data-dir', dataDir(), '--http-port', 'abc');
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('http.port');
    expect(r.stderr).toContain('--http-port');
    expect(r.stdout).toBe('');

    const unknown = await bridge('--data-dir', dataDir(), '--no-such-flag', 'x');
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('--no-such-flag');
  });

  it('a port in use exits 1 with one line naming the port and the flag to change', async () => {
    const port = await occupiedPort();
    const cases = [
      { args: ['--http-port', String(port), '--mqtt-port', '0'], flag: '--http-port' },
      { args: ['--http-port', '0', '--mqtt-port', String(port)], flag: '--mqtt-port' },
    ];
    const results = await Promise.all(cases.map((c) => bridge('--data-dir', dataDir(), ...c.args)));
    for (const [i, r] of results.entries()) {
      const { flag } = cases[i]!;
      expect(r.code, r.stderr).toBe(1);
      const err = lines(r.stderr);
      expect(err, r.stderr).toHaveLength(1);
      expect(err[0]).toContain(`port ${port}`);
      expect(err[0]).toContain(flag);
      expect(err[0]).not.toMatch(/\bat\s|Error:/);
      // The journal gets the same reason as one structured line.
      const fatal = lines(r.stdout).map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(fatal).toEqual([expect.objectContaining({ level: 'fatal', event: 'bridge.start_failed' })]);
      expect(String(fatal[0]!.err)).toContain(flag);
    }
  });
});

describe('devcloud-bridge frontend', () => {
  interface Listed {
    id: string;
    name: string;
    isDefault: boolean;
    config: Record<string, boolean>;
  }
  const list = async (dir: string): Promise<Listed[]> => {
    const r = await bridge('--data-dir', dir, 'frontend', 'list', '--json');
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout) as Listed[];
  };

  it('creates, lists and changes frontends, and refuses bad settings with exit 2', async () => {
    const dir = dataDir();
    const created = await bridge('--data-dir', dir, 'frontend', 'create', '--name', 'shop', 'nearby=false');
    expect(created.code, created.stderr).toBe(0);
    const id = created.stdout.trim();
    expect(id).toMatch(UUID);

    const text = await bridge('--data-dir', dir, 'frontend', 'list');
    expect(text.code).toBe(0);
    const line = lines(text.stdout).find((l) => l.startsWith(id));
    expect(line).toContain('shop');
    expect(line).toContain('"nearby":false');
    expect(line).toContain('"registration":true');
    // The default frontend exists as well, marked as such.
    expect(lines(text.stdout).filter((l) => l.includes('(default)'))).toHaveLength(1);

    const set = await bridge('--data-dir', dir, 'frontend', 'set', id, 'registration=false');
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toContain('"registration":false');
    const shop = (await list(dir)).find((f) => f.id === id)!;
    expect(shop).toMatchObject({
      name: 'shop',
      isDefault: false,
      config: { nearby: false, registration: false, confirmationEmail: true, claimRequiresProximity: false },
    });

    const bad = await Promise.all([
      bridge('--data-dir', dir, 'frontend', 'set', id, 'registration=maybe'),
      bridge('--data-dir', dir, 'frontend', 'set', id, 'colour=true'),
      bridge('--data-dir', dir, 'frontend', 'create', 'nearby'),
      bridge('--data-dir', dir, 'frontend', 'create', 'constructor=true'),
      bridge('--data-dir', dir, 'frontend', 'create', '--name'),
      bridge('--data-dir', dir, 'frontend', 'rename', id),
    ]);
    for (const r of bad) {
      expect(r.code, r.stderr).toBe(2);
      expect(lines(r.stderr).length).toBeGreaterThan(0);
      expect(r.stderr).not.toMatch(/\n\s+at\s/);
    }
    const missing = await bridge(
      '--data-dir',
      dir,
      'frontend',
      'set',
      '00000000-0000-4000-8000-000000000000',
      'nearby=true',
    );
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('no frontend');

    // Nothing above changed or added a frontend.
    const after = await list(dir);
    expect(after).toHaveLength(2);
    expect(after.find((f) => f.id === id)).toEqual(shop);
  });
});

describe('devcloud-bridge run', () => {
  it('serves the REST API at the URL it logs and stops cleanly on SIGTERM', async () => {
    const dir = dataDir();
    const shop = await bridge('--data-dir', dir, 'frontend', 'create', '--name', 'shop');
    const shopId = shop.stdout.trim();

    const proc = start(['--data-dir', dir, '--http-port', '0', '--mqtt-port', '0', '--log-pretty', 'never']);
    const done = collect(proc);
    const started = await new Promise<Record<string, unknown>>((resolve, reject) => {
      const rl = createInterface({ input: proc.stdout! });
      rl.on('line', (l) => {
        const entry = JSON.parse(l) as Record<string, unknown>;
        if (entry.event === 'bridge.started') resolve(entry);
      });
      proc.once('exit', (code) => reject(new Error(`the bridge exited with ${code} before it started`)));
    });
    const url = started.url as string;
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(started.mqtt).toMatch(/^mqtt:\/\/127\.0\.0\.1:\d+$/);
    expect(started.defaultFrontend).toMatch(UUID);

    const res = await fetch(`${url}/0/session/`, { method: 'POST' });
    expect(res.status).toBe(201);
    expect(await res.text()).toBe('user-ok');
    const sid = /^sid=([A-Za-z0-9_-]{43});/.exec(res.headers.get('set-cookie') ?? '')?.[1];
    expect(sid).toBeDefined();
    const again = await fetch(`${url}/0/session/`, { method: 'POST', headers: { cookie: `sid=${sid}` } });
    expect(again.status).toBe(200);
    // The frontend made with the CLI is served, an unknown one is not.
    expect((await fetch(`${url}/0/session/?app=${shopId}`, { method: 'POST' })).status).toBe(201);
    const unknown = await fetch(`${url}/0/session/?app=00000000-0000-4000-8000-000000000000`, { method: 'POST' });
    expect(unknown.status).toBe(404);
    expect(await unknown.text()).toBe('not found');

    proc.kill('SIGTERM');
    const r = await done;
    expect(r.code, r.stderr).toBe(0);
    expect(r.signal).toBeNull();
    const events = lines(r.stdout).map((l) => (JSON.parse(l) as { event: string }).event);
    expect(events).toContain('bridge.stopping');
    expect(r.stderr).toBe('');
    // Stopped means the port is free again.
    await expect(fetch(`${url}/0/session/`, { method: 'POST' })).rejects.toThrow();
  });
});
