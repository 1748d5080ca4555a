import { configDefaults, type TestProjectInlineConfiguration } from 'vitest/config';

// What `npm test` runs, as vitest projects of one run (decision 0097): the whole suite on the
// Postgres queue backend, the files about what the queue itself does once more on Redis, and the
// interop files and one process kill once more with `runs.directWrites`. One run instead of three
// lets the sequencer (suite-sequencer.ts) plan all of it: one fault file at a time across all
// three, the other files of every project filling the time beside them, one start and one tail.
//
// KEEL_TEST_QUEUE=postgres|redis (and KEEL_TEST_DIRECT_WRITES=1) in the environment instead run
// every file once, on that backend (and write path): the way to run all of the suite on Redis.

/**
 * The files that run on Redis as well (decision 0096): a queue holds only wake-ups (runs,
 * projections, pushes, inbox callbacks, maintenance), Postgres holds the work, and BullMQ gives
 * both backends one API, so what they differ in is a job's fate when a process, Redis, Postgres or
 * a link fails, delayed jobs (timers, push retries and deferrals, wake-ups after a suspension),
 * priorities (the fair run slots' ranks), the queue's own pools, sweeps and dashboard, and
 * readiness. Those run on Redis: the queue's own files, the wake-ups and timers, every push file
 * (each delivery attempt is a job, retried and deferred as a delayed one), crash recovery and
 * fencing, the inbox, the interop files (the protocol end to end on each backend), and the fault
 * files where a job's fate or order is the question: Redis's own faults, the API host's Redis
 * partition, a worker's partition past its lease (the longest partition test, on both backends), a
 * killed worker with runs and with deliveries in flight, a Postgres crash under load, the 2 API + 2
 * worker topology and the fair run slots. The rest (the A2A surface's corners, statechart steps, the
 * write path, the CLI, per-client limits, streams, a clean Postgres restart, a flaky receiver, the
 * killed `all` process) runs the same code on either backend and runs once, on Postgres.
 */
export const REDIS_FILES: readonly string[] = [
  'test/integration/queue/',
  'test/integration/runs/maintenance-jobs.test.ts',
  'test/integration/runs/handoff-wakeup.test.ts',
  'test/integration/runs/approval-timeout.test.ts',
  'test/integration/runs/run-recovery.test.ts',
  'test/integration/executor-crash/',
  'test/integration/executor/late-writes-fenced.test.ts',
  'test/integration/statecharts/durable-timer.test.ts',
  'test/integration/statecharts/worker-kill.test.ts',
  'test/integration/push/',
  'test/integration/remote/',
  'test/integration/tasks/',
  'test/interop/',
  'test/e2e/queue-dashboard.browser.test.ts',
  'test/e2e/operator-ui-security.test.ts',
  'test/e2e/health-probes.test.ts',
  'test/e2e/metrics.test.ts',
  'test/faults/redis-faults.test.ts',
  'test/faults/hosts-api-redis-partition.test.ts',
  'test/faults/hosts-worker-partition.test.ts',
  'test/faults/worker-kill.test.ts',
  'test/faults/push-sequences.test.ts',
  'test/faults/postgres-crash.test.ts',
  'test/faults/two-api-two-workers.test.ts',
  'test/faults/fair-run-slots.test.ts',
];

/**
 * The API host cut off from Redis is about the Redis backend alone (the partition tests across
 * test hosts, test/faults/hosts-*.test.ts, run where they apply or are cheapest: the worker's
 * partition past its lease on both backends, the Postgres host cut off and the slow, lossy link to
 * Postgres on Postgres, the API host's Redis partition on Redis; `npm run test:hosts` runs all four).
 */
const POSTGRES_SKIPS: readonly string[] = ['test/faults/hosts-api-redis-partition.test.ts'];

/**
 * With `runs.directWrites` (no fast path, no group commit; suite-write-path.ts): what clients see
 * and what survives a killed process must not depend on the batching. The SIGKILL of the single
 * `all` process is the one fault that cuts both write paths mid-write; the worker kill, the Postgres
 * restart and crash, the pool crash, the flaky receiver, the streams across processes and the
 * topology are left to the two backends' projects (the switch changes nothing they are about).
 */
const DIRECT_WRITES_FILES: readonly string[] = ['test/interop/', 'test/faults/all-process-kill.test.ts'];

/** Every test file; agents/ is where `keel new agent` scaffolds an agent and its test in a checkout (it prints `npx vitest run agents/<name>.machine.test.ts`). */
const ALL_FILES = ['test/**/*.test.ts', 'agents/**/*.test.ts'];

/** `test/push/` → its test files; a file stays itself. */
function globsOf(entries: readonly string[]): string[] {
  return entries.map((entry) => (entry.endsWith('/') ? `${entry}**/*.test.ts` : entry));
}

/** The projects `npm test` runs, given the environment it was started in. */
export function suiteProjects(env: NodeJS.ProcessEnv): TestProjectInlineConfiguration[] {
  const queue = env.KEEL_TEST_QUEUE;
  if (queue !== undefined || env.KEEL_TEST_DIRECT_WRITES === '1') {
    // One backend named in the environment: every file once, as the environment says.
    const name = `${queue ?? 'postgres'}${env.KEEL_TEST_DIRECT_WRITES === '1' ? '-direct-writes' : ''}`;
    return [{ extends: true, test: { name, include: ALL_FILES } }];
  }
  return [
    { extends: true, test: { name: 'postgres', include: ALL_FILES, exclude: [...configDefaults.exclude, ...POSTGRES_SKIPS], env: { KEEL_TEST_QUEUE: 'postgres' } } },
    { extends: true, test: { name: 'redis', include: globsOf(REDIS_FILES), env: { KEEL_TEST_QUEUE: 'redis' } } },
    {
      extends: true,
      test: { name: 'postgres-direct-writes', include: globsOf(DIRECT_WRITES_FILES), env: { KEEL_TEST_QUEUE: 'postgres', KEEL_TEST_DIRECT_WRITES: '1' } },
    },
  ];
}
