import type { Command } from 'commander';
import { clientNameProblem, createClient, listClients, revokeClient, type ClientInfo } from '../auth/client-repository.js';
import { formatTokenHint } from '../auth/client-token.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';

function clientJson(client: ClientInfo): Record<string, unknown> {
  return {
    id: client.id,
    name: client.name,
    token: formatTokenHint(client.tokenHint),
    createdAt: formatTime(client.createdAt),
    lastUsedAt: client.lastUsedAt === null ? null : formatTime(client.lastUsedAt),
    revokedAt: client.revokedAt === null ? null : formatTime(client.revokedAt),
  };
}

export function registerClientsCommands(program: Command, globals: () => GlobalOptions): void {
  const clients = program.command('clients').description('manage the clients that may call the A2A endpoints (bearer tokens)');

  clients
    .command('add <name>')
    .description('create a client and print its token on stdout, once (TOKEN=$(keel clients add ci))')
    .action(async (name: string) => {
      const problem = clientNameProblem(name);
      if (problem !== null) throw new CliExit(EXIT.usage, `cannot add client "${name}": ${problem}`);
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const created = await createClient(pool, name);
        if (!created.ok) {
          if (created.reason === 'name_taken') {
            throw new CliExit(EXIT.failure, `a client named "${name}" exists already; revoke it first (keel clients revoke ${name}) or choose another name`);
          }
          throw new CliExit(EXIT.usage, `cannot add client "${name}": ${created.message}`);
        }
        // Only the token on stdout, so that TOKEN=$(keel clients add ci) works.
        process.stdout.write(`${created.token}\n`);
        process.stderr.write(
          `keel: created client "${name}" (${created.client.id}); its token is shown once and cannot be recovered` +
            (config.auth.mode === 'none' ? ' (note: auth.mode is "none", so tokens are not checked)' : '') +
            '\n',
        );
      });
    });

  clients
    .command('list')
    .description('list clients (never their tokens)')
    .option('--all', 'include revoked clients')
    .option('--json', 'print JSON lines instead of a table')
    .action(async (options: { all?: boolean; json?: boolean }) => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const rows = await listClients(pool, { includeRevoked: options.all === true });
        if (options.json) {
          for (const row of rows) process.stdout.write(`${JSON.stringify(clientJson(row))}\n`);
          return;
        }
        process.stdout.write(
          `${printTable(
            rows.map((row) => ({
              name: row.name,
              id: row.id,
              token: formatTokenHint(row.tokenHint),
              created: formatTime(row.createdAt),
              'last used': formatTime(row.lastUsedAt),
              revoked: formatTime(row.revokedAt),
            })),
            ['name', 'id', 'token', 'created', 'last used', 'revoked'],
          )}\n`,
        );
      });
    });

  clients
    .command('revoke <nameOrId>')
    .description('revoke a client by name or id; its token stops working within seconds')
    .action(async (nameOrId: string) => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const result = await revokeClient(pool, nameOrId);
        if (result.ok) {
          process.stdout.write(`client "${result.client.name}" (${result.client.id}) revoked\n`);
          return;
        }
        if (result.reason === 'not_found') throw new CliExit(EXIT.notFound, `no client named or with id "${nameOrId}"`);
        throw new CliExit(EXIT.failure, `client "${nameOrId}" is revoked already`);
      });
    });
}
