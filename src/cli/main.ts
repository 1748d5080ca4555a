import { Command, CommanderError } from 'commander';
import { registerAdminCommands } from './admin-commands.js';
import { registerCardsCommands } from './cards-commands.js';
import { CliExit, EXIT, type GlobalOptions } from './cli-support.js';
import { registerClientsCommands } from './clients-commands.js';
import { registerDoctorCommand } from './doctor-command.js';
import { registerKeysCommands } from './keys-commands.js';
import { registerMigrateCommand } from './migrate-command.js';
import { registerNewCommand } from './new-command.js';
import { registerPushCommands } from './push-commands.js';
import { registerRemoteCommands } from './remote-commands.js';
import { registerRetentionCommands } from './retention-commands.js';
import { registerRunsCommands } from './runs-commands.js';
import { registerStartCommand } from './start-command.js';

export function buildProgram(): Command {
  const program = new Command('keel')
    .description('Keel: a durable Agent2Agent (A2A 1.0) runtime')
    .option('-c, --config <path>', 'config file (default: $KEEL_CONFIG, else ./keel.config.yaml if present)')
    .showHelpAfterError()
    .exitOverride();
  const globals = () => program.opts<GlobalOptions>();
  registerStartCommand(program, globals);
  registerMigrateCommand(program, globals);
  registerDoctorCommand(program, globals);
  registerRunsCommands(program, globals);
  registerRetentionCommands(program, globals);
  registerPushCommands(program, globals);
  registerRemoteCommands(program, globals);
  registerCardsCommands(program, globals);
  registerKeysCommands(program, globals);
  registerClientsCommands(program, globals);
  registerAdminCommands(program, globals);
  registerNewCommand(program, globals);
  program.commands.forEach((command) => command.exitOverride());
  return program;
}

export async function main(argv: readonly string[]): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync([...argv]);
  } catch (error) {
    if (error instanceof CliExit) {
      process.stderr.write(`keel: ${error.message}\n`);
      process.exitCode = error.code;
    } else if (error instanceof CommanderError) {
      process.exitCode = error.exitCode === 0 ? EXIT.ok : EXIT.usage;
    } else {
      process.stderr.write(`keel: unexpected error: ${(error as Error).stack ?? String(error)}\n`);
      process.exitCode = EXIT.failure;
    }
  }
}
