import { hostname } from 'node:os';
import { fileURLToPath } from 'node:url';
import { sql } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../../src/auth/client-repository.js';
import { silentLogger } from '../../../src/log/logger.js';
import { runJobId } from '../../../src/queue/job-ids.js';
import { KeelQueues, type QueueBackend } from '../../../src/queue/keel-queues.js';
import { listRunEvents, type RunEventRow } from '../../../src/runs/run-event-repository.js';
import { getRun } from '../../../src/runs/run-repository.js';
import type { RunRow } from '../../../src/runs/run-row.js';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';
import { rawRpc, type Json } from '../../support/a2a-wire.js';
import { cleanEnv, spawnKeel, type KeelProcess } from '../../support/keel-process.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, TEST_POOL_ENV, tempDir, type TestKeel } from '../../support/test-keel.js';
import { deleteQueueKeys, TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor } from '../../support/wait-for.js';

// The fast path's debt is its lease (docs/decisions/0025-fast-path.md): a process with role `all`
// runs the new tasks it receives itself, inserting their runs already claimed, with no queue job.
// When that process is SIGKILLed between the leased insert and the completion, nothing but the
// lease remembers the runs: another Keel on the same database and queues must find each by its
// expired lease (the reaper), requeue it, and complete it exactly once.

const QUEUE = testQueueKind();
const TOOL_MODULE = fileURLToPath(new URL('../../fixtures/test-tools.ts', import.meta.url));
const LEASE_SECONDS = 2;
const REQUEUE_BASE_SECONDS = 0.5;
// Long enough that the child is still inside every run's first model step when it is killed, even
// on a loaded machine: the claims are observed about one heartbeat after the runs start.
const SLOW_STEP_MS = 6000;
const TASKS = 4;
const AGENT = 'slow';

const providers = {
  slow: { type: 'scripted', steps: [{ toolCalls: [{ name: 'lookup', arguments: { key: 'k' } }], delayMs: SLOW_STEP_MS }, { reply: 'done' }] },
};
// The answer is kept in full so GetTask shows it; the audit level (privacy.level, metadata) keeps
// the claim's metadata, fastPath included.
const agents = [{ id: AGENT, name: 'Slow', provider: 'slow', tools: ['lookup'], privacy: { answerLevel: 'full' } }];

const redisUrl = QUEUE === 'redis' ? TEST_REDIS_URL : null;
const prefixes: string[] = [];
const children: KeelProcess[] = [];
const keels: TestKeel[] = [];
const databases: TestDatabase[] = [];
const queueSets: KeelQueues[] = [];

afterAll(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill('SIGKILL');
      await child.exited;
    }
  }
  for (const keel of keels) await keel.dispose().catch(() => undefined);
  for (const queues of queueSets) await queues.close().catch(() => undefined);
  for (const database of databases) await database.drop().catch(() => undefined);
  if (redisUrl && prefixes.length > 0) {
    await deleteQueueKeys(prefixes, redisUrl);
  }
});

/** The KEEL_* environment of both Keels: the child and its in-process replacement. */
function keelEnv(databaseUrl: string, masterKey: string, queuePrefix: string): Record<string, string> {
  return {
    KEEL_DATABASE_URL: databaseUrl,
    KEEL_MASTER_KEY: masterKey,
    KEEL_SERVER_PORT: '0',
    KEEL_DATA_DIR: tempDir('keel-fast-crash-data-'),
    KEEL_QUEUE_PREFIX: queuePrefix,
    ...(redisUrl ? { KEEL_QUEUE_REDIS_URL: redisUrl } : {}),
    KEEL_RUNS_LEASE_SECONDS: String(LEASE_SECONDS),
    KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
    KEEL_RUNS_REQUEUE_BASE_SECONDS: String(REQUEUE_BASE_SECONDS),
    KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
    KEEL_TOOL_MODULES: TOOL_MODULE,
    KEEL_PROVIDERS: JSON.stringify(providers),
    KEEL_AGENTS: JSON.stringify(agents),
  };
}

function queueBackend(databaseUrl: string, prefix: string): QueueBackend {
  return redisUrl ? { kind: 'redis', url: redisUrl, prefix } : { kind: 'postgres', connectionString: databaseUrl, prefix };
}

const eventRow = z.object({ sequence: z.number(), run_revision: z.number(), kind: z.string(), state: z.string().nullable() });
type EventRow = z.infer<typeof eventRow>;
const journalRows = (pool: TestDatabase['pool'], taskId: string) =>
  pool.any(sql.type(eventRow)`SELECT sequence, run_revision, kind, state FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence`);

const eventsOf = (events: readonly RunEventRow[], kind: string) => events.filter((event) => event.kind === kind);
const payloadOf = (event: RunEventRow) => event.payload as Record<string, unknown>;
const describeJournal = (rows: readonly EventRow[]) => rows.map((row) => `${row.sequence}:${row.kind}:${row.state ?? '-'}@${row.run_revision}`).join(', ');

