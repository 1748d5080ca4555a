import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { decideApproval, readSuspendedRun } from '../../../src/runs/resume-run.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, tempDir, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';

// A statechart agent end to end over the official client: the machine's steps, its status
// messages and artifact in the journal, input asked and answered, an operator's approval, a
// durable timer, and the path the run took, committed transition by transition.

const MACHINE = new URL('../../fixtures/statecharts/order.machine.ts', import.meta.url).pathname;
const ASSISTANT = new URL('../../fixtures/statecharts/assistant.machine.ts', import.meta.url).pathname;
const REMINDER = new URL('../../fixtures/statecharts/reminder.machine.ts', import.meta.url).pathname;
const QUIET = new URL('../../fixtures/statecharts/quiet.machine.ts', import.meta.url).pathname;
const emailLog = join(tempDir('keel-statechart-mail-'), 'mail.log');
const stepLog = join(tempDir('keel-statechart-'), 'steps.log');

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  writeFileSync(stepLog, '');
  process.env.KEEL_TEST_STEP_LOG = stepLog;
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_MAINTENANCE_SWEEP_SECONDS: '1',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        'plans-lookup': { type: 'scripted', steps: [{ reply: JSON.stringify({ tool: 'lookup', arguments: { key: 'k1' } }) }] },
        'plans-email': { type: 'scripted', steps: [{ reply: JSON.stringify({ tool: 'send_email', arguments: { to: 'bob', logFile: emailLog } }) }] },
      },
      KEEL_AGENTS: [
        { id: 'order', name: 'Order', machine: MACHINE },
        { id: 'looks-up', name: 'Looks up', machine: ASSISTANT, provider: 'plans-lookup', tools: ['lookup'] },
        { id: 'emails', name: 'Emails', machine: ASSISTANT, provider: 'plans-email', tools: ['send_email'] },
        { id: 'no-provider', name: 'No provider', machine: ASSISTANT, tools: ['lookup'] },
        { id: 'reminder', name: 'Reminder', machine: REMINDER },
        { id: 'quiet', name: 'Quiet', machine: QUIET },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'statecharts');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
  // Test files share a process (vitest.config.ts: isolate false): the next file starts clean.
  delete process.env.KEEL_TEST_STEP_LOG;
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

function dataMessage(text: string, data: Record<string, unknown>) {
  return SendMessageRequest.fromJSON({ message: { messageId: `m-${Math.random().toString(36).slice(2)}`, role: 'ROLE_USER', parts: [{ text }, { data }] } });
}

const asJson = (result: unknown) => Task.toJSON(result as Task) as Json;
const stepLines = () => readFileSync(stepLog, 'utf8').split('\n').filter(Boolean);

async function journalStatuses(taskId: string): Promise<string[]> {
  const events = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0, 100);
  return events.map((event) => {
    const response = event.response as Json;
    if (response.statusUpdate) return `${response.statusUpdate.status.state}${response.statusUpdate.status.message ? `: ${response.statusUpdate.status.message.parts[0].text}` : ''}`;
    if (response.artifactUpdate) return `artifact ${response.artifactUpdate.artifact.name}`;
    return 'message';
  });
}

async function pathOf(runId: string): Promise<string[]> {
  const rows = await keel.context.pool.any(sql.type(z.object({ state: z.unknown(), event: z.string() }))`
    SELECT state, event FROM run_machine_steps WHERE run_id = ${runId} ORDER BY sequence`);
  return rows.map((row) => JSON.stringify(row.state));
}

