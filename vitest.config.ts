import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 120_000,
    teardownTimeout: 30_000,
    fileParallelism: true,
    // Two test files at a time on a 2-core machine (vitest's default would be one): most files
    // spend their time waiting on child processes, databases and timers, not on the CPU.
    maxWorkers: 2,
    reporters: ['default'],
  },
});
