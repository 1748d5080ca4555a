import { stateText } from '../statecharts/definition-graph.js';
import type { OpenMachineRun } from '../statecharts/definition-repository.js';
import { formatTime, html, raw, type Html } from './html.js';
import { pill } from './layout.js';
import { agentStateHref, ELSEWHERE, NOT_STARTED, type AgentMachine, type RunMachineView } from './agent-machines.js';
import { runHref } from './machine-rows.js';
import { renderSvg, toMermaid } from './statechart.js';

// The operator pages' parts about statechart agents (docs/statechart-agents.md, "Seen live"): each agent's
// machine on the machines page with its open runs per state, the runs in one state, and a run's
// path through its machine on the run's page. Only state names and event types are shown: a
// machine's context and its steps' outputs are sealed in the run's snapshot and never opened here.

const count = (value: number | undefined) => (value === undefined ? '–' : String(value));

export function agentMachinesContent(machines: readonly AgentMachine[], counts: Record<string, Record<string, number>>): Html {
  if (machines.length === 0) return html``;
  return html`<h2 id="statechart-agents">Statechart agents</h2>
<p class="muted">Each agent written as a machine, drawn from the definition this process runs, with the number of its open runs in each state now
(from <code>runs.machine_state</code>). A run counts in the state it stands in and in every compound state around it, so a compound state
shows the runs anywhere inside it; a run in a parallel state counts once in each region. Dotted edges lead a compound state to its initial child.</p>
<div class="machines">
${machines.map((machine) => {
  const machineCounts = counts[machine.key];
  return html`<section class="machine" id="machine-${machine.key.replace('/', '-')}" data-machine-section="${machine.key}" data-agent="${machine.agent}">
  <h2>agent ${machine.agent} <span class="muted">(statechart, version <span class="mono" data-version>${machine.hash}</span>)</span></h2>
  <div class="meta">${machine.file} · open runs in <code>runs.machine_state</code>
    · <span data-count-for="${machine.key}:${NOT_STARTED}">${count(machineCounts?.[NOT_STARTED])}</span> not started yet
    · <span data-count-for="${machine.key}:${ELSEWHERE}">${count(machineCounts?.[ELSEWHERE])}</span> in a state this version lacks (<code>keel machines diff ${machine.agent}</code>)</div>
  ${raw(renderSvg(machine.model, { counts: machineCounts ?? null, idPrefix: `m-${machine.key}`, hrefFor: (state) => agentStateHref(machine.agent, state) }))}
  <details><summary>Counts as a table, and the Mermaid source</summary>
    <table class="counts"><thead><tr><th>state</th><th class="num">open runs</th><th>description</th></tr></thead><tbody>
    ${machine.graph.states.map(
      (state) => html`<tr><td><a href="${agentStateHref(machine.agent, state.path)}">${state.path}</a>${state.kind !== 'atomic' ? html` <span class="muted">(${state.kind})</span>` : ''}</td>
        <td class="num" data-count-for="${machine.key}:${state.path}">${count(machineCounts?.[state.path])}</td><td class="muted">${state.description ?? (state.status ? `status "${state.status}"` : '')}</td></tr>`,
    )}
    </tbody></table>
    <pre>${toMermaid(machine.model)}</pre>
  </details>
</section>`;
})}
</div>`;
}

export function agentStateRowsContent(machine: AgentMachine, state: string, list: { runs: readonly OpenMachineRun[]; total: number }, limit: number): Html {
  return html`<p><a href="/ui/machines#machine-${machine.key.replace('/', '-')}">← Machines</a></p>
<h1>agent ${machine.agent}: ${state}</h1>
<p><strong data-state-total>${list.total}</strong> open run(s) of agent ${machine.agent} in this state${list.total > list.runs.length ? html` (the latest ${limit} shown)` : ''}.</p>
${list.runs.length === 0
    ? html`<p class="muted">None.</p>`
    : html`<table id="state-runs"><thead><tr><th>run</th><th>status</th><th>state</th><th>version</th><th>last change</th></tr></thead><tbody>
${list.runs.map(
  (run) => html`<tr data-run="${run.id}"><td class="mono"><a href="${runHref(run.id)}">${run.id}</a></td><td>${pill(run.status)}</td><td class="mono">${stateText(run.machine_state)}</td>
<td class="mono">${run.machine_hash ?? '–'}${run.machine_hash !== null && run.machine_hash !== machine.hash ? html` <span class="muted">(not current)</span>` : ''}</td><td class="time">${formatTime(run.updated_at)}</td></tr>`,
)}
</tbody></table>`}`;
}

export function runMachineContent(view: RunMachineView, agent: string): Html {
  const { machine, path } = view;
  return html`<h2 id="run-machine">Machine <span class="muted">agent ${agent} (statechart${view.runHash ? html`, version <span class="mono">${view.runHash}</span>` : ''})</span></h2>
${view.note ? html`<div class="note">${view.note}</div>` : ''}
<p>Stands in <strong class="mono" id="machine-state">${view.currentText}</strong>.
<span class="muted">Green: the states the run stood in and the transitions it took, from its committed transitions; orange: where it stands now.</span></p>
${machine
    ? raw(
        renderSvg(
          { ...machine.model, id: `path/${agent}` },
          { idPrefix: 'run-machine', path: { visited: path.visited, taken: path.taken, current: view.current } },
        ),
      )
    : ''}
<h3>The path it took</h3>
${path.steps.length === 0
    ? html`<p class="muted">No transition committed yet.</p>`
    : html`<table id="machine-path"><thead><tr><th class="num">#</th><th>at</th><th>event</th><th>state reached</th></tr></thead><tbody>
${path.steps.map((step) => html`<tr data-sequence="${step.sequence}"><td class="num">${step.sequence}</td><td class="time">${formatTime(step.at)}</td><td class="mono" title="${step.event}">${step.label}</td><td class="mono" data-state="${step.state}">${step.state}</td></tr>`)}
</tbody></table>`}`;
}
