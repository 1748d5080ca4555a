import type { Command } from 'commander';
import { deliveriesOfConfig, findPushConfigs, listPushConfigSummaries, maskCredential, resumePushConfig } from '../push/push-admin.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';
import { withCommandContext } from './command-context.js';

const STATES = ['active', 'paused', 'stopped'];

export function registerPushCommands(program: Command, globals: () => GlobalOptions): void {
  const push = program.command('push').description('push notification configs and their deliveries');

  push
    .command('list')
    .description('push configs with their delivery counts (credentials masked)')
    .option('--state <state>', `only configs in this state (${STATES.join(', ')})`)
    .option('--json', 'print JSON lines')
    .action(async (options: { state?: string; json?: boolean }) => {
      if (options.state && !STATES.includes(options.state)) throw new CliExit(EXIT.usage, `--state must be one of ${STATES.join(', ')}`);
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const rows = await listPushConfigSummaries(pool, options.state ? { state: options.state } : {});
        if (options.json) {
          for (const row of rows) process.stdout.write(`${JSON.stringify({ taskId: row.task_id, id: row.id, url: row.url, state: row.state, reason: row.state_reason, deleted: row.deleted, authentication: maskCredential(row.auth_scheme, row.credentials_hint), pending: row.pending, delivered: row.delivered, failed: row.failed })}\n`);
          return;
        }
        process.stdout.write(
          `${printTable(
            rows.map((row) => ({
              config: `${row.task_id}/${row.id}`,
              state: row.deleted ? 'deleted' : row.state,
              reason: row.state_reason ?? '',
              url: row.url,
              auth: maskCredential(row.auth_scheme, row.credentials_hint),
              pending: String(row.pending),
              delivered: String(row.delivered),
              failed: String(row.failed),
            })),
            ['config', 'state', 'reason', 'url', 'auth', 'pending', 'delivered', 'failed'],
          )}\n`,
        );
      });
    });

  push
    .command('show <configId>')
    .description('one config: its deliveries and every attempt (configId, or taskId/configId)')
    .option('--json', 'print JSON')
    .action(async (reference: string, options: { json?: boolean }) => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const found = await findPushConfigs(pool, reference);
        if (found.length === 0) throw new CliExit(EXIT.notFound, `no push config ${reference}`);
        if (found.length > 1) throw new CliExit(EXIT.usage, `${found.length} tasks have a push config ${reference}; name it as <taskId>/<configId>`);
        const summary = found[0]!;
        const { deliveries, attempts } = await deliveriesOfConfig(pool, summary.task_id, summary.id);
        if (options.json) {
          process.stdout.write(`${JSON.stringify({ ...summary, authentication: maskCredential(summary.auth_scheme, summary.credentials_hint), credentials_hint: undefined, deliveries, attempts }, null, 2)}\n`);
          return;
        }
        const lines = [
          `config    ${summary.task_id}/${summary.id}`,
          `url       ${summary.url}`,
          `state     ${summary.deleted ? 'deleted' : summary.state}${summary.state_reason ? ` (${summary.state_reason})` : ''}`,
          `auth      ${maskCredential(summary.auth_scheme, summary.credentials_hint)}`,
          '',
          'deliveries (event, state, attempts, last outcome)',
        ];
        for (const delivery of deliveries) {
          lines.push(`  #${String(delivery.event_sequence).padEnd(4)} ${delivery.state.padEnd(10)} ${String(delivery.attempts).padStart(2)}  ${delivery.last_outcome ?? ''}  [${delivery.id}]`);
          for (const attempt of attempts.filter((candidate) => candidate.delivery_id === delivery.id)) {
            lines.push(`      attempt ${attempt.attempt}  ${formatTime(attempt.started_at)}  ${attempt.status_code ?? attempt.error_class ?? '-'}  ${attempt.duration_ms} ms  ${attempt.outcome}`);
          }
        }
        process.stdout.write(`${lines.join('\n')}\n`);
      });
    });

  push
    .command('resume <configId>')
    .description('resume a config paused after "authentication failed"; its deliveries go out in order')
    .action(async (reference: string) => {
      const config = loadConfigOrExit(globals());
      await withCommandContext(config, async (context) => {
        const found = await findPushConfigs(context.pool, reference);
        if (found.length === 0) throw new CliExit(EXIT.notFound, `no push config ${reference}`);
        if (found.length > 1) throw new CliExit(EXIT.usage, `${found.length} tasks have a push config ${reference}; name it as <taskId>/<configId>`);
        const result = await resumePushConfig(context, found[0]!.task_id, found[0]!.id);
        if (!result.ok) {
          throw new CliExit(EXIT.failure, result.reason === 'not_found' ? `push config ${reference} was deleted` : `push config ${reference} is ${result.state}, not paused`);
        }
        process.stdout.write(`push config ${reference} resumed; ${found[0]!.pending} pending delivery(ies) go out in order\n`);
      });
    });
}
