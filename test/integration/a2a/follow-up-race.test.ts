import { GetTaskRequest, Message, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitForRunStatus } from '../../support/wait-for.js';

// A follow-up answered by a fast worker: the worker completes the task right after the follow-up
// hands the run over. Nothing the follow-up writes may land after that completion: the result (a
// final status message, a direct message) and the history (the client's reply, the agent's last
// message) are what the completion committed.
//
// The interleaving is forced in the database, without any hook in Keel: a statement trigger the
// test installs on its own database holds every write to the task row made by a transaction that
// has written or locked nothing yet (one that neither handed the run over nor holds the task row)
// while the task's run is running, until the run has left `running`. A follow-up that writes the
// task after the hand-off, in a transaction of its own, is held until the worker's completion has
// committed; the worker's own writes (completion, projection) lock the task row first and are not.
//
// And the follow-up's writes go with the hand-off or not at all: when one of them fails (the
// history write, the push config sent with the reply) the run is not handed over and still waits.

const AGENT = 'conformance';

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
      KEEL_PROVIDERS: { conformance: { type: 'conformance', streamTimeoutSeconds: 1 } },
      KEEL_AGENTS: [{ id: AGENT, name: 'Conformance', provider: 'conformance', limits: { maxIterations: 10 } }],
    },
  });
  const client = await createClient(keel.context.pool, 'follow-up-race');
  if (!client.ok) throw new Error('client');
  token = client.token;
  await keel.context.pool.query(sql.unsafe`CREATE TABLE held_task (task_id uuid PRIMARY KEY)`);
  await keel.context.pool.query(sql.unsafe`
    CREATE FUNCTION hold_unlocked_task_write() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      held uuid;
      deadline timestamptz := clock_timestamp() + interval '20 seconds';
    BEGIN
      -- Writes made by another trigger (the run's state following its status) are the run's own.
      IF pg_trigger_depth() > 1 THEN RETURN NULL; END IF;
      -- A transaction with an id has written or locked a row already: the hand-off itself, or a
      -- writer holding the task row (completion, projection).
      IF pg_current_xact_id_if_assigned() IS NOT NULL THEN RETURN NULL; END IF;
      SELECT task_id INTO held FROM held_task;
      IF held IS NULL OR (SELECT status FROM runs WHERE task_id = held) <> 'running' THEN RETURN NULL; END IF;
      -- Each statement of a volatile function sees what committed before it: the loop sees the
      -- worker's completion once it has committed.
      WHILE (SELECT status FROM runs WHERE task_id = held) = 'running' LOOP
        IF clock_timestamp() > deadline THEN RAISE EXCEPTION 'the held task write waited 20 s for the run to end'; END IF;
        PERFORM pg_sleep(0.02);
      END LOOP;
      RETURN NULL;
    END
    $$`);
  await keel.context.pool.query(sql.unsafe`
    CREATE TRIGGER hold_unlocked_task_write BEFORE UPDATE ON a2a_tasks FOR EACH STATEMENT EXECUTE FUNCTION hold_unlocked_task_write()`);
  // The follow-up's history write fails for this task, as if the process died just before it.
  await keel.context.pool.query(sql.unsafe`CREATE TABLE failing_task (task_id uuid PRIMARY KEY)`);
  await keel.context.pool.query(sql.unsafe`
    CREATE FUNCTION fail_history_write() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.history IS DISTINCT FROM OLD.history AND EXISTS (SELECT 1 FROM failing_task WHERE task_id = NEW.id) THEN
        RAISE EXCEPTION 'the history write of task % fails', NEW.id;
      END IF;
      RETURN NEW;
    END
    $$`);
  await keel.context.pool.query(sql.unsafe`
    CREATE TRIGGER fail_history_write BEFORE UPDATE ON a2a_tasks FOR EACH ROW EXECUTE FUNCTION fail_history_write()`);
  // A push config with the follow-up's id appears while the follow-up hands the run over (as a
  // concurrent CreateTaskPushNotificationConfig would, after the follow-up checked the id).
  await keel.context.pool.query(sql.unsafe`CREATE TABLE racing_config (task_id uuid PRIMARY KEY, config_id text NOT NULL)`);
  await keel.context.pool.query(sql.unsafe`
    CREATE FUNCTION race_push_config() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO push_configs (task_id, id, owner, url)
        SELECT c.task_id, c.config_id, t.owner, 'http://127.0.0.1:9/elsewhere' FROM racing_config c JOIN a2a_tasks t ON t.id = c.task_id
        WHERE c.task_id = NEW.task_id;
      RETURN NEW;
    END
    $$`);
  await keel.context.pool.query(sql.unsafe`
    CREATE TRIGGER race_push_config BEFORE UPDATE OF status ON runs FOR EACH ROW
      WHEN (OLD.status = 'waiting_for_input' AND NEW.status = 'running') EXECUTE FUNCTION race_push_config()`);
});
afterAll(async () => {
  await keel?.dispose();
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const unique = (prefix: string) => `${prefix}-${Math.random().toString(36).slice(2)}`;
const texts = (history: Json[] | undefined) => (history ?? []).map((message) => `${message.role}: ${message.parts.map((part: Json) => part.text ?? '').join('')}`);

/** A task waiting for input, whose task-row writes the trigger holds from now on. */
async function waitingTask(client: Awaited<ReturnType<typeof sdkClient>>): Promise<Json> {
  const created = Task.toJSON((await client.sendMessage(textMessage('start', { messageId: unique('tck-input-required') }))) as Task) as Json;
  expect(created.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
  await keel.context.pool.query(sql.unsafe`DELETE FROM held_task`);
  await keel.context.pool.query(sql.unsafe`INSERT INTO held_task (task_id) VALUES (${created.id})`);
  return created;
}

describe('a follow-up answered before its own writes would commit', () => {
  it('keeps the final status message and the whole history (reply and answer)', async () => {
    const client = await sdkClient(keel.url, AGENT, token);
    const task = await waitingTask(client);

    const answered = Task.toJSON((await client.sendMessage(textMessage('my reply', { taskId: task.id, messageId: unique('tck-complete-task') }))) as Task) as Json;
    await waitForRunStatus(keel.context.pool, task.id, ['completed']);

    const read = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 50 }))) as Task) as Json;
    expect(read.status.state).toBe('TASK_STATE_COMPLETED');
    expect(read.status.message, 'the final status message of the completed task').toMatchObject({ role: 'ROLE_AGENT', parts: [{ text: 'Hello from TCK' }] });
    expect(texts(read.history)).toContain('ROLE_USER: my reply');
    expect(texts(read.history).at(-1), 'the agent answer is the last history entry').toBe('ROLE_AGENT: Hello from TCK');
    expect(answered.status.message).toMatchObject({ parts: [{ text: 'Hello from TCK' }] });
  });

  it('keeps the direct message the task completed with', async () => {
    const client = await sdkClient(keel.url, AGENT, token);
    const task = await waitingTask(client);

    const answered = await client.sendMessage(textMessage('my reply', { taskId: task.id, messageId: unique('tck-message-response') }));
    expect('messageId' in answered ? (Message.toJSON(answered as Message) as Json).parts : null, 'SendMessage answers with the direct message').toEqual([
      { text: 'Direct message response' },
    ]);
    await waitForRunStatus(keel.context.pool, task.id, ['completed']);

    const stored = await keel.context.pool.one(sql.type(z.object({ direct_message: z.boolean(), has_message: z.boolean() }))`
      SELECT direct_message, status_message IS NOT NULL AS has_message FROM a2a_tasks WHERE id = ${task.id}`);
    expect(stored).toEqual({ direct_message: true, has_message: true });
    const read = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 50 }))) as Task) as Json;
    expect(read.status.state).toBe('TASK_STATE_COMPLETED');
    expect(texts(read.history)).toContain('ROLE_USER: my reply');
    expect(texts(read.history).at(-1)).toBe('ROLE_AGENT: Direct message response');
  });

  it('hands the run over only with the reply in history: when that write fails, the task still waits for input', async () => {
    const client = await sdkClient(keel.url, AGENT, token);
    const task = await waitingTask(client);
    await keel.context.pool.query(sql.unsafe`INSERT INTO failing_task (task_id) VALUES (${task.id})`);

    await expect(client.sendMessage(textMessage('lost reply', { taskId: task.id, messageId: unique('tck-complete-task') }))).rejects.toThrow();
    // Nothing of the follow-up was committed: no worker got the input.
    const run = await keel.context.pool.one(sql.type(z.object({ status: z.string() }))`SELECT status FROM runs WHERE id = ${task.id}`);
    expect(run.status, 'the run after a follow-up whose history write failed').toBe('waiting_for_input');
    const waiting = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 50 }))) as Task) as Json;
    expect(waiting.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    expect(texts(waiting.history)).not.toContain('ROLE_USER: lost reply');

    // The client sends it again once the write can succeed: the task continues as if nothing happened.
    await keel.context.pool.query(sql.unsafe`DELETE FROM failing_task`);
    await client.sendMessage(textMessage('my reply', { taskId: task.id, messageId: unique('tck-complete-task') }));
    await waitForRunStatus(keel.context.pool, task.id, ['completed']);
    const read = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 50 }))) as Task) as Json;
    expect(texts(read.history).filter((line) => line.startsWith('ROLE_USER'))).toEqual(['ROLE_USER: start', 'ROLE_USER: my reply']);
    expect(read.status.message).toMatchObject({ parts: [{ text: 'Hello from TCK' }] });
  });

  it('hands nothing over when the push config sent with the reply cannot be created: -32602 naming the id', async () => {
    const client = await sdkClient(keel.url, AGENT, token);
    const task = await waitingTask(client);
    await keel.context.pool.query(sql.unsafe`INSERT INTO racing_config (task_id, config_id) VALUES (${task.id}, 'mine')`);

    const response = await fetch(`${keel.url}/a2a/${AGENT}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}` },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'SendMessage',
        params: {
          message: { messageId: unique('tck-complete-task'), taskId: task.id, role: 'ROLE_USER', parts: [{ text: 'lost reply' }] },
          configuration: { taskPushNotificationConfig: { id: 'mine', url: 'http://127.0.0.1:9/hook' } },
        },
      }),
    });
    const body = (await response.json()) as Json;
    expect(body.error?.code).toBe(-32602);
    expect(JSON.stringify(body.error)).toContain('configuration.taskPushNotificationConfig.id');

    const stored = await keel.context.pool.one(sql.type(z.object({ status: z.string(), configs: z.number() }))`
      SELECT r.status, (SELECT count(*)::int FROM push_configs WHERE task_id = r.id) AS configs FROM runs r WHERE r.id = ${task.id}`);
    expect(stored, 'the run still waits, and neither config was kept').toEqual({ status: 'waiting_for_input', configs: 0 });
    const waiting = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 50 }))) as Task) as Json;
    expect(waiting.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    expect(waiting.status.message).toMatchObject({ parts: [{ text: 'Input required by TCK' }] });
    expect(texts(waiting.history)).not.toContain('ROLE_USER: lost reply');
  });
});
