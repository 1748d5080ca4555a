import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { RUN_STATUSES, TERMINAL_RUN_STATUSES, TERMINATION_REASONS } from '../../machines/run.machine.js';
import { tableExists } from './machine-rows.js';

// What the operator pages read beyond the repositories: filtered run lists, a run's task, journal
// states and deliveries, dependencies and callbacks. Never a sealed column, never content.

export type RunFilter = {
  status?: string;
  reason?: string;
  agent?: string;
  client?: string;
  /** created_at bounds, epoch ms. */
  from?: number;
  to?: number;
  limit: number;
  before?: { createdAt: number; id: string };
};

const listedRun = z.object({
  id: z.string(),
  agent: z.string(),
  status: z.string(),
  termination_reason: z.string().nullable(),
  truncated: z.boolean(),
  task_id: z.string().nullable(),
  task_state: z.string().nullable(),
  client: z.string().nullable(),
  created_at: z.number(),
  updated_at: z.number(),
});
export type ListedRun = z.infer<typeof listedRun>;

export async function listRunsFiltered(db: CommonQueryMethods, filter: RunFilter): Promise<readonly ListedRun[]> {
  const conditions = [sql.fragment`true`];
  if (filter.status && (RUN_STATUSES as readonly string[]).includes(filter.status)) {
    conditions.push(sql.fragment`r.status = ${filter.status}`);
    // An open status is looked up among the open runs (runs_open_idx, sql/0016).
    if (!(TERMINAL_RUN_STATUSES as readonly string[]).includes(filter.status)) conditions.push(sql.fragment`r.settled_at IS NULL`);
  }
  if (filter.reason && (TERMINATION_REASONS as readonly string[]).includes(filter.reason)) conditions.push(sql.fragment`r.termination_reason = ${filter.reason}`);
  if (filter.agent) conditions.push(sql.fragment`r.agent = ${filter.agent}`);
  if (filter.client) conditions.push(sql.fragment`c.name = ${filter.client}`);
  if (filter.from !== undefined) conditions.push(sql.fragment`r.created_at >= ${sql.timestamp(new Date(filter.from))}`);
  if (filter.to !== undefined) conditions.push(sql.fragment`r.created_at < ${sql.timestamp(new Date(filter.to))}`);
  if (filter.before) conditions.push(sql.fragment`(r.created_at, r.id) < (${sql.timestamp(new Date(filter.before.createdAt))}, ${filter.before.id})`);
  return db.any(sql.type(listedRun)`
    SELECT r.id, r.agent, r.status, r.termination_reason, r.truncated, r.task_id, t.state AS task_state, c.name AS client, r.created_at, r.updated_at
    FROM runs r LEFT JOIN a2a_tasks t ON t.id = r.task_id LEFT JOIN clients c ON c.id = t.owner
    WHERE ${sql.join(conditions, sql.fragment` AND `)}
    ORDER BY r.created_at DESC, r.id DESC LIMIT ${filter.limit}`);
}

/** Values the filters offer: agents that have runs, clients that own tasks. */
export async function filterChoices(db: CommonQueryMethods): Promise<{ agents: readonly string[]; clients: readonly string[] }> {
  const [agents, clients] = await Promise.all([
    db.anyFirst(sql.type(z.object({ agent: z.string() }))`SELECT DISTINCT agent FROM runs ORDER BY agent LIMIT 200`),
    db.anyFirst(sql.type(z.object({ name: z.string() }))`SELECT DISTINCT c.name FROM clients c WHERE EXISTS (SELECT 1 FROM a2a_tasks t WHERE t.owner = c.id) ORDER BY c.name LIMIT 200`),
  ]);
  return { agents, clients };
}

const taskInfo = z.object({
  id: z.string(),
  state: z.string(),
  context_id: z.string(),
  client: z.string(),
  run_id: z.string(),
  projected_revision: z.number(),
  projected_state: z.string(),
  last_sequence: z.number(),
  status_timestamp: z.number(),
  created_at: z.number(),
});
export type TaskInfo = z.infer<typeof taskInfo>;

export async function taskOfRun(db: CommonQueryMethods, taskId: string): Promise<TaskInfo | null> {
  return db.maybeOne(sql.type(taskInfo)`
    SELECT t.id, t.state, t.context_id, c.name AS client, t.run_id, t.projected_revision, t.projected_state, t.last_sequence, t.status_timestamp, t.created_at
    FROM a2a_tasks t JOIN clients c ON c.id = t.owner WHERE t.id = ${taskId}`);
}

