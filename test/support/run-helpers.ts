import { createHash } from 'node:crypto';
import { createAgentRun, enqueueRun } from '../../src/runs/create-agent-run.js';
import { userRequest } from '../../src/runs/run-request.js';
import type { RunRow } from '../../src/runs/run-row.js';
import { getRun } from '../../src/runs/run-repository.js';
import type { SettledRun } from '../../src/writes/completion-input.js';
import type { DatabasePool } from 'slonik';
import type { TestKeel } from './test-keel.js';
import { waitForRunStatus } from './wait-for.js';

export const TEST_TOOLS_MODULE = new URL('../fixtures/test-tools.ts', import.meta.url).pathname;

/** Creates a run the way the A2A layer will (QUEUED row, then the job) and returns its id. */
export async function startRun(keel: TestKeel, agentId: string, text: string): Promise<string> {
  const created = await createAgentRun(keel.context.pool, keel.context.sealer, keel.registry, agentId, userRequest(text));
  if (!created.ok) throw new Error(`cannot create a run for ${agentId}: ${created.reason}`);
  await enqueueRun(keel.context.queues, created.run.id);
  return created.run.id;
}

export const TERMINAL = ['completed', 'failed', 'cancelled'] as const;

export async function runToEnd(keel: TestKeel, agentId: string, text: string, timeoutMs = 30_000): Promise<RunRow> {
  const id = await startRun(keel, agentId, text);
  return waitForRunStatus(keel.context.pool, id, TERMINAL, timeoutMs);
}

/** What a completion reports of a run (SettledRun), read from the run's stored row. */
export async function storedSettledRun(pool: DatabasePool, runId: string): Promise<SettledRun | null> {
  const run = await getRun(pool, runId);
  return run && { id: run.id, task_id: run.task_id, status: run.status, termination_reason: run.termination_reason, failure_detail: run.failure_detail };
}

/**
 * A test worker's holder: its name, and a claim token fixed by the name (a UUID from its hash), so
 * a test that claims with `testClaim(name)` writes as `testHolder(name)`. Each claim of a real
 * worker stamps a new token (decision 0088); a test wanting that passes a token of its own.
 */
export const testHolder = (workerId: string): { workerId: string; token: string } => {
  const hex = createHash('sha256').update(`keel-test-worker:${workerId}`).digest('hex');
  return { workerId, token: `${hex.slice(0, 8)}-${hex.slice(8, 12)}-4${hex.slice(13, 16)}-8${hex.slice(17, 20)}-${hex.slice(20, 32)}` };
};

/** A test worker's claim (its lease, and the token of `testHolder`). */
export const testClaim = (workerId: string, leaseMs = 60_000) => ({ ...testHolder(workerId), leaseMs });
