import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { loadConfig } from '../src/config/load-config.js';
import { silentLogger } from '../src/log/logger.js';
import { createAgentRun, enqueueRun } from '../src/runs/create-agent-run.js';
import { userRequest } from '../src/runs/run-request.js';
import { startKeel } from '../src/runtime/start-keel.js';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';
import { fmt, withBenchDatabase } from './support.js';

// bench:runs — how many echo runs per second one worker process completes, at run concurrency 1
// and 16, on the Postgres queue backend and (when Redis answers) on Redis.

const counts: Record<number, number> = { 1: Number(process.env.BENCH_RUNS_C1 ?? 300), 16: Number(process.env.BENCH_RUNS_C16 ?? 2000) };
const backends = (process.env.BENCH_QUEUES ?? 'postgres,redis').split(',');

async function measure(backend: string, concurrency: number, total: number): Promise<number> {
  return withBenchDatabase(async (databaseUrl) => {
    const loaded = loadConfig({
      env: {
        KEEL_DATABASE_URL: databaseUrl,
        KEEL_SERVER_PORT: '0',
        KEEL_DATA_DIR: `/tmp/keel-bench-${process.pid}`,
        KEEL_RUNS_CONCURRENCY: String(concurrency),
        KEEL_QUEUE_PREFIX: `bench${process.pid}c${concurrency}`,
        ...(backend === 'redis' ? { KEEL_QUEUE_REDIS_URL: 'redis://127.0.0.1:6379' } : {}),
      },
    });
    if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
    const started = await startKeel(loaded.config, silentLogger(), { env: { KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()) } });
    if (!started.ok) throw new Error(started.message);
    const { keel } = started;
    const { pool, sealer, queues } = keel.context;
    try {
      // Warm-up, so connection set-up and JIT are not measured.
      for (let index = 0; index < 20; index += 1) {
        const created = await createAgentRun(pool, sealer, keel.registry, 'echo', userRequest(`warm ${index}`));
        if (created.ok) await enqueueRun(queues, created.run.id);
      }
      await waitAllSettled(pool, 20);
      const begin = Date.now();
      const ids: string[] = [];
      for (let index = 0; index < total; index += 1) {
        const created = await createAgentRun(pool, sealer, keel.registry, 'echo', userRequest(`run ${index}`));
        if (!created.ok) throw new Error('cannot create run');
        ids.push(created.run.id);
        await enqueueRun(queues, created.run.id);
      }
      await waitAllSettled(pool, 20 + total);
      const seconds = (Date.now() - begin) / 1000;
      return total / seconds;
    } finally {
      await keel.stop();
    }
  });
}

async function waitAllSettled(pool: DatabasePool, expected: number): Promise<void> {
  for (;;) {
    const done = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM runs WHERE status = 'completed'`);
    if (done >= expected) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const rows: string[] = [];
for (const backend of backends) {
  for (const concurrency of [1, 16]) {
    try {
      const rate = await measure(backend, concurrency, counts[concurrency]!);
      rows.push(`${backend.padEnd(9)} concurrency ${String(concurrency).padStart(2)}: ${fmt(rate)} runs/s (${counts[concurrency]} echo runs, one worker process)`);
    } catch (error) {
      rows.push(`${backend.padEnd(9)} concurrency ${String(concurrency).padStart(2)}: not measured (${(error as Error).message})`);
    }
    console.log(rows[rows.length - 1]);
  }
}
console.log(`\nbench:runs on ${process.version}, ${(await import('node:os')).cpus().length} cores`);
process.exit(0);
