import { randomUUID } from 'node:crypto';
import { pino } from 'pino';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { completeRun } from '../../../src/writes/complete-run.js';
import type { CompletionInput } from '../../../src/writes/completion-input.js';
import { CompletionBatch } from '../../../src/writes/completion-batch.js';
import { createTasksInNewContexts, TaskCreations, type TaskCreation } from '../../../src/writes/task-creation.js';
import { getTaskRowById, taskView } from '../../../src/tasks/task-repository.js';
import { callA2A, expectA2AResult } from '../../support/a2a-wire.js';
import { recordStatements, type StatementLog } from '../../support/statement-log.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { storedSettledRun, testClaim } from '../../support/run-helpers.js';
import { testSealer } from '../../support/test-sealer.js';
import { journalOf, newClientToken } from '../push/push-support.js';

// Group commit (docs/decisions/0026-group-commit.md): the creations of concurrent requests are one
// statement, the completions of runs ending together one transaction. An item that fails inside a
// batch is written again alone, so it fails alone and every other item of the batch is written.

const sealer = testSealer();
const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });
const claim = testClaim('group-worker');

let db: TestDatabase;
let owner = '';
beforeAll(async () => {
  db = await createTestDatabase();
  owner = await createTestClient(db, 'group-commit');
});
afterAll(async () => db?.drop());

