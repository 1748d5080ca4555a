import { randomUUID } from 'node:crypto';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';

// Runs of a statechart agent written straight into the database, in the states a test needs: the
// columns and rows a run's committed transitions leave (runs.machine_hash, runs.machine_state,
// run_machine_steps), without running the machine. Only statuses no worker or sweep moves on by
// itself are used (waits, terminal), so the rows stay as written while a test looks at them.

export type MachineRunRow = {
  agent: string;
  status: 'waiting_for_input' | 'waiting_for_approval' | 'waiting_for_dependency' | 'completed' | 'failed';
  hash: string | null;
  state: unknown;
  /** The path: one row per committed transition, in order. */
  steps?: Array<{ state: unknown; event: string }>;
  /** The version the path's transitions ran on (the run's own by default). */
  stepsHash?: string;
};

/** Inserts the run (and its path) and returns its id. */
export async function insertMachineRun(pool: DatabasePool, row: MachineRunRow): Promise<string> {
  const id = randomUUID();
  const terminal = row.status === 'completed' || row.status === 'failed';
  const reason = row.status === 'completed' ? 'completed' : row.status === 'failed' ? 'not_retryable' : null;
  await pool.query(sql.unsafe`
    INSERT INTO runs (id, agent, status, termination_reason, audit_level, answer_level, machine_hash, machine_state, started_at, settled_at)
    VALUES (${id}, ${row.agent}, ${row.status}, ${reason}, 'metadata', 'full', ${row.hash},
      ${row.state === null ? null : sql.jsonb(row.state as never)}, now(), ${terminal ? sql.fragment`now()` : null})`);
  for (const [sequence, step] of (row.steps ?? []).entries()) {
    await pool.query(sql.unsafe`
      INSERT INTO run_machine_steps (run_id, sequence, state, event, machine_hash, at)
      VALUES (${id}, ${sequence}, ${sql.jsonb(step.state as never)}, ${step.event}, ${row.stepsHash ?? row.hash ?? 'unknown'}, now() + ${sequence} * interval '1 second')`);
  }
  return id;
}

/** Settles an open run (completed), as its completion would. */
export async function settleMachineRun(pool: DatabasePool, runId: string, state: unknown): Promise<void> {
  await pool.query(sql.unsafe`
    UPDATE runs SET status = 'completed', termination_reason = 'completed', settled_at = now(), machine_state = ${sql.jsonb(state as never)}, updated_at = now()
    WHERE id = ${runId}`);
}

/** The definitions recorded for an agent: hash and the definition's machine id. */
export async function recordedDefinitions(pool: DatabasePool, agent: string): Promise<readonly { hash: string; machine: string }[]> {
  return pool.any(sql.type(z.object({ hash: z.string(), machine: z.string() }))`
    SELECT hash, definition ->> 'id' AS machine FROM machine_definitions WHERE agent = ${agent} ORDER BY first_seen_at, hash`);
}
