import type { Command } from 'commander';
import { encodeMasterKey, generateMasterKey } from '../sealing/master-key.js';
import { rotateMasterKey } from '../sealing/master-key-store.js';
import { CliExit, EXIT, loadConfigOrExit, withDatabase, type GlobalOptions } from './cli-support.js';

export function registerKeysCommands(program: Command, globals: () => GlobalOptions): void {
  const keys = program.command('keys').description('manage the master keys that seal stored values');

  keys
    .command('rotate')
    .description('add a new master key and rewrap every sealed value under it (resumable)')
    .option('--batch-size <n>', 'values rewrapped per transaction', '500')
    .action(async (options: { batchSize: string }) => {
      const batchSize = Number(options.batchSize);
      if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) throw new CliExit(EXIT.usage, '--batch-size must be a whole number from 1 to 100000');
      const config = loadConfigOrExit(globals());
      await withDatabase(config, async (pool) => {
        const result = await rotateMasterKey(pool, config.security.masterKeyFile, {
          batchSize,
          onProgress: (progress) => process.stderr.write(`${progress.table}.${progress.column}: ${progress.rewrapped} rewrapped\n`),
        });
        if (!result.ok) throw new CliExit(EXIT.masterKey, result.message);
        process.stdout.write(
          `${result.resumed ? 'resumed an unfinished rotation; ' : ''}active key ${result.activeKeyId}; ${result.rewrapped} value(s) rewrapped; retired ${result.retired.join(', ') || 'none'}\n`,
        );
        process.stdout.write('restart running Keel processes so they seal with the new key\n');
      });
    });

  keys
    .command('generate')
    .description('print a new random master key (base64) for KEEL_MASTER_KEY')
    .action(() => {
      process.stdout.write(`${encodeMasterKey(generateMasterKey())}\n`);
    });
}
