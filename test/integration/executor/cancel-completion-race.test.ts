import { CancelTaskRequest, GetTaskRequest, Task } from '@a2a-js/sdk';
import { TaskNotCancelableError } from '@a2a-js/sdk/errors';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { getRun } from '../../../src/runs/run-repository.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { newClientToken } from '../push/push-support.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { TERMINAL } from '../../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// CancelTask racing a completion that stores a result: exactly one wins. A task shown CANCELED
// never shows a result; a task shown COMPLETED always does; the run's termination reason, the task
// row, GetTask and the journal agree. The race is forced many times: each CancelTask is sent at a
// moment spread around the provider's reply (early ones cancel, late ones find it completed).

const TASKS = 50;
const PROVIDER_DELAY_MS = 200;
const WAVE = 5;
const ANSWER = 'the raced answer';

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PROVIDERS: { racer: { type: 'scripted', steps: [{ reply: ANSWER, delayMs: PROVIDER_DELAY_MS }] } },
      KEEL_AGENTS: [{ id: 'racer', name: 'Racer', provider: 'racer' }],
    },
  });
  token = await newClientToken(keel.context.pool, 'racer');
});
afterAll(async () => keel?.dispose());

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * When CancelTask is sent, counted from the run's claim (`runs.started_at`): most around the
 * provider's reply, so they meet the completion transaction; one in ten at once, without waiting
 * for the claim (the cancel wins); one in ten long after (the completion wins: a second after the
 * claim, five times the reply's delay; 4 s made half the file's time a wait).
 */
function cancelAfterClaimMs(index: number): number | 'at_once' {
  if (index % 10 === 0) return 'at_once';
  if (index % 10 === 9) return 5 * PROVIDER_DELAY_MS;
  return PROVIDER_DELAY_MS - 50 + ((index * 37) % 100);
}

const claimRow = z.object({ id: z.string(), started_at: z.number() });

/**
 * One poller for all tasks (not one per task, which would load the database it measures): resolves
 * each run's claim time as it appears (a run cancelled before its claim: the time it ended).
 */
function claimTimes(ids: readonly string[]): Map<string, Promise<number>> {
  const waiting = new Map<string, { resolve: (at: number) => void; promise: Promise<number> }>();
  for (const id of ids) {
    let resolve: (at: number) => void = () => undefined;
    const promise = new Promise<number>((done) => (resolve = done));
    waiting.set(id, { resolve, promise });
  }
  void (async () => {
    while (waiting.size > 0) {
      const rows = await keel.context.pool.any(sql.type(claimRow)`
        SELECT id, coalesce(started_at, updated_at) AS started_at FROM runs
        WHERE id = ANY(${sql.array([...waiting.keys()], 'uuid')}) AND (started_at IS NOT NULL OR status IN ('completed', 'failed', 'cancelled'))`);
      for (const row of rows) {
        waiting.get(row.id)!.resolve(row.started_at);
        waiting.delete(row.id);
      }
      await sleep(5);
    }
  })();
  return new Map([...waiting].map(([id, claim]) => [id, claim.promise]));
}

type WireTask = { id: string; status: { state: string }; artifacts?: Array<{ parts: Array<{ text?: string }> }> };

const resultRow = z.object({
  state: z.string(),
  artifacts: z.instanceof(Buffer).nullable(),
  status_message: z.instanceof(Buffer).nullable(),
  outputs: z.number(),
});

