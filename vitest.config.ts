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
  },
});
