import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { createClient } from '../../src/auth/client-repository.js';
import { getRun } from '../../src/runs/run-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { insertMachineRun } from '../support/statechart-rows.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitForRunStatus } from '../support/wait-for.js';
import { failNext, recoveryCounters } from '../fixtures/statecharts/recovery-steps.js';

// `keel runs retry` and `keel runs cancel` against a running Keel (the steps run in this process,
// the CLI in its own): a failed statechart run retried from its last or an earlier state, refusals
// with their message and exit code, bulk cancel and retry by agent, status, state or reason with a
// dry run that changes no row, usage errors; and `keel runs show` naming the state and step of a
// statechart approval.

const RECOVERY = new URL('../fixtures/statecharts/recovery.machine.ts', import.meta.url).pathname;
const ORDER = new URL('../fixtures/statecharts/order.machine.ts', import.meta.url).pathname;
const AGENTS = [
  { id: 'recovery', name: 'Recovery', machine: RECOVERY },
  { id: 'orders', name: 'Orders', machine: ORDER },
];

let keel: TestKeel;
let env: NodeJS.ProcessEnv;
let token = '';
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });

beforeAll(async () => {
  keel = await startTestKeel({ overrides: { KEEL_AGENTS: AGENTS } });
  env = cleanEnv({ ...cliEnvFor(keel), KEEL_AGENTS: JSON.stringify(AGENTS) });
  const client = await createClient(keel.context.pool, 'cli-recovery');
  if (!client.ok) throw new Error('client');
  token = client.token;
}, 60_000);
afterAll(async () => keel?.dispose());

async function failedRun(text: string, step: 'charge' | 'notify'): Promise<string> {
  failNext(text, step, 1);
  const client = await sdkClient(keel.url, 'recovery', token);
  const task = Task.toJSON((await client.sendMessage(textMessage(text))) as Task) as { id: string; status: { state: string } };
  expect(task.status.state).toBe('TASK_STATE_FAILED');
  return task.id;
}

const statuses = () => keel.context.pool.any(sql.type(z.object({ id: z.string(), status: z.string(), revision: z.number() }))`SELECT id, status, revision FROM runs ORDER BY id`);

