import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import type { KeelContext } from '../context/keel-context.js';
import { wakePendingHeads } from './wake-deliveries.js';
import { transitionConfig } from './delivery-repository.js';
import { MASK } from './push-config-repository.js';

// What operators see and do about push configs (CLI and UI): lists with delivery counts, one
// config's deliveries and attempts, and resuming a paused config. Credentials are always masked.

const configSummary = z.object({
  task_id: z.string(),
  id: z.string(),
  url: z.string(),
  state: z.string(),
  state_reason: z.string().nullable(),
  auth_scheme: z.string().nullable(),
  credentials_hint: z.string().nullable(),
  deleted: z.boolean(),
  created_at: z.number(),
  pending: z.number(),
  delivered: z.number(),
  failed: z.number(),
});
export type PushConfigSummary = z.infer<typeof configSummary>;

/** Configs with their delivery counts, for the rows a condition selects. */
function summaries(db: CommonQueryMethods, where: ReturnType<typeof sql.fragment>, limit = 200): Promise<readonly PushConfigSummary[]> {
  return db.any(sql.type(configSummary)`
    SELECT c.task_id, c.id, c.url, c.state, c.state_reason, c.auth_scheme, c.credentials_hint, c.deleted_at IS NOT NULL AS deleted, c.created_at,
      count(d.*) FILTER (WHERE d.state = 'pending')::int AS pending,
      count(d.*) FILTER (WHERE d.state = 'delivered')::int AS delivered,
      count(d.*) FILTER (WHERE d.state IN ('dead', 'expired', 'cancelled', 'superseded'))::int AS failed
    FROM push_configs c LEFT JOIN push_deliveries d ON d.task_id = c.task_id AND d.config_id = c.id
    WHERE ${where}
    GROUP BY c.task_id, c.id ORDER BY c.created_at DESC LIMIT ${limit}`);
}

export async function listPushConfigSummaries(db: CommonQueryMethods, filter: { state?: string; limit?: number } = {}): Promise<readonly PushConfigSummary[]> {
  return summaries(db, filter.state ? sql.fragment`c.state = ${filter.state} AND c.deleted_at IS NULL` : sql.fragment`true`, filter.limit);
}

export const maskCredential = (scheme: string | null, hint: string | null) => (scheme ? `${scheme} ${hint ? `${MASK}${hint}` : ''}`.trim() : '-');

const deliveryDetail = z.object({
  id: z.string(),
  event_sequence: z.number(),
  state: z.string(),
  attempts: z.number(),
  last_outcome: z.string().nullable(),
  next_attempt_at: z.number(),
  created_at: z.number(),
  ended_at: z.number().nullable(),
});
const attemptDetail = z.object({
  delivery_id: z.string(),
  attempt: z.number(),
  started_at: z.number(),
  duration_ms: z.number(),
  status_code: z.number().nullable(),
  outcome: z.string(),
  error_class: z.string().nullable(),
});

/** A config addressed by its id alone, or `<taskId>/<configId>` when ids repeat across tasks. */
export async function findPushConfigs(db: CommonQueryMethods, reference: string): Promise<readonly PushConfigSummary[]> {
  const [first, second] = reference.includes('/') ? reference.split('/', 2) : [null, reference];
  return summaries(db, sql.fragment`c.id = ${second!} ${first ? sql.fragment`AND c.task_id::text = ${first}` : sql.fragment``}`);
}

export async function deliveriesOfConfig(db: CommonQueryMethods, taskId: string, configId: string) {
  const deliveries = await db.any(sql.type(deliveryDetail)`
    SELECT id, event_sequence, state, attempts, last_outcome, next_attempt_at, created_at, ended_at
    FROM push_deliveries WHERE task_id = ${taskId} AND config_id = ${configId} ORDER BY event_sequence`);
  const attempts = await db.any(sql.type(attemptDetail)`
    SELECT a.delivery_id, a.attempt, a.started_at, a.duration_ms, a.status_code, a.outcome, a.error_class
    FROM push_attempts a JOIN push_deliveries d ON d.id = a.delivery_id
    WHERE d.task_id = ${taskId} AND d.config_id = ${configId} ORDER BY d.event_sequence, a.attempt`);
  return { deliveries, attempts };
}

export type ResumeResult = { ok: true; woken: number } | { ok: false; reason: 'not_paused'; state: string } | { ok: false; reason: 'not_found' };

/** A paused config becomes active and its pending deliveries go out again, in order. */
export async function resumePushConfig(context: Pick<KeelContext, 'pool' | 'queues'>, taskId: string, configId: string): Promise<ResumeResult> {
  const resumed = await transitionConfig(context.pool, taskId, configId, 'RESUME', null);
  if (!resumed) {
    const state = await context.pool.maybeOneFirst(sql.type(z.object({ state: z.string() }))`
      SELECT state FROM push_configs WHERE task_id = ${taskId} AND id = ${configId} AND deleted_at IS NULL`);
    return state === null ? { ok: false, reason: 'not_found' } : { ok: false, reason: 'not_paused', state };
  }
  return { ok: true, woken: await wakePendingHeads(context, { taskId, configId }) };
}
