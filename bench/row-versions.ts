import pg from 'pg';
import { Pool } from 'undici';
import {
  A2A_HEADERS,
  databaseName,
  dropRedisKeys,
  guard,
  interrupted,
  judgeSend,
  machineLine,
  newInstallation,
  openKeelBench,
  postgresVersion,
  rpcBody,
  runBench,
  sendMessageParams,
  sleep,
  startKeelProcess,
  stopKeelProcess,
  unguard,
  withAdmin,
  withTrackedDatabase,
  writeBenchJson,
} from './keel-harness.js';
import { startPrivatePostgres } from './private-postgres.js';
import { ADMIN_URL, fmt } from './support.js';

// bench:rows — what one blocking echo task leaves in Postgres: row versions per table (inserts,
// updates, of which HOT, deletes, from pg_stat_user_tables), the bytes its heap and each index
// grow by, and the WAL it writes. One `keel start` (role all, auth off) on a fresh database; a
// warm-up; then BENCH_ROWS_TASKS blocking SendMessage requests at BENCH_CONCURRENCY, counters read
// before and after, each after every backend has flushed its statistics (Keel is stopped before
// the second reading). Heap bytes are coarse: under concurrent inserts Postgres extends a table
// by many pages at once.
//
// Environment:
//   BENCH_ROWS_TASKS       tasks measured (2000)
//   BENCH_CONCURRENCY      concurrent clients (32)
//   BENCH_ROWS_WARMUP      tasks sent before the first reading (200)
//   BENCH_KEEL_QUEUE       redis | postgres (redis)
//   BENCH_POSTGRES         private | machine (private): a cluster of the bench's own (see
//                          bench/private-postgres.ts), where the WAL written is the task's alone,
//                          or the machine's server, where other databases write WAL too (not shown)
//   and the knobs of bench/keel-harness.ts.

const { knobs, queue } = openKeelBench('bench:rows');
const tasks = knobs.positiveInt('BENCH_ROWS_TASKS', 2000);
const concurrency = knobs.positiveInt('BENCH_CONCURRENCY', 32);
const warmup = knobs.positiveInt('BENCH_ROWS_WARMUP', 200);
const usePrivatePostgres = knobs.choice<'private' | 'machine'>('BENCH_POSTGRES', 'private', ['private', 'machine']) === 'private';

type TableCounters = { ins: number; upd: number; hot: number; del: number; heapBytes: number };
type Snapshot = { tables: Map<string, TableCounters>; indexes: Map<string, { table: string; bytes: number }>; walLsn: string };

async function snapshot(url: string): Promise<Snapshot> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    // A fresh view of the shared statistics, not the one this session cached.
    await client.query('SELECT pg_stat_clear_snapshot()');
    const tables = await client.query<{ name: string; ins: string; upd: string; hot: string; del: string; bytes: string }>(`
      SELECT schemaname || '.' || relname AS name, n_tup_ins AS ins, n_tup_upd AS upd, n_tup_hot_upd AS hot, n_tup_del AS del,
        pg_relation_size(relid) AS bytes
      FROM pg_stat_user_tables`);
    const indexes = await client.query<{ name: string; table: string; bytes: string }>(`
      SELECT schemaname || '.' || indexrelname AS name, schemaname || '.' || relname AS table, pg_relation_size(indexrelid) AS bytes
      FROM pg_stat_user_indexes`);
    const wal = await client.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
    return {
      walLsn: wal.rows[0]!.lsn,
      tables: new Map(tables.rows.map((row) => [row.name, { ins: Number(row.ins), upd: Number(row.upd), hot: Number(row.hot), del: Number(row.del), heapBytes: Number(row.bytes) }])),
      indexes: new Map(indexes.rows.map((row) => [row.name, { table: row.table, bytes: Number(row.bytes) }])),
    };
  } finally {
    await client.end();
  }
}

/** Waits until no backend but ours is connected to the database, so every one has flushed its statistics. */
async function quiescent(url: string): Promise<void> {
  const name = databaseName(url);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const { rows } = await client.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()', [name]);
      if (rows[0]!.n === 0) break;
      await sleep(200);
    }
  } finally {
    await client.end();
  }
}

async function load(origin: string, count: number): Promise<{ seconds: number; errors: number }> {
  const pool = new Pool(origin, { connections: concurrency, pipelining: 1, headersTimeout: 120_000, bodyTimeout: 120_000 });
  let next = 0;
  let errors = 0;
  const started = performance.now();
  const client = async () => {
    while (!interrupted.signal.aborted && next < count) {
      next += 1;
      const text = `rows ${next}`;
      const response = await pool.request({
        path: '/a2a/echo',
        method: 'POST',
        headers: A2A_HEADERS,
        body: rpcBody(next, 'SendMessage', sendMessageParams(text)),
        signal: interrupted.signal,
      });
      const judged = judgeSend(response.statusCode, await response.body.text(), text, ['TASK_STATE_COMPLETED']);
      if ('error' in judged) errors += 1;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, client));
  const seconds = (performance.now() - started) / 1000;
  await pool.close();
  return { seconds, errors };
}

