import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Builds dist/ when a source is newer: the tests that need a real process run the built JavaScript.
    globalSetup: ['test/support/dist.ts'],
    // Integration tests start brokers and agent processes; give them room, never rely on timing.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    fileParallelism: true,
    maxWorkers: 2,
    // The files share their two worker processes: each worker imports the modules once (most of what starting a file
    // costs). What one file leaves changed in the process is put back after it (test/support/per-file.ts); state is
    // per instance in the code, never per module, so that files do not see each other's.
    isolate: false,
    setupFiles: ['test/support/per-file.ts'],
  },
});
