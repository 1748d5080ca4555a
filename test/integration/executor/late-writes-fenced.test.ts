import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { listRunEvents, type RunEventRow } from '../../../src/runs/run-event-repository.js';
import { getRun } from '../../../src/runs/run-repository.js';
import { buildRunTimeline } from '../../../src/runs/run-timeline.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { reapExpiredLeases } from '../../../workers/maintenance.js';
import { newClientToken, PUSH_TEST_OVERRIDES, sendWithPush } from '../push/push-support.js';
import { startTestKeel, tempDir, type TestKeel } from '../../support/test-keel.js';
import { testQueueKind } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// Fencing (docs/reliability.md, "Fencing"; decision 0088): a worker that lost its lease inside a
// step comes back to find the run taken over, and every write it then makes is refused by its
// claim's token. The worker is not cut from the network: its heartbeat is set past the test's
// length, so nothing tells it of the loss while its step runs, as nothing would tell a worker cut
// off from Postgres; the test expires the lease and runs the reaper while the step is in flight.
// The same process takes the requeued run again (with a new claim), so the fence, not the
// worker's id, is what refuses the late writes.

const QUEUE = testQueueKind();
const HOLD_MS = 2500;
const FENCE_TOOLS = new URL('../../fixtures/fence-tools.ts', import.meta.url).pathname;
const logs = tempDir('keel-fence-');
const payments = join(logs, 'payments.log');

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      ...PUSH_TEST_OVERRIDES,
      KEEL_PRIVACY_LEVEL: 'full',
      // No heartbeat during the test: the late drive learns of the takeover only from its refused writes.
      KEEL_RUNS_HEARTBEAT_SECONDS: '600',
      KEEL_RUNS_REQUEUE_BASE_SECONDS: '0',
      KEEL_TOOL_MODULES: JSON.stringify([FENCE_TOOLS]),
      KEEL_PROVIDERS: {
        slow: { type: 'scripted', steps: [{ reply: 'the answer', delayMs: HOLD_MS }] },
        payer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'slow_payment', arguments: { logFile: payments, holdMs: HOLD_MS } }] }, { reply: 'paid: {{tool_result}}' }] },
      },
      KEEL_AGENTS: [
        { id: 'slow', name: 'Slow', provider: 'slow' },
        { id: 'payer', name: 'Payer', provider: 'payer', tools: ['slow_payment'] },
      ],
    },
  });
  token = await newClientToken(keel.context.pool, 'fenced');
}, 120_000);
afterAll(async () => keel?.dispose());

const policy = { maxRequeues: 3, requeueBaseMs: 0, requeueMaxMs: 0 };

/**
 * The lease of the running run expires now, and the reaper runs (requeue, or dead-letter inside a
 * non-idempotent call): here, or in the Keel's own sweep (every 0.5 s) if it comes first.
 */
async function expireAndReap(runId: string): Promise<'requeued' | 'dead_lettered'> {
  await keel.context.pool.query(sql.unsafe`UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = ${runId} AND status = 'running'`);
  // The reaper skips a run whose row a write holds at that moment (SKIP LOCKED: the drive writes
  // its steps), and takes it at its next sweep: so does this, until the reaper has taken it.
  const run = await waitFor(
    async () => {
      await reapExpiredLeases(keel.context, policy);
      const row = (await getRun(keel.context.pool, runId))!;
      // Requeued, it may already run again under a new claim.
      return row.status === 'running' && row.requeue_count === 0 ? undefined : row;
    },
    'the reaper to take the run',
    10_000,
    100,
  );
  if (run.requeue_count === 1) return 'requeued';
  return run.termination_reason === 'retries_exhausted' ? 'dead_lettered' : (run.status as never);
}

const claimsOf = (events: readonly RunEventRow[]) => events.filter((event) => event.kind === 'claimed').map((event) => (event.payload as { claim: string }).claim);
const refusalOf = (events: readonly RunEventRow[]) => events.find((event) => event.kind === 'late_write_refused');
const deliveryRow = z.object({ sequence: z.number(), n: z.number() });