describe('a statechart agent over A2A', () => {
  it('runs the machine to its final state: steps, status messages, an emitted artifact and the output as the result', async () => {
    const client = await sdkClient(keel.url, 'order', token);
    const task = asJson(await client.sendMessage(dataMessage('refund please', { amount: 40 })));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    const names = (task.artifacts as Json[]).map((artifact) => artifact.name);
    expect(names).toContain('receipt');
    expect(names).toContain('result');
    expect(names).toContain('answer');
    const result = (task.artifacts as Json[]).find((artifact) => artifact.name === 'result')!;
    expect(result.parts[0].data).toEqual({ amount: 40, receipt: 'r-40' });
    const answer = (task.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!;
    expect(answer.parts[0].text).toBe('paid 40');

    expect(await journalStatuses(task.id)).toEqual([
      'TASK_STATE_WORKING',
      'TASK_STATE_WORKING: Checking the order',
      'TASK_STATE_WORKING: Paying',
      'artifact receipt',
      'artifact result',
      'artifact answer',
      'TASK_STATE_COMPLETED',
    ]);
    expect(await pathOf(task.id)).toEqual(['"checking"', '"paying"', '"done"']);
    const run = await keel.context.pool.one(sql.type(z.object({ machine_hash: z.string().nullable(), machine_state: z.unknown() }))`
      SELECT machine_hash, machine_state FROM runs WHERE id = ${task.id}`);
    expect(run.machine_hash).toBe(keel.registry.get('order')!.statechart!.hash);
    expect(run.machine_state).toBe('done');
    expect(stepLines().filter((line) => line.startsWith(`pay `))).toHaveLength(1);
  });

  it('asks for input, takes the reply, waits for an approval and goes on when it is given', async () => {
    const client = await sdkClient(keel.url, 'order', token);
    const asked = asJson(await client.sendMessage(textMessage('refund my order')));
    expect(asked.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    expect(asked.status.message.parts[0].text).toBe('What is the amount?');

    const reply = SendMessageRequest.fromJSON({
      message: { messageId: 'reply-1', role: 'ROLE_USER', taskId: asked.id, contextId: asked.contextId, parts: [{ data: { amount: 250 } }] },
      configuration: { returnImmediately: true },
    });
    const waiting = asJson(await client.sendMessage(reply));
    expect(waiting.id).toBe(asked.id);
    const suspended = await waitFor(async () => {
      const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, asked.id, 'waiting_for_approval');
      return read.ok ? read.view : null;
    }, 'the run to wait for an approval');
    expect(suspended.state.pendingApproval?.kind).toBe('tools');
    expect(suspended.state.pendingApproval?.kind === 'tools' && suspended.state.pendingApproval.calls[0]!.arguments).toEqual({ summary: 'pay 250', amount: 250 });
    const decided = await decideApproval(keel.context, asked.id, suspended.state.pendingApproval!.digest, true);
    expect(decided.ok).toBe(true);

    const done = await waitFor(async () => {
      const task = asJson(await client.getTask({ id: asked.id } as never));
      return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
    }, 'the task to complete');
    expect((done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('paid 250');
    expect(await pathOf(asked.id)).toEqual(['"checking"', '"asking"', '"approving"', '"paying"', '"done"']);
    const statuses = await journalStatuses(asked.id);
    expect(statuses).toContain('TASK_STATE_INPUT_REQUIRED: What is the amount?');
    expect(statuses).toContain('TASK_STATE_WORKING: Waiting for an operator');
  });

  it('a denial ends on the refusing final state', async () => {
    const client = await sdkClient(keel.url, 'order', token);
    const sent = asJson(await client.sendMessage(SendMessageRequest.fromJSON({ message: { messageId: 'deny-1', role: 'ROLE_USER', parts: [{ data: { amount: 500 } }] }, configuration: { returnImmediately: true } })));
    const suspended = await waitFor(async () => {
      const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, sent.id, 'waiting_for_approval');
      return read.ok ? read.view : null;
    }, 'the run to wait for an approval');
    expect((await decideApproval(keel.context, sent.id, suspended.state.pendingApproval!.digest, false)).ok).toBe(true);
    const done = await waitFor(async () => {
      const task = asJson(await client.getTask({ id: sent.id } as never));
      return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
    }, 'the task to complete');
    expect((done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('not paid: 500 needs approval');
  });

  it('a delay longer than a few seconds suspends the run until its due time', async () => {
    const client = await sdkClient(keel.url, 'order', token);
    const sent = asJson(await client.sendMessage(SendMessageRequest.fromJSON({ message: { messageId: 'wait-1', role: 'ROLE_USER', parts: [{ data: { amount: 10, waitMs: 4000 } }] }, configuration: { returnImmediately: true } })));
    const waiting = await waitFor(async () => {
      const row = await keel.context.pool.maybeOne(sql.type(z.object({ status: z.string(), due_in: z.number().nullable() }))`
        SELECT status, extract(epoch FROM timer_due_at - now())::float8 AS due_in FROM runs WHERE id = ${sent.id}`);
      return row?.status === 'waiting_for_timer' ? row : null;
    }, 'the run to wait for its timer');
    expect(waiting.due_in!).toBeGreaterThan(1);
    expect(asJson(await client.getTask({ id: sent.id } as never)).status.state).toBe('TASK_STATE_WORKING');
    const done = await waitFor(async () => {
      const task = asJson(await client.getTask({ id: sent.id } as never));
      return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
    }, 'the task to complete after the timer', 20_000);
    expect((done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('paid 10');
    expect(await pathOf(sent.id)).toEqual(['"checking"', '"pausing"', '"paying"', '"done"']);
  });

  it('callModel asks the provider chain and callTool runs one of the agent\'s tools', async () => {
    const client = await sdkClient(keel.url, 'looks-up', token);
    const task = asJson(await client.sendMessage(textMessage('look k1 up')));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect((task.artifacts as Json[]).find((artifact) => artifact.name === 'result')!.parts[0].data).toEqual({ key: 'k1', value: 42 });
    expect(await journalStatuses(task.id)).toEqual(['TASK_STATE_WORKING', 'TASK_STATE_WORKING: Planning', 'TASK_STATE_WORKING: Using a tool', 'artifact result', 'artifact answer', 'TASK_STATE_COMPLETED']);
  });

  it('a tool that needs approval waits for an operator before callTool runs it, and a denial is the step\'s error', async () => {
    const client = await sdkClient(keel.url, 'emails', token);
    for (const approved of [true, false]) {
      writeFileSync(emailLog, '');
      const sent = asJson(await client.sendMessage(textMessage(`mail bob (${approved})`, { returnImmediately: true })));
      const suspended = await waitFor(async () => {
        const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, sent.id, 'waiting_for_approval');
        return read.ok ? read.view : null;
      }, 'the tool call to wait for an approval');
      const pending = suspended.state.pendingApproval;
      expect(pending?.kind === 'tools' && pending.calls.map((call) => call.name)).toEqual(['send_email']);
      expect(readFileSync(emailLog, 'utf8')).toBe('');
      expect((await decideApproval(keel.context, sent.id, pending!.digest, approved)).ok).toBe(true);
      const done = await waitFor(async () => {
        const task = asJson(await client.getTask({ id: sent.id } as never));
        return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
      }, 'the task to complete');
      const answer = (done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text;
      if (approved) {
        expect(answer).toBe('done');
        expect(readFileSync(emailLog, 'utf8')).toBe('sent:bob\n');
      } else {
        expect(answer).toBe('failed: an operator did not approve the call');
        expect(readFileSync(emailLog, 'utf8')).toBe('');
      }
    }
  });

  it('callModel without a provider is the step\'s error, naming what is missing', async () => {
    const client = await sdkClient(keel.url, 'no-provider', token);
    const task = asJson(await client.sendMessage(textMessage('plan something')));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect((task.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toMatch(/^failed: the model call failed/);
  });

  it('a wait with a deadline: the timer runs while the task is INPUT_REQUIRED and moves the machine on when nobody answers', async () => {
    const client = await sdkClient(keel.url, 'reminder', token);
    const ask = (timeoutMs: number) => SendMessageRequest.fromJSON({ message: { messageId: `r-${timeoutMs}-${Math.random()}`, role: 'ROLE_USER', parts: [{ data: { timeoutMs } }] } });

    const unanswered = asJson(await client.sendMessage(ask(4000)));
    expect(unanswered.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    const row = await keel.context.pool.one(sql.type(z.object({ status: z.string(), due_in: z.number().nullable() }))`
      SELECT status, extract(epoch FROM timer_due_at - now())::float8 AS due_in FROM runs WHERE id = ${unanswered.id}`);
    expect(row.status).toBe('waiting_for_input');
    expect(row.due_in!).toBeGreaterThan(1);
    // Once the deadline took the run back, the task is WORKING without the prompt as its status message.
    const movedOn = await waitFor(async () => {
      const task = asJson(await client.getTask({ id: unanswered.id } as never));
      return task.status.state !== 'TASK_STATE_INPUT_REQUIRED' ? task : null;
    }, 'the deadline to take the run back', 20_000);
    expect(movedOn.status.state).toBe('TASK_STATE_WORKING');
    expect(movedOn.status.message).toBeUndefined();
    const gaveUp = await waitFor(async () => {
      const task = asJson(await client.getTask({ id: unanswered.id } as never));
      return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
    }, 'the deadline to move the task on', 20_000);
    expect((gaveUp.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('nobody answered in time');
    // The prompt no longer stands as the task's status message once the task has moved on.
    expect(gaveUp.status.message).toBeUndefined();
    expect(await journalStatuses(unanswered.id)).toEqual(['TASK_STATE_WORKING', 'TASK_STATE_INPUT_REQUIRED: Which date?', 'TASK_STATE_WORKING', 'artifact answer', 'TASK_STATE_COMPLETED']);
    expect(await pathOf(unanswered.id)).toEqual(['"asking"', '"closing"', '"gaveUp"']);

    // Answered before the deadline: the answer wins, and the timer's wake-up later finds nothing to do.
    const answered = asJson(await client.sendMessage(ask(3500)));
    const done = asJson(await client.sendMessage(SendMessageRequest.fromJSON({ message: { messageId: 'date-reply', role: 'ROLE_USER', taskId: answered.id, contextId: answered.contextId, parts: [{ text: 'May 4' }] } })));
    expect(done.status.state).toBe('TASK_STATE_COMPLETED');
    expect((done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('noted: May 4');
    await new Promise((resolve) => setTimeout(resolve, 4000));
    expect(await pathOf(answered.id)).toEqual(['"asking"', '"answered"']);
    expect(asJson(await client.getTask({ id: answered.id } as never)).status.state).toBe('TASK_STATE_COMPLETED');
  });

  it('a run that showed nothing before its end still gets its output\'s artifacts as the result', async () => {
    const client = await sdkClient(keel.url, 'quiet', token);
    const task = asJson(await client.sendMessage(textMessage('anything')));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect((task.artifacts as Json[]).map((artifact) => [artifact.name, artifact.parts[0].text ?? artifact.parts[0].data])).toEqual([
      ['result', { quiet: true }],
      ['notes', 'nothing to show'],
      ['answer', 'quiet answer'],
    ]);
    expect(await journalStatuses(task.id)).toEqual(['TASK_STATE_WORKING', 'artifact result', 'artifact notes', 'artifact answer', 'TASK_STATE_COMPLETED']);
  });
});
