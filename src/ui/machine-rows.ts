import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { TERMINAL_RUN_STATUSES } from '../../machines/run.machine.js';
import { maskCredential } from '../push/push-admin.js';
import type { CatalogEntry } from './machine-catalog.js';

// Where the rows of each statechart live: which table and column hold a row's state, and what an
// operator sees in the list of the rows in one state. A table that is not there yet (a migration
// still to land) counts as null, shown as "–", never as an error.

export type Cell = { text: string; href?: string; mono?: boolean };
export type RowList = { columns: string[]; rows: Cell[][]; total: number };

export type RowSource = {
  table: string;
  column: string;
  /** What a row is, for headings ("runs", "push configs (not deleted)"). */
  noun: string;
  /** Extra condition on the rows counted (e.g. deleted configs are not counted). */
  where?: ReturnType<typeof sql.fragment>;
  list: (db: CommonQueryMethods, state: string, limit: number) => Promise<Omit<RowList, 'total'>>;
};

const uuidCell = (id: string, href?: string): Cell => ({ text: id, mono: true, ...(href ? { href } : {}) });
const time = (ms: number | null) => (ms === null ? '–' : new Date(ms).toISOString().replace('T', ' ').replace(/\.\d{3}Z$/, 'Z'));
const text = (value: string | number | null | undefined): Cell => ({ text: value === null || value === undefined ? '–' : String(value) });

/** A webhook URL as the UI shows it: the origin in clear, the path and query masked to their last characters. */
export function maskUrl(url: string): string {
  try {
    const parsed = new URL(url);
    const rest = `${parsed.pathname}${parsed.search}`;
    if (rest === '/' || rest === '') return parsed.origin;
    return `${parsed.origin}/…${rest.length > 8 ? rest.slice(-4) : ''}`;
  } catch {
    return '(unparseable URL)';
  }
}

export const pushConfigHref = (taskId: string, configId: string) => `/ui/push/${encodeURIComponent(taskId)}/${encodeURIComponent(configId)}`;
export const runHref = (runId: string) => `/ui/runs/${encodeURIComponent(runId)}`;

const runRow = z.object({ id: z.string(), agent: z.string(), termination_reason: z.string().nullable(), client: z.string().nullable(), created_at: z.number(), updated_at: z.number() });
const taskRow = z.object({ id: z.string(), run_id: z.string(), agent: z.string(), client: z.string(), context_id: z.string(), status_timestamp: z.number() });
const deliveryRow = z.object({
  id: z.string(),
  task_id: z.string(),
  config_id: z.string(),
  event_sequence: z.number(),
  attempts: z.number(),
  last_outcome: z.string().nullable(),
  next_attempt_at: z.number(),
  created_at: z.number(),
});
const configRow = z.object({
  task_id: z.string(),
  id: z.string(),
  url: z.string(),
  state_reason: z.string().nullable(),
  auth_scheme: z.string().nullable(),
  credentials_hint: z.string().nullable(),
  updated_at: z.number(),
});
const dependencyRow = z.object({
  id: z.string(),
  run_id: z.string(),
  remote_agent: z.string(),
  remote_task_id: z.string().nullable(),
  outcome: z.string().nullable(),
  created_at: z.number(),
  resolved_at: z.number().nullable(),
});

