import { Task } from '@a2a-js/sdk';
import pg from 'pg';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { ADMIN_URL, createEmptyDatabase } from '../support/test-database.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// A Postgres on the same machine is reached through its Unix socket when the database URL names
// the socket's directory as its host, percent-encoded (postgres://user@%2Fvar%2Frun%2Fpostgresql/db,
// README "Production layout"): Keel's pool, its journal listener and its migrations all connect
// that way, and a task runs end to end over it.

/** The server's first socket directory, or null when it listens on none. */
async function socketDirectory(): Promise<string | null> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    const { rows } = await client.query<{ dirs: string }>("SELECT current_setting('unix_socket_directories') AS dirs");
    return rows[0]?.dirs.split(',')[0]?.trim() || null;
  } finally {
    await client.end();
  }
}

const directory = await socketDirectory();
let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
let keel: TestKeel;
let token = '';

beforeAll(async () => {
  if (directory === null) return;
  database = await createEmptyDatabase();
  // The host is the directory, percent-encoded; the port names the socket file in it.
  const url = new URL(database.url);
  url.hostname = encodeURIComponent(directory);
  keel = await startTestKeel({ databaseUrl: url.toString() });
  const created = await createClient(keel.context.pool, 'socket');
  if (!created.ok) throw new Error(created.reason);
  token = created.token;
});
afterAll(async () => {
  await keel?.dispose();
  await database?.drop();
});

describe.skipIf(directory === null)('a database URL that names a Unix socket directory', () => {
  it('migrates, answers a blocking SendMessage, and holds every Keel connection on the socket', async () => {
    expect(keel.databaseUrl).toContain(encodeURIComponent(directory!));
    const client = await sdkClient(keel.url, 'echo', token);
    const task = Task.toJSON((await client.sendMessage(textMessage('over the socket'))) as Task) as { status: { state: string }; artifacts: unknown[] };
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(JSON.stringify(task.artifacts)).toContain('echo: over the socket');

    // Every session Keel holds on its database came in through the socket: no client address.
    const sessions = await keel.context.pool.any(sql.type(z.object({ application_name: z.string(), tcp: z.boolean() }))`
      SELECT application_name, client_addr IS NOT NULL AS tcp FROM pg_stat_activity
      WHERE datname = current_database() AND application_name LIKE 'keel%'`);
    expect(sessions.map((session) => session.application_name)).toEqual(expect.arrayContaining(['keel', 'keel-journal-listener']));
    expect(sessions.filter((session) => session.tcp)).toEqual([]);
  });
});
