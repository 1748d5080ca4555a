import { userInfo } from 'node:os';
import type { Command } from 'commander';
import { RUN_STATUSES, TERMINATION_REASONS, type RunStatus } from '../../machines/run.machine.js';
import { configBaseDir, type KeelConfig } from '../config/load-config.js';
import { cancelRun, getRun, listRuns } from '../runs/run-repository.js';
import { bulkCancel, bulkRetry, retryRun, selectionProblem, type BulkReport, type Operator, type RecoveryDeps, type RunSelection } from '../recovery/run-recovery.js';
import { loadStatechart, type StatechartDefinition } from '../statecharts/statechart-definition.js';
import { stepApprovalOf, waitingStep, type StepApproval } from '../ui/step-approval.js';
import { dueOpenDependenciesOfRun } from '../remote/dependency-repository.js';
import { listRunEvents } from '../runs/run-event-repository.js';
import { buildRunTimeline, timelineLines } from '../runs/run-timeline.js';
import { machineStepsOf } from '../ui/ui-queries.js';
import { decideApproval, readSuspendedRun } from '../runs/resume-run.js';
import type { LoopState } from '../../machines/agent-loop.machine.js';
import { withCommandContext } from './command-context.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';
import { isUuid } from '../db/uuid.js';

function requireRunId(id: string): string {
  if (!isUuid(id)) throw new CliExit(EXIT.usage, `"${id}" is not a run id (expected a UUID)`);
  return id.toLowerCase();
}

type PendingView =
  | {
      kind: 'approval';
      digest: string;
      calls?: Array<{ id: string; name: string; arguments: unknown }>;
      guardrail?: { name: string; stage: string; reason: string };
      /** A statechart run's askApproval step: which state and step wait, and what it asks at the levels that keep content. */
      step?: StepApproval;
    }
  | { kind: 'input'; tool: string; prompt: string; schema: unknown }
  | { kind: 'unreadable'; detail: string };

function pendingFromState(state: LoopState, run: { machine_state?: unknown; audit_level: string }): PendingView | null {
  const approval = state.pendingApproval;
  const step = stepApprovalOf(approval, waitingStep(state), run.machine_state, run.audit_level as StepApproval['level']);
  if (step && approval) return { kind: 'approval', digest: approval.digest, step };
  if (approval?.kind === 'tools') return { kind: 'approval', digest: approval.digest, calls: approval.calls };
  if (approval?.kind === 'guardrail') {
    return { kind: 'approval', digest: approval.digest, guardrail: { name: approval.guardrail, stage: approval.stage, reason: approval.reason } };
  }
  if (state.pendingInput) return { kind: 'input', tool: state.pendingInput.toolName, prompt: state.pendingInput.prompt, schema: state.pendingInput.schema };
  return null;
}

function describePending(pending: PendingView): string[] {
  switch (pending.kind) {
    case 'unreadable':
      return [`pending: cannot be shown (${pending.detail})`];
    case 'input':
      return [`waiting for input to tool ${pending.tool}: ${pending.prompt}`, `  schema ${JSON.stringify(pending.schema)}`];
    case 'approval': {
      const lines = [`waiting for approval; turn digest ${pending.digest}`];
      if (pending.step) lines.push(...describeStepApproval(pending.step));
      for (const call of pending.calls ?? []) lines.push(`  call ${call.id}: ${call.name} ${JSON.stringify(call.arguments)}`);
      if (pending.guardrail) lines.push(`  guardrail ${pending.guardrail.name} on the ${pending.guardrail.stage}: ${pending.guardrail.reason}`);
      lines.push(`  decide with: keel runs approve|deny <runId> --turn ${pending.digest}`);
      return lines;
    }
  }
}