const journalState = z.object({ sequence: z.number(), kind: z.string(), state: z.string().nullable(), run_revision: z.number(), created_at: z.number() });

/** The task's journal without its payloads: which states (and artifacts) it announced, in order. */
export async function journalOutline(db: CommonQueryMethods, taskId: string): Promise<readonly z.infer<typeof journalState>[]> {
  return db.any(sql.type(journalState)`
    SELECT sequence, kind, state, run_revision, created_at FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence LIMIT 1000`);
}

const runOfTask = z.object({ id: z.string(), status: z.string(), termination_reason: z.string().nullable(), created_at: z.number() });

export async function runsOfTask(db: CommonQueryMethods, taskId: string): Promise<readonly z.infer<typeof runOfTask>[]> {
  return db.any(sql.type(runOfTask)`SELECT id, status, termination_reason, created_at FROM runs WHERE task_id = ${taskId} ORDER BY created_at, id`);
}

const taskDelivery = z.object({
  id: z.string(),
  config_id: z.string(),
  config_state: z.string(),
  config_deleted: z.boolean(),
  event_sequence: z.number(),
  state: z.string(),
  attempts: z.number(),
  last_outcome: z.string().nullable(),
  created_at: z.number(),
  ended_at: z.number().nullable(),
});

export async function deliveriesOfTask(db: CommonQueryMethods, taskId: string): Promise<readonly z.infer<typeof taskDelivery>[]> {
  return db.any(sql.type(taskDelivery)`
    SELECT d.id, d.config_id, c.state AS config_state, c.deleted_at IS NOT NULL AS config_deleted, d.event_sequence, d.state, d.attempts,
      d.last_outcome, d.created_at, d.ended_at
    FROM push_deliveries d JOIN push_configs c ON c.task_id = d.task_id AND c.id = d.config_id
    WHERE d.task_id = ${taskId} ORDER BY d.config_id, d.event_sequence LIMIT 1000`);
}

const waitingRun = z.object({ id: z.string(), agent: z.string(), revision: z.number(), updated_at: z.number(), client: z.string().nullable(), task_id: z.string().nullable() });

export async function runsWaitingForApproval(db: CommonQueryMethods, limit: number): Promise<readonly z.infer<typeof waitingRun>[]> {
  return db.any(sql.type(waitingRun)`
    SELECT r.id, r.agent, r.revision, r.updated_at, c.name AS client, r.task_id
    FROM runs r LEFT JOIN a2a_tasks t ON t.id = r.task_id LEFT JOIN clients c ON c.id = t.owner
    WHERE r.settled_at IS NULL AND r.status = 'waiting_for_approval' ORDER BY r.updated_at, r.id LIMIT ${limit}`);
}

export type Badges = { approvals: number; pausedConfigs: number };

export async function badges(db: CommonQueryMethods): Promise<Badges> {
  return db.one(sql.type(z.object({ approvals: z.number(), pausedConfigs: z.number() }))`
    SELECT (SELECT count(*)::int FROM runs WHERE settled_at IS NULL AND status = 'waiting_for_approval') AS approvals,
      (SELECT count(*)::int FROM push_configs WHERE state = 'paused' AND deleted_at IS NULL) AS "pausedConfigs"`);
}

/** A fingerprint of what a run page shows: it changes whenever the run, its task or its deliveries do. */
export async function runVersion(db: CommonQueryMethods, runId: string): Promise<string | null> {
  return db.maybeOneFirst(sql.type(z.object({ version: z.string() }))`
    SELECT concat_ws(':', r.revision, r.status, t.projected_revision, t.last_sequence,
      (SELECT count(*) || '-' || coalesce(sum(d.attempts), 0) || '-' || count(*) FILTER (WHERE d.state <> 'pending') FROM push_deliveries d WHERE d.task_id = r.task_id),
      (SELECT count(*) FROM run_events e WHERE e.run_id = r.id),
      -- A statechart agent's transition changes no revision: its path and state are read too.
      (SELECT count(*) FROM run_machine_steps s WHERE s.run_id = r.id), r.machine_state) AS version
    FROM runs r LEFT JOIN a2a_tasks t ON t.id = r.task_id WHERE r.id = ${runId}`);
}

