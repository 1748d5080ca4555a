import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/log/logger.js';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { listRunOutputs } from '../../../src/runs/run-output-repository.js';
import { cancelRun, getRun } from '../../../src/runs/run-repository.js';
import { decideApproval, provideRunInput, readSuspendedRun } from '../../../src/runs/resume-run.js';
import { startRun, TERMINAL, TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, tempDir, type TestKeel } from '../../support/test-keel.js';
import { waitForRunStatus } from '../../support/wait-for.js';

// Approvals (tool turns and guardrails), typed input, and cancellation of a waiting run.

let keel: TestKeel;
const mailLog = join(tempDir('keel-mail-'), 'mail.log');

beforeAll(async () => {
  writeFileSync(mailLog, '');
  keel = await startTestKeel({
    overrides: {
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com', logFile: mailLog } }] }, { reply: 'mail handled' }] },
        asker: { type: 'scripted', steps: [{ toolCalls: [{ name: 'ask_user', arguments: {} }] }, { reply: 'thanks for the colour' }] },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] },
        { id: 'asker', name: 'Asker', provider: 'asker', tools: ['ask_user'] },
        {
          id: 'reviewed',
          name: 'Reviewed',
          provider: 'echo',
          guardrails: [{ type: 'denyPattern', name: 'answer-review', patterns: ['refund'], on: ['answer'], action: 'requireApproval', reason: 'refunds need a person' }],
        },
      ],
    },
  });
});
afterAll(async () => keel?.dispose());

async function waitingTurn(runId: string) {
  await waitForRunStatus(keel.context.pool, runId, ['waiting_for_approval']);
  const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, runId, 'waiting_for_approval');
  if (!read.ok) throw new Error(read.reason);
  return read.view;
}

const mails = () => readFileSync(mailLog, 'utf8').split('\n').filter(Boolean);

describe('a tool call that needs approval suspends the whole turn', () => {
  it('stores the transcript and pending calls sealed, with a digest over the calls', async () => {
    const id = await startRun(keel, 'mailer', 'tell ops');
    const view = await waitingTurn(id);
    expect(view.run.claimed_by).toBeNull();
    expect(view.run.suspended_state!.includes(Buffer.from('ops@example.com'))).toBe(false);
    const pending = view.state.pendingApproval!;
    expect(pending.kind).toBe('tools');
    expect(pending.kind === 'tools' && pending.calls.map((call) => call.name)).toEqual(['send_email']);
    expect(pending.digest).toMatch(/^[0-9a-f]{64}$/);
    await cancelRun(keel.context.pool, silentLogger(), id);
  });

  it('approve: the tool runs once and the loop continues to an answer', async () => {
    const before = mails().length;
    const id = await startRun(keel, 'mailer', 'tell ops');
    const view = await waitingTurn(id);
    const decided = await decideApproval(keel.context, id, view.state.pendingApproval!.digest, true);
    expect(decided.ok).toBe(true);
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed', tool_calls: 1 });
    expect(mails().length - before).toBe(1);
    const outputs = await listRunOutputs(keel.context.pool, keel.context.sealer, id);
    expect(JSON.stringify(outputs[0]!.content)).toContain('mail handled');
    const kinds = (await listRunEvents(keel.context.pool, id)).map((event) => event.kind);
    expect(kinds).toEqual(expect.arrayContaining(['suspended', 'resumed', 'approval_decided', 'tool_call', 'tool_result', 'completed']));
  });

  it('deny: the tool does not run, the model is told, and the loop continues', async () => {
    const before = mails().length;
    const id = await startRun(keel, 'mailer', 'tell ops');
    const view = await waitingTurn(id);
    expect((await decideApproval(keel.context, id, view.state.pendingApproval!.digest, false)).ok).toBe(true);
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed' });
    expect(mails().length).toBe(before);
    const decided = (await listRunEvents(keel.context.pool, id)).find((event) => event.kind === 'approval_decided');
    expect(decided?.payload).toMatchObject({ approved: false });
  });

  it('two concurrent approvals: exactly one claims the run', async () => {
    const before = mails().length;
    const id = await startRun(keel, 'mailer', 'tell ops');
    const view = await waitingTurn(id);
    const digest = view.state.pendingApproval!.digest;
    const results = await Promise.all([1, 2, 3, 4].map((index) => decideApproval(keel.context, id, digest, index % 2 === 0)));
    expect(results.filter((result) => result.ok)).toHaveLength(1);
    expect(results.filter((result) => !result.ok).every((result) => !result.ok && ['already_decided', 'not_waiting', 'stale_digest'].includes(result.reason))).toBe(true);
    await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(mails().length - before).toBeLessThanOrEqual(1);
    const resumes = (await listRunEvents(keel.context.pool, id)).filter((event) => event.kind === 'resumed');
    expect(resumes).toHaveLength(1);
  });

  it('a stale digest is refused and the run keeps waiting', async () => {
    const id = await startRun(keel, 'mailer', 'tell ops');
    const view = await waitingTurn(id);
    const wrong = `${view.state.pendingApproval!.digest.slice(0, 63)}${view.state.pendingApproval!.digest.endsWith('0') ? '1' : '0'}`;
    expect(await decideApproval(keel.context, id, wrong, true)).toEqual({ ok: false, reason: 'stale_digest' });
    const run = await getRun(keel.context.pool, id);
    expect(run).toMatchObject({ status: 'waiting_for_approval', revision: view.run.revision });
    await cancelRun(keel.context.pool, silentLogger(), id);
  });

  it('cancel while waiting: the run is cancelled and a later decision is refused', async () => {
    const id = await startRun(keel, 'mailer', 'tell ops');
    const view = await waitingTurn(id);
    expect((await cancelRun(keel.context.pool, silentLogger(), id)).settled).toBe(true);
    expect(await decideApproval(keel.context, id, view.state.pendingApproval!.digest, true)).toEqual({ ok: false, reason: 'not_waiting', status: 'cancelled' });
    const run = await getRun(keel.context.pool, id);
    expect(run).toMatchObject({ status: 'cancelled', termination_reason: 'cancelled', suspended_state: null });
  });
});

