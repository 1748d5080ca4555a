import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import { arrayCasts } from '../src/db/same-text-statement.js';
import { heldCompletionStatement } from '../src/writes/complete-held-runs.js';
import { creationStatement } from '../src/writes/task-creation.js';
import { clockTicks, envKnobs, machineLine, postgresVersion, procStat } from './keel-harness.js';
import { ADMIN_URL, fmt } from './support.js';

// bench:columns — what it costs to hand a batch's columns to Postgres, as text literals (a JS array
// node-postgres escapes) or as binary arrays (decision 0037). For the creation and the held
// completion statements: a batch of BENCH_COLUMNS_BATCH tasks with sealed values of the sizes an
// echo task has, bound BENCH_COLUMNS_CALLS times into a prepared statement with the same
// parameter types that only counts the elements (so what is measured is the parameters: building
// them, sending them, and Postgres reading them at Bind), alternating the two ways for
// BENCH_ROUNDS rounds. CPU per call: this process (process.cpuUsage) and its Postgres backend
// (/proc/<pid>/stat, so Postgres must run on this machine).
//
// Environment:
//   BENCH_COLUMNS_BATCH   tasks per batch (10)
//   BENCH_COLUMNS_CALLS   calls per measurement (3000)
//   BENCH_ROUNDS          rounds, each measuring both ways (3)
//   KEEL_BENCH_ADMIN_URL  the Postgres to bind against (bench/support.ts)

const knobs = envKnobs('bench:columns');
const batch = knobs.positiveInt('BENCH_COLUMNS_BATCH', 10);
const calls = knobs.positiveInt('BENCH_COLUMNS_CALLS', 3000);
const rounds = knobs.positiveInt('BENCH_ROUNDS', 3);

// Sealed sizes of one echo task ("hello"), as bench:rows finds them: the run's request, the
// history, the journal's payloads and the result.
const sealed = (bytes: number) => randomBytes(bytes);

function creationRows(): Parameters<typeof creationStatement.with>[0] {
  const ids = Array.from({ length: batch }, () => randomUUID());
  const at = Date.now();
  return [
    ids.map((id) => [randomUUID(), id] as const),
    ids.map((id) => [id, 'echo', 'running', 'metadata', 'full', null, id, sealed(420), 'worker-1', 30_000, at, 2]),
    ids.map((id) => [id, randomUUID(), randomUUID(), 'echo', 'TASK_STATE_WORKING', 'full', sealed(380), null, at, 2, 1, 'TASK_STATE_WORKING']),
    ids.map((id) => [id, 1, id, 2, 0, 'status', 'TASK_STATE_WORKING', sealed(300)]),
  ];
}

function heldCompletionRows(): Parameters<typeof heldCompletionStatement.with>[0] {
  const ids = Array.from({ length: batch }, () => randomUUID());
  const at = Date.now();
  return [
    ids.map((id) => [id, id, 'worker-1', 2, 'full', 1, 2, 'TASK_STATE_WORKING', sealed(380)]),
    ids.flatMap((id) => [
      [id, 1, 'claimed', '{"worker":"worker-1"}', at],
      [id, 2, 'completed', '{}', at + 1],
    ]),
    ids.map((id) => [id, sealed(350), null, false, null, false, 'full', 3, 3, at + 2]),
    ids.map((id) => [id, 'worker-1', 'completed', false, 1, 0, 10, 20, at + 2]),
    ids.flatMap((id) => [
      [id, 2, id, 3, 0, 'artifact', null, sealed(400)],
      [id, 3, id, 3, 1, 'status', 'TASK_STATE_COMPLETED', sealed(330)],
    ]),
    ids.map((id) => `${id} 3 1`),
  ];
}

/** utime + stime of a process on this machine, in ms. */
function cpuMs(pid: number): number {
  const stat = procStat(pid);
  if (stat === null) throw new Error(`bench:columns: process ${pid} is not on this machine (or is gone): Postgres must run here`);
  return (stat.ticks * 1000) / clockTicks();
}

type Way = 'text' | 'binary';

type Built = { sql: string; values: readonly unknown[] };

async function measure<S>(client: pg.Client, backendPid: number, name: string, statement: { with: (sets: S) => Built; withColumnsAsText: (sets: S) => Built }, sets: S) {
  // The statement's array parameters, by the casts slonik wrote; the rest (the NOTIFY channel) is left out.
  const { sql: text } = statement.with(sets);
  const casts = [...arrayCasts(text)].map(([index, type]) => ({ index, type }));
  const counting = `SELECT ${casts.map((cast, at) => `cardinality($${at + 1}::${cast.type}[])`).join(' + ')} AS elements`;
  const results: Record<Way, { node: number[]; postgres: number[] }> = { text: { node: [], postgres: [] }, binary: { node: [], postgres: [] } };
  for (let round = 0; round < rounds; round += 1) {
    for (const way of ['text', 'binary'] as const) {
      const node = process.cpuUsage();
      const backend = cpuMs(backendPid);
      for (let call = 0; call < calls; call += 1) {
        const values = (way === 'binary' ? statement.with(sets) : statement.withColumnsAsText(sets)).values;
        await client.query({ name: `${name}-${way}`, text: counting, values: casts.map((cast) => values[cast.index]) });
      }
      const used = process.cpuUsage(node);
      results[way].node.push((used.user + used.system) / calls);
      results[way].postgres.push(((cpuMs(backendPid) - backend) * 1000) / calls);
    }
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
  for (const way of ['text', 'binary'] as const) {
    const { node, postgres } = results[way];
    console.log(
      `${name.padEnd(16)} ${way.padEnd(7)} µs per batch: this process ${fmt(median(node), 0).padStart(5)} (${node.map((v) => fmt(v, 0)).join(', ')}), ` +
        `Postgres ${fmt(median(postgres), 0).padStart(5)} (${postgres.map((v) => fmt(v, 0)).join(', ')})`,
    );
  }
}

const client = new pg.Client({ connectionString: ADMIN_URL });
await client.connect();
try {
  const backendPid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
  console.log(`bench:columns — a batch's columns bound as text literals or binary arrays; ${batch} tasks per batch, ${calls} calls × ${rounds} rounds`);
  console.log(machineLine(await postgresVersion()));
  await measure(client, backendPid, 'creation', creationStatement, creationRows());
  await measure(client, backendPid, 'held completion', heldCompletionStatement, heldCompletionRows());
  console.log('medians over the rounds (each round in parentheses); Postgres: its backend, which reads the parameters at Bind');
} finally {
  await client.end();
}
