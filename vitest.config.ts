import { defineConfig } from 'vitest/config';
import { canRaisePriority } from './test/support/cpu-priority.js';
import { suiteProjects } from './test/support/suite-plan.js';
import { SuiteSequencer } from './test/support/suite-sequencer.js';

export default defineConfig({
  test: {
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 120_000,
    teardownTimeout: 30_000,
    fileParallelism: true,
    // Three test files at a time on a 2-core machine (vitest's default would be one): most files
    // spend their time waiting on child processes, databases and timers, not on the CPU. A fault
    // file runs at a higher priority than the two beside it (fault-slot.ts, decision 0102), which
    // needs root (CAP_SYS_NICE); without it, two (decision 0101).
    maxWorkers: canRaisePriority() ? 3 : 2,
    // Fault files (test/faults/) hold a slot of their own, one at a time (decision 0101).
    setupFiles: ['./test/faults/support/fault-slot.ts'],
    // Each worker runs its files one after another in one process, loading Keel's modules once
    // instead of once per file: the integration files took 259 s of CPU isolated and 93 s
    // shared. A file therefore leaves the process as it found it: it disposes what it starts and
    // deletes the environment variables it sets.
    isolate: false,
    // Fault files never handed out two at once, the rest filling the time between them.
    sequence: { sequencer: SuiteSequencer },
    // The suite on Postgres, the queue's files on Redis, interop with runs.directWrites: one run
    // (test/support/suite-plan.ts; KEEL_TEST_QUEUE=redis runs every file on Redis instead).
    projects: suiteProjects(process.env),
    reporters: ['default'],
  },
});
