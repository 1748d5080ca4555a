import type { HeldRows } from '../src/writes/completion-input.js';
import type { RegisteredAgent } from '../src/agents/agent-registry.js';
import type { FastRun } from '../src/runs/fast-runs.js';
import { FIRST_CLAIM_REVISION, type RunRow } from '../src/runs/run-row.js';
import { heldRowsOfFastRun } from '../src/writes/task-creation.js';

// A fast run's rows as its insert wrote them (decisions 0025 and 0029): the process that inserted
// the run claimed knows them without reading them back, to start the run and to complete it.

/** The row a fast run's insert wrote (runValues with a FastStart), without reading it back. */
export const insertedRunRow = (run: FastRun, workerId: string, leaseMs: number): RunRow => ({
  id: run.id,
  agent: run.agent,
  status: 'running',
  termination_reason: null,
  truncated: false,
  revision: FIRST_CLAIM_REVISION,
  claimed_by: workerId,
  claim_token: run.claimToken,
  lease_expires_at: run.at + leaseMs,
  requeue_count: 0,
  available_at: run.at,
  audit_level: run.auditLevel,
  answer_level: run.answerLevel,
  queued_request: null,
  suspended_state: null,
  iterations: 0,
  tool_calls: 0,
  input_tokens: 0,
  output_tokens: 0,
  error_class: null,
  inside_non_idempotent_call: null,
  failure_detail: null,
  provider: run.provider,
  task_id: run.taskId,
  status_changed_at: run.at,
  created_at: run.at,
  updated_at: run.at,
  started_at: run.at,
  settled_at: null,
  trace_context: run.trace?.context ?? null,
  trace_parent_span: run.trace?.parentSpanId ?? null,
  trace_state: run.trace?.state ?? null,
});

/**
 * The run and task rows a fast run's completion checks instead of reading them (decision 0029),
 * or null when its completion must read: a statechart agent's run (its revision moves as it goes)
 * or a task with a push config (its deliveries are written by the transaction).
 */
export const heldRowsOf = (fast: FastRun | null, agent: RegisteredAgent): HeldRows | null =>
  fast && !agent.statechart && !fast.task.pushConfigured ? heldRowsOfFastRun(fast) : null;