async function main(): Promise<number> {
  console.log(machineLine(await postgresVersion()));
  if (!usePrivatePostgres) return measure(ADMIN_URL);
  const mirrorFrom = await withAdmin(async () => ADMIN_URL).catch(() => undefined);
  const cluster = await startPrivatePostgres({
    ...(mirrorFrom ? { mirrorFrom } : {}),
    maxConnections: 200,
    ...(process.env.BENCH_PG_BINDIR ? { binDir: process.env.BENCH_PG_BINDIR } : {}),
    signal: interrupted.signal,
    onDataDir: (path) => guard({ kind: 'dir', path }),
    onServer: (pid, dir) => guard({ kind: 'postgres', pid, dir }),
  });
  console.log(`a private PostgreSQL ${cluster.version} cluster (${cluster.settings.join(', ')})`);
  try {
    return await measure(cluster.adminUrl);
  } finally {
    await cluster.stop().catch((error: Error) => console.error(`bench:rows: the private Postgres did not stop cleanly: ${error.message}`));
    unguard({ kind: 'postgres', pid: cluster.pid, dir: cluster.dataDir });
    unguard({ kind: 'dir', path: cluster.dataDir });
  }
}

async function measure(adminUrl: string): Promise<number> {
  const document = await withTrackedDatabase(async (url) => {
    const installation = newInstallation();
    const keel = await startKeelProcess({ name: 'Keel', databaseUrl: url, queue, ...installation });
    let before: Snapshot;
    let measured: { seconds: number; errors: number };
    try {
      await load(keel.origin, warmup);
      // Backends flush their statistics at most once a second while busy and within ~10 s of going idle.
      await sleep(11_000);
      // Every page written after this point logs its first change in full (full_page_writes), as
      // it would after any checkpoint: both variants compared start here.
      await withAdmin((client) => client.query('CHECKPOINT'), adminUrl);
      before = await snapshot(url);
      measured = await load(keel.origin, tasks);
    } finally {
      await stopKeelProcess(keel);
      if (queue === 'redis') await dropRedisKeys(installation.queuePrefix);
    }
    await quiescent(url);
    const after = await snapshot(url);
    const rows: Record<string, unknown>[] = [];
    for (const [name, end] of after.tables) {
      const start = before.tables.get(name) ?? { ins: 0, upd: 0, hot: 0, del: 0, heapBytes: 0 };
      const indexBytes = [...after.indexes]
        .filter(([, index]) => index.table === name)
        .map(([indexName, index]) => ({ name: indexName, bytes: index.bytes - (before.indexes.get(indexName)?.bytes ?? 0) }));
      const per = (value: number) => value / tasks;
      const row = {
        table: name,
        insertsPerTask: per(end.ins - start.ins),
        updatesPerTask: per(end.upd - start.upd),
        hotUpdatesPerTask: per(end.hot - start.hot),
        deletesPerTask: per(end.del - start.del),
        heapBytesPerTask: per(end.heapBytes - start.heapBytes),
        indexBytesPerTask: per(indexBytes.reduce((sum, index) => sum + index.bytes, 0)),
        indexes: Object.fromEntries(indexBytes.map((index) => [index.name, per(index.bytes)])),
      };
      if (row.insertsPerTask + row.updatesPerTask + row.deletesPerTask > 0) rows.push(row);
    }
    rows.sort((a, b) => String(a.table).localeCompare(String(b.table)));
    const walBytes = await withAdmin(
      async (client) => Number((await client.query<{ bytes: string }>('SELECT pg_wal_lsn_diff($1, $2)::bigint AS bytes', [after.walLsn, before.walLsn])).rows[0]!.bytes),
      adminUrl,
    );
    return {
      queue,
      tasks,
      concurrency,
      seconds: measured.seconds,
      tasksPerSecond: tasks / measured.seconds,
      errors: measured.errors,
      walBytesPerTask: usePrivatePostgres ? walBytes / tasks : null,
      tables: rows,
    };
  }, adminUrl);
  console.log(
    `queue ${document.queue}, ${document.tasks} tasks at concurrency ${document.concurrency}: ${fmt(document.tasksPerSecond)} tasks/s, ${document.errors} errors` +
      (document.walBytesPerTask === null ? '' : `, ${fmt(document.walBytesPerTask, 0)} WAL bytes/task`),
  );
  console.log(['table', 'ins/task', 'upd/task', 'HOT/task', 'del/task', 'heap B/task', 'index B/task'].join('\t'));
  const totals = { ins: 0, upd: 0, hot: 0, del: 0 };
  for (const row of document.tables as Array<{ table: string; insertsPerTask: number; updatesPerTask: number; hotUpdatesPerTask: number; deletesPerTask: number; heapBytesPerTask: number; indexBytesPerTask: number; indexes: Record<string, number> }>) {
    totals.ins += row.insertsPerTask;
    totals.upd += row.updatesPerTask;
    totals.hot += row.hotUpdatesPerTask;
    totals.del += row.deletesPerTask;
    console.log([row.table, fmt(row.insertsPerTask, 2), fmt(row.updatesPerTask, 2), fmt(row.hotUpdatesPerTask, 2), fmt(row.deletesPerTask, 2), fmt(row.heapBytesPerTask, 0), fmt(row.indexBytesPerTask, 0)].join('\t'));
    for (const [index, bytes] of Object.entries(row.indexes)) if (bytes !== 0) console.log(`  ${index}\t${fmt(bytes, 0)} B/task`);
  }
  console.log(['total', fmt(totals.ins, 2), fmt(totals.upd, 2), fmt(totals.hot, 2), fmt(totals.del, 2)].join('\t'));
  writeBenchJson(document);
  return document.errors === 0 ? 0 : 1;
}

runBench('bench:rows', main);