describe(`CancelTask racing a completion`, () => {
  it(`exactly one wins, ${TASKS} times over, and what is shown agrees with what is stored`, async () => {
    const client = await sdkClient(keel.url, 'racer', token);
    type Outcome = { id: string; cancel: 'canceled' | 'not_cancelable'; cancelState: string | null };
    // Cancels from well before the reply (surely first) to well after it (surely last): the ones in
    // between meet the completion transaction.
    // In waves of a few tasks, so the moment a cancel lands stays close to the moment it was meant
    // for (fifty requests at once on a loaded machine take longer than the run).
    const outcomes: Outcome[] = [];
    for (let wave = 0; wave < TASKS / WAVE; wave += 1) {
      const indexes = Array.from({ length: WAVE }, (_, offset) => wave * WAVE + offset);
      const ids = await Promise.all(
        indexes.map(async (index) => ((await client.sendMessage(textMessage(`race ${index}`, { returnImmediately: true }))) as { id: string }).id),
      );
      const claimed = claimTimes(ids);
      outcomes.push(
        ...(await Promise.all(
          ids.map(async (id, position): Promise<Outcome> => {
            const after = cancelAfterClaimMs(indexes[position]!);
            if (after !== 'at_once') await sleep((await claimed.get(id)!) + after - Date.now());
            try {
              const canceled = Task.toJSON(await client.cancelTask(CancelTaskRequest.fromJSON({ id }))) as WireTask;
              return { id, cancel: 'canceled', cancelState: canceled.status.state };
            } catch (error) {
              expect(error, String(error)).toBeInstanceOf(TaskNotCancelableError);
              return { id, cancel: 'not_cancelable', cancelState: null };
            }
          }),
        )),
      );
    }

    let discardedEnds = 0;
    for (const outcome of outcomes) {
      const run = await waitForRunStatus(keel.context.pool, outcome.id, TERMINAL);
      const shown = Task.toJSON(await client.getTask(GetTaskRequest.fromJSON({ id: outcome.id }))) as WireTask;
      const stored = await keel.context.pool.one(sql.type(resultRow)`
        SELECT t.state, t.artifacts, t.status_message, (SELECT count(*)::int FROM run_outputs o WHERE o.run_id = t.run_id) AS outputs
        FROM a2a_tasks t WHERE t.id = ${outcome.id}`);
      const journal = await waitFor(async () => {
        const events = await readJournal(keel.context.pool, keel.context.sealer, outcome.id, 0);
        return events.some((event) => event.state === 'TASK_STATE_CANCELED' || event.state === 'TASK_STATE_COMPLETED') ? events : null;
      }, `the terminal event of ${outcome.id}`);
      const journalStates = journal.map((event) => event.state).filter((state) => state === 'TASK_STATE_CANCELED' || state === 'TASK_STATE_COMPLETED');
      const what = `task ${outcome.id} (cancel: ${outcome.cancel})`;

      if (outcome.cancel === 'canceled') {
        // The cancel won: it said so, and no result exists anywhere.
        expect(outcome.cancelState, what).toBe('TASK_STATE_CANCELED');
        expect(run, what).toMatchObject({ status: 'cancelled', termination_reason: 'cancelled' });
        expect(shown.status.state, what).toBe('TASK_STATE_CANCELED');
        expect(shown.artifacts ?? [], what).toEqual([]);
        expect(JSON.stringify(shown), what).not.toContain(ANSWER);
        expect(stored, what).toMatchObject({ state: 'TASK_STATE_CANCELED', artifacts: null, status_message: null, outputs: 0 });
        expect(journalStates, what).toEqual(['TASK_STATE_CANCELED']);
        expect(journal.filter((event) => event.kind === 'artifact'), what).toEqual([]);
        // The timeline never says it completed; an end refused because the cancel won is recorded as discarded.
        const timeline = await waitFor(async () => {
          const events = await listRunEvents(keel.context.pool, outcome.id);
          return events.some((event) => event.kind === 'cancelled') ? events : null;
        }, `the cancel in the timeline of ${outcome.id}`);
        expect(timeline.map((event) => event.kind), what).not.toContain('completed');
        discardedEnds += timeline.filter((event) => event.kind === 'late_result_discarded' && (event.payload as { step?: string }).step === 'end').length;
      } else {
        // The completion won: the cancel was refused, and the result is there.
        expect(run, what).toMatchObject({ status: 'completed', termination_reason: 'completed' });
        expect(shown.status.state, what).toBe('TASK_STATE_COMPLETED');
        expect(JSON.stringify(shown.artifacts ?? []), what).toContain(ANSWER);
        expect(stored.state, what).toBe('TASK_STATE_COMPLETED');
        expect(stored.artifacts, what).not.toBeNull();
        expect(journalStates, what).toEqual(['TASK_STATE_COMPLETED']);
        expect(JSON.stringify(journal.filter((event) => event.kind === 'artifact').map((event) => event.response)), what).toContain(ANSWER);
      }
      expect((await getRun(keel.context.pool, outcome.id))!.revision, what).toBe(run.revision);
    }
    if (process.env.KEEL_PRINT_CANCEL_FIGURES) console.log(`[cancel] ends refused because the cancel won, recorded as discarded: ${discardedEnds}`);
    // The spread reaches both sides of the race.
    const sides = outcomes.map((outcome) => (outcome.cancel === 'canceled' ? 'C' : 'n')).join('');
    expect(sides, 'C: the cancel won, n: the completion won').toMatch(/C/);
    expect(sides, 'C: the cancel won, n: the completion won').toMatch(/n/);
  }, 120_000);
});
