import { Task } from '@a2a-js/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { runJobId } from '../../../src/queue/job-ids.js';
import { HANDOFF_LEASE_MS, readSuspendedRun } from '../../../src/runs/resume-run.js';
import { claimForResume, getRun, HANDOFF_PREFIX } from '../../../src/runs/run-repository.js';
import { sweepDebts } from '../../../workers/maintenance.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { testQueueKind } from '../../support/test-queues.js';
import { waitForRunStatus } from '../../support/wait-for.js';

// The wake-up of a resumed run (an A2A follow-up to an INPUT_REQUIRED task, an approval, a resolved
// dependency) is a job of its own. The job of the stretch that suspended stays under the run's usual
// id `run-<id>` for a moment after the suspension committed ('active' until BullMQ completes it, or
// 'delayed' waiting for a retry): a follow-up answered within that moment used the same id, BullMQ
// dropped it as a duplicate, and the sweeper, finding that job pending, restored nothing either. The
// stale job is a delayed one here, so the moment lasts as long as the test needs.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        asks: { type: 'scripted', steps: [{ toolCalls: [{ name: 'ask_with_prompt', arguments: { prompt: 'Which address?' } }] }, { reply: 'noted' }] },
      },
      KEEL_AGENTS: [{ id: 'asks', name: 'Asks', provider: 'asks', tools: ['ask_with_prompt'] }],
      // Only the sweeps a test runs itself: the periodic one must not repair what is under test.
      KEEL_MAINTENANCE_SWEEP_SECONDS: '600',
      // A wake-up that is lost shows as a follow-up answered at this cap with the task still WORKING.
      KEEL_A2A_BLOCKING_CAP_SECONDS: '10',
    },
  });
  const client = await createClient(keel.context.pool, 'handoff-wakeup');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
});

async function send(text: string, taskId?: string): Promise<Json> {
  const client = await sdkClient(keel.url, 'asks', token);
  return Task.toJSON((await client.sendMessage(textMessage(text, taskId ? { taskId } : {}))) as Task) as Json;
}

/** A task waiting for input, with a pending job under its run's usual id (the suspended stretch's). */
async function waitingTaskWithStaleJob(): Promise<{ taskId: string; removeStale: () => Promise<void> }> {
  const created = await send('write to someone');
  expect(created.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
  const stale = await keel.context.queues.queue('runs').add('runs', { runId: created.id }, { jobId: runJobId(created.id), delay: 10 * 60_000 });
  expect(await stale.getState()).toBe('delayed');
  return { taskId: created.id, removeStale: async () => void (await stale.remove().catch(() => undefined)) };
}

/** The hand-off of a follow-up's input committed, and its process died before it enqueued the wake-up. */
async function handOffWithoutWakeUp(taskId: string): Promise<void> {
  const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, taskId, 'waiting_for_input');
  if (!read.ok) throw new Error(`not waiting: ${read.reason}`);
  const claimed = await claimForResume(
    keel.context.pool,
    taskId,
    'waiting_for_input',
    { workerId: `${HANDOFF_PREFIX}lost-wake-up`, leaseMs: HANDOFF_LEASE_MS },
    read.view.run.revision,
    { sealer: keel.context.sealer, state: { ...read.view.state, resume: { kind: 'input', value: 'the first one' } } },
  );
  expect(claimed?.claimed_by).toBe(`${HANDOFF_PREFIX}lost-wake-up`);
}

describe(`hand-off wake-ups on the ${testQueueKind()} queue backend`, () => {
  it("resumes a follow-up at once while the suspended stretch's job still holds the run's id", async () => {
    const { taskId, removeStale } = await waitingTaskWithStaleJob();
    try {
      const started = Date.now();
      const done = await send('the first one', taskId);
      expect(done.status.state).toBe('TASK_STATE_COMPLETED');
      expect(Date.now() - started, 'answered by the resumed run, not by the blocking cap').toBeLessThan(8_000);
      expect((await getRun(keel.context.pool, taskId))?.status).toBe('completed');
    } finally {
      await removeStale();
    }
  });

  it("restores a hand-off's lost wake-up in one sweep when no run is queued", async () => {
    // The fast path ran the task's first stretch: no run is QUEUED, the sweep's usual debt.
    const created = await send('write to someone');
    expect(created.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    await handOffWithoutWakeUp(created.id);
    expect(await sweepDebts(keel.context)).toEqual({ queuedRuns: 0, restored: 1 });
    await waitForRunStatus(keel.context.pool, created.id, ['completed'], 8_000);
  });

  it("restores a hand-off's lost wake-up in one sweep while a job holds the run's id", async () => {
    const { taskId, removeStale } = await waitingTaskWithStaleJob();
    try {
      await handOffWithoutWakeUp(taskId);
      expect((await sweepDebts(keel.context)).restored).toBe(1);
      await waitForRunStatus(keel.context.pool, taskId, ['completed'], 8_000);
    } finally {
      await removeStale();
    }
  });
});