export const ROW_SOURCES: Record<string, RowSource> = {
  run: {
    table: 'runs',
    column: 'status',
    noun: 'runs',
    list: async (db, state, limit) => {
      // An open status is looked up among the open runs (runs_open_idx, sql/0016).
      const rows = await db.any(sql.type(runRow)`
        SELECT r.id, r.agent, r.termination_reason, c.name AS client, r.created_at, r.updated_at
        FROM runs r LEFT JOIN a2a_tasks t ON t.id = r.task_id LEFT JOIN clients c ON c.id = t.owner
        WHERE r.status = ${state}
          ${(TERMINAL_RUN_STATUSES as readonly string[]).includes(state) ? sql.fragment`` : sql.fragment`AND r.settled_at IS NULL`}
        ORDER BY r.updated_at DESC, r.id LIMIT ${limit}`);
      return {
        columns: ['run', 'agent', 'reason', 'client', 'created', 'last change'],
        rows: rows.map((row) => [uuidCell(row.id, runHref(row.id)), text(row.agent), text(row.termination_reason), text(row.client), text(time(row.created_at)), text(time(row.updated_at))]),
      };
    },
  },
  task: {
    table: 'a2a_tasks',
    column: 'state',
    noun: 'A2A tasks',
    list: async (db, state, limit) => {
      const rows = await db.any(sql.type(taskRow)`
        SELECT t.id, t.run_id, t.agent, c.name AS client, t.context_id, t.status_timestamp
        FROM a2a_tasks t JOIN clients c ON c.id = t.owner
        WHERE t.state = ${state} ORDER BY t.status_timestamp DESC, t.id LIMIT ${limit}`);
      return {
        columns: ['task', 'agent', 'client', 'context', 'since'],
        rows: rows.map((row) => [uuidCell(row.id, runHref(row.run_id)), text(row.agent), text(row.client), { text: row.context_id, mono: true }, text(time(row.status_timestamp))]),
      };
    },
  },
  delivery: {
    table: 'push_deliveries',
    column: 'state',
    noun: 'push deliveries',
    list: async (db, state, limit) => {
      const rows = await db.any(sql.type(deliveryRow)`
        SELECT id, task_id, config_id, event_sequence, attempts, last_outcome, next_attempt_at, created_at
        FROM push_deliveries WHERE state = ${state} ORDER BY created_at DESC, id LIMIT ${limit}`);
      return {
        columns: ['delivery', 'config', 'event', 'attempts', 'last outcome', 'created'],
        rows: rows.map((row) => [
          uuidCell(row.id),
          { text: `${row.task_id.slice(0, 8)}…/${row.config_id}`, href: pushConfigHref(row.task_id, row.config_id), mono: true },
          text(`#${row.event_sequence}`),
          text(row.attempts),
          text(row.last_outcome),
          text(time(row.created_at)),
        ]),
      };
    },
  },
  pushConfig: {
    table: 'push_configs',
    column: 'state',
    noun: 'push configs (not deleted)',
    where: sql.fragment`deleted_at IS NULL`,
    list: async (db, state, limit) => {
      const rows = await db.any(sql.type(configRow)`
        SELECT task_id, id, url, state_reason, auth_scheme, credentials_hint, updated_at
        FROM push_configs WHERE state = ${state} AND deleted_at IS NULL ORDER BY updated_at DESC, task_id, id LIMIT ${limit}`);
      return {
        columns: ['config', 'target', 'reason', 'authentication', 'last change'],
        rows: rows.map((row) => [
          { text: `${row.task_id.slice(0, 8)}…/${row.id}`, href: pushConfigHref(row.task_id, row.id), mono: true },
          { text: maskUrl(row.url), mono: true },
          text(row.state_reason),
          { text: maskCredential(row.auth_scheme, row.credentials_hint), mono: true },
          text(time(row.updated_at)),
        ]),
      };
    },
  },
  dependency: {
    table: 'dependencies',
    column: 'state',
    noun: 'dependencies',
    list: async (db, state, limit) => {
      const rows = await db.any(sql.type(dependencyRow)`
        SELECT id, run_id, remote_agent, remote_task_id, outcome, created_at, resolved_at
        FROM dependencies WHERE state = ${state} ORDER BY created_at DESC, id LIMIT ${limit}`);
      return {
        columns: ['dependency', 'run', 'remote agent', 'remote task', 'outcome', 'created', 'resolved'],
        rows: rows.map((row) => [
          uuidCell(row.id),
          uuidCell(row.run_id, runHref(row.run_id)),
          text(row.remote_agent),
          { text: row.remote_task_id ?? '–', mono: true },
          text(row.outcome),
          text(time(row.created_at)),
          text(time(row.resolved_at)),
        ]),
      };
    },
  },
};

export async function tableExists(db: CommonQueryMethods, table: string): Promise<boolean> {
  return db.oneFirst(sql.type(z.object({ present: z.boolean() }))`SELECT to_regclass(${table}) IS NOT NULL AS present`);
}

const countRow = z.object({ machine: z.string(), state: z.string(), n: z.number() });

/**
 * Rows per state of each machine: every state of the machine is present (0 when empty); a
 * machine whose table is missing maps every state to null; a machine without a row source is absent.
 * Two statements whatever the number of machines (pages poll this every second).
 */
export async function countStates(db: CommonQueryMethods, catalog: readonly CatalogEntry[]): Promise<Record<string, Record<string, number | null>>> {
  const bound = catalog.flatMap((entry) => (ROW_SOURCES[entry.id] ? [{ entry, source: ROW_SOURCES[entry.id]! }] : []));
  const tables = [...new Set(bound.map(({ source }) => source.table))];
  const present = new Set(
    tables.length === 0
      ? []
      : await db.anyFirst(sql.type(z.object({ name: z.string() }))`
          SELECT name FROM unnest(${sql.array(tables, 'text')}) AS name WHERE to_regclass(name) IS NOT NULL`),
  );
  const counted = bound.filter(({ source }) => present.has(source.table));
  const rows =
    counted.length === 0
      ? []
      : await db.any(sql.type(countRow)`${sql.join(
          counted.map(
            ({ entry, source }) => sql.fragment`
              (SELECT ${entry.id}::text AS machine, ${sql.identifier([source.column])}::text AS state, count(*)::int AS n
               FROM ${sql.identifier([source.table])} WHERE ${source.where ?? sql.fragment`true`} GROUP BY 2)`,
          ),
          sql.fragment` UNION ALL `,
        )}`);
  const result: Record<string, Record<string, number | null>> = {};
  for (const { entry, source } of bound) {
    const counts: Record<string, number | null> = Object.fromEntries(entry.model.states.map((state) => [state.name, present.has(source.table) ? 0 : null]));
    for (const row of rows) if (row.machine === entry.id) counts[row.state] = row.n;
    result[entry.id] = counts;
  }
  return result;
}

export async function listStateRows(db: CommonQueryMethods, entry: CatalogEntry, state: string, limit: number): Promise<RowList | null> {
  const source = ROW_SOURCES[entry.id];
  if (!source || !(await tableExists(db, source.table))) return null;
  const total = await db.oneFirst(sql.type(z.object({ n: z.number() }))`
    SELECT count(*)::int AS n FROM ${sql.identifier([source.table])}
    WHERE ${sql.identifier([source.column])} = ${state} AND ${source.where ?? sql.fragment`true`}`);
  return { ...(await source.list(db, state, limit)), total };
}
