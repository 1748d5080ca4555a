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
});
export type RunRow = z.infer<typeof runRow>;
