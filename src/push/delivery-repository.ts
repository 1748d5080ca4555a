import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { allowedFrom } from '../../machines/transitions.js';
import { deliveryMachine, type DeliveryEvent, type DeliveryState } from '../../machines/delivery.machine.js';
import { pushConfigMachine, type PushConfigEvent } from '../../machines/push-config.machine.js';
import { deliveryIdOf } from './delivery-id.js';

// push_deliveries and push_attempts: the outbox. Every state change is one guarded write whose
// allowed-from states come from the machines.

const deliveryFrom = (event: DeliveryEvent['type']) => sql.array(allowedFrom(deliveryMachine, event), 'text');
const configFrom = (event: PushConfigEvent['type']) => sql.array(allowedFrom(pushConfigMachine, event), 'text');

export type NewDeliveryEvent = { sequence: number; terminal: boolean; coalescible: boolean };

/**
 * One pending delivery per active or paused config of the task for each new journal event, in the
 * projector's transaction; then the bounds. Returns the new delivery ids (their jobs are added
 * after the commit).
 */
export async function recordDeliveries(
  db: CommonQueryMethods,
  taskId: string,
  events: readonly NewDeliveryEvent[],
  limits: { deadlineHours: number; maxPendingPerConfig: number; maxPendingTotal: number },
): Promise<string[]> {
  if (events.length === 0) return [];
  const configs = await db.anyFirst(sql.type(z.object({ id: z.string() }))`
    SELECT id FROM push_configs WHERE task_id = ${taskId} AND deleted_at IS NULL AND state IN ('active', 'paused') ORDER BY id`);
  return recordDeliveriesFor(db, taskId, configs, events, limits);
}

/**
 * `push.deadlineHours` as an interval. In seconds: make_interval takes whole hours only, and a
 * fractional `deadlineHours` (which the config allows) failed every projection with push configs.
 */
const deadlineInterval = (hours: number) => sql.interval({ seconds: hours * 3600 });

/** recordDeliveries for configs the caller has read already (active or paused, in id order). */
export async function recordDeliveriesFor(
  db: CommonQueryMethods,
  taskId: string,
  configs: readonly string[],
  events: readonly NewDeliveryEvent[],
  limits: { deadlineHours: number; maxPendingPerConfig: number; maxPendingTotal: number },
): Promise<string[]> {
  if (events.length === 0 || configs.length === 0) return [];
  const rows = configs.flatMap((configId) =>
    events.map((event) => [deliveryIdOf(taskId, configId, event.sequence), taskId, configId, event.sequence, event.terminal, event.coalescible] as const),
  );
  await db.query(sql.unsafe`
    INSERT INTO push_deliveries (id, task_id, config_id, event_sequence, terminal, coalescible, deadline)
    SELECT id, task_id, config_id, event_sequence, terminal, coalescible, now() + ${deadlineInterval(limits.deadlineHours)}
    FROM ${sql.unnest(rows.map((row) => [...row]), ['uuid', 'uuid', 'text', 'int4', 'bool', 'bool'])}
      AS t(id, task_id, config_id, event_sequence, terminal, coalescible)
    ON CONFLICT (task_id, config_id, event_sequence) DO NOTHING`);
  await enforceBounds(db, taskId, configs, limits);
  return rows.map((row) => row[0]);
}

/**
 * The bounds: over `maxPendingPerConfig` pending deliveries of a config (or `maxPendingTotal`
 * overall), the oldest pending non-terminal status events are coalesced: each is superseded by a
 * newer pending status event of the same task, which carries the newer state. Terminal events and
 * artifacts are never dropped, and the newest status is always kept.
 */
