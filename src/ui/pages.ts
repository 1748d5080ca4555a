import { RUN_STATUSES, TERMINATION_REASONS } from '../../machines/run.machine.js';
import type { PendingApproval } from '../../machines/agent-loop.machine.js';
import type { PushConfigSummary } from '../push/push-admin.js';
import type { DestinationView } from '../push/destination-gate.js';
import { maskCredential } from '../push/push-admin.js';
import type { RunEventRow } from '../runs/run-event-repository.js';
import type { RunRow } from '../runs/run-row.js';
import type { RunTimeline } from '../runs/run-timeline.js';
import { agentMachinesContent, runMachineContent } from './agent-pages.js';
import type { AgentMachine, RunMachineView } from './agent-machines.js';
import { formatTime, html, queryString, raw, type Html } from './html.js';
import { pill } from './layout.js';
import type { CatalogEntry } from './machine-catalog.js';
import { maskUrl, pushConfigHref, ROW_SOURCES, runHref, type Cell, type RowList } from './machine-rows.js';
import { retryForm } from './recovery-pages.js';
import { runTimelineChart } from './run-timeline-chart.js';
import { renderSvg, toMermaid } from './statechart.js';
import type { StepApproval } from './step-approval.js';
import type { DependencyOverview, ListedRun, RunFilter, TaskInfo } from './ui-queries.js';

// The operator pages' content, as escaped HTML built from template strings. Every value that came
// from a row, a client or a remote party goes through the `html` tag; credentials are only ever
// shown as their masked hints; no sealed column is opened here except the suspended turn of a run
// waiting for approval, whose pending calls the operator must see to decide (as `keel runs show`).

const cell = (value: Cell) => {
  const inner = value.href ? html`<a href="${value.href}">${value.text}</a>` : html`${value.text}`;
  return html`<td${value.mono ? raw(' class="mono"') : ''}>${inner}</td>`;
};

export function rowTable(list: Omit<RowList, 'total'>, empty = 'None.'): Html {
  if (list.rows.length === 0) return html`<p class="muted">${empty}</p>`;
  return html`<table><thead><tr>${list.columns.map((column) => html`<th>${column}</th>`)}</tr></thead>
<tbody>${list.rows.map((row) => html`<tr>${row.map(cell)}</tr>`)}</tbody></table>`;
}

// ---------------------------------------------------------------------------------------------
// Login
// ---------------------------------------------------------------------------------------------

export function loginContent(next: string, error: string | null): Html {
  return html`<div class="card login">
<h1>Operator login</h1>
<p class="muted">Paste an admin token. <code>keel admin token</code> creates one; it is shown once.</p>
${error ? html`<div class="flash error" role="alert">${error}</div>` : ''}
<form method="post" action="/ui/login">
  <input type="hidden" name="next" value="${next}">
  <p><label>Admin token<br><input type="password" name="token" autocomplete="current-password" required autofocus></label></p>
  <p><button class="primary" type="submit">Log in</button></p>
</form>
</div>`;
}

// ---------------------------------------------------------------------------------------------
// Machines
// ---------------------------------------------------------------------------------------------