describe('a guardrail that requires approval on the answer', () => {
  it('approval completes the run with the answer that was held', async () => {
    const id = await startRun(keel, 'reviewed', 'I want a refund');
    const view = await waitingTurn(id);
    expect(view.state.pendingApproval).toMatchObject({ kind: 'guardrail', stage: 'answer', guardrail: 'answer-review', reason: 'refunds need a person' });
    expect((await decideApproval(keel.context, id, view.state.pendingApproval!.digest, true)).ok).toBe(true);
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed' });
    const outputs = await listRunOutputs(keel.context.pool, keel.context.sealer, id);
    expect(JSON.stringify(outputs[0]!.content)).toContain('echo: I want a refund');
  });

  it('denial ends the run FAILED with approval_denied', async () => {
    const id = await startRun(keel, 'reviewed', 'another refund');
    const view = await waitingTurn(id);
    expect((await decideApproval(keel.context, id, view.state.pendingApproval!.digest, false)).ok).toBe(true);
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'approval_denied' });
    expect(await listRunOutputs(keel.context.pool, keel.context.sealer, id)).toEqual([]);
  });
});

describe('typed input', () => {
  it('waits for input; invalid input leaves it waiting; valid input resumes it', async () => {
    const id = await startRun(keel, 'asker', 'pick for me');
    await waitForRunStatus(keel.context.pool, id, ['waiting_for_input']);
    const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, id, 'waiting_for_input');
    if (!read.ok) throw new Error(read.reason);
    expect(read.view.state.pendingInput).toMatchObject({ toolName: 'ask_user', prompt: 'Which colour?' });

    const invalid = await provideRunInput(keel.context, id, { colour: 'green' });
    expect(invalid).toMatchObject({ ok: false, reason: 'invalid_input' });
    expect(await getRun(keel.context.pool, id)).toMatchObject({ status: 'waiting_for_input', revision: read.view.run.revision });

    expect((await provideRunInput(keel.context, id, { colour: 'red' })).ok).toBe(true);
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed' });
    const outputs = await listRunOutputs(keel.context.pool, keel.context.sealer, id);
    expect(JSON.stringify(outputs[0]!.content)).toContain('thanks for the colour');
    expect(await provideRunInput(keel.context, id, { colour: 'blue' })).toEqual({ ok: false, reason: 'not_waiting', status: 'completed' });
  });
});
