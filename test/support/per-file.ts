/**
 * Runs in each test file before its tests (vitest.config.ts, `setupFiles`). The files of a run share their worker
 * processes (`isolate: false`), which spares each file most of its start-up: the modules are imported once per
 * worker. So what a file changes of the process is put back when it ends, whether or not its own hooks did: real
 * timers, and the environment.
 */
import { afterAll, vi } from 'vitest';

const env = { ...process.env };

afterAll(() => {
  vi.useRealTimers();
  for (const name of Object.keys(process.env)) if (!(name in env)) delete process.env[name];
  Object.assign(process.env, env);
});
