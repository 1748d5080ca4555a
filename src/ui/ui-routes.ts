import { randomBytes } from 'node:crypto';
import { validateHeaderValue } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { DatabasePool } from 'slonik';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import type { PushDestinations } from '../push/destination-gate.js';
import { deliveriesOfConfig, findPushConfigs, listPushConfigSummaries, resumePushConfig } from '../push/push-admin.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { listRunEvents } from '../runs/run-event-repository.js';
import { buildRunTimeline } from '../runs/run-timeline.js';
import { getRun } from '../runs/run-repository.js';
import { decideApproval, readSuspendedRun } from '../runs/resume-run.js';
import { bulkCancel, bulkRetry, retryRun, selectionProblem, type BulkReport, type Operator, type RecoveryDeps, type RunSelection } from '../recovery/run-recovery.js';
import type { RunStatus } from '../../machines/run.machine.js';
import { RETRY_EVENT, stateText } from '../statecharts/definition-graph.js';
import { bulkPreviewContent, bulkResultContent, retryRefusedContent, selectionForm } from './recovery-pages.js';
import type { Sealer } from '../sealing/sealer.js';
import { openRunsInState } from '../statecharts/definition-repository.js';
import { agentStateRowsContent } from './agent-pages.js';
import { agentMachinesOf, countAgentStates, runMachineView } from './agent-machines.js';
import { closeSession, csrfMatches, findSession, openSession, SESSION_TTL_MS, type AdminSession } from './admin-auth.js';
import { html, type Html } from './html.js';
import { page, type NavKey } from './layout.js';
import { LoginThrottle } from './login-throttle.js';
import { loadMachineCatalog, type CatalogEntry } from './machine-catalog.js';
import { countStates, listStateRows } from './machine-rows.js';
import {
  approvalsContent,
  dependenciesContent,
  loginContent,
  machinesContent,
  pushConfigContent,
  pushContent,
  runContent,
  runsContent,
  stateRowsContent,
  type ApprovalItem,
  type PendingView,
  type RunFilterForm,
} from './pages.js';
import { QUEUE_DASHBOARD_PATH, registerQueueDashboard } from './queue-dashboard.js';
import { stepApprovalOf, waitingStep } from './step-approval.js';
import {
  badges,
  deliveriesOfTask,
  dependencyOverview,
  filterChoices,
  journalOutline,
  listRunsFiltered,
  machineStepsOf,
  pushConfigVersion,
  runsOfTask,
  runsWaitingForApproval,
  runVersion,
  taskOfRun,
  type RunFilter,
} from './ui-queries.js';
import { isUuid } from '../db/uuid.js';

// The operator web UI under /ui. Every route but the login form needs a session opened with an
// admin token: without one, pages redirect to the login form and everything else (the counts API,
// the dashboard's API and assets, any state-changing request) answers 401. Every state-changing
// request also needs the session's CSRF token (a hidden form field, or X-CSRF-Token), and a
// cross-origin Origin header is refused, whatever the cookie: missing or wrong, 403.

export type OperatorUiDeps = {
  pool: DatabasePool;
  sealer: Sealer;
  queues: KeelQueues;
  config: KeelConfig;
  logger: KeelLogger;
  /** The agents: the statechart agents' machines are drawn beside the lifecycles. */
  registry?: Pick<AgentRegistry, 'agents'>;
  /** This process's push destinations (breaker and backlog), shown on the push page. */
  pushDestinations?: PushDestinations;
};

export const SESSION_COOKIE = 'keel_ui_session';
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
const LIST_LIMIT = 200;

type Session = AdminSession & { id: string };
const sessions = new WeakMap<FastifyRequest, Session>();

export function readCookie(request: FastifyRequest, name: string): string | null {
  const header = request.headers.cookie;
  if (!header) return null;
  for (const part of header.split(';')) {
    const index = part.indexOf('=');
    if (index === -1) continue;
    if (part.slice(0, index).trim() === name) {
      try {
        return decodeURIComponent(part.slice(index + 1).trim());
      } catch {
        return null;
      }
    }
  }
  return null;
}

