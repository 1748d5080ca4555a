import { z } from 'zod';
import { RUN_STATUSES, TERMINATION_REASONS } from '../../machines/run.machine.js';

const level = z.enum(['none', 'metadata', 'redacted', 'full']);

/** A `runs` row as repositories return it (sealed columns stay sealed bytes). */
export const runRow = z.object({
  id: z.string().uuid(),
  agent: z.string(),
  status: z.enum(RUN_STATUSES),
  termination_reason: z.enum(TERMINATION_REASONS).nullable(),
  truncated: z.boolean(),
  revision: z.number(),
  claimed_by: z.string().nullable(),
  /** The token of the run's last claim (sql/0031): the fence every write of a held run carries; cleared by a requeue, a dead-letter, a release. */
  claim_token: z.string().nullable().optional(),
  lease_expires_at: z.number().nullable(),
  requeue_count: z.number(),
  available_at: z.number(),
  audit_level: level,
  answer_level: level,
  queued_request: z.instanceof(Buffer).nullable(),
  suspended_state: z.instanceof(Buffer).nullable(),
  iterations: z.number(),
  tool_calls: z.number(),
  input_tokens: z.number(),
  output_tokens: z.number(),
  error_class: z.string().nullable(),
  inside_non_idempotent_call: z.string().nullable(),
  failure_detail: z.record(z.unknown()).nullable(),
  provider: z.string().nullable(),
  task_id: z.string().nullable(),
  status_changed_at: z.number(),
  created_at: z.number(),
  updated_at: z.number(),
  started_at: z.number().nullable(),
  settled_at: z.number().nullable(),
  /** A statechart agent's run: the definition it runs and the state it stands in (sql/0017). */
  machine_hash: z.string().nullable().optional(),
  machine_state: z.unknown().optional(),
  /** When the run's durable timer is due (a statechart run suspended with one), else null. */
  timer_due_at: z.number().nullable().optional(),
  /** Its place in its task's trace (sql/0030, src/tracing/run-trace.ts), null when stored while tracing was off. */
  trace_context: z.string().nullable().optional(),
  trace_parent_span: z.string().nullable().optional(),
  trace_state: z.string().nullable().optional(),
});
export type RunRow = z.infer<typeof runRow>;

/** A run row is written at revision 1; every guarded transition adds one (src/runs/run-repository.ts). */
export const INSERTED_REVISION = 1;
/** The revision of a run whose only transition so far is the claim that just took it. */
export const FIRST_CLAIM_REVISION = INSERTED_REVISION + 1;

/**
 * Whether a claimed run is on its first claim: never run before, so it has no audit rows yet (a
 * requeued, resumed or taken-over run has moved past FIRST_CLAIM_REVISION).
 */
export function isFirstClaim(run: Pick<RunRow, 'revision' | 'requeue_count' | 'suspended_state'>): boolean {
  return run.revision === FIRST_CLAIM_REVISION && run.requeue_count === 0 && run.suspended_state === null;
}