export function machinesContent(
  catalog: readonly CatalogEntry[],
  counts: Record<string, Record<string, number | null>>,
  agents: { machines: readonly AgentMachine[]; counts: Record<string, Record<string, number>> } = { machines: [], counts: {} },
): Html {
  // The team's own agents come first: they are what an operator opens this page for; Keel's built-in
  // lifecycles follow under a heading of their own.
  return html`<h1>Machines</h1>
${agentMachinesContent(agents.machines, agents.counts)}
<h2 id="built-in-lifecycles">Built-in lifecycles</h2>
<p class="muted">Each lifecycle drawn from its XState definition in <code>machines/</code>, with the number of rows in each state now.
Click a state to list its rows. Dashed edges lead back to an earlier state; a guarded transition shows its guard in brackets, in italics.
One event leading to a final state from many states is drawn once, from a dot its sources join at.</p>
<div class="machines">
${catalog.map((entry) => {
  const source = ROW_SOURCES[entry.id];
  const machineCounts = counts[entry.id];
  const missing = source && machineCounts && Object.values(machineCounts).every((value) => value === null);
  return html`<section class="machine" id="machine-${entry.id}" data-machine-section="${entry.id}">
  <h2>${entry.id}</h2>
  <div class="meta">${entry.file}${source ? html` · ${source.noun} in <code>${source.table}.${source.column}</code>` : ' · not stored in a table'}${missing ? html` · <strong>the table is not in this database yet</strong>` : ''}</div>
  ${raw(renderSvg(entry.model, {
    counts: machineCounts ?? null,
    idPrefix: `m-${entry.id}`,
    ...(source ? { hrefFor: (state: string) => `/ui/machines/${encodeURIComponent(entry.id)}/${encodeURIComponent(state)}` } : {}),
  }))}
  <details><summary>Counts as a table, and the Mermaid source</summary>
    <table class="counts"><thead><tr><th>state</th><th class="num">rows</th><th>description</th></tr></thead><tbody>
    ${entry.model.states.map((state) => {
      const value = machineCounts?.[state.name];
      return html`<tr><td><a href="/ui/machines/${entry.id}/${state.name}">${state.name}</a>${state.final ? html` <span class="muted">(final)</span>` : ''}</td>
        <td class="num" data-count-for="${entry.id}:${state.name}">${value === null || value === undefined ? '–' : value}</td><td class="muted">${state.description ?? ''}</td></tr>`;
    })}
    </tbody></table>
    <pre>${toMermaid(entry.model)}</pre>
  </details>
</section>`;
})}
</div>`;
}

export function stateRowsContent(entry: CatalogEntry, state: string, list: RowList | null, limit: number): Html {
  const source = ROW_SOURCES[entry.id];
  const description = entry.model.states.find((candidate) => candidate.name === state)?.description;
  return html`<p><a href="/ui/machines#machine-${entry.id}">← Machines</a></p>
<h1>${entry.id}: ${state}</h1>
${description ? html`<p class="muted">${description}</p>` : ''}
${list === null
    ? html`<div class="note">${source ? html`The table <code>${source.table}</code> is not in this database yet.` : 'This machine is not stored in a table.'}</div>`
    : html`<p><strong data-state-total>${list.total}</strong> ${source?.noun ?? 'rows'} in this state${list.total > list.rows.length ? html` (the latest ${limit} shown)` : ''}.</p>
${rowTable(list)}`}`;
}

// ---------------------------------------------------------------------------------------------
// Runs and tasks
// ---------------------------------------------------------------------------------------------

export type RunFilterForm = { status: string; reason: string; agent: string; client: string; from: string; to: string };

