import type { Command } from 'commander';
import { RUN_STATUSES, type RunStatus } from '../../machines/run.machine.js';
import { cancelRun, getRun, listRuns } from '../runs/run-repository.js';
import { listRunEvents } from '../runs/run-event-repository.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function requireRunId(id: string): string {
  if (!UUID.test(id)) throw new CliExit(EXIT.usage, `"${id}" is not a run id (expected a UUID)`);
  return id.toLowerCase();
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
      await withDatabase(config, async (pool) => {
        const run = await getRun(pool, id);
        if (!run) throw new CliExit(EXIT.notFound, `run ${id} not found`);
        const events = await listRunEvents(pool, id);
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
        };
        if (options.json) {
          process.stdout.write(`${JSON.stringify({ ...summary, events }, null, 2)}\n`);
          return;
        }
        const lines = Object.entries(summary).map(([key, value]) => `${key.padEnd(17)} ${value ?? '-'}`);
        lines.push('', `events (audit level ${run.audit_level})`);
        if (events.length === 0) lines.push('  (none recorded)');
        for (const event of events) lines.push(`  ${String(event.sequence).padStart(4)}  ${formatTime(event.created_at)}  ${event.kind}  ${JSON.stringify(event.payload)}`);
        process.stdout.write(`${lines.join('\n')}\n`);
      });
    });

  runs
    .command('cancel <runId>')
    .description('cancel a run that has not ended yet')
    .action(async (runId: string) => {
      const id = requireRunId(runId);
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool, logger) => {
        const result = await cancelRun(pool, logger, id);
        if (result.settled) {
          process.stdout.write(`run ${id} cancelled\n`);
          return;
        }
        if (result.current === null) throw new CliExit(EXIT.notFound, `run ${id} not found`);
        throw new CliExit(EXIT.failure, `run ${id} is already ${result.current}; a run that has ended cannot be cancelled`);
      });
    });
}
