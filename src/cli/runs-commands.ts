import type { Command } from 'commander';
import { RUN_STATUSES, type RunStatus } from '../../machines/run.machine.js';
import { cancelRun, getRun, listRuns } from '../runs/run-repository.js';
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
  | { kind: 'approval'; digest: string; calls?: Array<{ id: string; name: string; arguments: unknown }>; guardrail?: { name: string; stage: string; reason: string } }
  | { kind: 'input'; tool: string; prompt: string; schema: unknown }
  | { kind: 'unreadable'; detail: string };

function pendingFromState(state: LoopState): PendingView | null {
  const approval = state.pendingApproval;
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
      for (const call of pending.calls ?? []) lines.push(`  call ${call.id}: ${call.name} ${JSON.stringify(call.arguments)}`);
      if (pending.guardrail) lines.push(`  guardrail ${pending.guardrail.name} on the ${pending.guardrail.stage}: ${pending.guardrail.reason}`);
      lines.push(`  decide with: keel runs approve|deny <runId> --turn ${pending.digest}`);
      return lines;
    }
  }
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
          return pendingFromState(read.view.state);
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

  runs
    .command('cancel <runId>')
    .description('cancel a run that has not ended yet')
    .action(async (runId: string) => {
      const id = requireRunId(runId);
      const config = loadConfigOrExit(globals());
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
}
