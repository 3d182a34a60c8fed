/**
 * The running agent loads only what a gateway needs (docs/agent.md, memory): nothing of the bridge (`dist/bridge/`)
 * and none of the packages only the bridge uses, since every module loaded stays in the agent's heap for good.
 * The built agent runs as a real process with a preload that records each module it loads: ES modules (and the
 * CommonJS entry of each package they import) through a load hook (`module.register`), and what CommonJS code
 * requires in turn from the require cache as the process exits.
 */
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LocalClient } from '../../agent/local/client.js';
import { type AgentProcess, spawnAgent, tempDir, waitForSocket } from '../support/agent.js';
import { type TestBroker, startAedes } from '../support/brokers.js';
import { until } from '../support/wait.js';

/** Packages in package.json's dependencies that only the bridge (or a person at a terminal) uses. */
const BRIDGE_ONLY = [
  'fastify',
  '@fastify',
  'pg',
  'pg-pool',
  'pg-protocol',
  'aedes',
  'nodemailer',
  'prom-client',
  'pino-pretty',
];

const PRELOAD = `
import { appendFileSync } from 'node:fs';
import { createRequire, register } from 'node:module';
const file = process.env.DEVCLOUD_TEST_MODULE_LOG;
register('./hooks.mjs', import.meta.url, { data: { file } });
const cache = createRequire(import.meta.url).cache;
process.on('exit', () => appendFileSync(file, Object.keys(cache).join('\\n') + '\\nexit\\n'));
`;

const HOOKS = `
import { appendFileSync } from 'node:fs';
let file = '';
export function initialize(data) { file = data.file; }
export async function load(url, context, nextLoad) {
  appendFileSync(file, url + '\\n');
  return nextLoad(url, context);
}
`;

/** Writes the preload into `dir`; the environment that makes node run it and where it writes. */
function moduleLog(dir: string): { env: NodeJS.ProcessEnv; read: () => string[] } {
  writeFileSync(join(dir, 'preload.mjs'), PRELOAD);
  writeFileSync(join(dir, 'hooks.mjs'), HOOKS);
  const file = join(dir, 'modules.log');
  writeFileSync(file, '');
  return {
    env: { NODE_OPTIONS: `--import ${join(dir, 'preload.mjs')}`, DEVCLOUD_TEST_MODULE_LOG: file },
    read: () =>
      readFileSync(file, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => l.replace(/^file:\/\//, '')),
  };
}

/** The bridge's own files and the bridge-only packages among `modules`. */
function bridgeModules(modules: string[]): string[] {
  return modules.filter(
    (m) => m.includes('/dist/bridge/') || BRIDGE_ONLY.some((p) => m.includes(`/node_modules/${p}/`)),
  );
}

describe('the modules the running agent loads', () => {
  let broker: TestBroker;
  let agent: AgentProcess;
  let local: LocalClient | undefined;
  let log: ReturnType<typeof moduleLog>;

  beforeAll(async () => {
    broker = await startAedes();
    const dir = tempDir();
    log = moduleLog(dir);
    agent = spawnAgent(
      ['run', '--state-dir', join(dir, 'state'), '--mqtt-url', broker.url, '--udp', 'false', '--log-level', 'warn'],
      { CONFIGURATION_DIRECTORY: dir, ...log.env },
    );
    local = await waitForSocket(agent.socket);
  });
  afterAll(async () => {
    local?.close();
    await agent?.kill9();
    await broker?.close();
  });

  it('are none of the bridge and none of its packages, through start, a change pushed and a stop', async () => {
    await until(async () => (await local!.status<{ state: string }>()).state === 'connected', 'the agent to connect');
    await local!.set('d', 'temp', '21.5');
    await until(async () => (await local!.status<{ sync: { pushed: number } }>()).sync.pushed === 1, 'the push');
    local!.close();
    local = undefined;
    agent.proc.kill('SIGTERM');
    await agent.exited;
    const modules = log.read();
    // Both channels worked: the agent's own ES modules and the files mqtt.js requires.
    expect(modules).toContain('exit');
    expect(modules.some((m) => m.endsWith('/dist/agent/agent.js'))).toBe(true);
    expect(modules.some((m) => m.includes('/node_modules/mqtt-packet/'))).toBe(true);
    expect(bridgeModules(modules)).toEqual([]);
  });

  it('would show a bridge package if one were loaded', async () => {
    const dir = tempDir();
    const control = moduleLog(dir);
    const proc = spawn(process.execPath, ['--input-type=module', '-e', "import 'fastify'; import 'pg';"], {
      cwd: join(import.meta.dirname, '../..'),
      env: { PATH: process.env.PATH, ...control.env },
      stdio: 'ignore',
    });
    const code = await new Promise<number | null>((resolve) => proc.once('exit', resolve));
    expect(code).toBe(0);
    const found = bridgeModules(control.read());
    expect(found.some((m) => m.includes('/node_modules/fastify/'))).toBe(true);
    expect(found.some((m) => m.includes('/node_modules/pg/'))).toBe(true);
  });
});