/** Pages redirect to the login form; the APIs, the dashboard's assets and anything not a GET answer 401. */
function isPage(request: FastifyRequest): boolean {
  const path = request.url.split('?')[0]!;
  return SAFE_METHODS.has(request.method) && !path.startsWith('/ui/api/') && !path.startsWith(`${QUEUE_DASHBOARD_PATH}/api/`) && !path.startsWith(`${QUEUE_DASHBOARD_PATH}/static/`);
}

/** Where a login goes when its `next` is not a safe path inside the UI. */
export const LOGIN_DEFAULT_NEXT = '/ui/machines';
const NEXT_BASE = 'http://keel.invalid';

/**
 * A `next` that stays inside the UI (no open redirect) and can be sent as a Location header: the
 * value is resolved against a placeholder origin as a browser would (so `/\\evil`, `//evil` and
 * `/ui/../x` show what they are), must stay on that origin under /ui, and is sent re-serialized, its
 * non-ASCII and control characters percent-encoded. Anything else is the default.
 */
export function safeNext(value: unknown): string {
  if (typeof value !== 'string' || !value.startsWith('/') || value.startsWith('//') || value.includes('\\')) return LOGIN_DEFAULT_NEXT;
  let url: URL;
  try {
    url = new URL(value, NEXT_BASE);
  } catch {
    return LOGIN_DEFAULT_NEXT;
  }
  if (url.origin !== NEXT_BASE || !/^\/ui(\/|$)/.test(url.pathname) || url.pathname.startsWith('/ui/login')) return LOGIN_DEFAULT_NEXT;
  const next = `${url.pathname}${url.search}`;
  // Printable ASCII only: what the URL serializer leaves unencoded, and all a header may carry.
  return /^\/ui[\x21-\x7e]*$/.test(next) && !next.startsWith('//') ? next : LOGIN_DEFAULT_NEXT;
}

const flashes: Record<string, { kind: 'ok' | 'error'; text: string }> = {
  approved: { kind: 'ok', text: 'Approved: the run resumes.' },
  denied: { kind: 'ok', text: 'Denied: the run resumes and the model is told.' },
  stale_digest: { kind: 'error', text: 'Not decided: the run is waiting on another turn than the one shown. Look again.' },
  already_decided: { kind: 'error', text: 'Not decided: someone else decided this turn meanwhile.' },
  not_waiting: { kind: 'error', text: 'Not decided: the run is no longer waiting for approval.' },
  not_found: { kind: 'error', text: 'No such run or config.' },
  unreadable: { kind: 'error', text: 'Not decided: the pending turn cannot be read.' },
  resumed: { kind: 'ok', text: 'Resumed: pending deliveries go out again, in order.' },
  retried: { kind: 'ok', text: 'Retried: the run is queued again from the state chosen, and its task works on.' },
  not_paused: { kind: 'error', text: 'Not resumed: the config is not paused.' },
  bad_request: { kind: 'error', text: 'The request was incomplete.' },
};
const flashOf = (request: FastifyRequest) => {
  const key = (request.query as Record<string, unknown>).flash;
  return typeof key === 'string' ? (flashes[key] ?? null) : null;
};

function parseUtc(value: unknown): number | undefined {
  if (typeof value !== 'string' || value === '') return undefined;
  const ms = Date.parse(/[zZ]|[+-]\d\d:\d\d$/.test(value) ? value : `${value}Z`);
  return Number.isNaN(ms) ? undefined : ms;
}

/** The states of a path, each once, in the order of their last visit (the last is where the run was last). */
function lastVisits(states: readonly string[]): string[] {
  const order = new Set<string>();
  for (const state of states) {
    order.delete(state);
    order.add(state);
  }
  return [...order];
}

const registeredRoutes = new WeakMap<object, Array<{ method: string; url: string }>>();

/** Every route the UI registered on a server (the dashboard's included), for tests that walk them all. */
export function uiRoutesOf(server: object): ReadonlyArray<{ method: string; url: string }> {
  return registeredRoutes.get(server) ?? [];
}

