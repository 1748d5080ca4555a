import { chmodSync, existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, describe, expect, it } from 'vitest';
import { runningEmbeddedUrl } from '../../src/db/embedded-postgres.js';
import { createDatabasePool } from '../../src/db/pool.js';
import { createRun, getRun, queuedRequestContext } from '../../src/runs/run-repository.js';
import { loadMasterKeys } from '../../src/sealing/master-key-store.js';
import { MasterKeyRing } from '../../src/sealing/master-key.js';
import { createSealer } from '../../src/sealing/sealer.js';
import { cleanEnv, runKeel, spawnKeel, type KeelProcess } from '../support/keel-process.js';
import { tempDir } from '../support/test-keel.js';

// `keel start` with no config file and no services but its own: the embedded default.

const cwd = tempDir('keel-embedded-');
// The embedded server runs as the user postgres, which must be able to enter the directory.
chmodSync(cwd, 0o755);
const dataDir = join(cwd, '.keel');
const env = cleanEnv({ KEEL_SERVER_PORT: '0' });
const running: KeelProcess[] = [];

async function startKeel(): Promise<{ keel: KeelProcess; url: string; readyMs: number }> {
  const startedAt = Date.now();
  const keel = spawnKeel(['start'], { cwd, env });
  running.push(keel);
  const ready = await keel.waitForLog('keel is ready', 90_000);
  return { keel, url: String(ready.url), readyMs: Date.now() - startedAt };
}

function postmasterPid(): number | null {
  const file = join(dataDir, 'pg', 'postmaster.pid');
  return existsSync(file) ? Number(readFileSync(file, 'utf8').split('\n')[0]) : null;
}

afterAll(async () => {
  for (const keel of running) if (keel.child.exitCode === null) keel.child.kill('SIGKILL');
  const pid = postmasterPid();
  if (pid) {
    try {
      process.kill(pid, 'SIGINT');
    } catch {
      // already gone
    }
  }
});

describe('the embedded default', () => {
  let runId = '';

  it('comes up with no config and answers /readyz', async () => {
    const { keel, url, readyMs } = await startKeel();
    const ready = await fetch(`${url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready', database: 'ok', queue: 'ok' });
    expect(await (await fetch(`${url}/healthz`)).json()).toEqual({ status: 'ok' });
    expect(existsSync(join(dataDir, 'pg', 'PG_VERSION'))).toBe(true);
    expect(readFileSync(join(dataDir, 'master.key')).length).toBeGreaterThan(40);
    console.info(`embedded start on a fresh data directory: ready in ${readyMs} ms`);
    void keel;
  });

  it('refuses a second instance on the same data directory with a clear message', async () => {
    const second = await runKeel(['start'], { cwd, env });
    expect(second.code).toBe(3);
    expect(second.stderr).toMatch(/another Keel process \(pid \d+\) is already using the data directory/);
  });

  it('lets short commands use the running embedded server', async () => {
    const url = runningEmbeddedUrl(dataDir);
    expect(url).toBeTruthy();
    // Through the server's Unix socket in its own data directory, the password still required.
    const socketDir = join(dataDir, 'pg');
    expect(new URL(url!).hostname).toBe(encodeURIComponent(socketDir));
    expect(existsSync(join(socketDir, `.s.PGSQL.${new URL(url!).port}`))).toBe(true);
    const wrong = new URL(url!);
    wrong.password = 'not-the-password';
    const refused = new pg.Client({ connectionString: wrong.href });
    await expect(refused.connect()).rejects.toMatchObject({ code: '28P01' });
    await refused.end().catch(() => undefined);
    const pool = await createDatabasePool(url!);
    // Every connection of the running Keel (its pool, the journal listener, the queue's) and this
    // one: none over TCP (a socket connection has no client address).
    const backends = await pool.one(sql.type(z.object({ all: z.number(), tcp: z.number() }))`
      SELECT count(*)::int AS all, (count(*) FILTER (WHERE client_addr IS NOT NULL))::int AS tcp
      FROM pg_stat_activity WHERE datname = 'keel' AND backend_type = 'client backend'`);
    expect(backends.all).toBeGreaterThan(1);
    expect(backends.tcp).toBe(0);
    const keys = await loadMasterKeys(join(dataDir, 'master.key'), {});
    if (!keys.ok) throw new Error('no key');
    const sealer = createSealer(new MasterKeyRing(keys.keys));
    const run = await createRun(pool, sealer, { agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', request: { text: 'kept across restarts' } });
    runId = run.id;
    // Not due for a day: the running Keel's sweeper gives it a delayed job, so no worker takes it
    // (its request is not an agent request) before the restart check below.
    await pool.query(sql.unsafe`UPDATE runs SET available_at = now() + interval '1 day' WHERE id = ${runId}`);
    await pool.end();
    const listed = await runKeel(['runs', 'list', '--json'], { cwd, env });
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain(runId);
    const doctor = await runKeel(['doctor'], { cwd, env });
    expect(doctor.code).toBe(0);
    expect(doctor.stdout).toMatch(/ok\s+database\s+embedded; schema current/);
  });

  it('stops Postgres cleanly on SIGTERM and keeps the rows across a restart', async () => {
    const first = running[0]!;
    const pgPid = postmasterPid();
    expect(pgPid).toBeGreaterThan(0);
    first.child.kill('SIGTERM');
    expect(await first.exited).toEqual({ code: 0, signal: null });
    expect(postmasterPid()).toBeNull();
    expect(existsSync(join(dataDir, 'keel.pid'))).toBe(false);

    const { url, readyMs } = await startKeel();
    console.info(`embedded start on a warm data directory: ready in ${readyMs} ms`);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    const pool = await createDatabasePool(runningEmbeddedUrl(dataDir)!);
    const keys = await loadMasterKeys(join(dataDir, 'master.key'), {});
    if (!keys.ok) throw new Error('no key');
    const run = await getRun(pool, runId);
    await pool.end();
    expect(run?.status).toBe('queued');
    const opened = createSealer(new MasterKeyRing(keys.keys)).openJson(queuedRequestContext(runId), run!.queued_request!);
    expect(opened).toEqual({ ok: true, value: { text: 'kept across restarts' } });
  });

  it('recovers after SIGKILL: the orphaned Postgres is stopped and the data is still there', async () => {
    const current = running[running.length - 1]!;
    current.child.kill('SIGKILL');
    await current.exited;
    const { url } = await startKeel();
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    const listed = await runKeel(['runs', 'list', '--json'], { cwd, env });
    expect(listed.stdout).toContain(runId);
    const last = running[running.length - 1]!;
    last.child.kill('SIGTERM');
    expect((await last.exited).code).toBe(0);
  });
});
