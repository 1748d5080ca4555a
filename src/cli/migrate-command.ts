import type { Command } from 'commander';
import { migrate } from '../db/migrate.js';
import { openDatabase } from '../runtime/open-database.js';
import { CliExit, commandLogger, EXIT, loadConfigOrExit, type GlobalOptions } from './cli-support.js';

export function registerMigrateCommand(program: Command, globals: () => GlobalOptions): void {
  program
    .command('migrate')
    .description('apply pending database migrations (also done by `keel start`)')
    .action(async () => {
      const config = loadConfigOrExit(globals());
      const opened = await openDatabase(config, commandLogger(), 'command', { maximumPoolSize: 2, applicationName: 'keel-migrate' });
      if (!opened.ok) throw new CliExit(EXIT.database, opened.message);
      try {
        const result = await migrate(opened.database.url);
        if (!result.ok) throw new CliExit(EXIT.database, result.message);
        for (const name of result.applied) process.stdout.write(`applied ${name}\n`);
        process.stdout.write(`schema is at ${String(result.current).padStart(4, '0')} (${result.applied.length} applied now)\n`);
      } finally {
        await opened.database.close();
      }
    });
}