/** A statechart step waiting for an operator, in the words of the run page (src/ui/step-approval.ts). */
function describeStepApproval(step: StepApproval): string[] {
  const lines = [`  the step ${step.step}${step.src !== step.step ? ` (${step.src})` : ''} in state ${step.state} is waiting for an operator's decision`];
  if (step.input === null) {
    lines.push(
      `  what it asks is not shown: this run keeps no content at its audit level (${step.level})${step.fields.length > 0 ? `; its details have the fields ${step.fields.join(', ')}` : ''}`,
    );
    return lines;
  }
  lines.push(`  it asks: ${step.input.summary}${step.level === 'redacted' ? ' (redacted, as this run\'s audit level keeps it)' : ''}`);
  if (step.input.details && Object.keys(step.input.details).length > 0) lines.push(`  details ${JSON.stringify(step.input.details)}`);
  return lines;
}

/** Who runs the command, for the audit entry of a retry. */
function cliOperator(): Operator {
  try {
    return { name: userInfo().username, via: 'cli' };
  } catch {
    return { name: 'cli', via: 'cli' };
  }
}

/** The current machine of each statechart agent of the configuration, loaded once when a retry needs it. */
function configuredDefinitions(config: KeelConfig): RecoveryDeps['definitionOf'] {
  const loaded = new Map<string, Promise<StatechartDefinition | null>>();
  return (agentId) => {
    let definition = loaded.get(agentId);
    if (!definition) {
      definition = (async () => {
        const index = config.agents.findIndex((agent) => agent.id === agentId);
        const agent = config.agents[index];
        if (!agent?.machine) return null;
        const result = await loadStatechart(agent.machine, configBaseDir(config), `agents.${index} (${agent.id})`);
        if (!result.ok) throw new CliExit(EXIT.config, `the machine of agent ${agentId} cannot be loaded:\n${result.problems.map((problem) => `  - ${problem}`).join('\n')}`);
        return result.definition;
      })();
      loaded.set(agentId, definition);
    }
    return definition;
  };
}

type SelectionOptions = { agent?: string; status?: string; state?: string; reason?: string; dryRun?: boolean; json?: boolean };

/** The selection of a bulk command, or null when it names one run; a run id and a selection together, or neither, is a usage error. */
function selectionOf(runId: string | undefined, options: SelectionOptions, verb: string): RunSelection | null {
  const selection: RunSelection = {
    ...(options.agent ? { agent: options.agent } : {}),
    ...(options.status ? { status: options.status as RunStatus } : {}),
    ...(options.state ? { state: options.state } : {}),
    ...(options.reason ? { reason: options.reason } : {}),
  };
  const selecting = Object.keys(selection).length > 0;
  if (runId !== undefined && selecting) throw new CliExit(EXIT.usage, `give a run id or a selection (--agent, --status, --state, --reason), not both`);
  if (runId === undefined && !selecting) throw new CliExit(EXIT.usage, `give the run to ${verb}, or choose runs with --agent, --status, --state or --reason`);
  if (runId === undefined) {
    const problem = selectionProblem(selection);
    if (problem) throw new CliExit(EXIT.usage, problem.replace('status must', '--status must').replace('termination reason must', '--reason must'));
    return selection;
  }
  if (options.dryRun) throw new CliExit(EXIT.usage, '--dry-run goes with a selection (--agent, --status, --state, --reason)');
  return null;
}

const OUTCOME_TEXT: Record<BulkReport['items'][number]['outcome'], string> = {
  would_cancel: 'would cancel',
  cancelled: 'cancelled',
  would_retry: 'would retry',
  retried: 'retried',
  refused: 'refused',
  skipped: 'skipped',
};

