import type { Command } from 'commander';
import { sql } from 'slonik';
import { z } from 'zod';
import { findClient } from '../auth/client-repository.js';
import { purgeExpiredRuns, pruneContextHistory } from '../tasks/retention.js';
import { CliExit, EXIT, loadConfigOrExit, withDatabase, type GlobalOptions } from './cli-support.js';
import { withCommandContext } from './command-context.js';

export function registerRetentionCommands(program: Command, globals: () => GlobalOptions): void {
  program
    .command('purge')
    .description('remove runs older than privacy.retention.agentRun days, with their tasks, history, journal and deliveries')
    .option('--older-than-days <n>', 'override the retention for this purge (days, at least 1)')
    .action(async (options: { olderThanDays?: string }) => {
      const config = loadConfigOrExit(globals());
      const days = options.olderThanDays === undefined ? config.privacy.retention.agentRun : Number(options.olderThanDays);
      if (!Number.isInteger(days) || days < 1) throw new CliExit(EXIT.usage, '--older-than-days must be a whole number of days, at least 1');
      await withDatabase(config, async (pool) => {
        const report = await purgeExpiredRuns(pool, days);
        process.stdout.write(`purged ${report.runs} run(s) older than ${days} day(s) and ${report.contexts} empty context(s)\n`);
      });
    });

  const contexts = program.command('contexts').description('manage A2A contexts');
  contexts
    .command('prune <contextId>')
    .description("trim a context's history to its latest messages; every task keeps its result")
    .requiredOption('--keep-latest <n>', 'how many of the latest messages to keep (0 or more)')
    .option('--client <name>', 'the client owning the context (needed when several clients use the same context id)')
    .action(async (contextId: string, options: { keepLatest: string; client?: string }) => {
      const keep = Number(options.keepLatest);
      if (!Number.isInteger(keep) || keep < 0) throw new CliExit(EXIT.usage, '--keep-latest must be a whole number, 0 or more');
      const config = loadConfigOrExit(globals());
      await withCommandContext(config, async ({ pool, sealer }) => {
        let owner: string;
        if (options.client) {
          const client = await findClient(pool, options.client);
          if (!client) throw new CliExit(EXIT.notFound, `no client named or with id "${options.client}"`);
          owner = client.id;
        } else {
          const owners = await pool.anyFirst(sql.type(z.object({ owner: z.string() }))`SELECT owner FROM contexts WHERE id = ${contextId}`);
          if (owners.length === 0) throw new CliExit(EXIT.notFound, `no context ${contextId}`);
          if (owners.length > 1) throw new CliExit(EXIT.usage, `context id ${contextId} is used by ${owners.length} clients; name one with --client`);
          owner = owners[0]!;
        }
        const result = await pruneContextHistory(pool, sealer, owner, contextId, keep);
        if (!result.ok) throw new CliExit(EXIT.notFound, `no context ${contextId} for that client`);
        process.stdout.write(`context ${contextId}: kept ${result.kept} message(s), removed ${result.removed}, across ${result.tasks} task(s); results untouched\n`);
      });
    });
}
