import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { sql } from 'slonik';
import { z } from 'zod';
import { remoteCredentialContext, listRemoteCardStatus } from '../remote/remote-agents.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';
import { withCommandContext } from './command-context.js';

const depRow = z.object({
  id: z.string(),
  run_id: z.string(),
  remote_agent: z.string(),
  state: z.string(),
  remote_task_id: z.string().nullable(),
  outcome: z.string().nullable(),
  polls: z.number(),
  created_at: z.number(),
  resolved_at: z.number().nullable(),
  registrations: z.number(),
  callbacks: z.number(),
  unprocessed: z.number(),
});

const DEP_SELECT = sql.fragment`
  SELECT d.id, d.run_id, d.remote_agent, d.state, d.remote_task_id, d.outcome, d.polls, d.created_at, d.resolved_at,
    (SELECT count(*)::int FROM inbox_registrations g WHERE g.dependency_id = d.id) AS registrations,
    (SELECT count(*)::int FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id WHERE g.dependency_id = d.id) AS callbacks,
    (SELECT count(*)::int FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id WHERE g.dependency_id = d.id AND c.processed_at IS NULL) AS unprocessed
  FROM dependencies d`;

export function registerRemoteCommands(program: Command, globals: () => GlobalOptions): void {
  const remote = program.command('remote').description('remote A2A agents this installation calls');
  remote
    .command('list')
    .description('configured remote agents and the status of their cached cards')
    .action(async () => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const status = new Map((await listRemoteCardStatus(pool)).map((row) => [row.remote_agent, row]));
        process.stdout.write(
          `${printTable(
            config.remoteAgents.map((agent) => {
              const card = status.get(agent.id);
              return {
                id: agent.id,
                card: agent.cardUrl,
                credential: agent.credentialEnv ? `env ${agent.credentialEnv}` : agent.credentialSealed ? 'sealed' : 'none',
                status: !card ? 'not fetched yet' : card.error ? `error: ${card.error}` : `ok (${card.name ?? 'unnamed'})`,
                fetched: card?.fetched_at ? formatTime(card.fetched_at) : '-',
              };
            }),
            ['id', 'card', 'credential', 'status', 'fetched'],
          )}\n`,
        );
      });
    });
  remote
    .command('seal <remoteId>')
    .description("seal a remote agent's credential (read from stdin) for remoteAgents[].credentialSealed")
    .action(async (remoteId: string) => {
      const config = loadConfigOrExit(globals());
      if (!config.remoteAgents.some((agent) => agent.id === remoteId)) throw new CliExit(EXIT.usage, `no remote agent ${remoteId} in remoteAgents`);
      const credential = readFileSync(0, 'utf8').trim();
      if (!credential) throw new CliExit(EXIT.usage, 'pipe the credential on stdin');
      await withCommandContext(config, async ({ sealer }) => {
        process.stdout.write(`${sealer.sealJson(remoteCredentialContext(remoteId), credential).toString('base64')}\n`);
      });
    });

  const deps = program.command('deps').description('dependencies of runs on remote agent tasks');
  deps
    .command('list')
    .description('open and resolved dependencies')
    .option('--state <state>', 'pending, waiting, resolved or failed')
    .action(async (options: { state?: string }) => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const rows = await pool.any(sql.type(depRow)`${DEP_SELECT}
          ${options.state ? sql.fragment`WHERE d.state = ${options.state}` : sql.fragment``} ORDER BY d.created_at DESC LIMIT 200`);
        process.stdout.write(
          `${printTable(
            rows.map((row) => ({
              id: row.id,
              run: row.run_id,
              remote: row.remote_agent,
              state: row.state,
              outcome: row.outcome ?? '',
              callbacks: `${row.callbacks} (${row.unprocessed} unprocessed)`,
              created: formatTime(row.created_at),
            })),
            ['id', 'run', 'remote', 'state', 'outcome', 'callbacks', 'created'],
          )}\n`,
        );
      });
    });
  deps
    .command('show <dependencyId>')
    .description('one dependency: its registration and the callbacks received')
    .action(async (id: string) => {
      if (!/^[0-9a-f-]{36}$/i.test(id)) throw new CliExit(EXIT.usage, `"${id}" is not a dependency id`);
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const row = await pool.maybeOne(sql.type(depRow)`${DEP_SELECT} WHERE d.id = ${id}`);
        if (!row) throw new CliExit(EXIT.notFound, `dependency ${id} not found`);
        const callbacks = await pool.any(sql.type(z.object({ id: z.string(), kind: z.string(), received_at: z.number(), processed_at: z.number().nullable() }))`
          SELECT c.id, c.kind, c.received_at, c.processed_at FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id
          WHERE g.dependency_id = ${id} ORDER BY c.received_at`);
        const lines = Object.entries(row).map(([key, value]) => `${key.padEnd(15)} ${value === null ? '-' : key.endsWith('_at') ? formatTime(Number(value)) : value}`);
        lines.push('', 'callbacks received (the body decides nothing; each is reconciled by GetTask)');
        for (const callback of callbacks) lines.push(`  ${formatTime(callback.received_at)}  ${callback.kind.padEnd(14)}  ${callback.processed_at ? `processed ${formatTime(callback.processed_at)}` : 'unprocessed'}`);
        process.stdout.write(`${lines.join('\n')}\n`);
      });
    });
}
