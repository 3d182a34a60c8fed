/**
 * Runs in each test file before its tests (vitest.config.ts, `setupFiles`). The files of a run share their worker
 * processes (`isolate: false`), which spares each file most of its start-up: the modules are imported once per
 * worker. So what a file changes of the process is put back when it ends, whether or not its own hooks did: real
 * timers, spies and stubbed globals, the working directory, and the environment. A library's own module state (such
 * as mqtt-packet's cache of packet ids) is shared too: a test about it runs in a process of its own
 * (test/bridge/broker.test.ts).
 */
import { afterAll, vi } from 'vitest';

const env = { ...process.env };
const cwd = process.cwd();

afterAll(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
  vi.unstubAllGlobals();
  if (process.cwd() !== cwd) process.chdir(cwd);
  for (const name of Object.keys(process.env)) if (!(name in env)) delete process.env[name];
  Object.assign(process.env, env);
});