export function runsContent(
  runs: readonly ListedRun[],
  form: RunFilterForm,
  choices: { agents: readonly string[]; clients: readonly string[] },
  filter: RunFilter,
  recovery: Html = html``,
): Html {
  const select = (name: keyof RunFilterForm, label: string, values: readonly string[]) =>
    html`<label>${label}<select name="${name}"><option value="">any</option>${values.map((value) => html`<option value="${value}"${form[name] === value ? raw(' selected') : ''}>${value}</option>`)}</select></label>`;
  const last = runs[runs.length - 1];
  const older = runs.length === filter.limit && last ? queryString({ ...form, before: `${last.created_at}_${last.id}` }) : null;
  return html`<h1>Runs and tasks</h1>
<form class="filters" method="get" action="/ui/runs">
  ${select('status', 'status', RUN_STATUSES)}
  ${select('reason', 'termination reason', TERMINATION_REASONS)}
  ${select('agent', 'agent', choices.agents)}
  ${select('client', 'client', choices.clients)}
  <label>created from (UTC)<input type="datetime-local" name="from" value="${form.from}"></label>
  <label>created before (UTC)<input type="datetime-local" name="to" value="${form.to}"></label>
  <button type="submit" class="primary">Filter</button> <a href="/ui/runs">clear</a>
</form>
${recovery}
<p class="muted">${runs.length} run(s)${runs.length === filter.limit ? ', newest first; more below the link' : ''}.</p>
${runs.length === 0
    ? html`<p class="muted">No run matches.</p>`
    : html`<table id="runs"><thead><tr><th>run</th><th>agent</th><th>status</th><th>reason</th><th>task state</th><th>client</th><th>created</th></tr></thead><tbody>
${runs.map((run) => html`<tr data-run="${run.id}"><td class="mono"><a href="${runHref(run.id)}">${run.id}</a></td><td>${run.agent}</td><td>${pill(run.status)}</td>
  <td>${run.termination_reason ?? ''}${run.truncated ? html` <span class="muted">(truncated)</span>` : ''}</td><td>${pill(run.task_state)}</td><td>${run.client ?? html`<span class="muted">–</span>`}</td><td class="time">${formatTime(run.created_at)}</td></tr>`)}
</tbody></table>`}
${older ? html`<p><a href="/ui/runs${older}">Older runs →</a></p>` : ''}`;
}

export type PendingView =
  | { kind: 'approval'; pending: PendingApproval; step: StepApproval | null }
  | { kind: 'input'; tool: string; prompt: string; schema: unknown }
  | { kind: 'unreadable'; detail: string };

