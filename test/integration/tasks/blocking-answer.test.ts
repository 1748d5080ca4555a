import { randomUUID } from 'node:crypto';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';
import { JOURNAL_CHANNEL, journalNotice } from '../../../src/tasks/journal.js';
import { JournalWait } from '../../../src/tasks/journal-listener.js';
import { getTaskRowById } from '../../../src/tasks/task-repository.js';
import { callA2A, expectA2AResult, type Binding } from '../../support/a2a-wire.js';
import { recordStatements, type StatementLog } from '../../support/statement-log.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { testQueuePrefix } from '../../support/test-queues.js';
import { newClientToken } from '../push/push-support.js';

// A blocking SendMessage whose run completes in the same process is answered with the task as the
// completion transaction wrote it, once its COMMIT has returned, without reading the task or the
// journal again (decision 0022). A COMMIT whose outcome the process does not know leaves the
// answer to a read, and so does an end committed by another process (the NOTIFY path).

// getTaskRow (src/tasks/task-repository.ts) and journalEndedAfter (src/tasks/journal.ts) as sent.
const TASK_READ = /FROM a2a_tasks t JOIN runs r ON r\.id = t\.run_id\s+WHERE t\.id = \$\d+ AND t\.owner = \$\d+/;
const JOURNAL_READ = /SELECT EXISTS \(\s*SELECT 1 FROM a2a_events WHERE task_id/;

let log: StatementLog;

beforeAll(() => {
  log = recordStatements();
});
afterAll(() => log?.stop());

let counter = 0;
const send = (keel: TestKeel, token: string, binding: Binding, text: string) => {
  counter += 1;
  return callA2A(keel.url, 'echo', binding, 'SendMessage', { message: { messageId: `blocking-${counter}-${Date.now()}`, role: 'ROLE_USER', parts: [{ text }] } }, { token });
};
const getTask = (keel: TestKeel, token: string, binding: Binding, id: string) => callA2A(keel.url, 'echo', binding, 'GetTask', { id }, { token });

describe('in one process', () => {
  let keel: TestKeel;
  let token = '';
  beforeAll(async () => {
    // The statement log sees every statement of the process: no maintenance sweep during the test
    // (the start-up sweep and retention purge are waited out below).
    keel = await startTestKeel({ overrides: { KEEL_PRIVACY_LEVEL: 'full', KEEL_MAINTENANCE_SWEEP_SECONDS: '3600' } });
    token = await newClientToken(keel.context.pool);
  });
  afterAll(async () => keel?.dispose());

  for (const binding of ['JSONRPC', 'HTTP+JSON'] as const) {
    it(`the answer is the committed task, with no read of the task or the journal (${binding})`, async () => {
      // Warm: the first task of a process pays its one-time reads (types, the agent's first claim).
      expectA2AResult(binding, await send(keel, token, binding, 'warm up'));
      // The maintenance jobs Keel runs as it starts (a sweep, the retention purge) once landed in
      // the measured window: wait until the process has sent nothing for half a second.
      await log.untilQuiet(500);
      for (const text of ['answer from the commit', 'réponse 😀']) {
        const from = log.entries.length;
        const answer = expectA2AResult(binding, await send(keel, token, binding, text));
        const sent = log.since(from);
        const task = answer.task as { id: string; status: { state: string }; artifacts: Array<{ parts: Array<{ text: string }> }> };
        expect(task.status.state).toBe('TASK_STATE_COMPLETED');
        expect(task.artifacts[0]!.parts[0]!.text).toContain(text);
        expect(log.since(from, TASK_READ), 'a read of the task row for the answer').toEqual([]);
        expect(log.since(from, JOURNAL_READ), 'a read of the journal for the answer').toEqual([]);
        // The whole task in this process (creation, claim, completion with its journal) on the
        // Redis queue: no other transaction than those three.
        if (process.env.KEEL_TEST_QUEUE === 'redis') {
          expect(log.commitsSince(from), sent.map((entry) => entry.text.slice(0, 60)).join('\n')).toBeLessThanOrEqual(3);
        }
        // What GetTask reads afterwards is what the answer said.
        expect(expectA2AResult(binding, await getTask(keel, token, binding, task.id))).toEqual(task);
      }
    });
  }

  it('a wait ended by a NOTIFY while this process commits waits for that commit, and reads when its outcome is unknown', async () => {
    const taskId = randomUUID();
    const wait = new JournalWait(keel.listener, taskId);
    try {
      const local = keel.listener.beginLocalCommit(taskId);
      // The NOTIFY can arrive before the committing process hears its COMMIT returned.
      await keel.context.pool.query(sql.unsafe`SELECT pg_notify(${JOURNAL_CHANNEL}, ${journalNotice(taskId, 2, true)})`);
      expect(await wait.until(keel.context.pool, 0, 10_000)).toBe(true);
      let answered: unknown = 'pending';
      const committed = wait.committedTask(10_000).then((row) => (answered = row));
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(answered).toBe('pending');
      local.unknown();
      expect(await committed).toBeNull();
    } finally {
      wait.close();
    }
  });

  it('a commit of this process ends the wait at once and hands over the task it wrote', async () => {
    const answer = expectA2AResult('JSONRPC', await send(keel, token, 'JSONRPC', 'a row to hand over')) as { task: { id: string } };
    const row = (await getTaskRowById(keel.context.pool, answer.task.id))!;
    const taskId = randomUUID();
    const wait = new JournalWait(keel.listener, taskId);
    try {
      const local = keel.listener.beginLocalCommit(taskId);
      const ended = wait.until(keel.context.pool, 0, 10_000);
      local.committed({ ...row, id: taskId }, { taskId, lastSequence: 3, ends: true });
      expect(await ended).toBe(true);
      expect(await wait.committedTask(0)).toMatchObject({ id: taskId, state: 'TASK_STATE_COMPLETED' });
    } finally {
      wait.close();
    }
  });
});

describe('across processes', () => {
  let api: TestKeel;
  let worker: TestKeel;
  let token = '';
  let drop: () => Promise<void> = async () => undefined;
  beforeAll(async () => {
    const database = await createEmptyDatabase();
    drop = () => database.drop();
    const env = { KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()), KEEL_QUEUE_PREFIX: testQueuePrefix() };
    const overrides = { KEEL_PRIVACY_LEVEL: 'full' };
    api = await startTestKeel({ databaseUrl: database.url, env, overrides, start: { role: 'api' } });
    worker = await startTestKeel({ databaseUrl: database.url, env, overrides, start: { role: 'worker' } });
    token = await newClientToken(api.context.pool);
  });
  afterAll(async () => {
    await api?.dispose();
    await worker?.dispose();
    await drop();
  });

  it('an end committed by another process is answered from the journal NOTIFY and a read of the task', async () => {
    const from = log.entries.length;
    const answer = expectA2AResult('JSONRPC', await send(api, token, 'JSONRPC', 'answered by a read')) as { task: { id: string; status: { state: string } } };
    expect(answer.task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(log.since(from, TASK_READ).length).toBeGreaterThanOrEqual(1);
    expect(expectA2AResult('JSONRPC', await getTask(api, token, 'JSONRPC', answer.task.id))).toEqual(answer.task);
  });
});