export async function operatorUiPlugin(scope: FastifyInstance, deps: OperatorUiDeps): Promise<void> {
  const { pool, sealer, queues, config, logger } = deps;
  const routes: Array<{ method: string; url: string }> = [];
  registeredRoutes.set(scope.server, routes);
  scope.addHook('onRoute', (route) => {
    for (const method of [route.method].flat()) routes.push({ method: String(method), url: route.url });
  });
  const log = logger.child({ component: 'ui' });
  const catalog = await loadMachineCatalog();
  const entryOf = (id: string): CatalogEntry | undefined => catalog.find((entry) => entry.id === id);
  const agentMachines = agentMachinesOf(deps.registry);
  const secureCookie = config.server.publicUrl.startsWith('https:');
  const loginSettings = config.security.operatorLogin;
  const loginThrottle = new LoginThrottle({ maxFailures: loginSettings.maxFailures, windowMs: loginSettings.windowSeconds * 1000 });
  const publicOrigin = (() => {
    try {
      return new URL(config.server.publicUrl).origin;
    } catch {
      return null;
    }
  })();

  scope.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string', bodyLimit: 65_536 }, (_request, body, done) => {
    done(null, Object.fromEntries(new URLSearchParams(String(body))));
  });

  scope.addHook('onRequest', async (request, reply) => {
    const path = request.url.split('?')[0]!;
    reply.header('x-frame-options', 'DENY').header('referrer-policy', 'same-origin').header('x-content-type-options', 'nosniff');
    if (!path.startsWith(`${QUEUE_DASHBOARD_PATH}/static/`)) reply.header('cache-control', 'no-store');
    if (!SAFE_METHODS.has(request.method)) {
      const origin = request.headers.origin;
      if (typeof origin === 'string' && origin !== 'null' && origin !== `${request.protocol}://${request.headers.host ?? ''}` && origin !== publicOrigin) {
        return reply.code(403).type('text/plain').send('cross-origin request refused');
      }
    }
    if (path === '/ui/login') return;
    const cookie = readCookie(request, SESSION_COOKIE);
    const session = cookie ? await findSession(pool, cookie) : null;
    if (!session) {
      if (isPage(request)) return reply.redirect(`/ui/login?next=${encodeURIComponent(request.url)}`, 303);
      return reply.code(401).header('www-authenticate', 'Cookie realm="keel-ui"').type('application/json').send({ error: 'admin login required' });
    }
    sessions.set(request, { ...session, id: cookie! });
    if (path.startsWith(`${QUEUE_DASHBOARD_PATH}/`) || path === QUEUE_DASHBOARD_PATH) {
      if (!SAFE_METHODS.has(request.method)) return reply.code(403).type('application/json').send({ error: 'the queue dashboard is read-only' });
    }
  });

  scope.addHook('preHandler', async (request, reply) => {
    if (SAFE_METHODS.has(request.method) || request.url.split('?')[0] === '/ui/login') return;
    const session = sessions.get(request);
    const body = request.body as Record<string, unknown> | undefined;
    const presented = (typeof body === 'object' && body !== null ? body._csrf : undefined) ?? request.headers['x-csrf-token'];
    if (!session || !csrfMatches(session.id, presented)) {
      log.warn({ method: request.method, route: request.routeOptions.url }, 'state-changing request without a valid CSRF token refused');
      return reply.code(403).type('text/plain').send('missing or invalid CSRF token');
    }
  });

  scope.setErrorHandler((error: { statusCode?: number; message: string }, request, reply) => {
    const status = error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 500;
    if (status === 500) log.error({ err: error, route: request.routeOptions.url }, 'operator UI request failed');
    return reply.code(status).type('text/plain').send(status === 500 ? 'internal error' : error.message);
  });
  const errorContent = (title: string, text: string) => html`<h1>${title}</h1><p>${text}</p><p><a href="/ui/machines">Machines</a></p>`;
  scope.setNotFoundHandler((request, reply) => sendPage(request, reply, { title: 'Not found', nav: null }, errorContent('Not found', 'There is no such page.'), 404));

  const sendPage = async (request: FastifyRequest, reply: FastifyReply, options: { title: string; nav: NavKey | null; liveUrl?: string; liveVersion?: string | null }, content: Html, status = 200) => {
    const nonce = randomBytes(16).toString('base64');
    const session = sessions.get(request);
    const body = page(
      {
        ...options,
        nonce,
        csrf: session?.csrf ?? null,
        operator: session?.tokenName ?? null,
        badges: session ? await badges(pool) : null,
        flash: flashOf(request),
      },
      content,
    );
    return reply
      .code(status)
      .header(
        'content-security-policy',
        `default-src 'none'; script-src 'nonce-${nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`,
      )
      .type('text/html; charset=utf-8')
      .send(body);
  };

  // Login and logout.
  scope.get('/login', async (request, reply) => {
    const query = request.query as Record<string, unknown>;
    const bye = query.bye === '1' ? { kind: 'ok' as const, text: 'Logged out.' } : null;
    const content = loginContent(safeNext(query.next), null);
    const nonce = randomBytes(16).toString('base64');
    return reply
      .header('content-security-policy', `default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`)
      .type('text/html; charset=utf-8')
      .send(page({ title: 'Log in', nav: null, nonce, flash: bye }, content));
  });

  scope.post('/login', async (request, reply) => {
    const body = (request.body ?? {}) as Record<string, unknown>;
    const next = safeNext(body.next);
    const address = request.ip;
    const admission = loginThrottle.admit(address);
    if (!admission.admitted) {
      return reply.code(429).header('retry-after', String(admission.retryAfterSeconds)).type('text/plain; charset=utf-8').send('Too many failed logins from this address; try again later.');
    }
    const token = typeof body.token === 'string' ? body.token.trim() : '';
    // The answer's headers are checked before a session row is written: a row whose cookie could
    // not be sent would be a session nobody holds.
    const maxAge = Math.floor(SESSION_TTL_MS / 1000);
    const cookieFor = (sessionId: string) => `${SESSION_COOKIE}=${sessionId}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=${maxAge}${secureCookie ? '; Secure' : ''}`;
    validateHeaderValue('location', next);
    validateHeaderValue('set-cookie', cookieFor('A'.repeat(43)));
    const opened = token ? await openSession(pool, token) : null;
    if (!opened) {
      if (loginThrottle.failed(address).firstInWindow) {
        log.warn(
          { ip: address, windowSeconds: loginSettings.windowSeconds, maxFailures: loginSettings.maxFailures },
          'operator login refused; further refusals from this address in this window are counted, not logged',
        );
      }
      const nonce = randomBytes(16).toString('base64');
      return reply
        .code(401)
        .header('content-security-policy', `default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`)
        .type('text/html; charset=utf-8')
        .send(page({ title: 'Log in', nav: null, nonce }, loginContent(next, 'That is not a valid admin token.')));
    }
    loginThrottle.succeeded(address);
    log.info({ operator: opened.tokenName }, 'operator logged in');
    return reply.header('set-cookie', cookieFor(opened.sessionId)).redirect(next, 303);
  });

  scope.get('/logout', async (request, reply) => {
    const session = sessions.get(request)!;
    return sendPage(request, reply, { title: 'Log out', nav: null }, html`<h1>Log out</h1>
<form method="post" action="/ui/logout"><input type="hidden" name="_csrf" value="${session.csrf}"><button class="primary" type="submit">Log out</button></form>`);
  });

  scope.post('/logout', async (request, reply) => {
    const session = sessions.get(request)!;
    await closeSession(pool, session.id);
    return reply
      .header('set-cookie', `${SESSION_COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0${secureCookie ? '; Secure' : ''}`)
      .redirect('/ui/login?bye=1', 303);
  });

  // Live numbers. Every open page polls them each second: one reading serves all pollers for a
  // moment, so ten tabs cost what one does.
  let latest: { at: number; reading: Promise<{ counts: Awaited<ReturnType<typeof countStates>>; badges: Awaited<ReturnType<typeof badges>>; at: string }> } | null = null;
  const liveCounts = () => {
    if (!latest || Date.now() - latest.at > 500) {
      const reading = Promise.all([countStates(pool, catalog), countAgentStates(pool, agentMachines), badges(pool)]).then(([counts, agentCounts, badgeCounts]) => ({
        counts: { ...counts, ...agentCounts },
        badges: badgeCounts,
        at: new Date().toISOString(),
      }));
      latest = { at: Date.now(), reading };
      reading.catch(() => (latest = null));
    }
    return latest.reading;
  };
  scope.get('/api/counts', async () => liveCounts());
  scope.get<{ Params: { id: string } }>('/api/runs/:id/version', async (request, reply) => {
    if (!isUuid(request.params.id)) return reply.code(404).send({ error: 'not found' });
    const version = await runVersion(pool, request.params.id);
    return version === null ? reply.code(404).send({ error: 'not found' }) : { version };
  });
  scope.get<{ Params: { taskId: string; configId: string } }>('/api/push/:taskId/:configId/version', async (request, reply) => {
    if (!isUuid(request.params.taskId)) return reply.code(404).send({ error: 'not found' });
    const version = await pushConfigVersion(pool, request.params.taskId, request.params.configId);
    return version === null ? reply.code(404).send({ error: 'not found' }) : { version };
  });

  // Machines.
  scope.get('/', async (_request, reply) => reply.redirect('/ui/machines', 303));
  scope.get('/machines', async (request, reply) => {
    const [counts, agentCounts] = await Promise.all([countStates(pool, catalog), countAgentStates(pool, agentMachines)]);
    return sendPage(request, reply, { title: 'Machines', nav: 'machines' }, machinesContent(catalog, counts, { machines: agentMachines, counts: agentCounts }));
  });
  scope.get<{ Params: { agent: string; state: string } }>('/agents/:agent/:state', async (request, reply) => {
    const machine = agentMachines.find((candidate) => candidate.agent === request.params.agent);
    if (!machine || !machine.graph.states.some((state) => state.path === request.params.state)) {
      return sendPage(request, reply, { title: 'Not found', nav: 'machines' }, errorContent('Not found', 'No such statechart agent or state.'), 404);
    }
    const list = await openRunsInState(pool, machine.agent, request.params.state, LIST_LIMIT);
    return sendPage(request, reply, { title: `agent ${machine.agent}: ${request.params.state}`, nav: 'machines' }, agentStateRowsContent(machine, request.params.state, list, LIST_LIMIT));
  });
  scope.get<{ Params: { machine: string; state: string } }>('/machines/:machine/:state', async (request, reply) => {
    const entry = entryOf(request.params.machine);
    if (!entry || !entry.model.states.some((state) => state.name === request.params.state)) {
      return sendPage(request, reply, { title: 'Not found', nav: 'machines' }, errorContent('Not found', 'No such machine or state.'), 404);
    }
    const list = await listStateRows(pool, entry, request.params.state, LIST_LIMIT);
    return sendPage(request, reply, { title: `${entry.id}: ${request.params.state}`, nav: 'machines' }, stateRowsContent(entry, request.params.state, list, LIST_LIMIT));
  });

  // Runs and tasks.
  scope.get('/runs', async (request, reply) => {
    const query = request.query as Record<string, unknown>;
    const text = (key: string) => (typeof query[key] === 'string' ? (query[key] as string).trim() : '');
    const form: RunFilterForm = { status: text('status'), reason: text('reason'), agent: text('agent'), client: text('client'), from: text('from'), to: text('to') };
    const before = /^(\d+)_([0-9a-f-]{36})$/i.exec(text('before'));
    const filter: RunFilter = {
      ...(form.status ? { status: form.status } : {}),
      ...(form.reason ? { reason: form.reason } : {}),
      ...(form.agent ? { agent: form.agent } : {}),
      ...(form.client ? { client: form.client } : {}),
      ...(parseUtc(form.from) !== undefined ? { from: parseUtc(form.from) } : {}),
      ...(parseUtc(form.to) !== undefined ? { to: parseUtc(form.to) } : {}),
      ...(before ? { before: { createdAt: Number(before[1]), id: before[2]! } } : {}),
      limit: LIST_LIMIT,
    };
    const [runs, choices] = await Promise.all([listRunsFiltered(pool, filter), filterChoices(pool)]);
    const selection: RunSelection = {
      ...(form.agent ? { agent: form.agent } : {}),
      ...(form.status ? { status: form.status as RunStatus } : {}),
      ...(form.reason ? { reason: form.reason } : {}),
    };
    return sendPage(request, reply, { title: 'Runs and tasks', nav: 'runs' }, runsContent(runs, form, choices, filter, selectionForm(selection, choices.agents)));
  });

  // Recovery: a failed statechart run retried from a state; many runs cancelled or retried at once,
  // after a preview (a dry run) that lists what would change.
  const recovery: RecoveryDeps = { pool, sealer, queues, logger: log, definitionOf: async (agent) => deps.registry?.agents.get(agent)?.statechart ?? null };
  const operatorOf = (request: FastifyRequest): Operator => ({ name: sessions.get(request)!.tokenName, via: 'ui' });
  const selectionFrom = (source: Record<string, unknown>): RunSelection => {
    const text = (key: string) => (typeof source[key] === 'string' ? (source[key] as string).trim() : '');
    return {
      ...(text('agent') ? { agent: text('agent') } : {}),
      ...(text('status') ? { status: text('status') as RunStatus } : {}),
      ...(text('state') ? { state: text('state') } : {}),
      ...(text('reason') ? { reason: text('reason') } : {}),
    };
  };
  const bulk = async (request: FastifyRequest, source: Record<string, unknown>, dryRun: boolean, only?: ReadonlySet<string>): Promise<BulkReport | { problem: string }> => {
    const action = source.action;
    if (action !== 'cancel' && action !== 'retry') return { problem: 'Choose to cancel or to retry.' };
    const selection = selectionFrom(source);
    const problem = selectionProblem(selection);
    if (problem) return { problem: `${problem[0]!.toUpperCase()}${problem.slice(1)}.` };
    const options = { dryRun, operator: operatorOf(request), ...(only ? { only } : {}) };
    return action === 'cancel' ? bulkCancel(recovery, selection, options) : bulkRetry(recovery, selection, options);
  };
  const problemPage = (request: FastifyRequest, reply: FastifyReply, problem: string) =>
    sendPage(request, reply, { title: 'Runs not chosen', nav: 'runs' }, html`<p><a href="/ui/runs">← Runs</a></p><h1>Runs not chosen</h1><div class="flash error" role="alert" id="bulk-problem">${problem}</div>`, 400);

  scope.get('/runs/recover', async (request, reply) => {
    const report = await bulk(request, request.query as Record<string, unknown>, true);
    if ('problem' in report) return problemPage(request, reply, report.problem);
    return sendPage(request, reply, { title: `${report.action === 'cancel' ? 'Cancel' : 'Retry'} runs: preview`, nav: 'runs' }, bulkPreviewContent(report, sessions.get(request)!.csrf));
  });

  scope.post('/runs/recover', async (request, reply) => {
    const body = (request.body ?? {}) as Record<string, unknown>;
    const ids = typeof body.ids === 'string' ? body.ids.split(',').map((id) => id.trim().toLowerCase()).filter(isUuid) : [];
    if (ids.length === 0) return problemPage(request, reply, 'The confirmation names no run: preview the operation again.');
    const report = await bulk(request, body, false, new Set(ids));
    if ('problem' in report) return problemPage(request, reply, report.problem);
    return sendPage(request, reply, { title: report.action === 'cancel' ? 'Cancelled runs' : 'Retried runs', nav: 'runs' }, bulkResultContent(report));
  });

  scope.post<{ Params: { id: string } }>('/runs/:id/retry', async (request, reply) => {
    const id = request.params.id.toLowerCase();
    const body = (request.body ?? {}) as Record<string, unknown>;
    const state = typeof body.state === 'string' && body.state.trim() !== '' ? body.state.trim() : undefined;
    if (!isUuid(id)) return reply.redirect('/ui/runs?flash=not_found', 303);
    const result = await retryRun(recovery, id, operatorOf(request), state);
    if (result.ok) return reply.redirect(`/ui/runs/${id}?flash=retried`, 303);
    if (result.reason === 'not_found') return reply.redirect('/ui/runs?flash=not_found', 303);
    return sendPage(request, reply, { title: 'Not retried', nav: 'runs' }, retryRefusedContent(id, result.message), 409);
  });

  scope.get<{ Params: { id: string } }>('/runs/:id', async (request, reply) => {
    const id = request.params.id.toLowerCase();
    // The version first: whatever changes after it is read makes the page reload, so the page
    // never keeps showing a state older than the version it polls against.
    const version = isUuid(id) ? await runVersion(pool, id) : null;
    const run = version !== null ? await getRun(pool, id) : null;
    if (!run) return sendPage(request, reply, { title: 'Not found', nav: 'runs' }, errorContent('Not found', 'No such run (it may have been purged).'), 404);
    const task = run.task_id ? await taskOfRun(pool, run.task_id) : null;
    const [events, journal, deliveries, taskRuns, machine, machineSteps] = await Promise.all([
      listRunEvents(pool, run.id),
      task ? journalOutline(pool, task.id) : Promise.resolve([]),
      task ? deliveriesOfTask(pool, task.id) : Promise.resolve([]),
      task ? runsOfTask(pool, task.id) : Promise.resolve([]),
      runMachineView(pool, run, agentMachines),
      machineStepsOf(pool, run.id),
    ]);
    const timeline = buildRunTimeline(run, events, machineSteps, Date.now());
    // A failed statechart run may be retried from a state it passed through (the retry checks which).
    const passed = run.status === 'failed' && run.machine_hash ? lastVisits(machineSteps.filter((step) => step.event !== RETRY_EVENT).map((step) => stateText(step.state))) : undefined;
    let pending: PendingView | null = null;
    if (run.status === 'waiting_for_approval' || run.status === 'waiting_for_input') {
      const read = await readSuspendedRun(pool, sealer, run.id, run.status);
      if (read.ok) {
        const state = read.view.state;
        if (state.pendingApproval) {
          pending = { kind: 'approval', pending: state.pendingApproval, step: stepApprovalOf(state.pendingApproval, waitingStep(state), run.machine_state, run.audit_level) };
        }
        else if (state.pendingInput) pending = { kind: 'input', tool: state.pendingInput.toolName, prompt: state.pendingInput.prompt, schema: state.pendingInput.schema };
      } else if (read.reason === 'unreadable') pending = { kind: 'unreadable', detail: read.detail };
    }
    const session = sessions.get(request)!;
    return sendPage(
      request,
      reply,
      { title: `Run ${run.id}`, nav: 'runs', liveUrl: `/ui/api/runs/${run.id}/version`, liveVersion: version },
      runContent({ run, client: task?.client ?? null, task, taskRuns, journal, events, deliveries, pending, machine, timeline, ...(passed ? { passed } : {}) }, session.csrf),
    );
  });

  // Approvals.
  scope.get('/approvals', async (request, reply) => {
    const waiting = await runsWaitingForApproval(pool, LIST_LIMIT);
    const items: ApprovalItem[] = [];
    for (const run of waiting) {
      const read = await readSuspendedRun(pool, sealer, run.id, 'waiting_for_approval');
      if (!read.ok && read.reason !== 'unreadable') continue; // decided meanwhile
      items.push({
        id: run.id,
        agent: run.agent,
        client: run.client,
        since: run.updated_at,
        pending: read.ok ? read.view.state.pendingApproval : null,
        step: read.ok ? stepApprovalOf(read.view.state.pendingApproval, waitingStep(read.view.state), read.view.run.machine_state, read.view.run.audit_level) : null,
        problem: read.ok ? (read.view.state.pendingApproval ? null : 'no pending approval stored') : read.detail,
      });
    }
    return sendPage(request, reply, { title: 'Approvals', nav: 'approvals' }, approvalsContent(items, sessions.get(request)!.csrf));
  });

  scope.post<{ Params: { id: string } }>('/approvals/:id', async (request, reply) => {
    const id = request.params.id.toLowerCase();
    const body = (request.body ?? {}) as Record<string, unknown>;
    const digest = typeof body.digest === 'string' ? body.digest.trim().toLowerCase() : '';
    const decision = body.decision;
    if (!isUuid(id) || !/^[0-9a-f]{64}$/.test(digest) || (decision !== 'approve' && decision !== 'deny')) {
      return reply.redirect('/ui/approvals?flash=bad_request', 303);
    }
    const session = sessions.get(request)!;
    const result = await decideApproval({ pool, sealer, queues }, id, digest, decision === 'approve');
    log.info({ runId: id, decision, operator: session.tokenName, ok: result.ok, reason: result.ok ? undefined : result.reason }, 'operator decided an approval');
    if (result.ok) return reply.redirect(`/ui/runs/${id}?flash=${decision === 'approve' ? 'approved' : 'denied'}`, 303);
    return reply.redirect(`/ui/approvals?flash=${result.reason}`, 303);
  });

  // Push.
  scope.get('/push', async (request, reply) => {
    const [configs, counts] = await Promise.all([listPushConfigSummaries(pool, { limit: 500 }), countStates(pool, catalog)]);
    return sendPage(request, reply, { title: 'Push', nav: 'push' }, pushContent(configs, counts.pushConfig, sessions.get(request)!.csrf, deps.pushDestinations?.gate?.view() ?? null));
  });

  scope.get<{ Params: { taskId: string; configId: string } }>('/push/:taskId/:configId', async (request, reply) => {
    const { taskId, configId } = request.params;
    // The version first, as for a run page.
    const version = isUuid(taskId) ? await pushConfigVersion(pool, taskId, configId) : null;
    const found = isUuid(taskId) ? await findPushConfigs(pool, `${taskId}/${configId}`) : [];
    if (found.length !== 1) return sendPage(request, reply, { title: 'Not found', nav: 'push' }, errorContent('Not found', 'No such push config.'), 404);
    const { deliveries, attempts } = await deliveriesOfConfig(pool, taskId, configId);
    return sendPage(
      request,
      reply,
      { title: `Push config ${configId}`, nav: 'push', liveUrl: `/ui/api/push/${encodeURIComponent(taskId)}/${encodeURIComponent(configId)}/version`, liveVersion: version },
      pushConfigContent({ summary: found[0]!, deliveries, attempts }, sessions.get(request)!.csrf),
    );
  });

  scope.post<{ Params: { taskId: string; configId: string } }>('/push/:taskId/:configId/resume', async (request, reply) => {
    const { taskId, configId } = request.params;
    if (!isUuid(taskId)) return reply.redirect('/ui/push?flash=not_found', 303);
    const result = await resumePushConfig({ pool, queues }, taskId, configId);
    log.info({ taskId, configId, operator: sessions.get(request)!.tokenName, ok: result.ok }, 'operator resumed a push config');
    const back = `/ui/push/${encodeURIComponent(taskId)}/${encodeURIComponent(configId)}`;
    if (result.ok) return reply.redirect(`${back}?flash=resumed`, 303);
    return reply.redirect(result.reason === 'not_found' ? '/ui/push?flash=not_found' : `${back}?flash=${result.reason}`, 303);
  });

  // Dependencies.
  scope.get('/dependencies', async (request, reply) => {
    const entry = entryOf('dependency');
    const states = entry
      ? { open: entry.model.states.filter((state) => !state.final).map((state) => state.name), ended: entry.model.states.filter((state) => state.final).map((state) => state.name) }
      : { open: ['pending', 'waiting'], ended: ['resolved', 'failed'] };
    const overview = await dependencyOverview(pool, states, LIST_LIMIT);
    return sendPage(request, reply, { title: 'Dependencies', nav: 'dependencies' }, dependenciesContent(overview));
  });

  await registerQueueDashboard(scope, queues);
}
