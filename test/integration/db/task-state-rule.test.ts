import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { RUN_STATUSES } from '../../../machines/run.machine.js';
import { taskStateOf } from '../../../src/tasks/task-state.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// The A2A state of a run is written twice: by the trigger on runs (keel_task_state, sql/0004) and
// by taskStateOf, which the projector and the answers use. The two must never disagree, or a task
// row would say one state while its journal and the wire say another.

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

// What a run's failure_detail can hold as far as the rule is concerned: nothing, a failure without
// the flag, a rejection, and the flag explicitly off.
const FAILURE_DETAILS: ReadonlyArray<Record<string, unknown> | null> = [
  null,
  {},
  { reason: 'provider_failed', message: 'the model is down' },
  { rejected: true, message: 'refused by policy' },
  { rejected: false },
];

async function sqlTaskState(status: string, failureDetail: Record<string, unknown> | null): Promise<string | null> {
  const failure = failureDetail === null ? sql.fragment`NULL` : sql.fragment`${JSON.stringify(failureDetail)}::jsonb`;
  return db.pool.oneFirst(sql.type(z.object({ state: z.string().nullable() }))`SELECT keel_task_state(${status}, ${failure}) AS state`);
}

describe('keel_task_state() and taskStateOf agree', () => {
  for (const status of RUN_STATUSES) {
    it(`for a run that is ${status}`, async () => {
      for (const failureDetail of FAILURE_DETAILS) {
        const inDatabase = await sqlTaskState(status, failureDetail);
        expect({ status, failureDetail, state: inDatabase }).toEqual({ status, failureDetail, state: taskStateOf(status, failureDetail) });
      }
    });
  }
});