/** A fingerprint of one push config's page. */
export async function pushConfigVersion(db: CommonQueryMethods, taskId: string, configId: string): Promise<string | null> {
  return db.maybeOneFirst(sql.type(z.object({ version: z.string() }))`
    SELECT concat_ws(':', c.state, c.deleted_at IS NOT NULL, c.updated_at,
      (SELECT count(*) || '-' || coalesce(sum(d.attempts), 0) || '-' || count(*) FILTER (WHERE d.state <> 'pending') FROM push_deliveries d WHERE d.task_id = c.task_id AND d.config_id = c.id)) AS version
    FROM push_configs c WHERE c.task_id = ${taskId} AND c.id = ${configId}`);
}

const dependencyListed = z.object({
  id: z.string(),
  run_id: z.string(),
  tool_name: z.string(),
  remote_agent: z.string(),
  state: z.string(),
  remote_task_id: z.string().nullable(),
  outcome: z.string().nullable(),
  polls: z.number(),
  callbacks: z.number(),
  created_at: z.number(),
  resolved_at: z.number().nullable(),
});
const callbackListed = z.object({
  id: z.string(),
  dependency_id: z.string().nullable(),
  remote_agent: z.string().nullable(),
  kind: z.string(),
  received_at: z.number(),
  processed_at: z.number().nullable(),
});

export type DependencyOverview =
  | { present: false }
  | {
      present: true;
      open: readonly z.infer<typeof dependencyListed>[];
      resolved: readonly z.infer<typeof dependencyListed>[];
      callbacks: readonly z.infer<typeof callbackListed>[] | null;
      pendingCallbacks: number | null;
    };

/** Dependencies and inbox callbacks, from whichever of their tables exist in this database. */
export async function dependencyOverview(
  db: CommonQueryMethods,
  states: { open: readonly string[]; ended: readonly string[] },
  limit: number,
): Promise<DependencyOverview> {
  if (!(await tableExists(db, 'dependencies'))) return { present: false };
  const withCallbacks = (await tableExists(db, 'inbox_callbacks')) && (await tableExists(db, 'inbox_registrations'));
  const callbackCount = withCallbacks
    ? sql.fragment`(SELECT count(*)::int FROM inbox_callbacks k JOIN inbox_registrations g ON g.id = k.registration_id WHERE g.dependency_id = d.id)`
    : sql.fragment`0`;
  const select = (states: readonly string[], order: ReturnType<typeof sql.fragment>) =>
    db.any(sql.type(dependencyListed)`
      SELECT d.id, d.run_id, d.tool_name, d.remote_agent, d.state, d.remote_task_id, d.outcome, d.polls, ${callbackCount} AS callbacks,
        d.created_at, d.resolved_at
      FROM dependencies d WHERE d.state = ANY(${sql.array(states, 'text')}) ORDER BY ${order} LIMIT ${limit}`);
  const [open, resolved] = await Promise.all([
    select(states.open, sql.fragment`d.created_at, d.id`),
    select(states.ended, sql.fragment`d.resolved_at DESC NULLS LAST, d.id`),
  ]);
  if (!withCallbacks) return { present: true, open, resolved, callbacks: null, pendingCallbacks: null };
  const [callbacks, pendingCallbacks] = await Promise.all([
    db.any(sql.type(callbackListed)`
      SELECT k.id, g.dependency_id, d.remote_agent, k.kind, k.received_at, k.processed_at
      FROM inbox_callbacks k JOIN inbox_registrations g ON g.id = k.registration_id LEFT JOIN dependencies d ON d.id = g.dependency_id
      ORDER BY k.received_at DESC, k.id LIMIT ${limit}`),
    db.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM inbox_callbacks WHERE processed_at IS NULL`),
  ]);
  return { present: true, open, resolved, callbacks, pendingCallbacks };
}

const machineStep = z.object({ sequence: z.number(), state: z.unknown(), event: z.string(), machine_hash: z.string(), at: z.number() });
export type MachineStepRow = z.infer<typeof machineStep>;

/** The path a statechart agent's run took: its committed transitions in order (state names only, no content). */
export async function machineStepsOf(db: CommonQueryMethods, runId: string, limit = 1000): Promise<readonly MachineStepRow[]> {
  return db.any(sql.type(machineStep)`
    SELECT sequence, state, event, machine_hash, at FROM run_machine_steps WHERE run_id = ${runId} ORDER BY sequence LIMIT ${limit}`);
}
