import { RUN_STATUSES, TERMINATION_REASONS } from '../../machines/run.machine.js';
import type { BulkItem, BulkReport, RunSelection } from '../recovery/run-recovery.js';
import type { RunRow } from '../runs/run-row.js';
import { html, queryString, raw, type Html } from './html.js';
import { pill } from './layout.js';
import { runHref } from './machine-rows.js';

// The operator UI's recovery surfaces (docs/operator.md, "Recovering runs"): the retry form of a
// failed statechart run's page, the selection form of the runs page, and the preview of a bulk
// cancel or retry, a dry run that lists what would change, with the button that confirms it. The
// confirmation carries the runs the preview listed: only those change, if the selection still
// chooses them. Every form that changes something carries the session's CSRF token.

const OUTCOMES: Record<BulkItem['outcome'], string> = {
  would_cancel: 'would be cancelled',
  cancelled: 'cancelled',
  would_retry: 'would be retried',
  retried: 'retried',
  refused: 'refused',
  skipped: 'left as it is',
};

/** The retry form of a failed statechart run: from its last committed state, or one it passed through. */
export function retryForm(run: RunRow, passed: readonly string[], csrf: string): Html {
  if (run.status !== 'failed' || !run.machine_hash || passed.length === 0) return html``;
  const last = passed.at(-1)!;
  return html`<div class="card" id="retry-run"><h3>Retry this run</h3>
<p class="muted">The run starts again from a state it committed, as a new revision of the same run; its task is submitted again and ends with the retried result. A step that is not idempotent is never run twice: a state before one is refused.</p>
<form method="post" action="/ui/runs/${run.id}/retry">
  <input type="hidden" name="_csrf" value="${csrf}">
  <label>from state <select name="state" id="retry-state">${[...passed].reverse().map((state) => html`<option value="${state}"${state === last ? raw(' selected') : ''}>${state}${state === last ? ' (last)' : ''}</option>`)}</select></label>
  <button class="primary" type="submit" id="retry-button">Retry from this state</button>
</form></div>`;
}

/** The selection form of the runs page: agent, status, statechart state, termination reason; preview a cancel or a retry. */
export function selectionForm(selection: RunSelection, agents: readonly string[]): Html {
  const select = (name: string, label: string, values: readonly string[], chosen: string | undefined) =>
    html`<label>${label}<select name="${name}"><option value="">any</option>${values.map((value) => html`<option value="${value}"${chosen === value ? raw(' selected') : ''}>${value}</option>`)}</select></label>`;
  return html`<details class="card" id="bulk-recovery"${selection.agent || selection.status || selection.reason ? raw(' open') : ''}><summary>Cancel or retry many runs</summary>
<p class="muted">Choose runs by agent, status, statechart state or termination reason. The preview lists what would change and changes nothing; you confirm from there.</p>
<form class="filters" method="get" action="/ui/runs/recover">
  ${select('agent', 'agent', agents, selection.agent)}
  ${select('status', 'status', RUN_STATUSES, selection.status)}
  <label>statechart state<input type="text" name="state" value="${selection.state ?? ''}" placeholder="review.approval"></label>
  ${select('reason', 'termination reason', TERMINATION_REASONS, selection.reason)}
  <button type="submit" name="action" value="cancel" id="preview-cancel">Preview cancel</button>
  <button type="submit" name="action" value="retry" id="preview-retry">Preview retry</button>
</form></details>`;
}

const selectionText = (selection: RunSelection) =>
  [
    selection.agent ? `agent ${selection.agent}` : null,
    selection.status ? `status ${selection.status}` : null,
    selection.state ? `state ${selection.state}` : null,
    selection.reason ? `reason ${selection.reason}` : null,
  ]
    .filter(Boolean)
    .join(', ');

function itemsTable(items: readonly BulkItem[]): Html {
  if (items.length === 0) return html`<p class="muted" id="bulk-empty">No run matches.</p>`;
  return html`<table id="bulk-items"><thead><tr><th>run</th><th>agent</th><th>status</th><th>state</th><th>reason</th><th>outcome</th><th>detail</th></tr></thead><tbody>
${items.map(
  (item) => html`<tr data-run="${item.id}" data-outcome="${item.outcome}"><td class="mono"><a href="${runHref(item.id)}">${item.id}</a></td><td>${item.agent}</td><td>${pill(item.status)}</td>
<td class="mono">${item.state ?? ''}</td><td>${item.reason ?? ''}</td><td>${OUTCOMES[item.outcome]}</td><td>${item.detail}</td></tr>`,
)}
</tbody></table>`;
}

/** A bulk operation's dry run: what would change, and the button that does it to exactly the runs listed. */
export function bulkPreviewContent(report: BulkReport, csrf: string): Html {
  const changing = report.items.filter((item) => item.outcome === 'would_cancel' || item.outcome === 'would_retry');
  const verb = report.action === 'cancel' ? 'Cancel' : 'Retry';
  const { selection } = report;
  return html`<p><a href="/ui/runs${queryString({ agent: selection.agent ?? '', status: selection.status ?? '', reason: selection.reason ?? '' })}">← Runs</a></p>
<h1>${verb} runs: preview</h1>
<p id="bulk-summary" data-would="${changing.length}">Chosen by ${selectionText(selection)}: <strong>${changing.length}</strong> of ${report.items.length} run(s) would be ${report.action === 'cancel' ? 'cancelled' : 'retried'}. Nothing has changed yet.</p>
${itemsTable(report.items)}
${changing.length === 0
    ? html`<p class="muted">Nothing to confirm.</p>`
    : html`<form method="post" action="/ui/runs/recover" id="bulk-confirm">
  <input type="hidden" name="_csrf" value="${csrf}">
  <input type="hidden" name="action" value="${report.action}">
  ${(['agent', 'status', 'state', 'reason'] as const).map((key) => (selection[key] ? html`<input type="hidden" name="${key}" value="${selection[key]}">` : ''))}
  <input type="hidden" name="ids" value="${changing.map((item) => item.id).join(',')}">
  <button class="primary" type="submit" id="bulk-confirm-button">${verb} ${changing.length} run(s)</button>
</form>`}`;
}

/** What a confirmed bulk operation did. */
export function bulkResultContent(report: BulkReport): Html {
  return html`<p><a href="/ui/runs">← Runs</a></p>
<h1>${report.action === 'cancel' ? 'Cancelled' : 'Retried'} runs</h1>
<p id="bulk-summary" data-changed="${report.changed}"><strong>${report.changed}</strong> of ${report.items.length} run(s) ${report.action === 'cancel' ? 'cancelled' : 'retried'} (chosen by ${selectionText(report.selection)}).</p>
${itemsTable(report.items)}`;
}

/** A single retry the run refused. */
export function retryRefusedContent(runId: string, message: string): Html {
  return html`<p><a href="${runHref(runId)}">← Run</a></p><h1>Not retried</h1><div class="flash error" role="alert" id="retry-refused">${message}</div>`;
}