/** A statechart step waiting for an operator: which state and step, and what it asks where the run's audit level keeps content. */
function stepApprovalDetails(step: StepApproval): Html {
  const named = html`<p class="step-approval">The step <strong class="mono" data-step>${step.step}</strong>${step.src !== step.step ? html` <span class="muted">(${step.src})</span>` : ''}
in state <strong class="mono" data-state>${step.state}</strong> is waiting for an operator's decision.</p>`;
  if (step.input === null) {
    return html`${named}<p class="muted" data-input-not-kept>What it asks is not shown: this run keeps no content at its audit level (<code>${step.level}</code>)${step.fields.length > 0 ? html`; its details have the fields ${step.fields.join(', ')}` : ''}.
Runs keep it with <code>privacy.level</code> set to <code>redacted</code> or <code>full</code> (an agent's or provider's <code>privacy.auditLevel</code> can only lower it).</p>`;
  }
  const details = step.input.details && Object.keys(step.input.details).length > 0 ? html`<pre data-details>${JSON.stringify(step.input.details, null, 2)}</pre>` : '';
  return html`${named}<p>It asks: <q data-summary>${step.input.summary}</q>${step.level === 'redacted' ? html` <span class="muted">(redacted, as this run's audit level keeps it)</span>` : ''}</p>${details}`;
}

export function pendingApprovalDetails(pending: PendingApproval, step: StepApproval | null = null): Html {
  if (step) return stepApprovalDetails(step);
  if (pending.kind === 'tools') {
    return html`<p>The model asked to call ${pending.calls.length === 1 ? 'this tool' : html`these ${pending.calls.length} tools`}:</p>
${pending.calls.map((call) => html`<div class="pending-call"><strong class="mono">${call.name}</strong> <span class="muted mono">${call.id}</span><pre>${JSON.stringify(call.arguments, null, 2)}</pre></div>`)}`;
  }
  return html`<p>The guardrail <strong>${pending.guardrail}</strong> asks for a person on the ${pending.stage}: ${pending.reason}</p>`;
}

export function decisionForms(runId: string, digest: string, csrf: string): Html {
  const form = (decision: 'approve' | 'deny', label: string) =>
    html`<form class="inline" method="post" action="/ui/approvals/${runId}">
  <input type="hidden" name="_csrf" value="${csrf}"><input type="hidden" name="digest" value="${digest}"><input type="hidden" name="decision" value="${decision}">
  <button type="submit" class="${decision}" data-decision="${decision}" data-run="${runId}">${label}</button></form>`;
  return html`<div class="decide">${form('approve', 'Approve')} ${form('deny', 'Deny')}</div>`;
}

export type RunPageData = {
  run: RunRow;
  client: string | null;
  task: TaskInfo | null;
  taskRuns: readonly { id: string; status: string; termination_reason: string | null; created_at: number }[];
  journal: readonly { sequence: number; kind: string; state: string | null; run_revision: number; created_at: number }[];
  events: readonly RunEventRow[];
  deliveries: readonly {
    id: string;
    config_id: string;
    config_state: string;
    config_deleted: boolean;
    event_sequence: number;
    state: string;
    attempts: number;
    last_outcome: string | null;
    created_at: number;
    ended_at: number | null;
  }[];
  pending: PendingView | null;
  /** A statechart agent's run: its machine, the path it took and where it stands. */
  machine?: RunMachineView | null;
  /** What the run did over time, from its committed transitions (run-timeline.ts). */
  timeline?: RunTimeline | null;
  /** A failed statechart run: the states it passed through, which an operator may retry it from. */
  passed?: readonly string[];
};

/**
 * A statechart step's unhandled error as its run recorded it (the audit trail's machine_error):
 * the step, the error's class and its message as the audit level kept it, or the line saying it
 * was not kept and which setting keeps it.
 */
function stepErrorOf(events: RunPageData['events']): string | null {
  const event = events.findLast((candidate) => candidate.kind === 'machine_error' && typeof (candidate.payload as { errorClass?: unknown } | null)?.errorClass === 'string');
  if (!event) return null;
  const { step, errorClass, message, content } = event.payload as { step?: unknown; errorClass: string; message?: unknown; content?: { message?: unknown } };
  const where = typeof step === 'string' ? `step ${step}: ` : '';
  if (typeof content?.message === 'string') return `${where}${errorClass}: ${content.message}`;
  return `${where}${errorClass}${typeof message === 'string' ? ` (${message})` : ''}`;
}

export function runContent(data: RunPageData, csrf: string): Html {
  const { run, task } = data;
  const facts: Array<[string, Html | string]> = [
    ['status', html`<span id="run-status">${pill(run.status)}</span>`],
    ['termination reason', run.termination_reason ? `${run.termination_reason}${run.truncated ? ' (truncated)' : ''}` : '–'],
    ['agent', run.agent],
    ['client', data.client ?? '–'],
    ['revision', String(run.revision)],
    ['provider', run.provider ?? '–'],
    ['levels', `audit ${run.audit_level}, answer ${run.answer_level}`],
    ['iterations / tool calls', `${run.iterations} / ${run.tool_calls}`],
    ['tokens', `${run.input_tokens} in, ${run.output_tokens} out`],
    ['claimed by', run.claimed_by ?? '–'],
    ['requeues', String(run.requeue_count)],
    ['error class', run.error_class ?? '–'],
    ['created', formatTime(run.created_at)],
    ['started', formatTime(run.started_at)],
    ['settled', formatTime(run.settled_at)],
  ];
  if (run.failure_detail) facts.push(['failure detail', html`<code>${JSON.stringify(run.failure_detail)}</code>`]);
  const stepError = stepErrorOf(data.events);
  if (stepError !== null) facts.push(['step error', html`<span id="step-error">${stepError}</span>`]);
  const pendingSection = (() => {
    if (!data.pending) return html``;
    switch (data.pending.kind) {
      case 'approval':
        return html`<div class="card"><h3>Waiting for approval</h3>${pendingApprovalDetails(data.pending.pending, data.pending.step)}
<p class="muted">turn digest <code>${data.pending.pending.digest}</code></p>${decisionForms(run.id, data.pending.pending.digest, csrf)}</div>`;
      case 'input':
        return html`<div class="card"><h3>Waiting for input</h3><p>Tool <code>${data.pending.tool}</code> asks: ${data.pending.prompt}</p><pre>${JSON.stringify(data.pending.schema, null, 2)}</pre>
<p class="muted">The client answers with a message on its task.</p></div>`;
      case 'unreadable':
        return html`<div class="note">The pending turn cannot be shown: ${data.pending.detail}</div>`;
    }
  })();
  return html`<p><a href="/ui/runs">← Runs</a></p>
<h1>Run <span class="mono">${run.id}</span></h1>
${pendingSection}
${data.passed ? retryForm(run, data.passed, csrf) : ''}
<dl class="facts">${facts.map(([key, value]) => html`<dt>${key}</dt><dd>${value}</dd>`)}</dl>
${data.machine ? runMachineContent(data.machine, run.agent) : ''}
<h2>Task</h2>
${task
    ? html`<dl class="facts">
<dt>task</dt><dd class="mono">${task.id}</dd>
<dt>state</dt><dd id="task-state">${pill(task.state)}</dd>
<dt>context</dt><dd class="mono">${task.context_id}</dd>
<dt>client</dt><dd>${task.client}</dd>
<dt>projected</dt><dd>run revision ${task.projected_revision} of ${run.task_id === task.id && task.run_id === run.id ? run.revision : '?'}, journal up to #${task.last_sequence}, announced ${task.projected_state}</dd>
</dl>
${data.taskRuns.length > 1 ? html`<h3>Runs of this task</h3><ul>${data.taskRuns.map((other) => html`<li><a class="mono" href="${runHref(other.id)}">${other.id}</a> ${pill(other.status)} ${other.termination_reason ?? ''}</li>`)}</ul>` : ''}
<h3>States the task announced (its journal, without content)</h3>
${data.journal.length === 0
  ? html`<p class="muted">Nothing journaled yet.</p>`
  : html`<table id="task-journal"><thead><tr><th class="num">#</th><th>event</th><th>state</th><th class="num">run revision</th><th>at</th></tr></thead><tbody>
${data.journal.map((event) => html`<tr><td class="num">${event.sequence}</td><td>${event.kind}</td><td>${event.state ? pill(event.state) : ''}</td><td class="num">${event.run_revision}</td><td>${formatTime(event.created_at)}</td></tr>`)}
</tbody></table>`}
<h3>Push deliveries</h3>
${data.deliveries.length === 0
  ? html`<p class="muted">No push config received this task's events.</p>`
  : html`<table id="run-deliveries"><thead><tr><th>config</th><th class="num">event</th><th>state</th><th class="num">attempts</th><th>last outcome</th><th>ended</th></tr></thead><tbody>
${data.deliveries.map((delivery) => html`<tr><td class="mono"><a href="${pushConfigHref(task.id, delivery.config_id)}">${delivery.config_id}</a> ${pill(delivery.config_deleted ? 'deleted' : delivery.config_state)}</td>
<td class="num">#${delivery.event_sequence}</td><td>${pill(delivery.state)}</td><td class="num">${delivery.attempts}</td><td>${delivery.last_outcome ?? ''}</td><td>${formatTime(delivery.ended_at)}</td></tr>`)}
</tbody></table>`}`
    : html`<p class="muted">This run serves no A2A task (it was started inside this installation).</p>`}
<h2>Timeline <span class="muted">(audit level ${run.audit_level})</span></h2>
${data.timeline
    ? html`<p class="muted">States, steps, waits, retries and requeues to scale, from the run's committed transitions (names and times only; <code>keel runs timeline ${run.id}</code> prints the same).</p>
${runTimelineChart(data.timeline)}`
    : ''}
<h3>Events</h3>
${data.events.length === 0
    ? html`<p class="muted">No events recorded${run.audit_level === 'none' ? ' (the audit level is none)' : ''}.</p>`
    : html`<table id="timeline"><thead><tr><th class="num">#</th><th>at</th><th>event</th><th>detail</th></tr></thead><tbody>
${data.events.map((event) => html`<tr><td class="num">${event.sequence}</td><td class="time">${formatTime(event.created_at)}</td><td>${event.kind}</td><td><code>${JSON.stringify(event.payload)}</code></td></tr>`)}
</tbody></table>`}`;
}

// ---------------------------------------------------------------------------------------------
// Approvals
// ---------------------------------------------------------------------------------------------

export type ApprovalItem = {
  id: string;
  agent: string;
  client: string | null;
  since: number;
  pending: PendingApproval | null;
  /** A statechart step's approval: which state and step wait, and what it asks. */
  step: StepApproval | null;
  problem: string | null;
};

export function approvalsContent(items: readonly ApprovalItem[], csrf: string): Html {
  return html`<h1>Approvals</h1>
<p class="muted">Runs whose turn waits for an operator. The decision is bound to the turn digest shown: a turn that changed meanwhile is refused,
and two operators deciding at once cannot both win (the same guarded path as <code>keel runs approve|deny</code>).</p>
${items.length === 0
    ? html`<p class="muted" id="no-approvals">Nothing is waiting for approval.</p>`
    : items.map((item) => html`<div class="card approval" data-run="${item.id}">
<h3><a class="mono" href="${runHref(item.id)}">${item.id}</a> <span class="muted">· agent ${item.agent}${item.client ? ` · client ${item.client}` : ''} · waiting since ${formatTime(item.since)}</span></h3>
${item.pending
  ? html`${pendingApprovalDetails(item.pending, item.step)}<p class="muted">turn digest <code>${item.pending.digest}</code></p>${decisionForms(item.id, item.pending.digest, csrf)}`
  : html`<div class="note">The pending turn cannot be shown: ${item.problem ?? 'unknown'}. Decide with the CLI after checking the run.</div>`}
</div>`)}`;
}

// ---------------------------------------------------------------------------------------------
// Push
// ---------------------------------------------------------------------------------------------

const resumeForm = (taskId: string, configId: string, csrf: string) =>
  html`<form class="inline" method="post" action="${pushConfigHref(taskId, configId)}/resume"><input type="hidden" name="_csrf" value="${csrf}"><button type="submit" class="primary" data-resume="${taskId}/${configId}">Resume</button></form>`;

function configTable(rows: readonly PushConfigSummary[], csrf: string, withResume: boolean, id: string): Html {
  if (rows.length === 0) return html`<p class="muted">None.</p>`;
  return html`<table id="${id}"><thead><tr><th>config</th><th>task</th><th>target</th><th>authentication</th><th>state reason</th><th class="num">pending</th><th class="num">delivered</th><th class="num">ended otherwise</th><th>created</th>${withResume ? html`<th></th>` : ''}</tr></thead><tbody>
${rows.map((row) => html`<tr data-config="${row.task_id}/${row.id}"><td class="mono"><a href="${pushConfigHref(row.task_id, row.id)}">${row.id}</a></td>
<td class="mono"><a href="${runHref(row.task_id)}">${row.task_id.slice(0, 8)}…</a></td><td class="mono">${maskUrl(row.url)}</td><td class="mono">${maskCredential(row.auth_scheme, row.credentials_hint)}</td>
<td>${row.state_reason ?? ''}</td><td class="num">${row.pending}</td><td class="num">${row.delivered}</td><td class="num">${row.failed}</td><td class="time">${formatTime(row.created_at)}</td>
${withResume ? html`<td>${resumeForm(row.task_id, row.id, csrf)}</td>` : ''}</tr>`)}
</tbody></table>`;
}

/** Each destination's breaker and backlog in the process serving the page (null: it runs no push worker). */
function destinationTable(destinations: readonly DestinationView[] | null): Html {
  if (destinations === null) return html`<p class="muted">This process runs no push worker: each worker process shows its own destinations on its <code>/metrics</code>.</p>`;
  if (destinations.length === 0) return html`<p class="muted">No delivery attempted yet by this process.</p>`;
  return html`<table id="push-destinations"><thead><tr><th>destination</th><th>breaker</th><th class="num">in flight</th><th class="num">backlog</th><th class="num">consecutive failures</th></tr></thead><tbody>
${destinations.map((row) => html`<tr data-destination="${row.destination}"><td class="mono">${row.destination}</td><td>${pill(row.breaker)}</td><td class="num">${row.inFlight}</td><td class="num">${row.backlog}</td><td class="num">${row.consecutiveFailures}</td></tr>`)}
</tbody></table>`;
}

export function pushContent(configs: readonly PushConfigSummary[], counts: Record<string, number | null> | undefined, csrf: string, destinations: readonly DestinationView[] | null = null): Html {
  const live = configs.filter((config) => !config.deleted);
  const byState = (state: string) => live.filter((config) => config.state === state);
  const countOf = (state: string) => html`<span data-count-for="pushConfig:${state}">${counts?.[state] ?? '–'}</span>`;
  return html`<h1>Push</h1>
<p class="muted">Where tasks' events are pushed. Credentials and tokens are never shown, only their scheme and last characters; target paths are masked
(<code>keel push show</code> prints the full URL to an operator with database access).</p>
<h2 id="destinations">Destinations in this process</h2>
<p class="muted">A destination's circuit breaker opens after consecutive timeouts or connection failures; while open its deliveries wait (backlog) without holding a slot, and one probe is sent after the cool-down.</p>
${destinationTable(destinations)}
<h2 id="paused">Paused: authentication failed (${countOf('paused')})</h2>
<p class="muted">The receiver answered 401 or 403. Pending deliveries wait; resuming sends them again, in order.</p>
${configTable(byState('paused'), csrf, true, 'configs-paused')}
<h2 id="active">Active (${countOf('active')})</h2>
${configTable(byState('active'), csrf, false, 'configs-active')}
<h2 id="stopped">Stopped (${countOf('stopped')})</h2>
<p class="muted">The target is gone (404, 410) or the address guard refused it; pending deliveries were cancelled.</p>
${configTable(byState('stopped'), csrf, false, 'configs-stopped')}
<h2 id="deleted">Deleted by their clients (${configs.length - live.length})</h2>
${configTable(configs.filter((config) => config.deleted), csrf, false, 'configs-deleted')}
${configs.length >= 500 ? html`<p class="muted">Only the latest 500 configs are listed.</p>` : ''}`;
}

export type PushConfigPageData = {
  summary: PushConfigSummary;
  deliveries: readonly { id: string; event_sequence: number; state: string; attempts: number; last_outcome: string | null; next_attempt_at: number; created_at: number; ended_at: number | null }[];
  attempts: readonly { delivery_id: string; attempt: number; started_at: number; duration_ms: number; status_code: number | null; outcome: string; error_class: string | null }[];
};

export function pushConfigContent(data: PushConfigPageData, csrf: string): Html {
  const { summary } = data;
  const state = summary.deleted ? 'deleted' : summary.state;
  return html`<p><a href="/ui/push">← Push</a></p>
<h1>Push config <span class="mono">${summary.id}</span></h1>
<dl class="facts">
<dt>state</dt><dd id="config-state">${pill(state)}${summary.state_reason ? html` <span>${summary.state_reason}</span>` : ''} ${summary.state === 'paused' && !summary.deleted ? resumeForm(summary.task_id, summary.id, csrf) : ''}</dd>
<dt>task</dt><dd class="mono"><a href="${runHref(summary.task_id)}">${summary.task_id}</a></dd>
<dt>target</dt><dd class="mono">${maskUrl(summary.url)}</dd>
<dt>authentication</dt><dd class="mono">${maskCredential(summary.auth_scheme, summary.credentials_hint)}</dd>
<dt>deliveries</dt><dd>${summary.pending} pending, ${summary.delivered} delivered, ${summary.failed} ended otherwise</dd>
<dt>created</dt><dd>${formatTime(summary.created_at)}</dd>
</dl>
<h2>Deliveries and attempts</h2>
${data.deliveries.length === 0
    ? html`<p class="muted">No delivery yet.</p>`
    : html`<table id="deliveries"><thead><tr><th class="num">event</th><th>state</th><th class="num">attempts</th><th>last outcome</th><th>next attempt</th><th>ended</th></tr></thead><tbody>
${data.deliveries.map((delivery) => html`<tr data-delivery="${delivery.id}" data-state="${delivery.state}"><td class="num">#${delivery.event_sequence}</td><td>${pill(delivery.state)}</td><td class="num">${delivery.attempts}</td>
<td>${delivery.last_outcome ?? ''}</td><td>${delivery.state === 'pending' ? formatTime(delivery.next_attempt_at) : '–'}</td><td>${formatTime(delivery.ended_at)}</td></tr>
${data.attempts
  .filter((attempt) => attempt.delivery_id === delivery.id)
  .map((attempt) => html`<tr class="attempt"><td></td><td colspan="5" class="muted">attempt ${attempt.attempt} at ${formatTime(attempt.started_at)}: ${attempt.status_code ?? attempt.error_class ?? 'no answer'} in ${attempt.duration_ms} ms → ${attempt.outcome}</td></tr>`)}`)}
</tbody></table>`}`;
}

// ---------------------------------------------------------------------------------------------
// Dependencies
// ---------------------------------------------------------------------------------------------

export function dependenciesContent(overview: DependencyOverview): Html {
  if (!overview.present) {
    return html`<h1>Dependencies</h1><div class="note">The <code>dependencies</code> table is not in this database yet: no run has delegated to a remote agent.</div>`;
  }
  const table = (rows: typeof overview.open, id: string) =>
    rows.length === 0
      ? html`<p class="muted">None.</p>`
      : html`<table id="${id}"><thead><tr><th>dependency</th><th>run</th><th>tool</th><th>remote agent</th><th>state</th><th>remote task</th><th>outcome</th><th class="num">polls</th><th class="num">callbacks</th><th>created</th><th>resolved</th></tr></thead><tbody>
${rows.map((row) => html`<tr><td class="mono">${row.id}</td><td class="mono"><a href="${runHref(row.run_id)}">${row.run_id.slice(0, 8)}…</a></td><td>${row.tool_name}</td><td>${row.remote_agent}</td>
<td>${pill(row.state)}</td><td class="mono">${row.remote_task_id ?? '–'}</td><td>${row.outcome ?? ''}</td><td class="num">${row.polls}</td><td class="num">${row.callbacks}</td><td>${formatTime(row.created_at)}</td><td>${formatTime(row.resolved_at)}</td></tr>`)}
</tbody></table>`;
  return html`<h1>Dependencies</h1>
<p class="muted">Runs that delegated to remote A2A agents and wait on their tasks. Callbacks are only wake-ups: a worker reconciles by asking the remote.</p>
<h2>Open (${overview.open.length})</h2>
${table(overview.open, 'dependencies-open')}
<h2>Resolved (latest ${overview.resolved.length})</h2>
${table(overview.resolved, 'dependencies-resolved')}
<h2>Callbacks received${overview.pendingCallbacks !== null ? html` <span class="muted">(${overview.pendingCallbacks} not processed yet)</span>` : ''}</h2>
${overview.callbacks === null
    ? html`<div class="note">The inbox tables are not in this database yet.</div>`
    : overview.callbacks.length === 0
      ? html`<p class="muted">None.</p>`
      : html`<table id="callbacks"><thead><tr><th>callback</th><th>dependency</th><th>remote agent</th><th>kind</th><th>received</th><th>processed</th></tr></thead><tbody>
${overview.callbacks.map((row) => html`<tr><td class="mono">${row.id}</td><td class="mono">${row.dependency_id ?? '–'}</td><td>${row.remote_agent ?? '–'}</td><td>${row.kind}</td><td>${formatTime(row.received_at)}</td><td>${formatTime(row.processed_at)}</td></tr>`)}
</tbody></table>`}`;
}
