import type { Command } from 'commander';
import { configBaseDir, type KeelConfig } from '../config/load-config.js';
import { problemList } from '../config/module-load-error.js';
import { diffDefinitions, graphOfMachine, orphanedSteps, readDefinitionGraph, stateText, type DefinitionDiff, type DefinitionGraph } from '../statecharts/definition-graph.js';
import { definitionsOf, openRunsByState, openRunsOf } from '../statecharts/definition-repository.js';
import { loadStatechart, stateIdsOf, type StatechartDefinition } from '../statecharts/statechart-definition.js';
import { loadMachineCatalog } from '../ui/machine-catalog.js';
import { describeGraph, standaloneSvg, toMermaid } from '../ui/statechart.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';

// `keel machines`: the statecharts of machines/ as the operator UI draws them, generated from the
// XState definitions: Mermaid text (stateDiagram-v2), JSON (states and transitions), or SVG.
// `keel machines <agent>` prints a statechart agent's machine the same way (read from the config),
// and `keel machines diff <agent>` compares the definitions its open runs started with against the
// current one (docs/statechart-agents.md, "Seen live").

const FORMATS = ['mermaid', 'json', 'svg'] as const;
type Format = (typeof FORMATS)[number];

/** Stranded runs listed by `diff` (all are counted). */
const STRANDED_LISTED = 500;

/** The machine of a statechart agent of the config, loaded as `keel start` loads it; a clear error otherwise. */
async function agentMachine(config: KeelConfig, agentId: string, lifecycles: readonly string[]): Promise<StatechartDefinition> {
  const index = config.agents.findIndex((agent) => agent.id === agentId);
  const statechartAgents = config.agents.filter((agent) => agent.machine !== undefined).map((agent) => agent.id);
  if (index === -1) {
    const known = [
      ...(lifecycles.length > 0 ? [`machines ${lifecycles.join(', ')}`] : []),
      statechartAgents.length > 0 ? `statechart agents ${statechartAgents.join(', ')}` : 'no statechart agent in the config',
    ];
    throw new CliExit(EXIT.notFound, `no machine or agent ${agentId}; there are ${known.join('; ')}`);
  }
  const agent = config.agents[index]!;
  if (agent.machine === undefined) {
    throw new CliExit(
      EXIT.notFound,
      `agent ${agentId} is not a statechart agent: its config names no machine${statechartAgents.length > 0 ? ` (statechart agents: ${statechartAgents.join(', ')})` : ''}`,
    );
  }
  const baseDir = configBaseDir(config);
  const loaded = await loadStatechart(agent.machine, baseDir, `agents.${index} (${agent.id})`);
  if (!loaded.ok) throw new CliExit(EXIT.config, `the machine of agent ${agentId} cannot be used:\n${problemList(loaded.problems)}`);
  return loaded.definition;
}

function printAgentMachine(agentId: string, definition: StatechartDefinition, format: Format): void {
  const model = describeGraph(graphOfMachine(definition.machine), agentId);
  switch (format) {
    case 'json':
      process.stdout.write(
        `${JSON.stringify(
          {
            machines: [
              { id: agentId, agent: agentId, machine: definition.machine.id, version: definition.hash, file: definition.path, initial: model.initial, states: model.states, transitions: model.edges },
            ],
          },
          null,
          2,
        )}\n`,
      );
      return;
    case 'mermaid':
      process.stdout.write(`%% agent ${agentId} (statechart, version ${definition.hash}, ${definition.path})\n${toMermaid(model)}\n`);
      return;
    case 'svg':
      process.stdout.write(`${standaloneSvg(model)}\n`);
      return;
  }
}

type VersionReport = { version: string; firstSeenAt: string; openRuns: number; changes: DefinitionDiff | null };
type StrandedRun = {
  id: string;
  status: string;
  state: string;
  /** States it stands in that the current version lacks. */
  missing: string[];
  /** Steps it waits on that the current version no longer invokes (by id) in its state. */
  steps: string[];
  startedWith: string | null;
};