function printBulk(report: BulkReport, json: boolean | undefined): void {
  if (json) {
    process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return;
  }
  const rows = report.items.map((item) => ({ id: item.id, agent: item.agent, status: item.status, state: item.state ?? '', reason: item.reason ?? '', outcome: OUTCOME_TEXT[item.outcome], detail: item.detail }));
  const would = report.items.filter((item) => item.outcome === 'would_cancel' || item.outcome === 'would_retry').length;
  const verb = report.action === 'cancel' ? 'cancelled' : 'retried';
  const summary = report.dryRun
    ? `dry run: ${would} of ${report.items.length} selected runs would be ${verb}; nothing was changed (run again without --dry-run to do it)`
    : `${report.changed} of ${report.items.length} selected runs ${verb}`;
  process.stdout.write(`${rows.length > 0 ? `${printTable(rows, ['id', 'agent', 'status', 'state', 'reason', 'outcome', 'detail'])}\n` : ''}${summary}\n`);
}

export function registerRunsCommands(program: Command, globals: () => GlobalOptions): void {

  const runs = program.command('runs').description('inspect and control agent runs');

  runs
    .command('list')
    .description('list runs, newest first')
    .option('--status <status>', `only runs in this status (${RUN_STATUSES.join(', ')})`)
    .option('--agent <id>', 'only runs of this agent')
    .option('--limit <n>', 'at most this many rows (1-1000)', '50')
    .option('--json', 'print JSON lines instead of a table')
    .action(async (options: { status?: string; agent?: string; limit: string; json?: boolean }) => {
      if (options.status && !RUN_STATUSES.includes(options.status as RunStatus)) {
        throw new CliExit(EXIT.usage, `--status must be one of ${RUN_STATUSES.join(', ')}`);
      }
      const limit = Number(options.limit);
      if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new CliExit(EXIT.usage, '--limit must be a whole number from 1 to 1000');
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const rows = await listRuns(pool, { status: options.status as RunStatus | undefined, agent: options.agent, limit });
        if (options.json) {
          for (const row of rows) {
            process.stdout.write(`${JSON.stringify({ id: row.id, agent: row.agent, status: row.status, terminationReason: row.termination_reason, truncated: row.truncated, revision: row.revision, createdAt: formatTime(row.created_at) })}\n`);
          }
          return;
        }
        process.stdout.write(
          `${printTable(
            rows.map((row) => ({
              id: row.id,
              agent: row.agent,
              status: row.status,
              reason: row.termination_reason ?? '',
              created: formatTime(row.created_at),
            })),
            ['id', 'agent', 'status', 'reason', 'created'],
          )}\n`,
        );
      });
    });

  runs
    .command('show <runId>')
    .description('show one run and its event timeline (within its audit level)')
    .option('--json', 'print JSON')
    .action(async (runId: string, options: { json?: boolean }) => {
      const id = requireRunId(runId);
      const config = loadConfigOrExit(globals());
      await withCommandContext(config, async ({ pool, sealer }) => {
        const pendingOf = async (status: 'waiting_for_approval' | 'waiting_for_input'): Promise<PendingView | null> => {
          const read = await readSuspendedRun(pool, sealer, id, status);
          if (!read.ok) return read.reason === 'unreadable' ? { kind: 'unreadable', detail: read.detail } : null;
          return pendingFromState(read.view.state, read.view.run);
        };
        const run = await getRun(pool, id);
        if (!run) throw new CliExit(EXIT.notFound, `run ${id} not found`);
        const events = await listRunEvents(pool, id);
        const pending = run.status === 'waiting_for_approval' || run.status === 'waiting_for_input' ? await pendingOf(run.status) : null;
        const summary = {
          id: run.id,
          agent: run.agent,
          status: run.status,
          terminationReason: run.termination_reason,
          truncated: run.truncated,
          revision: run.revision,
          claimedBy: run.claimed_by,
          leaseExpiresAt: run.lease_expires_at === null ? null : formatTime(run.lease_expires_at),
          requeueCount: run.requeue_count,
          auditLevel: run.audit_level,
          answerLevel: run.answer_level,
          iterations: run.iterations,
          toolCalls: run.tool_calls,
          inputTokens: run.input_tokens,
          outputTokens: run.output_tokens,
          errorClass: run.error_class,
          createdAt: formatTime(run.created_at),
          startedAt: run.started_at === null ? null : formatTime(run.started_at),
          settledAt: run.settled_at === null ? null : formatTime(run.settled_at),
          failureDetail: run.failure_detail,
          // A statechart agent's run: the state it stands in and the version of its machine it started with.
          ...(run.machine_hash ? { machineState: run.machine_state ?? null, machineVersion: run.machine_hash } : {}),
        };
        if (options.json) {
          process.stdout.write(`${JSON.stringify({ ...summary, pending, events }, null, 2)}\n`);
          return;
        }
        const lines = Object.entries(summary).map(([key, value]) => `${key.padEnd(17)} ${value === null || value === undefined ? '-' : typeof value === 'object' ? JSON.stringify(value) : value}`);
        if (pending) lines.push('', ...describePending(pending));
        lines.push('', `events (audit level ${run.audit_level})`);
        if (events.length === 0) lines.push('  (none recorded)');
        for (const event of events) lines.push(`  ${String(event.sequence).padStart(4)}  ${formatTime(event.created_at)}  ${event.kind}  ${JSON.stringify(event.payload)}`);
        process.stdout.write(`${lines.join('\n')}\n`);
      });
    });

  runs
    .command('timeline <runId>')
    .description('print what a run did over time: states, steps, waits, retries and requeues (names and times only)')
    .option('--json', 'print JSON')
    .action(async (runId: string, options: { json?: boolean }) => {
      const id = requireRunId(runId);
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const run = await getRun(pool, id);
        if (!run) throw new CliExit(EXIT.notFound, `run ${id} not found`);
        const [events, machineSteps] = await Promise.all([listRunEvents(pool, id), machineStepsOf(pool, id)]);
        const timeline = buildRunTimeline(run, events, machineSteps, Date.now());
        if (options.json) {
          const segments = timeline.segments.map((segment) => ({
            kind: segment.kind,
            ...(segment.wait ? { wait: segment.wait } : {}),
            label: segment.label,
            start: formatTime(segment.start),
            end: formatTime(segment.end),
            offsetMs: segment.start - timeline.start,
            durationMs: segment.end - segment.start,
            open: segment.open,
          }));
          const body = { id: run.id, agent: run.agent, status: run.status, auditLevel: run.audit_level, start: formatTime(timeline.start), end: formatTime(timeline.end), inProgress: timeline.inProgress, segments };
          process.stdout.write(`${JSON.stringify(body, null, 2)}\n`);
          return;
        }
        const header = `run ${run.id} (agent ${run.agent}, ${run.status}, audit level ${run.audit_level}), created ${formatTime(run.created_at)}`;
        process.stdout.write(`${[header, ...timelineLines(timeline)].join('\n')}\n`);
      });
    });

  for (const decision of ['approve', 'deny'] as const) {
    runs
      .command(`${decision} <runId>`)
      .description(`${decision} the turn a run is waiting on (the digest binds the decision to the turn that was shown)`)
      .requiredOption('--turn <digest>', 'the turn digest printed by `keel runs show`')
      .action(async (runId: string, options: { turn: string }) => {
        const id = requireRunId(runId);
        if (!/^[0-9a-f]{64}$/i.test(options.turn)) throw new CliExit(EXIT.usage, '--turn must be the 64-character digest shown by `keel runs show`');
        const config = loadConfigOrExit(globals());
        await withCommandContext(config, async (context) => {
          const result = await decideApproval(context, id, options.turn, decision === 'approve');
          if (result.ok) {
            process.stdout.write(`run ${id}: turn ${decision === 'approve' ? 'approved' : 'denied'}; the run resumes\n`);
            return;
          }
          switch (result.reason) {
            case 'not_found':
              throw new CliExit(EXIT.notFound, `run ${id} not found`);
            case 'not_waiting':
              throw new CliExit(EXIT.failure, `run ${id} is ${result.status}, not waiting for approval`);
            case 'stale_digest':
              throw new CliExit(EXIT.failure, `turn ${options.turn} is not the turn run ${id} is waiting on; run \`keel runs show ${id}\` for the current digest`);
            case 'already_decided':
              throw new CliExit(EXIT.failure, `the turn of run ${id} was decided by someone else meanwhile`);
            case 'unreadable':
              throw new CliExit(EXIT.failure, `run ${id}: ${result.detail}`);
          }
        });
      });
  }

  const selectionOptions = (command: Command) =>
    command
      .option('--agent <id>', 'choose the runs of this agent')
      .option('--status <status>', `choose the runs in this status (${RUN_STATUSES.join(', ')})`)
      .option('--state <state>', 'choose the statechart runs standing in this state of their machine ("review" or "review.approval")')
      .option('--reason <reason>', `choose the runs that ended with this termination reason (${TERMINATION_REASONS.join(', ')})`)
      .option('--dry-run', 'list what would change and change nothing')
      .option('--json', 'print the report as JSON');

  selectionOptions(
    runs
      .command('cancel [runId]')
      .description('cancel a run that has not ended yet, or every run a selection chooses (--agent, --status, --state, --reason; --dry-run lists them)'),
  ).action(async (runId: string | undefined, options: SelectionOptions) => {
    const selection = selectionOf(runId, options, 'cancel');
    const config = loadConfigOrExit(globals());
    if (selection) {
      await withDatabase(config, async (pool, logger) =>
        printBulk(await bulkCancel({ pool, logger: logger.child({}, { level: 'warn' }) }, selection, { dryRun: options.dryRun === true, operator: cliOperator() }), options.json),
      );
      return;
    }
    const id = requireRunId(runId!);
    await withDatabase(config, async (pool, logger) => {
      const result = await cancelRun(pool, logger, id);
      // Remote tasks the run waits on are made due: a running Keel's poller cancels them.
      if (result.settled) await dueOpenDependenciesOfRun(pool, id);
      if (result.settled) {
        process.stdout.write(`run ${id} cancelled\n`);
        return;
      }
      if (result.current === null) throw new CliExit(EXIT.notFound, `run ${id} not found`);
      throw new CliExit(EXIT.failure, `run ${id} is already ${result.current}; a run that has ended cannot be cancelled`);
    });
  });

  selectionOptions(
    runs
      .command('retry [runId]')
      .description(
        'retry a failed statechart run from its last committed state (or --from-state), as a new revision of the same run and task; or every failed run a selection chooses (--dry-run lists where each would start, or why it is refused)',
      )
      .option('--from-state <state>', 'start from this state the run passed through (its latest visit) instead of the last one'),
  ).action(async (runId: string | undefined, options: SelectionOptions & { fromState?: string }) => {
    const selection = selectionOf(runId, options, 'retry');
    const config = loadConfigOrExit(globals());
    await withCommandContext(config, async ({ pool, sealer, queues, logger }) => {
      // The command prints what it did; the log says only what went wrong (the run's events keep the audit entry).
      const deps: RecoveryDeps = { pool, sealer, queues, logger: logger.child({}, { level: 'warn' }), definitionOf: configuredDefinitions(config) };
      if (selection) {
        printBulk(await bulkRetry(deps, selection, { dryRun: options.dryRun === true, operator: cliOperator(), ...(options.fromState ? { fromState: options.fromState } : {}) }), options.json);
        return;
      }
      const id = requireRunId(runId!);
      const result = await retryRun(deps, id, cliOperator(), options.fromState);
      if (result.ok) {
        if (options.json) process.stdout.write(`${JSON.stringify({ id, retried: true, state: result.state, revision: result.run.revision })}\n`);
        else process.stdout.write(`run ${id} retried from state ${result.state} (revision ${result.run.revision}); it is queued again\n`);
        return;
      }
      throw new CliExit(result.reason === 'not_found' ? EXIT.notFound : EXIT.failure, result.message);
    });
  });
}
