import { defineConfig } from 'vitest/config';
import { SuiteSequencer } from './test/support/suite-sequencer.js';

export default defineConfig({
  test: {
    // agents/: where `keel new agent` scaffolds an agent and its test in a checkout (it prints `npx vitest run agents/<name>.machine.test.ts`).
    include: ['test/**/*.test.ts', 'agents/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 120_000,
    teardownTimeout: 30_000,
    fileParallelism: true,
    // Two test files at a time on a 2-core machine (vitest's default would be one): most files
    // spend their time waiting on child processes, databases and timers, not on the CPU.
    maxWorkers: 2,
    // Each worker runs its files one after another in one process, loading Keel's modules once
    // instead of once per file: the integration files took 259 s of CPU isolated and 93 s
    // shared. A file therefore leaves the process as it found it: it disposes what it starts and
    // deletes the environment variables it sets.
    isolate: false,
    // Fault files never handed out two at once, the rest filling the time between them.
    sequence: { sequencer: SuiteSequencer },
    reporters: ['default'],
  },
});