function creation(options: { id?: string; fast: boolean; text?: string }): TaskCreation {
  const id = options.id ?? randomUUID();
  const message = { messageId: `m-${id}`, role: 'ROLE_USER' as const, parts: [{ text: options.text ?? 'hello' }], contextId: id, taskId: id };
  return {
    task: { id, contextId: id, owner, agent: 'echo', answerLevel: 'full', history: [message], metadata: {} },
    run: { id, agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', provider: 'echo', taskId: id, request: { messages: [{ role: 'user', content: options.text ?? 'hello' }] } },
    fast: options.fast ? { claim, at: Date.now() } : null,
  };
}

const taskRow = z.object({ id: z.string(), state: z.string(), projected_revision: z.number(), last_sequence: z.number(), run_status: z.string(), events: z.number() });
const tasksOf = (ids: readonly string[]) =>
  db.pool.any(sql.type(taskRow)`
    SELECT t.id, t.state, t.projected_revision, t.last_sequence, r.status AS run_status,
      (SELECT count(*)::int FROM a2a_events e WHERE e.task_id = t.id) AS events
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE t.id = ANY(${sql.array(ids, 'uuid')}) ORDER BY t.id`);

describe('creations', () => {
  it('those ready together are one statement; one that cannot be written fails alone', async () => {
    const existing = creation({ fast: false });
    await createTasksInNewContexts(db.pool, sealer, [existing]);
    const batches: number[] = [];
    const creations = new TaskCreations(db.pool, sealer, { maxBatch: 64, onBatch: (size) => batches.push(size) });
    // 20 new tasks (every other one fast) and one whose id is taken: all submitted in one turn.
    const items = Array.from({ length: 20 }, (_, index) => creation({ fast: index % 2 === 0 }));
    const duplicate = creation({ id: existing.task.id, fast: true });
    const results = await Promise.allSettled([...items.slice(0, 10), duplicate, ...items.slice(10)].map((item) => creations.create(item)));

    expect(batches, 'one batch of all 21').toEqual([21]);
    const rejected = results.filter((result) => result.status === 'rejected');
    expect(rejected).toHaveLength(1);
    expect(String((rejected[0] as PromiseRejectedResult).reason)).toMatch(/duplicate key|unique/i);
    expect(results.indexOf(rejected[0]!), 'the duplicate is the one that failed').toBe(10);

    const rows = await tasksOf(items.map((item) => item.task.id));
    expect(rows).toHaveLength(20);
    for (const item of items) {
      const row = rows.find((candidate) => candidate.id === item.task.id)!;
      expect(row).toEqual(
        item.fast
          ? { id: item.task.id, state: 'TASK_STATE_WORKING', projected_revision: 2, last_sequence: 1, run_status: 'running', events: 1 }
          : { id: item.task.id, state: 'TASK_STATE_SUBMITTED', projected_revision: 0, last_sequence: 0, run_status: 'queued', events: 0 },
      );
    }
    // The existing task is untouched by the duplicate's attempts.
    expect((await tasksOf([existing.task.id]))[0]).toMatchObject({ state: 'TASK_STATE_SUBMITTED', events: 0 });
  });
});

describe('completions', () => {
  const completion = (id: string, overrides: Partial<CompletionInput> = {}): CompletionInput => ({
    runId: id,
    holder: claim,
    reason: 'completed',
    answer: `answer of ${id}`,
    totals: { iterations: 1, toolCalls: 0, inputTokens: 1, outputTokens: 1 },
    taskId: id,
    hasOutputs: false,
    ...overrides,
  });

  it('those ready together share one transaction; a ceiling tightened and a write that fails end alone, the others complete', async () => {
    const items = Array.from({ length: 6 }, () => creation({ fast: true }));
    await createTasksInNewContexts(db.pool, sealer, items);
    const ids = items.map((item) => item.task.id);
    // The answer ceiling tightened under the run (an operator, a fallback's policy): no result may be kept.
    await db.pool.query(sql.unsafe`UPDATE runs SET answer_level = 'metadata' WHERE id = ${ids[1]!}`);

    const batches: number[] = [];
    const rolledBack: string[] = [];
    const completions = new CompletionBatch(db.pool, sealer, logger, { maxBatch: 32, onBatch: (size) => batches.push(size) });
    const results = await Promise.allSettled(
      ids.map((id, index) =>
        completions.complete(
          completion(id, {
            rolledBack: () => rolledBack.push(id),
            ...(index === 0
              ? {
                  beforeSettle: async () => {
                    throw new Error('the result could not be stored');
                  },
                }
              : {}),
          }),
        ),
      ),
    );

    expect(batches, 'one batch of all six').toEqual([6]);
    expect(rolledBack.sort(), 'the failed batch gave back what each completion took').toEqual([...ids].sort());
    expect(results[0]).toMatchObject({ status: 'rejected', reason: { message: 'the result could not be stored' } });
    expect(results[1]).toMatchObject({ status: 'fulfilled', value: { settled: true, run: { status: 'failed', termination_reason: 'result_not_retainable' } } });
    for (const result of results.slice(2)) expect(result).toMatchObject({ status: 'fulfilled', value: { settled: true, run: { status: 'completed' } } });

    const rows = await tasksOf(ids);
    const stateOf = (id: string) => rows.find((row) => row.id === id)!;
    // The run whose write failed is still held by its worker: the executor fails it on its own.
    expect(stateOf(ids[0]!)).toMatchObject({ state: 'TASK_STATE_WORKING', run_status: 'running', events: 1 });
    expect(stateOf(ids[1]!)).toMatchObject({ state: 'TASK_STATE_FAILED', run_status: 'failed' });
    for (const id of ids.slice(2)) {
      expect(stateOf(id)).toMatchObject({ state: 'TASK_STATE_COMPLETED', run_status: 'completed' });
      const journal = await journalOf(db.pool, sealer, id);
      expect(journal.map((event) => event.state)).toEqual(['TASK_STATE_WORKING', null, 'TASK_STATE_COMPLETED']);
      const artifact = (journal[1]!.response as { artifactUpdate: { artifact: { parts: Array<{ text: string }> } } }).artifactUpdate.artifact;
      expect(artifact.parts[0]!.text).toBe(`answer of ${id}`);
    }
    // Written alone, the failing one's neighbours would have completed the same way.
    const alone = creation({ fast: true });
    await createTasksInNewContexts(db.pool, sealer, [alone]);
    expect(await completeRun(db.pool, sealer, logger, completion(alone.task.id))).toMatchObject({ settled: true, run: { status: 'completed' } });
  });
});

describe('completions written together', () => {
  const completion = (id: string, presentation: 'artifact' | 'status_message' | 'direct_message', answer: string): CompletionInput => ({
    runId: id,
    holder: claim,
    reason: presentation === 'artifact' ? 'completed' : 'max_iterations',
    answer,
    presentation,
    totals: { iterations: 3, toolCalls: 1, inputTokens: 11, outputTokens: 7 },
    taskId: id,
    hasOutputs: false,
  });
  const runColumns = z.object({
    status: z.string(),
    termination_reason: z.string().nullable(),
    truncated: z.boolean(),
    revision: z.number(),
    claimed_by: z.string().nullable(),
    lease_expires_at: z.number().nullable(),
    queued_request: z.instanceof(Buffer).nullable(),
    iterations: z.number(),
    tool_calls: z.number(),
    input_tokens: z.number(),
    output_tokens: z.number(),
    settled: z.boolean(),
  });
  const runOf = (id: string) =>
    db.pool.one(sql.type(runColumns)`
      SELECT status, termination_reason, truncated, revision, claimed_by, lease_expires_at, queued_request, iterations, tool_calls,
        input_tokens, output_tokens, settled_at IS NOT NULL AS settled FROM runs WHERE id = ${id}`);
  /** What a reader sees of a task, with its ids made neutral: the view, the journal, the watermark. */
  async function seen(id: string) {
    const row = (await getTaskRowById(db.pool, id))!;
    const neutral = (value: unknown) => JSON.parse(JSON.stringify(value).replaceAll(id, 'ID').replace(/"timestamp":"[^"]+"/g, '"timestamp":"T"'));
    const journal = await journalOf(db.pool, sealer, id);
    return {
      view: neutral(taskView(sealer, row, {})),
      journal: journal.map((event) => neutral({ sequence: event.sequence, kind: event.kind, state: event.state, response: event.response })),
      watermark: { projected_revision: row.projected_revision, last_sequence: row.last_sequence, projected_state: row.projected_state, state: row.state },
    };
  }

  it('store, journal and answer exactly what each would have alone', async () => {
    const cases = [
      ['artifact', 'an answer as an artifact'],
      ['status_message', 'an answer as the status message'],
      ['direct_message', 'an answer as a direct message'],
      ['artifact', 'réponse 😀 with "quotes"'],
    ] as const;
    const alone = cases.map(() => creation({ fast: true, text: 'same question' }));
    const together = cases.map(() => creation({ fast: true, text: 'same question' }));
    await createTasksInNewContexts(db.pool, sealer, [...alone, ...together]);

    for (const [index, item] of alone.entries()) await completeRun(db.pool, sealer, logger, completion(item.task.id, cases[index]![0], cases[index]![1]));
    const batches: number[] = [];
    const completions = new CompletionBatch(db.pool, sealer, logger, { maxBatch: 32, onBatch: (size) => batches.push(size) });
    const rolledBack: string[] = [];
    const results = await Promise.all(
      together.map((item, index) => completions.complete({ ...completion(item.task.id, cases[index]![0], cases[index]![1]), rolledBack: () => rolledBack.push(item.task.id) })),
    );
    expect(batches, 'one batch, written together').toEqual([cases.length]);
    expect(rolledBack, 'the batch committed as one, not item by item after a rollback').toEqual([]);

    for (const [index, item] of together.entries()) {
      const twin = alone[index]!.task.id;
      const id = item.task.id;
      expect(await runOf(id)).toEqual(await runOf(twin));
      expect(await seen(id)).toEqual(await seen(twin));
      // The blocking answer is built from what the batch wrote: it is the row as stored.
      const stored = (await getTaskRowById(db.pool, id))!;
      const result = results[index]!;
      if (!result.settled) throw new Error(`run ${id} was not settled`);
      expect(result.journaled!.task).toEqual(stored);
      expect(result.run).toEqual(await storedSettledRun(db.pool, id));
    }
  });
});

describe('over A2A', () => {
  let keel: TestKeel;
  let token = '';
  let log: StatementLog;
  beforeAll(async () => {
    log = recordStatements();
    keel = await startTestKeel({
      overrides: {
        KEEL_PRIVACY_LEVEL: 'full',
        KEEL_PROVIDERS: { echo: { type: 'echo' } },
        KEEL_AGENTS: [
          { id: 'echo', name: 'Echo', provider: 'echo' },
          { id: 'guarded', name: 'Guarded', provider: 'echo', guardrails: [{ type: 'denyPattern', name: 'no-forbidden', patterns: ['forbidden'], on: ['input'], reason: 'forbidden topic' }] },
        ],
      },
    });
    token = await newClientToken(keel.context.pool);
  });
  afterAll(async () => {
    log?.stop();
    await keel?.dispose();
  });

  it('concurrent requests with guardrail denials among them: every other task completes with its result', async () => {
    const send = (agent: string, text: string) =>
      callA2A(keel.url, agent, 'JSONRPC', 'SendMessage', { message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text }] } }, { token });
    await send('echo', 'warm up');
    const from = log.entries.length;
    const requests = Array.from({ length: 24 }, (_, index) => (index % 8 === 3 ? { agent: 'guarded', text: `forbidden ${index}` } : { agent: 'echo', text: `task ${index}` }));
    const answers = await Promise.all(requests.map(async (request) => ({ request, answer: expectA2AResult('JSONRPC', await send(request.agent, request.text)) })));
    for (const { request, answer } of answers) {
      if (request.agent === 'guarded') {
        expect(answer.task.status.state).toBe('TASK_STATE_FAILED');
        expect(answer.task.metadata?.['keel.terminationReason'] ?? answer.task.status.message).toBeTruthy();
      } else {
        expect(answer.task.status.state).toBe('TASK_STATE_COMPLETED');
        expect(answer.task.artifacts[0].parts[0].text).toBe(`echo: ${request.text}`);
      }
    }
    // Every task was created by a creation statement of its own or shared (how many share one
    // depends on how the requests arrive; the batching itself is checked under 'creations').
    const creations = log.since(from, /INSERT INTO contexts \(owner, id\)\s+SELECT c.owner, c.id FROM unnest/);
    expect(creations.length).toBeGreaterThan(0);
    expect(creations.length).toBeLessThanOrEqual(requests.length);
  });

  it('clients in a loop: creations and completions share statements, every task completed once with its result (decision 0048)', async () => {
    const send = (text: string) => callA2A(keel.url, 'echo', 'JSONRPC', 'SendMessage', { message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text }] } }, { token });
    const from = log.entries.length;
    // Eight clients, eight tasks each, a short random pause between a client's tasks: requests
    // arrive while other tasks' statements are in flight, as under real load.
    const answered: string[] = [];
    await Promise.all(
      Array.from({ length: 8 }, async (_, client) => {
        for (let turn = 0; turn < 8; turn += 1) {
          await new Promise((resolve) => setTimeout(resolve, Math.floor(Math.random() * 4)));
          const text = `client ${client} turn ${turn}`;
          const answer = expectA2AResult('JSONRPC', await send(text));
          expect(answer.task.status.state).toBe('TASK_STATE_COMPLETED');
          expect(answer.task.artifacts[0].parts[0].text).toBe(`echo: ${text}`);
          answered.push(answer.task.id);
        }
      }),
    );
    expect(new Set(answered).size).toBe(64);
    const writes = log.since(from, /keel:prepared/);
    const together = writes.filter((entry) => entry.text.includes('new_tasks AS') && entry.text.includes('held AS'));
    expect(together.length, 'statements that carried creations and completions').toBeGreaterThan(0);
    // 64 creations and 64 completions in fewer statements than tasks (about 27 here: under one commit per two tasks).
    expect(writes.filter((entry) => /new_tasks AS|held AS/.test(entry.text)).length).toBeLessThan(64);
    const states = await keel.context.pool.any(sql.type(z.object({ state: z.string(), events: z.number() }))`
      SELECT t.state, (SELECT count(*)::int FROM a2a_events e WHERE e.task_id = t.id) AS events FROM a2a_tasks t WHERE t.id = ANY(${sql.array(answered, 'uuid')})`);
    expect(states).toHaveLength(64);
    for (const state of states) expect(state).toEqual({ state: 'TASK_STATE_COMPLETED', events: 3 });
  });
});
