import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { definitionJson } from './definition-graph.js';
import type { StatechartDefinition } from './statechart-definition.js';

// The definitions of statechart agents' machines that processes started with (machine_definitions,
// sql/0017), and what the operator surfaces read about the runs of those agents: how many open runs
// stand in each state, with the definition each started with. `keel machines diff` compares an
// older definition with the current one; the machines page counts runs per state.

/** What this module needs of the agent registry (the registry itself imports this folder). */
export type StatechartAgents = { agents: ReadonlyMap<string, { statechart?: StatechartDefinition }> };

/**
 * Records the definition of every statechart agent this process runs, by hash, once: a definition
 * seen before keeps its first row. Every process does it at start, so each definition a run can
 * have started with is there to compare with. Returns how many definitions were new.
 */
export async function recordMachineDefinitions(db: CommonQueryMethods, registry: StatechartAgents): Promise<number> {
  const rows = [...registry.agents.entries()].flatMap(([agent, registered]) =>
    registered.statechart ? [sql.fragment`(${agent}, ${registered.statechart.hash}, ${sql.jsonb(definitionJson(registered.statechart.machine) as never)})`] : [],
  );
  if (rows.length === 0) return 0;
  const inserted = await db.anyFirst(sql.type(z.object({ hash: z.string() }))`
    INSERT INTO machine_definitions (agent, hash, definition) VALUES ${sql.join(rows, sql.fragment`, `)}
    ON CONFLICT (agent, hash) DO NOTHING RETURNING hash`);
  return inserted.length;
}

const storedDefinition = z.object({ hash: z.string(), definition: z.unknown(), first_seen_at: z.number() });
export type StoredDefinition = z.infer<typeof storedDefinition>;

/** Every definition of an agent's machine that a process started with, oldest first. */
export async function definitionsOf(db: CommonQueryMethods, agent: string): Promise<readonly StoredDefinition[]> {
  return db.any(sql.type(storedDefinition)`
    SELECT hash, definition, first_seen_at FROM machine_definitions WHERE agent = ${agent} ORDER BY first_seen_at, hash`);
}

/** One stored definition of an agent's machine, or null. */
export async function definitionOf(db: CommonQueryMethods, agent: string, hash: string): Promise<StoredDefinition | null> {
  return db.maybeOne(sql.type(storedDefinition)`
    SELECT hash, definition, first_seen_at FROM machine_definitions WHERE agent = ${agent} AND hash = ${hash}`);
}

const statesRow = z.object({ agent: z.string(), machine_hash: z.string().nullable(), machine_state: z.unknown(), n: z.number() });
export type OpenRunsInState = z.infer<typeof statesRow>;

/**
 * Open runs (not settled) of the given agents per definition and state: machine_state is the state
 * value a run stands in now (null before its first transition), machine_hash the definition it
 * started with. One statement for all agents (the machines page polls it every second).
 */
export async function openRunsByState(db: CommonQueryMethods, agents: readonly string[]): Promise<readonly OpenRunsInState[]> {
  if (agents.length === 0) return [];
  // Open runs are found through runs_open_idx (sql/0016), whatever the number of settled ones.
  return db.any(sql.type(statesRow)`
    SELECT agent, machine_hash, machine_state, count(*)::int AS n
    FROM runs WHERE settled_at IS NULL AND agent = ANY(${sql.array(agents, 'text')})
    GROUP BY agent, machine_hash, machine_state ORDER BY agent, machine_hash NULLS LAST`);
}

const openRun = z.object({ id: z.string(), status: z.string(), machine_hash: z.string().nullable(), machine_state: z.unknown(), updated_at: z.number() });
const openRunWithLatest = openRun.extend({ latest_hash: z.string().nullable() });
export type OpenMachineRun = z.infer<typeof openRun>;

/**
 * The open runs of an agent with the definition each started with, the one its latest transition
 * ran on (null before any), and where it stands; oldest change first.
 */
export async function openRunsOf(db: CommonQueryMethods, agent: string, limit: number): Promise<readonly z.infer<typeof openRunWithLatest>[]> {
  return db.any(sql.type(openRunWithLatest)`
    SELECT r.id, r.status, r.machine_hash, r.machine_state, r.updated_at,
      (SELECT s.machine_hash FROM run_machine_steps s WHERE s.run_id = r.id ORDER BY s.sequence DESC LIMIT 1) AS latest_hash
    FROM runs r WHERE r.settled_at IS NULL AND r.agent = ${agent} ORDER BY r.updated_at, r.id LIMIT ${limit}`);
}

/**
 * The open runs of an agent standing in a state, named by its path ("review.asking"): the state
 * value holds it as a nested key or, at the innermost level, as a string. A compound state's runs
 * are those anywhere inside it.
 */
export async function openRunsInState(
  db: CommonQueryMethods,
  agent: string,
  path: string,
  limit: number,
): Promise<{ runs: readonly OpenMachineRun[]; total: number }> {
  const segments = path.split('.');
  const parent = sql.array(segments.slice(0, -1), 'text');
  const last = segments[segments.length - 1]!;
  const inState = sql.fragment`(machine_state #> ${parent} = to_jsonb(${last}::text) OR jsonb_exists(machine_state #> ${parent}, ${last}))`;
  const [runs, total] = await Promise.all([
    db.any(sql.type(openRun)`
      SELECT id, status, machine_hash, machine_state, updated_at
      FROM runs WHERE settled_at IS NULL AND agent = ${agent} AND ${inState} ORDER BY updated_at DESC, id LIMIT ${limit}`),
    db.oneFirst(sql.type(z.object({ n: z.number() }))`
      SELECT count(*)::int AS n FROM runs WHERE settled_at IS NULL AND agent = ${agent} AND ${inState}`),
  ]);
  return { runs, total };
}
