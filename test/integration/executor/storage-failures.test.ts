import { GetTaskRequest, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { newClientToken } from '../push/push-support.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { TERMINAL, TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// Writes that must not half-happen. Triggers this file installs on its own database refuse one
// write of one agent each (as a full disk or a constraint would): the completion's result write,
// and the suspension of an approval-gated turn. The run must fail, and its task say FAILED; a task
// never shows COMPLETED without its result, and no approval is promised that was not stored.

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        answers: { type: 'scripted', steps: [{ reply: 'the answer 42' }] },
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
      },
      KEEL_AGENTS: [
        { id: 'result-refused', name: 'Result refused', provider: 'answers' },
        { id: 'suspension-refused', name: 'Suspension refused', provider: 'mailer', tools: ['send_email'] },
      ],
    },
  });
  token = await newClientToken(keel.context.pool, 'storage-failures');
  await keel.context.pool.query(sql.unsafe`
    CREATE FUNCTION test_refuse_write() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      RAISE EXCEPTION 'test: % of % refused', TG_ARGV[0], TG_TABLE_NAME;
    END $$`);
  // The result of a result-refused task: its artifacts or final status message.
  await keel.context.pool.query(sql.unsafe`
    CREATE TRIGGER test_refuse_result BEFORE UPDATE ON a2a_tasks FOR EACH ROW
    WHEN (NEW.agent = 'result-refused' AND (NEW.artifacts IS NOT NULL OR NEW.status_message IS NOT NULL))
    EXECUTE FUNCTION test_refuse_write('the result')`);
  // The suspension of a suspension-refused run.
  await keel.context.pool.query(sql.unsafe`
    CREATE TRIGGER test_refuse_suspension BEFORE UPDATE ON runs FOR EACH ROW
    WHEN (NEW.agent = 'suspension-refused' AND NEW.status = 'waiting_for_approval')
    EXECUTE FUNCTION test_refuse_write('the suspension')`);
  // Every committed run status, as any reader of the database could have seen it.
  await keel.context.pool.query(sql.unsafe`CREATE TABLE test_run_statuses (run_id uuid NOT NULL, status text NOT NULL)`);
  await keel.context.pool.query(sql.unsafe`
    CREATE FUNCTION test_log_status() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO test_run_statuses VALUES (NEW.id, NEW.status);
      RETURN NEW;
    END $$`);
  await keel.context.pool.query(sql.unsafe`
    CREATE TRIGGER test_log_status AFTER INSERT OR UPDATE OF status ON runs FOR EACH ROW EXECUTE FUNCTION test_log_status()`);
});
afterAll(async () => keel?.dispose());

type WireTask = { status: { state: string; message?: { parts: Array<{ text?: string }> } }; artifacts?: unknown[] };

async function send(agent: string, text: string): Promise<string> {
  const client = await sdkClient(keel.url, agent, token);
  const task = (await client.sendMessage(textMessage(text, { returnImmediately: true }))) as { id: string };
  return task.id;
}

async function getTask(agent: string, taskId: string): Promise<WireTask> {
  const client = await sdkClient(keel.url, agent, token);
  return Task.toJSON(await client.getTask(GetTaskRequest.fromJSON({ id: taskId }))) as WireTask;
}

const taskRow = z.object({ state: z.string(), artifacts: z.instanceof(Buffer).nullable(), status_message: z.instanceof(Buffer).nullable() });
const readTaskRow = (taskId: string) =>
  keel.context.pool.one(sql.type(taskRow)`SELECT state, artifacts, status_message FROM a2a_tasks WHERE id = ${taskId}`);

/** The journal once it holds a terminal state (the projection follows the commit). */
const terminalJournal = (taskId: string) =>
  waitFor(async () => {
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    return journal.some((event) => event.state !== null && ['TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED'].includes(event.state)) ? journal : null;
  }, `a terminal state in the journal of ${taskId}`);

const messageText = (message: { parts: Array<{ text?: string }> } | undefined) => message?.parts.map((part) => part.text ?? '').join('') ?? '';

describe(`a write refused inside a transaction fails the run`, () => {
  it('a result that cannot be written in the completion transaction: run and task FAILED, never COMPLETED without it', async () => {
    const id = await send('result-refused', 'answer me');
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'not_retryable', failure_detail: { reason: 'result_not_stored' } });
    const statuses = await keel.context.pool.anyFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM test_run_statuses WHERE run_id = ${id}`);
    expect(statuses).not.toContain('completed');

    const task = await getTask('result-refused', id);
    expect(task.status.state).toBe('TASK_STATE_FAILED');
    expect(messageText(task.status.message)).toBe('the result could not be stored');
    expect(task.artifacts ?? []).toEqual([]);
    expect(JSON.stringify(task)).not.toContain('the answer 42');
    expect(await readTaskRow(id)).toMatchObject({ state: 'TASK_STATE_FAILED', artifacts: null, status_message: null });

    const journal = await terminalJournal(id);
    expect(journal.map((event) => event.state)).not.toContain('TASK_STATE_COMPLETED');
    expect(journal.filter((event) => event.kind === 'artifact')).toEqual([]);
    expect(journal.at(-1)).toMatchObject({ state: 'TASK_STATE_FAILED' });

    // The timeline keeps what the run did and says why it failed, never that it completed.
    const events = await listRunEvents(keel.context.pool, id);
    expect(events.map((event) => event.kind)).toEqual(['claimed', 'model_reply', 'failed']);
    expect(events.at(-1)).toMatchObject({ kind: 'failed', payload: { reason: 'not_retryable', detail: 'result_not_stored' } });
  });

  it('a suspension that cannot be stored: run and task FAILED, no approval promised', async () => {
    const id = await send('suspension-refused', 'tell ops');
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'approval_denied', suspended_state: null, failure_detail: { reason: 'suspension_not_stored' } });
    // No reader ever saw the run wait for an approval.
    const statuses = await keel.context.pool.anyFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM test_run_statuses WHERE run_id = ${id}`);
    expect(statuses).not.toContain('waiting_for_approval');
    expect(statuses.at(-1)).toBe('failed');

    const task = await getTask('suspension-refused', id);
    expect(task.status.state).toBe('TASK_STATE_FAILED');
    expect(messageText(task.status.message)).toBe('the approval this request needs could not be recorded');
    expect(await readTaskRow(id)).toMatchObject({ state: 'TASK_STATE_FAILED', artifacts: null });
    const journal = await terminalJournal(id);
    expect(journal.at(-1)).toMatchObject({ state: 'TASK_STATE_FAILED' });

    // The timeline shows no suspension that never happened (`keel runs show` would offer it for a
    // decision), and says why the run failed.
    const events = await listRunEvents(keel.context.pool, id);
    expect(events.map((event) => event.kind)).not.toContain('suspended');
    expect(events.at(-1)).toMatchObject({ kind: 'failed', payload: { reason: 'approval_denied', detail: 'suspension_not_stored' } });
  });
});
