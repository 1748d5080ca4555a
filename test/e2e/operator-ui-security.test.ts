import { randomUUID } from 'node:crypto';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { getRun } from '../../src/runs/run-repository.js';
import { readSuspendedRun } from '../../src/runs/resume-run.js';
import { revokeAdminToken } from '../../src/ui/admin-auth.js';
import { loadMachineCatalog } from '../../src/ui/machine-catalog.js';
import { uiRoutesOf } from '../../src/ui/ui-routes.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { adminSession, LOOPBACK_PUSH_OVERRIDES, sendWithPush, startHookReceiver, type AdminSession, type HookReceiver } from '../support/operator-ui.js';
import { startRun, TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../support/wait-for.js';

// The operator UI's doors: without an admin session every UI and dashboard route answers 401 or
// redirects to the login form; a state-changing request without the session's CSRF token (or from
// another origin) is refused and changes nothing; sessions end at logout, at expiry and when their
// token is revoked; and no page ever shows a push credential or token.

const CREDENTIAL = 'cred-Zq81-very-secret-push-credential-7Hk2';
const PUSH_TOKEN = 'tok-Pw44-very-secret-notification-token-9Qx';

let keel: TestKeel;
let receiver: HookReceiver;
let clientToken = '';
let session: AdminSession;

beforeAll(async () => {
  receiver = await startHookReceiver([401, 200]);
  keel = await startTestKeel({
    overrides: {
      ...LOOPBACK_PUSH_OVERRIDES,
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'security-client');
  if (!client.ok) throw new Error('client');
  clientToken = client.token;
  session = await adminSession(keel);
});
afterAll(async () => {
  await keel?.dispose();
  await receiver?.close();
});

const get = (path: string, cookie?: string) => fetch(`${keel.url}${path}`, { headers: cookie ? { cookie } : {}, redirect: 'manual' });
const post = (path: string, form: Record<string, string>, cookie?: string, headers: Record<string, string> = {}) =>
  fetch(`${keel.url}${path}`, { method: 'POST', body: new URLSearchParams(form), headers: { ...(cookie ? { cookie } : {}), ...headers }, redirect: 'manual' });

/** A concrete path for a route pattern: parameters filled with plausible values. */
function concrete(url: string): string {
  return url
    .replace(/:machine/g, 'run')
    .replace(/:state/g, 'queued')
    .replace(/:(id|taskId|runId)/g, randomUUID())
    .replace(/:configId/g, 'hook')
    .replace(/:[A-Za-z]+/g, 'x')
    .replace(/\*/g, 'x');
}

describe('without an admin session', () => {
  it('every UI and dashboard route answers 401 or redirects to the login form', async () => {
    const routes = uiRoutesOf(keel.http.server);
    const urls = new Set(routes.map((route) => route.url));
    // The pages, the APIs and the dashboard are all among them.
    for (const expected of ['/ui/machines', '/ui/runs', '/ui/runs/:id', '/ui/approvals', '/ui/push', '/ui/dependencies', '/ui/api/counts', '/ui/queues', '/ui/queues/api/queues']) {
      expect([...urls].some((url) => url === expected || url.replace(/\/$/, '') === expected), `route ${expected} registered`).toBe(true);
    }
    expect(routes.length).toBeGreaterThan(20);
    let checked = 0;
    for (const route of routes) {
      if (route.url === '/ui/login') continue;
      const response = await fetch(`${keel.url}${concrete(route.url)}`, {
        method: route.method,
        redirect: 'manual',
        ...(['POST', 'PUT', 'PATCH', 'DELETE'].includes(route.method) ? { body: '{}', headers: { 'content-type': 'application/json' } } : {}),
      });
      const status = response.status;
      const where = response.headers.get('location') ?? '';
      expect(status === 401 || (status === 303 && where.startsWith('/ui/login')), `${route.method} ${route.url} answered ${status} ${where}`).toBe(true);
      if (route.method === 'GET' && !route.url.startsWith('/ui/api/') && !route.url.startsWith('/ui/queues/api/') && !route.url.startsWith('/ui/queues/static/')) {
        expect(status, `${route.url} is a page: redirect`).toBe(303);
      }
      checked += 1;
    }
    expect(checked).toBeGreaterThan(20);
    // Unknown paths under /ui and a forged cookie fare no better.
    expect((await get('/ui/no-such-page')).status).toBe(303);
    expect((await get('/ui/api/no-such-thing')).status).toBe(401);
    expect((await get('/ui/api/counts', 'keel_ui_session=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA')).status).toBe(401);
    expect((await get('/ui/machines', `keel_ui_session=${session.token}`)).status).toBe(303);
  });

  it('the login form refuses a wrong token and sets an HttpOnly, SameSite=Strict cookie for a right one', async () => {
    const wrong = await post('/ui/login', { token: `keel_admin_${'A'.repeat(43)}`, next: '/ui/runs' });
    expect(wrong.status).toBe(401);
    expect(wrong.headers.get('set-cookie')).toBeNull();
    const login = await post('/ui/login', { token: session.token, next: '/ui/runs' });
    expect(login.status).toBe(303);
    expect(login.headers.get('location')).toBe('/ui/runs');
    const cookie = login.headers.get('set-cookie')!;
    expect(cookie).toMatch(/^keel_ui_session=[A-Za-z0-9_-]{43};/);
    expect(cookie).toContain('HttpOnly');
    expect(cookie).toContain('SameSite=Strict');
    expect(cookie).toContain('Path=/ui');
    // An open redirect is not possible.
    const away = await post('/ui/login', { token: session.token, next: 'https://evil.example/' });
    expect(away.headers.get('location')).toBe('/ui/machines');
  });
});

describe('state-changing requests', () => {
  it('without the CSRF token, with a wrong one or from another origin: 403 and nothing changes', async () => {
    const runId = await startRun(keel, 'mailer', 'tell ops');
    await waitForRunStatus(keel.context.pool, runId, ['waiting_for_approval']);
    const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, runId, 'waiting_for_approval');
    if (!read.ok) throw new Error(read.reason);
    const digest = read.view.state.pendingApproval!.digest;

    expect((await post(`/ui/approvals/${runId}`, { decision: 'approve', digest }, session.cookie)).status).toBe(403);
    expect((await post(`/ui/approvals/${runId}`, { decision: 'approve', digest, _csrf: 'x'.repeat(43) }, session.cookie)).status).toBe(403);
    expect((await post(`/ui/approvals/${runId}`, { decision: 'approve', digest, _csrf: session.csrf }, session.cookie, { origin: 'https://evil.example' })).status).toBe(403);
    // Another session's CSRF token does not fit this session.
    const other = await adminSession(keel, 'other-operator');
    expect((await post(`/ui/approvals/${runId}`, { decision: 'approve', digest, _csrf: other.csrf }, session.cookie)).status).toBe(403);
    expect((await getRun(keel.context.pool, runId))!.status).toBe('waiting_for_approval');

    // Resume and logout are guarded the same way.
    expect((await post(`/ui/push/${randomUUID()}/hook/resume`, {}, session.cookie)).status).toBe(403);
    expect((await post('/ui/logout', {}, session.cookie)).status).toBe(403);
    expect((await get('/ui/machines', session.cookie)).status).toBe(200);
    // The dashboard is read-only: its mutations are refused even with a session.
    expect((await fetch(`${keel.url}/ui/queues/api/queues/runs/pause`, { method: 'PUT', headers: { cookie: session.cookie, 'x-csrf-token': session.csrf } })).status).toBe(403);

    // With the token, the same request decides the turn.
    const decided = await post(`/ui/approvals/${runId}`, { decision: 'approve', digest, _csrf: session.csrf }, session.cookie);
    expect(decided.status).toBe(303);
    expect(decided.headers.get('location')).toBe(`/ui/runs/${runId}?flash=approved`);
    await waitForRunStatus(keel.context.pool, runId, ['completed']);
    // A replay of the decision is refused by the guarded path, not applied twice.
    const again = await post(`/ui/approvals/${runId}`, { decision: 'deny', digest, _csrf: session.csrf }, session.cookie);
    expect(again.headers.get('location')).toBe('/ui/approvals?flash=not_waiting');
  });
});

describe('sessions end', () => {
  it('at logout, at expiry, and when the admin token is revoked', async () => {
    const a = await adminSession(keel, 'logout-test');
    expect((await post('/ui/logout', { _csrf: a.csrf }, a.cookie)).headers.get('location')).toBe('/ui/login?bye=1');
    expect((await get('/ui/machines', a.cookie)).status).toBe(303);

    const b = await adminSession(keel, 'expiry-test');
    await keel.context.pool.query(sql.unsafe`UPDATE admin_sessions SET expires_at = now() - interval '1 second' WHERE token_id = (SELECT id FROM admin_tokens WHERE name = 'expiry-test')`);
    expect((await get('/ui/machines', b.cookie)).status).toBe(303);
    expect((await get('/ui/api/counts', b.cookie)).status).toBe(401);

    const c = await adminSession(keel, 'revoke-test');
    expect((await get('/ui/api/counts', c.cookie)).status).toBe(200);
    expect((await revokeAdminToken(keel.context.pool, 'revoke-test')).ok).toBe(true);
    expect((await get('/ui/api/counts', c.cookie)).status).toBe(401);
    expect((await post('/ui/login', { token: c.token })).status).toBe(401);
  });
});

describe('credentials never appear', () => {
  it('in any page, list, API answer or the metrics, for a paused config and its deliveries', async () => {
    const taskId = await sendWithPush(keel, clientToken, 'echo', 'secret-free text', { id: 'hook', url: receiver.url, credentials: CREDENTIAL, token: PUSH_TOKEN }, false);
    // The receiver refused the credential: the config is paused ("authentication failed").
    await waitFor(
      async () =>
        (await keel.context.pool.maybeOneFirst(sql.type(z.object({ state: z.string() }))`SELECT state FROM push_configs WHERE task_id = ${taskId} AND id = 'hook'`)) === 'paused',
      'the config to pause',
    );
    expect(receiver.requests[0]!.authorization).toBe(`Bearer ${CREDENTIAL}`);
    const runId = await startRun(keel, 'mailer', 'tell ops');
    await waitForRunStatus(keel.context.pool, runId, ['waiting_for_approval']);

    const catalog = await loadMachineCatalog();
    const paths = [
      '/ui/machines',
      '/ui/runs',
      `/ui/runs/${taskId}`,
      `/ui/runs/${runId}`,
      '/ui/approvals',
      '/ui/push',
      `/ui/push/${taskId}/hook`,
      '/ui/dependencies',
      '/ui/queues',
      '/ui/api/counts',
      `/ui/api/runs/${taskId}/version`,
      `/ui/api/push/${taskId}/hook/version`,
      '/ui/logout',
      ...catalog.flatMap((entry) => entry.model.states.map((state) => `/ui/machines/${entry.id}/${state.name}`)),
      ...['runs', 'projector', 'push', 'inbox', 'maintenance'].map((queue) => `/ui/queues/api/queues?activeQueue=${queue}&status=latest&page=1&jobsPerPage=50`),
    ];
    const secrets = [CREDENTIAL, PUSH_TOKEN, CREDENTIAL.slice(0, 20), PUSH_TOKEN.slice(0, 20), Buffer.from(CREDENTIAL).toString('base64')];
    for (const path of paths) {
      const response = await get(path, session.cookie);
      expect(response.status, path).toBe(200);
      const body = await response.text();
      for (const secret of secrets) expect(body.includes(secret), `${path} shows a secret`).toBe(false);
    }
    const push = await (await get(`/ui/push/${taskId}/hook`, session.cookie)).text();
    expect(push).toContain(`Bearer …${CREDENTIAL.slice(-4)}`);
    expect(push).toContain('authentication failed');
    // The webhook path is masked too.
    expect(push).not.toContain('keel-receiver-path');
    const metrics = await (await fetch(`${keel.url}/metrics`)).text();
    for (const secret of secrets) expect(metrics.includes(secret)).toBe(false);
  });
});

describe('the dependencies page', () => {
  it('shows open and resolved dependencies and the callbacks received, never a callback body', async () => {
    const runId = await startRun(keel, 'echo', 'a run to hang dependencies on');
    await waitForRunStatus(keel.context.pool, runId, ['completed']);
    const open = randomUUID();
    const resolved = randomUUID();
    const registration = randomUUID();
    const body = 'callback-body-must-not-show';
    await keel.context.pool.transaction(async (transaction) => {
      for (const [id, state, call] of [[open, 'waiting', 'call-open'], [resolved, 'resolved', 'call-done']] as const) {
        await transaction.query(sql.unsafe`
          INSERT INTO dependencies (id, run_id, tool_call_id, tool_name, remote_agent, state, remote_task_id, outcome, next_poll_at, resolved_at)
          VALUES (${id}, ${runId}, ${call}, 'remote_agent', 'translator', ${state}, ${`remote-${call}`}, ${state === 'resolved' ? 'TASK_STATE_COMPLETED' : null},
            now() + interval '1 hour', ${state === 'resolved' ? sql.fragment`now()` : null})`);
      }
      await transaction.query(sql.unsafe`INSERT INTO inbox_registrations (id, dependency_id, credential_hash) VALUES (${registration}, ${open}, ${sql.binary(Buffer.alloc(32))})`);
      for (const processed of [true, false]) {
        await transaction.query(sql.unsafe`
          INSERT INTO inbox_callbacks (id, registration_id, body, kind, processed_at)
          VALUES (${randomUUID()}, ${registration}, ${sql.binary(Buffer.from(body))}, 'statusUpdate', ${processed ? sql.fragment`now()` : null})`);
      }
    });
    const page = await (await get('/ui/dependencies', session.cookie)).text();
    const section = (id: string) => page.slice(page.indexOf(`id="${id}"`), page.indexOf('</table>', page.indexOf(`id="${id}"`)));
    expect(section('dependencies-open')).toContain(open);
    expect(section('dependencies-open')).not.toContain(resolved);
    expect(section('dependencies-resolved')).toContain(resolved);
    expect(section('dependencies-resolved')).toContain('TASK_STATE_COMPLETED');
    expect(section('callbacks').match(/<tr><td class="mono">/g)).toHaveLength(2);
    expect(page).toContain('(1 not processed yet)');
    expect(page).not.toContain(body);
    const waiting = await (await get('/ui/machines/dependency/waiting', session.cookie)).text();
    expect(waiting).toContain(open);
    // The live counts (one reading serves every poller for a moment, so it may lag by that much).
    const counts = async () => ((await (await get('/ui/api/counts', session.cookie)).json()) as { counts: Record<string, Record<string, number>> }).counts.dependency;
    await expect.poll(counts, { timeout: 5_000 }).toEqual({ waiting: 1, resolved: 1, pending: 0, failed: 0 });
  });
});

describe('the queue dashboard', () => {
  it('reads every Keel queue on this backend, behind the login', async () => {
    const response = await get('/ui/queues/api/queues?activeQueue=maintenance&status=latest&page=1&jobsPerPage=10', session.cookie);
    expect(response.status).toBe(200);
    const body = (await response.json()) as { queues: Array<{ name: string; readOnlyMode: boolean; counts: Record<string, number> }> };
    expect(body.queues.map((queue) => queue.name).sort()).toEqual(['inbox', 'maintenance', 'projector', 'push', 'runs']);
    expect(body.queues.every((queue) => queue.readOnlyMode)).toBe(true);
    for (const queue of body.queues) expect(Object.keys(queue.counts)).toEqual(expect.arrayContaining(['waiting', 'active', 'delayed', 'failed']));
    // The datastore panel answers on either backend (Redis INFO, or Postgres statistics).
    expect((await get('/ui/queues/api/redis/stats', session.cookie)).status).toBe(200);
    const shell = await get('/ui/queues', session.cookie);
    expect(shell.status).toBe(200);
    expect(await shell.text()).toContain('<base href="/ui/queues/"');
  });
});

describe('CLI', () => {
  it('keel admin token prints only a token that logs in; keel machines prints every state and transition', async () => {
    const env = cleanEnv(cliEnvFor(keel));
    const created = await runKeel(['admin', 'token', '--name', 'cli-made'], { cwd: REPO_ROOT, env });
    expect(created.code).toBe(0);
    expect(created.stdout).toMatch(/^keel_admin_[A-Za-z0-9_-]{43}\n$/);
    const login = await post('/ui/login', { token: created.stdout.trim() });
    expect(login.status).toBe(303);
    const listed = await runKeel(['admin', 'list', '--json'], { cwd: REPO_ROOT, env });
    expect(listed.stdout).toContain('"name":"cli-made"');
    expect(listed.stdout).not.toContain(created.stdout.trim());

    const catalog = await loadMachineCatalog();
    const json = await runKeel(['machines', '--format', 'json'], { cwd: REPO_ROOT, env });
    expect(json.code).toBe(0);
    const parsed = JSON.parse(json.stdout) as { machines: Array<{ id: string; states: Array<{ name: string }>; transitions: Array<{ from: string; event: string; to: string }> }> };
    expect(parsed.machines.map((machine) => machine.id)).toEqual(catalog.map((entry) => entry.id));
    expect(parsed.machines.map((machine) => machine.id)).toEqual(expect.arrayContaining(['run', 'task', 'delivery', 'pushConfig', 'dependency']));
    for (const entry of catalog) {
      const machine = parsed.machines.find((candidate) => candidate.id === entry.id)!;
      expect(machine.states.map((state) => state.name)).toEqual(entry.model.states.map((state) => state.name));
      expect(machine.transitions).toEqual(entry.model.edges);
    }
    const mermaid = await runKeel(['machines', '--format', 'mermaid'], { cwd: REPO_ROOT, env });
    expect(mermaid.code).toBe(0);
    for (const entry of catalog) for (const edge of entry.model.edges) expect(mermaid.stdout).toContain(`${edge.from} --> ${edge.to} : ${edge.event}`);
    const bad = await runKeel(['machines', '--format', 'png'], { cwd: REPO_ROOT, env });
    expect(bad.code).toBe(64);
  });
});
