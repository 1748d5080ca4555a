import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { CatalogEntry } from '../../src/ui/machine-catalog.js';
import { createAdminToken } from '../../src/ui/admin-auth.js';
import { rawRpc } from './a2a-wire.js';
import type { TestKeel } from './test-keel.js';

// Shared by the operator-surface tests: an admin session over plain fetch, A2A tasks with push
// configs, a webhook receiver on loopback, and the database's own counts per machine state.

export const LOOPBACK_PUSH_OVERRIDES: Record<string, unknown> = {
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
  KEEL_PUSH_RETRY_BASE_SECONDS: '0.05',
  KEEL_PUSH_RETRY_MAX_SECONDS: '0.5',
};

export type AdminSession = { token: string; cookie: string; csrf: string };

/** Creates an admin token, logs in with it, and reads the session's CSRF token from a page. */
export async function adminSession(keel: TestKeel, name = 'tester'): Promise<AdminSession> {
  const { token } = await createAdminToken(keel.context.pool, name);
  const login = await fetch(`${keel.url}/ui/login`, { method: 'POST', body: new URLSearchParams({ token, next: '/ui/machines' }), redirect: 'manual' });
  if (login.status !== 303) throw new Error(`login answered ${login.status}`);
  const cookie = login.headers.get('set-cookie')!.split(';')[0]!;
  const page = await (await fetch(`${keel.url}/ui/machines`, { headers: { cookie } })).text();
  const csrf = /name="_csrf" value="([^"]+)"/.exec(page)?.[1];
  if (!csrf) throw new Error('no CSRF token on the machines page');
  return { token, cookie, csrf };
}

export type Hook = { at: number; status: number; authorization: string | undefined; body: unknown; headers: IncomingHttpHeaders };

export type HookReceiver = {
  url: string;
  requests: Hook[];
  /** Statuses answered in order; the last one repeats. */
  setPlan: (statuses: number[]) => void;
  close: () => Promise<void>;
};

/** A node:http webhook receiver on 127.0.0.1 answering the planned statuses in order (the last repeats). */
export async function startHookReceiver(plan: number[] = [200]): Promise<HookReceiver> {
  let statuses = [...plan];
  const requests: Hook[] = [];
  const server: Server = createServer((request, response) => {
    let raw = '';
    request.on('data', (chunk: Buffer) => (raw += chunk.toString('utf8')));
    request.on('end', () => {
      const status = statuses.length > 1 ? statuses.shift()! : statuses[0]!;
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch {
        body = raw;
      }
      requests.push({ at: Date.now(), status, authorization: request.headers.authorization, body, headers: request.headers });
      response.writeHead(status, { 'content-type': 'text/plain' });
      response.end(status === 200 ? 'ok' : 'no');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hooks/keel-receiver-path`,
    requests,
    setPlan: (next) => (statuses = [...next]),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

export type PushInput = { id: string; url: string; credentials: string; token: string };

/** SendMessage over JSON-RPC with an embedded push config; returns the task id. */
export async function sendWithPush(keel: TestKeel, clientToken: string, agent: string, text: string, push: PushInput | null, returnImmediately = true): Promise<string> {
  const response = await rawRpc(
    keel.url,
    agent,
    {
      jsonrpc: '2.0',
      id: 1,
      method: 'SendMessage',
      params: {
        message: { messageId: `m-${Math.random().toString(36).slice(2)}`, role: 'ROLE_USER', parts: [{ text }] },
        configuration: {
          returnImmediately,
          ...(push ? { taskPushNotificationConfig: { id: push.id, url: push.url, token: push.token, authentication: { scheme: 'Bearer', credentials: push.credentials } } } : {}),
        },
      },
    },
    { token: clientToken },
  );
  const task = response.body?.result?.task;
  if (!task?.id) throw new Error(`SendMessage failed: ${response.text}`);
  return task.id as string;
}

type CountRow = { state: string; n: number };

/** The database's count of rows per state, per machine: the test's own SQL, not the UI's. */
export async function databaseCounts(pool: DatabasePool, catalog: readonly CatalogEntry[]): Promise<Record<string, Record<string, number>>> {
  const row = z.object({ state: z.string(), n: z.number() });
  const queries: Record<string, () => Promise<readonly CountRow[]>> = {
    run: () => pool.any(sql.type(row)`SELECT status AS state, count(*)::int AS n FROM runs GROUP BY 1`),
    task: () => pool.any(sql.type(row)`SELECT state, count(*)::int AS n FROM a2a_tasks GROUP BY 1`),
    delivery: () => pool.any(sql.type(row)`SELECT state, count(*)::int AS n FROM push_deliveries GROUP BY 1`),
    pushConfig: () => pool.any(sql.type(row)`SELECT state, count(*)::int AS n FROM push_configs WHERE deleted_at IS NULL GROUP BY 1`),
    dependency: () => pool.any(sql.type(row)`SELECT state, count(*)::int AS n FROM dependencies GROUP BY 1`),
  };
  const result: Record<string, Record<string, number>> = {};
  for (const entry of catalog) {
    const query = queries[entry.id];
    if (!query) throw new Error(`the test does not know how to count machine ${entry.id}`);
    const rows = await query();
    result[entry.id] = Object.fromEntries(entry.model.states.map((state) => [state.name, rows.find((row) => row.state === state.name)?.n ?? 0]));
  }
  return result;
}