export type MachineDiffReport = {
  agent: string;
  file: string;
  current: { version: string; recorded: boolean };
  /** Open runs by the version they started with (null: not started yet). */
  openRuns: Array<{ version: string | null; runs: number; current: boolean; recorded: boolean }>;
  /** Every older recorded version and what changed from it to the current one (null: its stored definition cannot be read). */
  versions: VersionReport[];
  /** Open runs standing in a state the current version lacks, or waiting on a step it no longer invokes there: resumed, they fail with not_retryable. */
  stranded: { total: number; runs: StrandedRun[] };
};

function printDiff(report: MachineDiffReport): void {
  const out: string[] = [`agent ${report.agent}: machine ${report.file}, current version ${report.current.version}${report.current.recorded ? '' : ' (not recorded yet: no Keel process has started with it)'}`];
  out.push('', 'open runs by the version they started with:');
  if (report.openRuns.length === 0) out.push('  none');
  else {
    out.push(
      printTable(
        report.openRuns.map((group) => ({ version: group.version ?? 'not started yet', runs: String(group.runs), note: group.current ? 'current' : group.version !== null && !group.recorded ? 'not recorded' : '' })),
        ['version', 'runs', 'note'],
      )
        .split('\n')
        .map((line) => `  ${line}`)
        .join('\n'),
    );
  }
  if (report.versions.length === 0) out.push('', 'no older version of this machine is recorded.');
  for (const version of report.versions) {
    out.push('', `version ${version.version} (first seen ${version.firstSeenAt}; ${version.openRuns} open run(s) started with it), changed in the current one:`);
    if (!version.changes) {
      out.push('  its stored definition cannot be read');
      continue;
    }
    const { statesAdded, statesRemoved, transitionsAdded, transitionsRemoved } = version.changes;
    const section = (title: string, items: string[]) => {
      if (items.length > 0) out.push(`  ${title}:`, ...items.map((item) => `    ${item}`));
    };
    section('states added', statesAdded);
    section('states removed', statesRemoved);
    section('transitions added', transitionsAdded);
    section('transitions removed', transitionsRemoved);
    section('invokes changed', version.changes.invokesChanged);
    if (statesAdded.length + statesRemoved.length + transitionsAdded.length + transitionsRemoved.length + version.changes.invokesChanged.length === 0) {
      out.push('  no state, transition or invoke changed (only actions, guards\' code, inputs or metadata)');
    }
  }
  out.push('');
  if (report.stranded.total === 0) out.push('no open run stands in a state, or waits on a step, the current version lacks.');
  else {
    out.push(`open runs in a state, or waiting on a step, the current version lacks (${report.stranded.total}): resumed, they fail with not_retryable`);
    out.push(
      printTable(
        report.stranded.runs.map((run) => ({
          run: run.id,
          status: run.status,
          state: run.state,
          'gone from it': [...run.missing.map((state) => `state ${state}`), ...run.steps.map((step) => `step ${step}`)].join('; '),
          'started with': run.startedWith ?? '-',
        })),
        ['run', 'status', 'state', 'gone from it', 'started with'],
      )
        .split('\n')
        .map((line) => `  ${line}`)
        .join('\n'),
    );
    if (report.stranded.total > report.stranded.runs.length) out.push(`  … and ${report.stranded.total - report.stranded.runs.length} more`);
  }
  process.stdout.write(`${out.join('\n')}\n`);
}

