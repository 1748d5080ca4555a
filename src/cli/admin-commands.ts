import type { Command } from 'commander';
import { ADMIN_NAME_PATTERN, createAdminToken, listAdminTokens, revokeAdminToken, type AdminTokenInfo } from '../ui/admin-auth.js';
import { CliExit, EXIT, formatTime, loadConfigOrExit, printTable, withDatabase, type GlobalOptions } from './cli-support.js';
import { registerMachinesCommand } from './machines-command.js';

// Operator surfaces on the command line: admin tokens for the web UI (`keel admin token` prints
// only the token on stdout, so TOKEN=$(keel admin token) works), and `keel machines`.

const tokenJson = (info: AdminTokenInfo) => ({
  id: info.id,
  name: info.name,
  token: `keel_admin_…${info.tokenHint}`,
  createdAt: formatTime(info.createdAt),
  lastUsedAt: info.lastUsedAt === null ? null : formatTime(info.lastUsedAt),
  revokedAt: info.revokedAt === null ? null : formatTime(info.revokedAt),
});

export function registerAdminCommands(program: Command, globals: () => GlobalOptions): void {
  const admin = program.command('admin').description('admin tokens for the operator web UI (/ui)');

  admin
    .command('token')
    .description('create an admin token and print it on stdout, once (TOKEN=$(keel admin token))')
    .option('--name <name>', 'a label to tell tokens apart', 'admin')
    .action(async (options: { name: string }) => {
      if (!ADMIN_NAME_PATTERN.test(options.name)) throw new CliExit(EXIT.usage, 'a token name is 1 to 64 characters among letters, digits, ".", "_" and "-"');
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const created = await createAdminToken(pool, options.name);
        process.stdout.write(`${created.token}\n`);
        process.stderr.write(`keel: created admin token "${created.info.name}" (${created.info.id}); it is shown once and cannot be recovered. Log in at ${config.server.publicUrl}/ui\n`);
      });
    });

  admin
    .command('list')
    .description('list admin tokens (never the tokens themselves)')
    .option('--all', 'include revoked tokens')
    .option('--json', 'print JSON lines instead of a table')
    .action(async (options: { all?: boolean; json?: boolean }) => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const rows = await listAdminTokens(pool, options.all === true);
        if (options.json) {
          for (const row of rows) process.stdout.write(`${JSON.stringify(tokenJson(row))}\n`);
          return;
        }
        process.stdout.write(
          `${printTable(
            rows.map((row) => {
              const json = tokenJson(row);
              return { id: json.id, name: json.name, token: json.token, created: json.createdAt, 'last used': json.lastUsedAt ?? '-', revoked: json.revokedAt ?? '' };
            }),
            ['id', 'name', 'token', 'created', 'last used', 'revoked'],
          )}\n`,
        );
      });
    });

  admin
    .command('revoke <idOrName>')
    .description('revoke an admin token; its browser sessions end at once')
    .action(async (reference: string) => {
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const result = await revokeAdminToken(pool, reference);
        if (result.ok) {
          process.stdout.write(`admin token "${result.info.name}" (${result.info.id}) revoked\n`);
          return;
        }
        if (result.reason === 'ambiguous') throw new CliExit(EXIT.usage, `several live admin tokens are named "${reference}"; revoke one by its id (keel admin list)`);
        throw new CliExit(EXIT.notFound, `no live admin token ${reference}`);
      });
    });

  registerMachinesCommand(program);
}