let messageCounter = 0;

/** A nonblocking SendMessage over JSON-RPC opening a new task; returns the task as answered. */
async function sendNewTask(baseUrl: string, token: string, text: string): Promise<Json> {
  messageCounter += 1;
  const response = await rawRpc(
    baseUrl,
    AGENT,
    {
      jsonrpc: '2.0',
      id: messageCounter,
      method: 'SendMessage',
      params: {
        message: { messageId: `fast-crash-${Date.now()}-${messageCounter}`, role: 'ROLE_USER', parts: [{ text }] },
        configuration: { returnImmediately: true },
      },
    },
    { token },
  );
  const task = response.body?.result?.task;
  if (!task?.id) throw new Error(`SendMessage did not return a task: ${response.status} ${response.text}`);
  return task;
}

async function getTask(baseUrl: string, token: string, taskId: string): Promise<Json> {
  const response = await rawRpc(baseUrl, AGENT, { jsonrpc: '2.0', id: 1, method: 'GetTask', params: { id: taskId } }, { token });
  if (!response.body?.result) throw new Error(`GetTask failed: ${response.status} ${response.text}`);
  return response.body.result;
}

/** Rethrows a failed wait with every run row, its audit kinds, its journal and the processes' last log lines. */
async function explained<T>(pool: TestDatabase['pool'], taskIds: readonly string[], child: KeelProcess, wait: Promise<T>): Promise<T> {
  try {
    return await wait;
  } catch (error) {
    const detail: string[] = [];
    for (const id of taskIds) {
      const row = await getRun(pool, id).catch(() => null);
      const events = await listRunEvents(pool, id).catch(() => []);
      const journal = await journalRows(pool, id).catch(() => []);
      detail.push(
        `run ${id}: ${JSON.stringify(row && { ...row, queued_request: undefined, suspended_state: undefined })}`,
        `  events: ${events.map((event) => event.kind).join(', ')}`,
        `  journal: ${describeJournal(journal)}`,
      );
    }
    detail.push(`child log:\n${child.lines.slice(-40).join('\n')}`);
    throw new Error(`${(error as Error).message}\n${detail.join('\n')}`);
  }
}