// Each `keel` child takes seconds on a loaded machine: a test here runs up to eight of them.
describe('keel runs retry and cancel', { timeout: 180_000 }, () => {
  it('retry: from the last committed state, then the run completes as the same run; again: refused', async () => {
    const id = await failedRun('cli-last', 'notify');
    const revision = (await getRun(keel.context.pool, id))!.revision;
    const retried = await keelCli('runs', 'retry', id);
    expect(retried.stderr).toBe('');
    expect(retried).toMatchObject({ code: 0, stdout: `run ${id} retried from state notifying (revision ${revision + 1}); it is queued again\n` });
    expect((await waitForRunStatus(keel.context.pool, id, ['completed', 'failed'])).status).toBe('completed');
    expect(recoveryCounters('cli-last')).toEqual({ lookups: 1, charges: 1, records: 1, notices: 2 });
    const events = await keelCli('runs', 'show', id, '--json');
    const retriedEvent = (JSON.parse(events.stdout).events as Array<{ kind: string; payload: Record<string, unknown> }>).find((event) => event.kind === 'operator_retried');
    expect(retriedEvent?.payload).toMatchObject({ via: 'cli', state: 'notifying' });

    const again = await keelCli('runs', 'retry', id);
    expect(again).toMatchObject({ code: 1, stderr: `keel: run ${id} is completed: only a failed run can be retried\n` });
  });

  it('retry --from-state: an earlier state runs again; a state before the non-idempotent charge, or never passed through, is refused', async () => {
    const id = await failedRun('cli-earlier', 'notify');
    const before = await keelCli('runs', 'retry', id, '--from-state', 'looking_up');
    expect(before.code).toBe(1);
    expect(before.stderr).toBe(
      `keel: run ${id}: cannot retry from state looking_up: the run would run again step charge (charge), a non-idempotent write it already started; a retry may start from recording, notifying\n`,
    );
    const nowhere = await keelCli('runs', 'retry', id, '--from-state', 'shipping');
    expect(nowhere).toMatchObject({ code: 1, stderr: `keel: run ${id}: the run never stood in state shipping; it passed through looking_up, charging, recording, notifying\n` });
    expect((await getRun(keel.context.pool, id))!.status).toBe('failed');

    const earlier = await keelCli('runs', 'retry', id, '--from-state', 'recording', '--json');
    expect(earlier.code).toBe(0);
    expect(JSON.parse(earlier.stdout)).toMatchObject({ id, retried: true, state: 'recording' });
    await waitForRunStatus(keel.context.pool, id, ['completed']);
    expect(recoveryCounters('cli-earlier')).toEqual({ lookups: 1, charges: 1, records: 2, notices: 2 });
  });

  it('cancel and retry by selection: --dry-run lists and changes nothing; then they change exactly what was listed', async () => {
    const pool = keel.context.pool;
    const waiting = [
      await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_input', hash: 'h', state: 'recording' }),
      await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_approval', hash: 'h', state: 'recording' }),
    ];
    const before = await statuses();
    const dry = await keelCli('runs', 'cancel', '--agent', 'recovery', '--state', 'recording', '--dry-run');
    expect(dry.code).toBe(0);
    for (const id of waiting) expect(dry.stdout).toMatch(new RegExp(`${id}\\s+recovery\\s+waiting_for_\\w+\\s+recording\\s+would cancel`));
    expect(dry.stdout).toContain('dry run: 2 of 2 selected runs would be cancelled; nothing was changed');
    expect(await statuses()).toEqual(before);
    const cancelled = await keelCli('runs', 'cancel', '--agent', 'recovery', '--state', 'recording', '--json');
    expect(JSON.parse(cancelled.stdout)).toMatchObject({ action: 'cancel', dryRun: false, changed: 2 });
    for (const id of waiting) expect((await getRun(pool, id))!.status).toBe('cancelled');

    const a = await failedRun('cli-bulk-a', 'notify');
    const inside = await failedRun('cli-bulk-inside', 'charge');
    const failedBefore = await statuses();
    const preview = await keelCli('runs', 'retry', '--agent', 'recovery', '--status', 'failed', '--reason', 'not_retryable', '--dry-run', '--json');
    expect(preview.code).toBe(0);
    const report = JSON.parse(preview.stdout) as { items: Array<{ id: string; outcome: string; detail: string }>; changed: number };
    expect(report.changed).toBe(0);
    expect(report.items.find((item) => item.id === a)).toMatchObject({ outcome: 'would_retry', detail: 'from state notifying' });
    expect(report.items.find((item) => item.id === inside)).toMatchObject({ outcome: 'refused' });
    expect(await statuses()).toEqual(failedBefore);

    const retried = await keelCli('runs', 'retry', '--agent', 'recovery', '--status', 'failed', '--reason', 'not_retryable');
    expect(retried.code).toBe(0);
    expect(retried.stdout).toMatch(new RegExp(`${a}\\s+.*retried\\s+from state notifying`));
    expect(retried.stdout).toMatch(new RegExp(`${inside}\\s+.*refused`));
    await waitForRunStatus(pool, a, ['completed']);
    expect(recoveryCounters('cli-bulk-inside').charges).toBe(1);
  });

  it('bad input gets a clear message and the usage exit code', async () => {
    const neither = await keelCli('runs', 'cancel');
    expect(neither).toMatchObject({ code: 64, stderr: 'keel: give the run to cancel, or choose runs with --agent, --status, --state or --reason\n' });
    const both = await keelCli('runs', 'retry', '00000000-0000-4000-8000-000000000000', '--agent', 'recovery');
    expect(both).toMatchObject({ code: 64, stderr: 'keel: give a run id or a selection (--agent, --status, --state, --reason), not both\n' });
    const badStatus = await keelCli('runs', 'retry', '--status', 'broken');
    expect(badStatus.code).toBe(64);
    expect(badStatus.stderr).toContain('--status must be one of queued, running');
    const badReason = await keelCli('runs', 'cancel', '--reason', 'tired', '--dry-run');
    expect(badReason.code).toBe(64);
    expect(badReason.stderr).toContain('--reason must be one of completed');
    const missing = await keelCli('runs', 'retry', '00000000-0000-4000-8000-000000000000');
    expect(missing).toMatchObject({ code: 6, stderr: 'keel: run 00000000-0000-4000-8000-000000000000 not found\n' });
  });

  it('show names the state and step of a statechart approval, not a tool call', async () => {
    const client = await sdkClient(keel.url, 'orders', token);
    const request = SendMessageRequest.fromJSON({ message: { messageId: 'cli-approval', role: 'ROLE_USER', parts: [{ data: { amount: 500 } }] }, configuration: { returnImmediately: true } });
    const task = Task.toJSON((await client.sendMessage(request)) as Task) as { id: string };
    await waitForRunStatus(keel.context.pool, task.id, ['waiting_for_approval']);
    const shown = await keelCli('runs', 'show', task.id);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain("the step approve in state approving is waiting for an operator's decision");
    expect(shown.stdout).not.toMatch(/call .*askApproval/);
    expect(shown.stdout).toMatch(/decide with: keel runs approve\|deny/);
  });
});
