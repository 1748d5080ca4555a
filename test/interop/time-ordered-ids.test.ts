import { TaskState } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { createEmptyDatabase } from '../support/test-database.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { millisecondsOf, VERSION_7_UUID } from '../support/uuid-v7.js';

// The ids a client sees for the tasks and contexts Keel opens are time-ordered (RFC 9562 version 7,
// decision 0045): each carries the millisecond it was minted, tasks opened one after another have
// increasing ids, and the task's run and rows are stored under the same id. A context id the client
// chose is kept as it is.

let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
let keel: TestKeel;
let token = '';

beforeAll(async () => {
  database = await createEmptyDatabase();
  keel = await startTestKeel({
    databaseUrl: database.url,
    overrides: { KEEL_PROVIDERS: { echo: { type: 'echo' } }, KEEL_AGENTS: [{ id: 'echo', name: 'Echo', provider: 'echo' }] },
  });
  const client = await createClient(keel.context.pool, 'ids');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
  await database?.drop();
});

type SentTask = { id: string; contextId: string; status: { state: TaskState } };

describe('time-ordered ids over the wire', () => {
  it('gives each new task and context a version 7 id of its moment, increasing task after task, and stores the run under it', async () => {
    const client = await sdkClient(keel.url, 'echo', token);
    const sent: Array<{ task: SentTask; before: number; after: number }> = [];
    for (let index = 0; index < 5; index += 1) {
      const before = Date.now();
      const task = (await client.sendMessage(textMessage(`turn ${index}`))) as SentTask;
      sent.push({ task, before, after: Date.now() });
    }
    for (const { task, before, after } of sent) {
      expect(task.status.state).toBe(TaskState.TASK_STATE_COMPLETED);
      for (const id of [task.id, task.contextId]) {
        expect(id).toMatch(VERSION_7_UUID);
        expect(millisecondsOf(id)).toBeGreaterThanOrEqual(before);
        expect(millisecondsOf(id)).toBeLessThanOrEqual(after);
      }
    }
    const ids = sent.map(({ task }) => task.id);
    expect([...ids].sort()).toEqual(ids);

    const stored = await keel.context.pool.any(
      sql.type(z.object({ task_id: z.string(), run_id: z.string(), context_id: z.string() }))`
        SELECT t.id::text AS task_id, r.id::text AS run_id, t.context_id FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
        WHERE t.id = ANY(${sql.array(ids, 'uuid')}) ORDER BY t.id`,
    );
    expect(stored).toEqual(sent.map(({ task }) => ({ task_id: task.id, run_id: task.id, context_id: task.contextId })));
  });

  it('keeps the context id a client chose, and a later turn in it gets a later task id', async () => {
    const client = await sdkClient(keel.url, 'echo', token);
    const chosen = 'my-own-context-7';
    const first = (await client.sendMessage(textMessage('first', { contextId: chosen }))) as SentTask;
    const second = (await client.sendMessage(textMessage('second', { contextId: chosen }))) as SentTask;
    expect(first.contextId).toBe(chosen);
    expect(second.contextId).toBe(chosen);
    expect(first.id).toMatch(VERSION_7_UUID);
    expect(second.id > first.id).toBe(true);
  });
});