export function registerMachinesCommand(program: Command): void {
  const globals = () => program.opts<GlobalOptions>();
  const machines = program
    .command('machines [machine]')
    .description('print the statecharts (run, task, delivery, pushConfig, dependency, ...) generated from their definitions, or a statechart agent\'s machine by the agent\'s id')
    .option('--format <format>', `${FORMATS.join(' | ')}`, 'mermaid')
    .action(async (only: string | undefined, options: { format: string }) => {
      if (!FORMATS.includes(options.format as Format)) throw new CliExit(EXIT.usage, `--format must be one of ${FORMATS.join(', ')}`);
      const catalog = await loadMachineCatalog();
      const chosen = only === undefined ? catalog : catalog.filter((entry) => entry.id === only);
      if (chosen.length === 0) {
        // Not a lifecycle: a statechart agent of the config.
        const config = loadConfigOrExit(globals());
        const definition = await agentMachine(config, only!, catalog.map((entry) => entry.id));
        printAgentMachine(only!, definition, options.format as Format);
        return;
      }
      switch (options.format as Format) {
        case 'json':
          process.stdout.write(
            `${JSON.stringify(
              {
                machines: chosen.map((entry) => ({
                  id: entry.id,
                  file: `machines/${entry.file}`,
                  initial: entry.model.initial,
                  states: entry.model.states,
                  transitions: entry.model.edges,
                })),
              },
              null,
              2,
            )}\n`,
          );
          return;
        case 'mermaid':
          process.stdout.write(`${chosen.map((entry) => `%% ${entry.id} (machines/${entry.file})\n${toMermaid(entry.model)}\n`).join('\n')}`);
          return;
        case 'svg':
          if (chosen.length !== 1) throw new CliExit(EXIT.usage, `--format svg draws one machine: name it (${catalog.map((entry) => entry.id).join(', ')})`);
          process.stdout.write(`${standaloneSvg(chosen[0]!.model)}\n`);
          return;
      }
    });

  machines
    .command('diff <agent>')
    .description('list the versions of a statechart agent\'s machine its open runs started with, what changed in the current one, and which open runs stand in a state it lacks')
    .option('--json', 'print the report as JSON')
    .action(async (agentId: string, options: { json?: boolean }) => {
      const config = loadConfigOrExit(globals());
      const catalog = await loadMachineCatalog();
      const definition = await agentMachine(config, agentId, catalog.map((entry) => entry.id));
      const current = graphOfMachine(definition.machine);
      const report = await withDatabase(config, async (pool): Promise<MachineDiffReport> => {
        const [stored, groups, open] = await Promise.all([definitionsOf(pool, agentId), openRunsByState(pool, [agentId]), openRunsOf(pool, agentId, 100_000)]);
        const byVersion = new Map<string | null, number>();
        for (const group of groups) byVersion.set(group.machine_hash, (byVersion.get(group.machine_hash) ?? 0) + group.n);
        const recorded = new Set(stored.map((row) => row.hash));
        const graphs = new Map<string, DefinitionGraph | null>(stored.map((row) => [row.hash, readDefinitionGraph(row.definition)]));
        graphs.set(definition.hash, current);
        const strandedRuns: StrandedRun[] = [];
        let strandedTotal = 0;
        for (const run of open) {
          if (run.machine_state === null || run.machine_state === undefined) continue;
          // The executor's own check of a restored state, then the steps it waits on (by the
          // version its latest transition ran on, whose invokes started them).
          const { missing } = stateIdsOf(definition.machine, run.machine_state);
          const ranOn = graphs.get(run.latest_hash ?? run.machine_hash ?? '') ?? null;
          const steps = missing.length === 0 && ranOn ? orphanedSteps(ranOn, current, run.machine_state) : [];
          if (missing.length === 0 && steps.length === 0) continue;
          strandedTotal += 1;
          if (strandedRuns.length < STRANDED_LISTED) {
            strandedRuns.push({ id: run.id, status: run.status, state: stateText(run.machine_state), missing, steps, startedWith: run.machine_hash });
          }
        }
        return {
          agent: agentId,
          file: definition.path,
          current: { version: definition.hash, recorded: recorded.has(definition.hash) },
          openRuns: [...byVersion.entries()]
            .sort(([a], [b]) => (a === definition.hash ? -1 : b === definition.hash ? 1 : a === null ? 1 : b === null ? -1 : a.localeCompare(b)))
            .map(([version, runs]) => ({ version, runs, current: version === definition.hash, recorded: version !== null && recorded.has(version) })),
          versions: stored
            .filter((row) => row.hash !== definition.hash)
            .map((row) => {
              const graph = graphs.get(row.hash) ?? null;
              return { version: row.hash, firstSeenAt: formatTime(row.first_seen_at), openRuns: byVersion.get(row.hash) ?? 0, changes: graph ? diffDefinitions(graph, current) : null };
            }),
          stranded: { total: strandedTotal, runs: strandedRuns },
        };
      });
      if (options.json) process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
      else printDiff(report);
    });
}
