import { Task } from '@a2a-js/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'slonik';
import { z } from 'zod';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { LOOPBACK, delegatingOverrides, freePort, newToken } from '../remote/remote-support.js';

// callRemoteAgent: a statechart agent of Keel A delegates to an agent of Keel B; its run waits for
// the remote task (waiting_for_dependency) and the machine goes on with the remote outcome.

const DELEGATE = new URL('../../fixtures/statecharts/delegate.machine.ts', import.meta.url).pathname;

let a: TestKeel;
let b: TestKeel;
const databases: TestDatabase[] = [];
let token = '';

beforeAll(async () => {
  const [databaseA, databaseB] = await Promise.all([createTestDatabase(), createTestDatabase()]);
  databases.push(databaseA, databaseB);
  const tokenForB = await newToken(databaseB.pool, 'keel-a');
  const portB = await freePort();
  const urlB = `http://${LOOPBACK}:${portB}`;
  b = await startTestKeel({
    databaseUrl: databaseB.url,
    overrides: {
      ...delegatingOverrides([], {
        providers: { worker: { type: 'scripted', steps: [{ delayMs: 300, reply: 'work done by keel-b' }] } },
        agents: [{ id: 'worker', name: 'Worker', provider: 'worker' }],
      }),
      KEEL_SERVER_PORT: String(portB),
    },
  });
  a = await startTestKeel({
    databaseUrl: databaseA.url,
    env: { KEEL_B_TOKEN: tokenForB },
    overrides: delegatingOverrides([{ id: 'keel-b', cardUrl: `${urlB}/a2a/worker/.well-known/agent-card.json`, credentialEnv: 'KEEL_B_TOKEN', registration: 'embedded' }], {
      agents: [{ id: 'delegates', name: 'Delegates', machine: DELEGATE, tools: ['remote_agent'] }],
    }),
  });
  token = await newToken(databaseA.pool, 'tester');
});
afterAll(async () => {
  await Promise.all([a?.dispose(), b?.dispose()]);
  await Promise.all(databases.map((database) => database.drop()));
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

describe('callRemoteAgent', () => {
  it('waits for the remote task and gives the machine its outcome', async () => {
    const client = await sdkClient(a.url, 'delegates', token);
    const sent = Task.toJSON((await client.sendMessage(textMessage('please do the work', { returnImmediately: true }))) as Task) as Json;
    await waitFor(async () => {
      const status = await a.context.pool.maybeOneFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM runs WHERE id = ${sent.id}`);
      return status === 'waiting_for_dependency' || status === 'completed';
    }, 'the run to wait for the remote task');
    const done = await waitFor(async () => {
      const task = Task.toJSON((await client.getTask({ id: sent.id } as never)) as Task) as Json;
      return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
    }, 'the task to complete', 45_000);
    const answer = (done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!;
    expect(answer.parts[0].text).toBe('keel-b answered');
    const result = (done.artifacts as Json[]).find((artifact) => artifact.name === 'result')!;
    expect(JSON.stringify(result.parts[0].data)).toContain('work done by keel-b');
    const remoteTasks = await b.context.pool.anyFirst(sql.type(z.object({ id: z.string() }))`SELECT id FROM a2a_tasks WHERE agent = 'worker'`);
    expect(remoteTasks).toHaveLength(1);
  });
});