async function enforceBounds(
  db: CommonQueryMethods,
  taskId: string,
  configIds: readonly string[],
  limits: { maxPendingPerConfig: number; maxPendingTotal: number },
): Promise<void> {
  for (const configId of configIds) {
    await db.query(sql.unsafe`
      WITH pending AS (
        SELECT count(*) AS n FROM push_deliveries WHERE task_id = ${taskId} AND config_id = ${configId} AND state = 'pending'
      ), candidates AS (
        SELECT d.id FROM push_deliveries d
        WHERE d.task_id = ${taskId} AND d.config_id = ${configId} AND d.state = 'pending' AND d.coalescible
          AND EXISTS (SELECT 1 FROM push_deliveries newer WHERE newer.task_id = d.task_id AND newer.config_id = d.config_id
                      AND newer.state = 'pending' AND newer.coalescible AND newer.event_sequence > d.event_sequence)
        ORDER BY d.event_sequence
        LIMIT greatest(0, (SELECT n FROM pending) - ${limits.maxPendingPerConfig})
      )
      UPDATE push_deliveries SET state = 'superseded', last_outcome = 'coalesced: over the pending bound', ended_at = now(), updated_at = now()
      WHERE id IN (SELECT id FROM candidates) AND state = ANY(${deliveryFrom('COALESCED')})`);
  }
  const total = await db.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM push_deliveries WHERE state = 'pending'`);
  if (total <= limits.maxPendingTotal) return;
  await db.query(sql.unsafe`
    WITH candidates AS (
      SELECT d.id FROM push_deliveries d
      WHERE d.state = 'pending' AND d.coalescible
        AND EXISTS (SELECT 1 FROM push_deliveries newer WHERE newer.task_id = d.task_id AND newer.config_id = d.config_id
                    AND newer.state = 'pending' AND newer.coalescible AND newer.event_sequence > d.event_sequence)
      ORDER BY d.created_at LIMIT ${total - limits.maxPendingTotal}
    )
    UPDATE push_deliveries SET state = 'superseded', last_outcome = 'coalesced: over the total pending bound', ended_at = now(), updated_at = now()
    WHERE id IN (SELECT id FROM candidates) AND state = ANY(${deliveryFrom('COALESCED')})`);
}

export const deliveryRow = z.object({
  id: z.string(),
  task_id: z.string(),
  config_id: z.string(),
  event_sequence: z.number(),
  state: z.enum(['pending', 'delivered', 'dead', 'expired', 'cancelled', 'superseded']),
  attempts: z.number(),
  next_attempt_at: z.number(),
  last_outcome: z.string().nullable(),
  deadline: z.number(),
  created_at: z.number(),
  ended_at: z.number().nullable(),
  // The config, read with the delivery.
  url: z.string(),
  /** The client owning the config: the unit of fairness between push slots. */
  owner: z.string(),
  config_state: z.enum(['active', 'paused', 'stopped']),
  deleted_at: z.number().nullable(),
  auth_scheme: z.string().nullable(),
  credentials: z.instanceof(Buffer).nullable(),
  /** The config asked for the sequenced-events extension: the body carries the event's sequence. */
  sequenced: z.boolean(),
  /** Whether an earlier delivery of the same config has not ended yet. */
  behind: z.boolean(),
});
export type DeliveryRow = z.infer<typeof deliveryRow>;

export async function loadDelivery(db: CommonQueryMethods, deliveryId: string): Promise<DeliveryRow | null> {
  return db.maybeOne(sql.type(deliveryRow)`
    SELECT d.id, d.task_id, d.config_id, d.event_sequence, d.state, d.attempts, d.next_attempt_at, d.last_outcome, d.deadline,
      d.created_at, d.ended_at, c.url, c.owner, c.state AS config_state, c.deleted_at, c.auth_scheme, c.credentials, c.sequenced,
      EXISTS (SELECT 1 FROM push_deliveries e WHERE e.task_id = d.task_id AND e.config_id = d.config_id
              AND e.state = 'pending' AND e.event_sequence < d.event_sequence) AS behind
    FROM push_deliveries d JOIN push_configs c ON c.task_id = d.task_id AND c.id = d.config_id
    WHERE d.id = ${deliveryId}`);
}

export type ConfigHead = { id: string; attempts: number; next_attempt_at: number };

/** The next pending delivery of a config (its head), if any. */
export async function headOfConfig(db: CommonQueryMethods, taskId: string, configId: string): Promise<ConfigHead | null> {
  return db.maybeOne(sql.type(z.object({ id: z.string(), attempts: z.number(), next_attempt_at: z.number() }))`
    SELECT id, attempts, next_attempt_at FROM push_deliveries
    WHERE task_id = ${taskId} AND config_id = ${configId} AND state = 'pending'
    ORDER BY event_sequence LIMIT 1`);
}

export type AttemptRecord = { attempt: number; startedAt: number; durationMs: number; statusCode: number | null; outcome: string; errorClass: string | null };

async function recordAttempt(db: CommonQueryMethods, deliveryId: string, record: AttemptRecord): Promise<void> {
  await db.query(sql.unsafe`
    INSERT INTO push_attempts (delivery_id, attempt, started_at, duration_ms, status_code, outcome, error_class)
    VALUES (${deliveryId}, ${record.attempt}, ${sql.timestamp(new Date(record.startedAt))}, ${record.durationMs}, ${record.statusCode},
      ${record.outcome}, ${record.errorClass})
    ON CONFLICT (delivery_id, attempt) DO NOTHING`);
}

export type BegunAttempt =
  | { kind: 'begun'; attempt: number; startedAt: number }
  | { kind: 'past_deadline' }
  /** Its attempts are used up (a worker died after counting the last one, or push.maxAttempts was lowered). */
  | { kind: 'attempts_used'; attempts: number }
  /** Not pending, or not due yet (a lease of another attempt, a retry time ahead). */
  | { kind: 'not_due' }
  /** Its config is paused, stopped or deleted: nothing is sent, whatever the caller read before. */
  | { kind: 'config_not_active' };

const begunRow = z.object({
  past_deadline: z.boolean(),
  config_not_active: z.boolean(),
  counted: z.number(),
  attempts: z.number().nullable(),
  started_at: z.number(),
});

/**
 * Counts an attempt before it is made (a worker killed mid-POST still used that attempt) and leases
 * the delivery for `leaseMs`: only a due delivery can begin, so a second wake-up (the sweeper, a
 * stalled job run again) never starts a second request while one is in flight. The attempt's
 * outcome replaces the lease; a worker that died leaves it to expire, and the delivery is retried.
 *
 * Everything that decides whether the attempt may begin is checked in this one statement, on the
 * database's clock read once the delivery's row is locked (clock_timestamp(), not now(): the
 * caller's transaction may have waited for the event's row lock since it began), and the attempt
 * starts at that moment:
 * - the deadline: never begun past it, however long the worker took since it read the delivery
 *   (and whatever the skew between the worker's clock and the database's);
 * - the attempts: a delivery that has used `maxAttempts` is never begun again, whether its last
 *   attempt's worker died or a pause and a resume came between;
 * - the config's state: a worker that read the config active and was then held up (a second job of
 *   the delivery, a wait for a connection) while another attempt paused or stopped it must not
 *   send. The pause commits with its attempt's outcome, before the paused delivery is due again, so
 *   this statement sees one or the other.
 */
export async function beginAttempt(db: CommonQueryMethods, deliveryId: string, options: { leaseMs: number; maxAttempts: number }): Promise<BegunAttempt> {
  const row = await db.maybeOne(sql.type(begunRow)`
    WITH locked AS (
      SELECT d.id, d.attempts AS counted, d.deadline, (c.state <> 'active' OR c.deleted_at IS NOT NULL) AS config_not_active
      FROM push_deliveries d JOIN push_configs c ON c.task_id = d.task_id AND c.id = d.config_id
      WHERE d.id = ${deliveryId} AND d.state = 'pending' AND d.next_attempt_at <= statement_timestamp() + interval '50 milliseconds'
      FOR UPDATE OF d),
    -- The clock is read once the row is locked (a volatile function: this is evaluated once, after
    -- locked), so not even a wait for another attempt's lock on the row comes between the deadline
    -- check and the attempt's start.
    due AS (
      SELECT locked.*, clock_timestamp() AS at FROM locked),
    begun AS (
      UPDATE push_deliveries d SET attempts = d.attempts + 1, updated_at = due.at,
        next_attempt_at = due.at + ${sql.interval({ seconds: options.leaseMs / 1000 })}
      FROM due WHERE d.id = due.id AND due.deadline > due.at AND NOT due.config_not_active AND due.counted < ${options.maxAttempts}
      RETURNING d.attempts)
    SELECT due.deadline <= due.at AS past_deadline, due.config_not_active, due.counted, (SELECT attempts FROM begun) AS attempts,
      (extract(epoch FROM due.at) * 1000)::float8 AS started_at FROM due`);
  if (row === null) return { kind: 'not_due' };
  if (row.config_not_active) return { kind: 'config_not_active' };
  if (row.past_deadline) return { kind: 'past_deadline' };
  if (row.attempts === null) return { kind: 'attempts_used', attempts: row.counted };
  return { kind: 'begun', attempt: row.attempts, startedAt: row.started_at };
}

/**
 * What one outcome writes, all of it in one transaction (recordOutcome): the attempt's row, the
 * config's transition (paused, stopped) with the cancellation of its pending deliveries, and the
 * delivery's own transition.
 */
export type OutcomeWrite = {
  attempt?: AttemptRecord;
  config?: { event: 'AUTH_FAILED' | 'STOP'; reason: string };
  /** Every pending delivery of the config (this one included) is cancelled with this outcome. */
  cancelPending?: string;
  delivery?: { event: DeliveryEvent['type']; outcome: string; retryAt?: number };
};

/**
 * Records one outcome in one transaction, and reads the config's head as that transaction leaves
 * it (the delivery to wake next: this one again after a retry, the next one after an end).
 */
export async function recordOutcome(
  db: CommonQueryMethods,
  delivery: { id: string; taskId: string; configId: string },
  write: OutcomeWrite,
): Promise<ConfigHead | null> {
  return db.transaction(async (transaction) => {
    if (write.attempt) await recordAttempt(transaction, delivery.id, write.attempt);
    if (write.config) await transitionConfig(transaction, delivery.taskId, delivery.configId, write.config.event, write.config.reason);
    if (write.delivery) await transitionDelivery(transaction, delivery.id, write.delivery.event, write.delivery.outcome, write.delivery);
    if (write.cancelPending !== undefined) await cancelPendingOfConfig(transaction, delivery.taskId, delivery.configId, write.cancelPending);
    return headOfConfig(transaction, delivery.taskId, delivery.configId);
  });
}

async function transitionDelivery(
  db: CommonQueryMethods,
  deliveryId: string,
  event: DeliveryEvent['type'],
  outcome: string,
  options: { retryAt?: number } = {},
): Promise<boolean> {
  const to = event === 'RETRY_LATER' ? 'pending' : ({ ACKNOWLEDGED: 'delivered', GIVE_UP: 'dead', DEADLINE_PASSED: 'expired', CONFIG_GONE: 'cancelled', COALESCED: 'superseded' } as const)[event];
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE push_deliveries SET state = ${to}, last_outcome = ${outcome}, updated_at = now(),
      ${options.retryAt ? sql.fragment`next_attempt_at = ${sql.timestamp(new Date(options.retryAt))},` : sql.fragment``}
      ended_at = ${to === 'pending' ? null : sql.fragment`now()`}
    WHERE id = ${deliveryId} AND state = ANY(${deliveryFrom(event)}) RETURNING id`);
  return row !== null;
}

