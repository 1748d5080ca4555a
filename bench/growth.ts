import { Pool } from 'undici';
import { sql } from 'slonik';
import { z } from 'zod';
import { createClient } from '../src/auth/client-repository.js';
import { loadConfig } from '../src/config/load-config.js';
import { silentLogger } from '../src/log/logger.js';
import { startKeel } from '../src/runtime/start-keel.js';
import { foldTaskCountDeltas } from '../src/tasks/task-counts.js';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';
import { fmt, percentile, withBenchDatabase } from './support.js';

// bench:growth — GetTask and ListTasks latency as the database grows: 10^4, 10^5 and 10^6 tasks
// (generated in bulk with SQL), measured over HTTP against one Keel. Flat figures mean the indexes
// and keyset pagination do their job. Prints figures; asserts nothing.
//
//   BENCH_GROWTH_SIZES   comma list of task counts (10000,100000,1000000)
//   BENCH_GROWTH_SAMPLES requests per measurement (300)

const sizes = (process.env.BENCH_GROWTH_SIZES ?? '10000,100000,1000000').split(',').map(Number);
const samples = Number(process.env.BENCH_GROWTH_SAMPLES ?? 300);

async function timed(pool: Pool, path: string, token: string, method: 'GET' | 'POST' = 'GET', body?: string): Promise<number> {
  const started = performance.now();
  const response = await pool.request({
    path,
    method,
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', ...(body ? { 'content-type': 'application/json' } : {}) },
    ...(body ? { body } : {}),
  });
  const text = await response.body.text();
  if (response.statusCode !== 200) throw new Error(`${path}: ${response.statusCode} ${text.slice(0, 200)}`);
  return performance.now() - started;
}

function stats(values: number[]) {
  const sorted = [...values].sort((a, b) => a - b);
  return `p50 ${fmt(percentile(sorted, 50), 2)} ms  p99 ${fmt(percentile(sorted, 99), 2)} ms`;
}

await withBenchDatabase(async (databaseUrl) => {
  const loaded = loadConfig({ env: { KEEL_DATABASE_URL: databaseUrl, KEEL_SERVER_PORT: '0', KEEL_DATA_DIR: `/tmp/keel-growth-${process.pid}`, KEEL_QUEUE_PREFIX: `growth${process.pid}` } });
  if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
  const started = await startKeel(loaded.config, silentLogger(), { env: { KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()) }, notice: () => undefined });
  if (!started.ok) throw new Error(started.message);
  const { keel } = started;
  const { pool } = keel.context;
  const client = await createClient(pool, 'growth');
  if (!client.ok) throw new Error('client');
  const http = new Pool(keel.url, { connections: 4 });
  let present = 0;
  try {
    console.log(`bench:growth — ${samples} requests per figure, one client, sequential; ${new Date().toISOString()}`);
    for (const size of sizes) {
      const add = size - present;
      const began = Date.now();
      // Bulk: contexts of 100 tasks, runs and their tasks, all COMPLETED with staggered timestamps.
      await pool.query(sql.unsafe`
        INSERT INTO contexts (owner, id) SELECT ${client.client.id}::uuid, 'ctx-' || g FROM generate_series(${Math.floor(present / 100)}::int, ${Math.floor(size / 100)}::int) g
        ON CONFLICT DO NOTHING`);
      await pool.query(sql.unsafe`
        WITH ids AS (SELECT g, gen_random_uuid() AS id FROM generate_series(${present}::int, ${present + add - 1}::int) g),
        r AS (
          INSERT INTO runs (id, agent, status, termination_reason, audit_level, answer_level, task_id, revision, started_at, settled_at, created_at, updated_at, status_changed_at)
          SELECT id, 'echo', 'completed', 'completed', 'metadata', 'full', id, 3, now(), now(), now() - (g || ' seconds')::interval, now(), now()
          FROM ids RETURNING id)
        INSERT INTO a2a_tasks (id, context_id, owner, agent, run_id, state, status_timestamp, answer_level, projected_revision, projected_state, created_at)
        SELECT id, 'ctx-' || (g / 100), ${client.client.id}::uuid, 'echo', id, 'TASK_STATE_COMPLETED', now() - (g || ' seconds')::interval, 'full', 3,
          'TASK_STATE_COMPLETED', now() - (g || ' seconds')::interval
        FROM ids`);
      // What the maintenance sweep does every few seconds: fold the task-count deltas of the bulk insert.
      await foldTaskCountDeltas(pool);
      await pool.query(sql.unsafe`ANALYZE runs`);
      await pool.query(sql.unsafe`ANALYZE a2a_tasks`);
      present = size;
      const ids = await pool.anyFirst(sql.type(z.object({ id: z.string() }))`SELECT id FROM a2a_tasks TABLESAMPLE SYSTEM (1) LIMIT ${samples}`);
      const get: number[] = [];
      const firstPage: number[] = [];
      const deepPage: number[] = [];
      const byContext: number[] = [];
      const byState: number[] = [];
      const rpc = (method: string, params: unknown) => JSON.stringify({ jsonrpc: '2.0', id: 1, method, params });
      // A page token from deep in the list, to show keyset pagination does not slow down with depth.
      const deep = await pool.one(sql.type(z.object({ status_timestamp: z.number(), id: z.string() }))`
        SELECT status_timestamp, id FROM a2a_tasks ORDER BY status_timestamp DESC, id DESC OFFSET ${Math.floor(size * 0.9)} LIMIT 1`);
      const deepToken = Buffer.from(JSON.stringify([1, deep.status_timestamp, deep.id])).toString('base64url');
      for (let index = 0; index < samples; index += 1) {
        get.push(await timed(http, '/a2a/echo', client.token, 'POST', rpc('GetTask', { id: ids[index % ids.length] })));
        firstPage.push(await timed(http, '/a2a/echo/tasks?pageSize=50', client.token));
        deepPage.push(await timed(http, `/a2a/echo/tasks?pageSize=50&pageToken=${deepToken}`, client.token));
        byContext.push(await timed(http, `/a2a/echo/tasks?pageSize=50&contextId=ctx-${index % Math.max(1, size / 100)}`, client.token));
        byState.push(await timed(http, '/a2a/echo/tasks?pageSize=50&status=TASK_STATE_COMPLETED', client.token));
      }
      // totalSize must still be the exact count at every size.
      const answer = await http.request({ path: '/a2a/echo/tasks?pageSize=1', method: 'GET', headers: { authorization: `Bearer ${client.token}`, 'a2a-version': '1.0' } });
      const { totalSize } = (await answer.body.json()) as { totalSize: number };
      if (totalSize !== size) throw new Error(`totalSize ${totalSize} where ${size} tasks exist`);
      console.log(`${String(size).padStart(8)} tasks (generated in ${((Date.now() - began) / 1000).toFixed(1)} s)`);
      console.log(`  GetTask                        ${stats(get)}`);
      console.log(`  ListTasks first page           ${stats(firstPage)}   (totalSize ${totalSize}, from the task counters)`);
      console.log(`  ListTasks page at 90 %         ${stats(deepPage)}`);
      console.log(`  ListTasks by context           ${stats(byContext)}`);
      console.log(`  ListTasks by state             ${stats(byState)}`);
    }
  } finally {
    await http.close();
    await keel.stop();
  }
});
process.exit(0);
