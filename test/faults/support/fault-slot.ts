import { getPriority, setPriority } from 'node:os';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';
import { FAULT_FILE_NICE } from '../../support/cpu-priority.js';
import { isFaultFile, needsQuietMachine } from '../../support/fault-files.js';
import { ADMIN_URL } from '../../support/test-database.js';

// One fault file at a time, across the run's vitest workers (decision 0101). The sequencer
// (test/support/suite-sequencer.ts) plans the fault files one after another, but a plan is only an
// order: a file that runs longer than its recorded duration leaves the next fault file to start
// beside it, and two fault files at once slowed both by half and left their timing-bound steps to
// chance. So a fault file holds the fault slot, a session-level advisory lock on the machine's
// Postgres, from before its first hook until after its last. A file that finds the slot taken
// waits (its worker idle, the other workers running the other files); a worker that dies closes
// its session, and the slot with it. The slot is the machine's, not the run's: a fault file run by
// hand while the suite runs waits for the suite's, and the other way round.
//
// While it holds the slot a fault file runs at a higher CPU priority than the files beside it
// (test/support/cpu-priority.ts, decision 0102).
//
// A file that needs the machine to itself (needsQuietMachine: a bound on how fast Keel answers
// under its own load; a fault file or not) holds the fault slot as a fault file does, and the
// quiet lock, an exclusive advisory lock that every other file holds shared while it runs
// (decision 0103): it starts once the files running end, and files that come after it wait until
// it ends (Postgres queues a shared request behind a waiting exclusive one, so the quiet file is
// not starved). The sequencer hands it out last, when the others are done, so it seldom waits. A
// file that cannot reach the machine's Postgres runs without the shared lock (a unit file run by
// hand on a machine without one).
//
// This module is a setup file of every project (vitest.config.ts), so its hooks come before each
// file's own; a fault file is what the sequencer plans as one (test/support/fault-files.ts).

/** The advisory locks' keys: constants the suite uses for nothing else. */
const FAULT_SLOT_KEY = 7_043_101;
const QUIET_KEY = 7_043_102;

/** A fault file may wait through the longest fault file (60-110 s here) and more on a slow machine. */
const WAIT_TIMEOUT_MS = 10 * 60_000;

declare module 'vitest' {
  interface TaskMeta {
    /** Milliseconds the file waited for the fault slot or the quiet lock: the suite's report leaves them out of its duration. */
    faultSlotWaitMs?: number;
  }
}

let session: pg.Client | null = null;
/** The worker's priority before the fault file raised it (null: not raised). */
let priorityBefore: number | null = null;

// vitest wants the first argument (the fixtures) destructured, and this hook uses none of them.
// eslint-disable-next-line no-empty-pattern
beforeAll(async ({}, suite) => {
  const waitStarted = Date.now();
  const quiet = needsQuietMachine(suite.file.filepath);
  if (!isFaultFile(suite.file.filepath) && !quiet) {
    session = await holdQuietLockShared();
    suite.file.meta.faultSlotWaitMs = Date.now() - waitStarted;
    return;
  }
  const client = lockSession('keel-test-fault-slot');
  await client.connect();
  await client.query('SELECT pg_advisory_lock($1)', [FAULT_SLOT_KEY]);
  if (quiet) await client.query('SELECT pg_advisory_lock($1)', [QUIET_KEY]);
  session = client;
  suite.file.meta.faultSlotWaitMs = Date.now() - waitStarted;
  // Ahead of the two files beside it for the CPU (decision 0102): set on the worker's main thread,
  // so the Keel processes, Postgres and Redis servers and test hosts the file starts inherit it.
  const before = getPriority();
  try {
    setPriority(Math.min(before, FAULT_FILE_NICE));
    priorityBefore = before;
  } catch {
    // No CAP_SYS_NICE: the file runs at the others' priority (and the suite with two workers).
  }
}, WAIT_TIMEOUT_MS);

afterAll(async () => {
  // The worker runs other files next (vitest reuses it): back to the others' priority.
  if (priorityBefore !== null) setPriority(priorityBefore);
  priorityBefore = null;
  // Closing the session releases its advisory locks.
  await session?.end().catch(() => undefined);
  session = null;
});

/** A session holding the quiet lock shared (waiting while a quiet file holds it), or null without the machine's Postgres. */
async function holdQuietLockShared(): Promise<pg.Client | null> {
  const client = lockSession('keel-test-quiet-shared');
  try {
    await client.connect();
  } catch {
    await client.end().catch(() => undefined);
    return null;
  }
  await client.query('SELECT pg_advisory_lock_shared($1)', [QUIET_KEY]);
  return client;
}

/**
 * A session on the machine's Postgres whose advisory locks are held while it lives. One the server
 * ends (the machine's Postgres restarted) frees its locks; the file goes on without them rather
 * than failing on an unheard 'error'.
 */
function lockSession(applicationName: string): pg.Client {
  const client = new pg.Client({ connectionString: ADMIN_URL, application_name: applicationName });
  client.on('error', () => undefined);
  return client;
}
