import { GetTaskRequest, Task } from '@a2a-js/sdk';
import type { Job } from 'bullmq';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { silentLogger } from '../../../src/log/logger.js';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { allowedFrom, targetOf } from '../../../machines/transitions.js';
import { runMachine } from '../../../machines/run.machine.js';
import { cancelRun, getRun, listApprovalsPastTimeout, timeOutApproval } from '../../../src/runs/run-repository.js';
import { decideApproval, readSuspendedRun } from '../../../src/runs/resume-run.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { createMaintenanceProcessor, SWEEP_JOB } from '../../../workers/maintenance.js';
import { newClientToken } from '../push/push-support.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { TERMINAL, TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, testConfig, type TestKeel } from '../../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// runs.approvalTimeoutHours (default 72): the maintenance sweeper ends a run that has waited for an
// approval longer than that FAILED (`approval_denied`), says so in its timeline and in its task's
// FAILED status, and leaves alone a run that waited less or was decided first.

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
      },
      KEEL_AGENTS: [{ id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] }],
    },
  });
  token = await newClientToken(keel.context.pool, 'approval-timeout');
});
afterAll(async () => keel?.dispose());

/** A task whose run waits for an operator's approval of its send_email call. */
async function waitingTask(): Promise<{ id: string; digest: string }> {
  const client = await sdkClient(keel.url, 'mailer', token);
  const task = (await client.sendMessage(textMessage('tell ops', { returnImmediately: true }))) as { id: string };
  await waitForRunStatus(keel.context.pool, task.id, ['waiting_for_approval']);
  const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, task.id, 'waiting_for_approval');
  if (!read.ok) throw new Error(read.reason);
  return { id: task.id, digest: read.view.state.pendingApproval!.digest };
}

/** Moves the moment the run started waiting `hours` into the past. */
async function waitingSince(runId: string, hours: number): Promise<void> {
  await keel.context.pool.query(sql.unsafe`
    UPDATE runs SET status_changed_at = now() - ${sql.interval({ seconds: hours * 3600 })} WHERE id = ${runId}`);
}

/** One sweep, as the maintenance worker runs it every `maintenance.sweepSeconds`. */
const sweep = () => createMaintenanceProcessor(keel.context)({ name: SWEEP_JOB, data: {} } as Job);

async function getTask(taskId: string) {
  const client = await sdkClient(keel.url, 'mailer', token);
  return Task.toJSON(await client.getTask(GetTaskRequest.fromJSON({ id: taskId }))) as {
    status: { state: string; message?: { parts: Array<{ text?: string }> } };
    artifacts?: unknown[];
  };
}

const messageText = (message: { parts: Array<{ text?: string }> } | undefined) => message?.parts.map((part) => part.text ?? '').join('') ?? '';