describe(`late writes of a lost claim on the ${QUEUE} queue backend`, () => {
  it('a run taken over while its model call was in flight completes once, by the new claim; the late completion, journal rows, deliveries and audit rows are refused and the refusal is in the timeline', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'slow', 'answer slowly', { url: 'http://127.0.0.1:9/hook' });
    // The first claim's drive is inside its model call (a fast run: its trail is written with its end).
    const first = await waitFor(async () => {
      const row = await getRun(keel.context.pool, taskId);
      return row?.status === 'running' ? (row.claim_token ?? undefined) : undefined;
    }, 'the first claim');
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await expireAndReap(taskId)).toBe('requeued');

    const run = await waitForRunStatus(keel.context.pool, taskId, ['completed', 'failed', 'cancelled'], 30_000);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed', requeue_count: 1 });
    const events = await waitFor(async () => {
      const all = await listRunEvents(keel.context.pool, taskId);
      return refusalOf(all) ? all : undefined;
    }, 'the refusal in the timeline', 20_000);

    // The second claim has a token of its own; the first claim's trail is all refused (a fast
    // run writes its trail with its end), and the run completed once, by the second.
    const claims = claimsOf(events);
    expect(claims).toHaveLength(1);
    expect(claims[0]).not.toBe(first);
    expect((await getRun(keel.context.pool, taskId))!.claim_token).toBe(claims[0]);
    expect(events.filter((event) => event.kind === 'completed')).toHaveLength(1);
    expect(events.filter((event) => event.kind === 'model_reply')).toHaveLength(1);
    expect(refusalOf(events)!.payload).toMatchObject({ worker: keel.context.workerId, claim: first, refused: { completion: 1 }, status: 'completed' });
    expect((refusalOf(events)!.payload as { refused: Record<string, number> }).refused.audit_rows).toBeGreaterThan(0);

    // The journal has one COMPLETED event, and each event one delivery.
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    expect(journal.filter((event) => event.state === 'TASK_STATE_COMPLETED')).toHaveLength(1);
    const deliveries = await keel.context.pool.any(sql.type(deliveryRow)`
      SELECT event_sequence AS sequence, count(*)::int AS n FROM push_deliveries WHERE task_id = ${taskId} GROUP BY event_sequence ORDER BY event_sequence`);
    expect(deliveries.length).toBeGreaterThan(0);
    expect(deliveries.every((row) => row.n === 1)).toBe(true);

    // What `keel runs timeline <id>` shows: the refusal, naming the worker and its claim.
    const stored = (await getRun(keel.context.pool, taskId))!;
    const timeline = buildRunTimeline(stored, events, [], Date.now());
    const refused = timeline.segments.filter((segment) => segment.kind === 'refused');
    expect(refused).toHaveLength(1);
    expect(refused[0]!.label).toContain(`late write from worker ${keel.context.workerId} with claim ${first} refused`);
    expect(refused[0]!.label).toContain('completion');
  }, 90_000);

  it('a run taken over inside a non-idempotent tool call is dead-lettered; the tool ran once and the late tool result and audit rows are refused', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'payer', 'pay once');
    await waitFor(async () => (existsSync(payments) && readFileSync(payments, 'utf8').includes('started') ? true : undefined), 'the payment started');
    expect((await getRun(keel.context.pool, taskId))!.inside_non_idempotent_call).not.toBeNull();
    expect(await expireAndReap(taskId)).toBe('dead_lettered');

    const events = await waitFor(async () => {
      const all = await listRunEvents(keel.context.pool, taskId);
      return refusalOf(all) ? all : undefined;
    }, 'the refusal in the timeline', 20_000);
    const run = (await getRun(keel.context.pool, taskId))!;
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'retries_exhausted', claimed_by: null, claim_token: null });
    // The step ran once, and its late result wrote nothing.
    expect(readFileSync(payments, 'utf8').split('\n').filter((line) => line.startsWith('started'))).toHaveLength(1);
    expect(events.filter((event) => event.kind === 'tool_call')).toHaveLength(1);
    expect(events.filter((event) => event.kind === 'tool_result')).toHaveLength(0);
    expect(events.filter((event) => event.kind === 'completed')).toHaveLength(0);
    const refusal = refusalOf(events)!.payload as { worker: string; claim: string; refused: Record<string, number>; status: string };
    expect(refusal).toMatchObject({ worker: keel.context.workerId, claim: claimsOf(events)[0], status: 'failed' });
    // The mark is not cleared after the call (only the settle or a suspension clears it, with the
    // state that holds the call's result): no late write of it to refuse.
    expect(refusal.refused.non_idempotent_mark).toBeUndefined();
    expect(refusal.refused.audit_rows).toBeGreaterThan(0);
    const journal = await waitFor(async () => {
      const all = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
      return all.some((event) => event.state === 'TASK_STATE_FAILED') ? all : undefined;
    }, 'the FAILED event');
    expect(journal.filter((event) => event.state === 'TASK_STATE_FAILED')).toHaveLength(1);
    expect(journal.filter((event) => event.state === 'TASK_STATE_COMPLETED')).toHaveLength(0);
  }, 90_000);
});