/** Cancels every pending delivery of a config (deleted or stopped). */
export async function cancelPendingOfConfig(db: CommonQueryMethods, taskId: string, configId: string, outcome: string): Promise<number> {
  return db.oneFirst(sql.type(z.object({ n: z.number() }))`
    WITH gone AS (
      UPDATE push_deliveries SET state = 'cancelled', last_outcome = ${outcome}, ended_at = now(), updated_at = now()
      WHERE task_id = ${taskId} AND config_id = ${configId} AND state = ANY(${deliveryFrom('CONFIG_GONE')}) RETURNING 1)
    SELECT count(*)::int AS n FROM gone`);
}

export async function transitionConfig(db: CommonQueryMethods, taskId: string, configId: string, event: PushConfigEvent['type'], reason: string | null): Promise<boolean> {
  const to = ({ AUTH_FAILED: 'paused', RESUME: 'active', STOP: 'stopped' } as const)[event];
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE push_configs SET state = ${to}, state_reason = ${reason}, updated_at = now()
    WHERE task_id = ${taskId} AND id = ${configId} AND state = ANY(${configFrom(event)}) RETURNING id`);
  return row !== null;
}

export const DELIVERY_END_STATES: readonly DeliveryState[] = ['delivered', 'dead', 'expired', 'cancelled', 'superseded'];