describe(`runs.approvalTimeoutHours`, () => {
  it('is 72 h by default, takes fractions and its environment variable, and refuses zero', () => {
    const configWith = (overrides: Record<string, unknown>) =>
      testConfig(keel.databaseUrl, { KEEL_AGENTS: [{ id: 'echo', name: 'Echo', provider: 'echo' }], KEEL_PROVIDERS: { echo: { type: 'echo' } }, ...overrides });
    expect(configWith({}).runs.approvalTimeoutHours).toBe(72);
    expect(configWith({ KEEL_RUNS_APPROVAL_TIMEOUT_HOURS: '0.25' }).runs.approvalTimeoutHours).toBe(0.25);
    expect(() => configWith({ KEEL_RUNS_APPROVAL_TIMEOUT_HOURS: '0' })).toThrow(/runs\.approvalTimeoutHours/);
  });

  it('ends a run waiting longer FAILED approval_denied, with the timeout in its timeline, and its task FAILED', async () => {
    const { id, digest } = await waitingTask();
    await waitingSince(id, 73);

    // The scheduled sweep (every 0.5 s here) ends it.
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL, 15_000);
    expect(run).toMatchObject({
      status: 'failed',
      termination_reason: 'approval_denied',
      suspended_state: null,
      claimed_by: null,
      failure_detail: { reason: 'approval_timed_out', timeoutHours: 72 },
    });

    // The timeline `keel runs show` and the operator UI print.
    const events = await listRunEvents(keel.context.pool, id);
    const timedOut = events.find((event) => event.kind === 'approval_timed_out');
    expect(timedOut?.payload).toMatchObject({ message: 'approval timed out after 72 h', timeoutHours: 72 });
    expect(events.at(-1)?.kind).toBe('approval_timed_out');

    // The task over the official client, and the row it is read from.
    const task = await getTask(id);
    expect(task.status.state).toBe('TASK_STATE_FAILED');
    expect(messageText(task.status.message)).toBe('approval timed out after 72 h');
    expect(task.artifacts ?? []).toEqual([]);
    const state = await keel.context.pool.oneFirst(sql.type(z.object({ state: z.string() }))`SELECT state FROM a2a_tasks WHERE id = ${id}`);
    expect(state).toBe('TASK_STATE_FAILED');

    // Projected to the journal like any other terminal transition, with the same message.
    const failed = await waitFor(async () => {
      const journal = await readJournal(keel.context.pool, keel.context.sealer, id, 0);
      return journal.find((event) => event.state === 'TASK_STATE_FAILED') ?? null;
    }, `the FAILED event of ${id} in the journal`);
    const update = (failed.response as { statusUpdate: { status: { message?: { parts: Array<{ text?: string }> } } } }).statusUpdate;
    expect(messageText(update.status.message)).toBe('approval timed out after 72 h');

    // A decision that comes too late changes nothing.
    expect(await decideApproval(keel.context, id, digest, true)).toEqual({ ok: false, reason: 'not_waiting', status: 'failed' });
  });

  it('leaves a run that has waited less than the timeout untouched', async () => {
    const { id } = await waitingTask();
    await waitingSince(id, 71);
    const before = await getRun(keel.context.pool, id);
    await sweep();
    await sweep();
    const after = await getRun(keel.context.pool, id);
    expect(after).toMatchObject({ status: 'waiting_for_approval', revision: before!.revision, termination_reason: null });
    expect(after!.suspended_state).not.toBeNull();
    expect((await listRunEvents(keel.context.pool, id)).map((event) => event.kind)).not.toContain('approval_timed_out');
    expect((await getTask(id)).status.state).toBe('TASK_STATE_WORKING');
    await cancelRun(keel.context.pool, silentLogger(), id);
  });

  it('is a transition of the run machine, from waiting_for_approval only', () => {
    expect(allowedFrom(runMachine, 'APPROVAL_TIMED_OUT')).toEqual(['waiting_for_approval']);
    expect(targetOf(runMachine, 'APPROVAL_TIMED_OUT')).toBe('failed');
  });

  it('spares a run approved between the listing and the guarded write', async () => {
    const { id, digest } = await waitingTask();
    // A timeout of a millisecond, passed to the sweep's two steps by hand: the scheduled sweep
    // (72 h here) never touches this run, so the approval is the only thing between the steps.
    const timeoutHours = 0.001 / 3600;
    await waitingSince(id, 0.01 / 3600);
    expect(await listApprovalsPastTimeout(keel.context.pool, timeoutHours, 1000)).toContain(id);
    expect((await decideApproval(keel.context, id, digest, true)).ok).toBe(true);
    expect(await timeOutApproval(keel.context.pool, id, timeoutHours)).toBeNull();
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed' });
    expect((await listRunEvents(keel.context.pool, id)).map((event) => event.kind)).not.toContain('approval_timed_out');
    expect(JSON.stringify((await getTask(id)).artifacts)).toContain('mail handled');
  });

  it('never ends a run approved just before the sweep: each run is either approved or timed out', async () => {
    const waiting = await Promise.all(Array.from({ length: 8 }, () => waitingTask()));
    for (const task of waiting) await waitingSince(task.id, 73);
    // Approvals and sweeps race: the guarded transitions let exactly one of them have each run.
    const [decisions] = await Promise.all([
      Promise.all(waiting.map((task) => decideApproval(keel.context, task.id, task.digest, true))),
      sweep(),
      sweep(),
    ]);
    for (const [index, task] of waiting.entries()) {
      const run = await waitForRunStatus(keel.context.pool, task.id, TERMINAL);
      const kinds = (await listRunEvents(keel.context.pool, task.id)).map((event) => event.kind);
      if (decisions[index]!.ok) {
        expect(run, `approved run ${task.id}`).toMatchObject({ status: 'completed', termination_reason: 'completed' });
        expect(kinds).not.toContain('approval_timed_out');
        expect(JSON.stringify((await getTask(task.id)).artifacts)).toContain('mail handled');
      } else {
        // The approval lost: either it read the run after the timeout (not waiting any more), or it
        // read it waiting and its guarded claim found the timeout committed first.
        expect([
          { ok: false, reason: 'not_waiting', status: 'failed' },
          { ok: false, reason: 'already_decided' },
        ]).toContainEqual(decisions[index]);
        expect(run, `timed-out run ${task.id}`).toMatchObject({ status: 'failed', termination_reason: 'approval_denied' });
        expect(kinds).not.toContain('resumed');
      }
    }
  });
});