describe(`fast path crash recovery on the ${QUEUE} queue backend`, () => {
  it('fast runs of a process SIGKILLed before completing them are each recovered by their lease and complete once', { timeout: 180_000 }, async () => {
    const db = await createTestDatabase();
    databases.push(db);
    const { pool } = db;
    const queuePrefix = testQueuePrefix();
    prefixes.push(queuePrefix);
    const env = keelEnv(db.url, encodeMasterKey(generateMasterKey()), queuePrefix);
    const client = await createClient(pool, `fast-crash-${Math.random().toString(36).slice(2, 10)}`);
    if (!client.ok) throw new Error('cannot create the client');
    const { token } = client;
    const queues = new KeelQueues(queueBackend(db.url, queuePrefix), silentLogger());
    queueSets.push(queues);

    // `keel start` serves the API and runs workers (role all) with the fast path on by default.
    const child = spawnKeel(['start'], { cwd: tempDir('keel-fast-crash-cwd-'), env: cleanEnv({ ...TEST_POOL_ENV, ...env }) });
    children.push(child);
    const ready = await child.waitForLog('keel is ready', 60_000);
    expect(ready.role).toBe('all');
    const childUrl = String(ready.url);
    const childPrefix = `${hostname()}:${child.child.pid}:`;

    const sent = await Promise.all(Array.from({ length: TASKS }, (_, n) => sendNewTask(childUrl, token, `task ${n}`)));
    const taskIds = sent.map((task) => task.id as string);
    expect(new Set(taskIds).size).toBe(TASKS);
    // A fast run's task is answered WORKING: its run was inserted claimed and its WORKING event journaled.
    for (const task of sent) expect(task.status?.state, JSON.stringify(task)).toBe('TASK_STATE_WORKING');

    // Every run is held by the child, whose claim has reached the audit trail (flushed on a
    // heartbeat, so the run is inside its slow first model step), and no tool has run yet.
    const claimedRows = await explained(
      pool,
      taskIds,
      child,
      waitFor(
        async () => {
          const rows: RunRow[] = [];
          for (const id of taskIds) {
            const row = await getRun(pool, id);
            if (row?.status !== 'running' || !row.claimed_by?.startsWith(childPrefix)) return null;
            if (eventsOf(await listRunEvents(pool, id), 'claimed').length !== 1) return null;
            rows.push(row);
          }
          return rows;
        },
        'the child to run every task on the fast path',
        30_000,
      ),
    );

    // They are fast runs: started when created, never requeued, and no job in the runs queue.
    for (const row of claimedRows) {
      expect(row.started_at).toBe(row.created_at);
      expect(row).toMatchObject({ requeue_count: 0, task_id: row.id, tool_calls: 0, iterations: 0 });
      expect(await queues.queue('runs').getJob(runJobId(row.id))).toBeFalsy();
      const claims = eventsOf(await listRunEvents(pool, row.id), 'claimed');
      expect(payloadOf(claims[0]!)).toMatchObject({ worker: row.claimed_by, revision: 2, requeues: 0, fastPath: true });
      // The journal opened with the insert: WORKING at sequence 1, at the claim's revision.
      expect((await journalRows(pool, row.id)).map((event) => [event.sequence, event.kind, event.state, event.run_revision])).toEqual([
        [1, 'status', 'TASK_STATE_WORKING', 2],
      ]);
    }

    child.child.kill('SIGKILL');
    const exit = await child.exited;
    expect(exit.signal).toBe('SIGKILL');

    // Nobody settles or renews for the dead child: each row still names it until its lease runs out.
    const orphaned = new Map<string, RunRow>();
    for (const id of taskIds) {
      const row = (await getRun(pool, id))!;
      expect(row).toMatchObject({ status: 'running', requeue_count: 0, tool_calls: 0, termination_reason: null });
      expect(row.claimed_by?.startsWith(childPrefix)).toBe(true);
      expect(eventsOf(await listRunEvents(pool, id), 'tool_call')).toHaveLength(0);
      orphaned.set(id, row);
    }

    // A replacement on the same database, master key and queues; it receives no new task.
    const keel = await startTestKeel({ databaseUrl: db.url, env });
    keels.push(keel);

    await explained(
      pool,
      taskIds,
      child,
      waitFor(
        async () => {
          for (const id of taskIds) {
            const row = await getRun(pool, id);
            // A settle journals its end in its own transaction: a settled run's journal is complete.
            if (!row || !['completed', 'failed', 'cancelled'].includes(row.status)) return false;
          }
          return true;
        },
        'every task to settle',
        60_000,
      ),
    );

    for (const id of taskIds) {
      const settled = (await getRun(pool, id))!;
      expect(settled).toMatchObject({
        status: 'completed',
        termination_reason: 'completed',
        requeue_count: 1,
        claimed_by: null,
        lease_expires_at: null,
        iterations: 2,
        tool_calls: 1,
      });
      // Requeued by the reaper only once the child's lease had expired.
      expect(settled.available_at).toBeGreaterThanOrEqual(orphaned.get(id)!.lease_expires_at! + REQUEUE_BASE_SECONDS * 1000);

      // Two claims: the child's at the fast insert, the replacement's after the requeue, which ran
      // the whole agent once: one tool call, one completion.
      const events = await listRunEvents(pool, id);
      const claims = eventsOf(events, 'claimed');
      expect(claims).toHaveLength(2);
      expect(payloadOf(claims[0]!)).toMatchObject({ worker: orphaned.get(id)!.claimed_by, requeues: 0, fastPath: true });
      expect(payloadOf(claims[1]!)).toMatchObject({ worker: keel.context.workerId, requeues: 1 });
      expect(payloadOf(claims[1]!).fastPath).toBeUndefined();
      expect(claims[1]!.created_at).toBeGreaterThanOrEqual(settled.available_at);
      expect(eventsOf(events, 'tool_call').map((event) => payloadOf(event).tool)).toEqual(['lookup']);
      expect(eventsOf(events, 'tool_result')).toHaveLength(1);
      expect(eventsOf(events, 'completed')).toHaveLength(1);

      // The journal: contiguous from 1, opened by the fast insert's WORKING, ended by one COMPLETED.
      const journal = await journalRows(pool, id);
      const context = describeJournal(journal);
      expect(journal.map((event) => event.sequence), context).toEqual(journal.map((_, index) => index + 1));
      expect(journal[0], context).toMatchObject({ sequence: 1, kind: 'status', state: 'TASK_STATE_WORKING', run_revision: 2 });
      expect(journal.filter((event) => event.kind === 'status' && event.state === 'TASK_STATE_COMPLETED'), context).toHaveLength(1);
      expect(journal.at(-1), context).toMatchObject({ kind: 'status', state: 'TASK_STATE_COMPLETED', run_revision: settled.revision });

      // What the client sees: the task completed with the agent's reply.
      const task = await getTask(keel.url, token, id);
      expect(task.status.state, JSON.stringify(task)).toBe('TASK_STATE_COMPLETED');
      expect(task.artifacts, JSON.stringify(task)).toEqual([{ artifactId: `${id}-answer`, name: 'answer', parts: [{ text: 'done' }] }]);

      // The only job the run ever had is the requeue's: the fast insert added none.
      expect(await queues.queue('runs').getJob(runJobId(id))).toBeFalsy();
    }
  });
});
