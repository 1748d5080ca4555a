import { SubscribeToTaskRequest } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { createEmptyDatabase } from '../support/test-database.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// A fast run's end is NOTIFYd only when a stream watches its task (decision 0047): the process
// that ran it wakes its own requests. A stream opened in another process marks the task first, so
// that process hears the end at once, not at its journal listener's 15 s re-read.

const overrides = {
  KEEL_PROVIDERS: { slow: { type: 'scripted', steps: [{ reply: 'slow done', delayMs: 1500 }] } },
  KEEL_AGENTS: [{ id: 'slow', name: 'Slow', provider: 'slow' }],
  // This file is about the fast path: it keeps it when the suite runs with direct writes.
  KEEL_RUNS_DIRECT_WRITES: 'false',
};

let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
let runner: TestKeel;
let other: TestKeel;
let token = '';

beforeAll(async () => {
  database = await createEmptyDatabase();
  const masterKey = Buffer.alloc(32, 5).toString('base64');
  runner = await startTestKeel({ databaseUrl: database.url, env: { KEEL_MASTER_KEY: masterKey }, overrides });
  other = await startTestKeel({ databaseUrl: database.url, env: { KEEL_MASTER_KEY: masterKey }, overrides });
  const client = await createClient(runner.context.pool, 'remote-stream');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await other?.dispose();
  await runner?.dispose();
  await database?.drop();
});

const runOf = (taskId: string) =>
  runner.context.pool.one(sql.type(z.object({ claimed_by: z.string().nullable(), settled_at: z.number().nullable() }))`
    SELECT claimed_by, settled_at FROM runs WHERE id = ${taskId}`);

describe('a stream in another process of a task run on the fast path', () => {
  it('ends with the run, woken by the NOTIFY its subscription asked for', async () => {
    const onRunner = await sdkClient(runner.url, 'slow', token);
    const task = (await onRunner.sendMessage(textMessage('take your time', { returnImmediately: true }))) as { id: string; status: { state: number } };
    expect((await runOf(task.id)).claimed_by, 'run by the process that received it').toBe(runner.context.workerId);

    const onOther = await sdkClient(other.url, 'slow', token);
    const events: unknown[] = [];
    for await (const event of onOther.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: task.id }))) events.push(event);
    const endedAt = Date.now();

    const last = events.at(-1) as { payload: { $case: string; value: { status?: { state: number } } } } | undefined;
    expect(last?.payload.$case).toBe('statusUpdate');
    expect(last?.payload.value.status?.state, 'the stream ends with COMPLETED').toBe(3);
    const { settled_at: settledAt } = await runOf(task.id);
    expect(settledAt).not.toBeNull();
    // Without the NOTIFY the other process would read the journal again only after 15 s.
    expect(endedAt - settledAt!, 'from the commit of the end to the end of the remote stream').toBeLessThan(5_000);
    const watched = await runner.context.pool.oneFirst(sql.type(z.object({ watched: z.boolean() }))`SELECT watched FROM a2a_tasks WHERE id = ${task.id}`);
    expect(watched).toBe(true);
  });
});
