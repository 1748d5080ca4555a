import { Command, CommanderError } from 'commander';
import { CliExit, EXIT, type GlobalOptions, type HarnessStartOptions } from './cli-support.js';

type Register = (program: Command, globals: () => GlobalOptions, harness: HarnessStartOptions) => void;

/**
 * Every top-level command and the module that registers it, in the order `keel --help` lists
 * them. Only the named command's module is loaded, so a command pays for its own imports and not
 * for the server's: `keel clients add` took 2.0 s to start when it loaded fastify, gRPC and every
 * worker, and takes 0.8 s.
 */
const COMMANDS: ReadonlyArray<{ names: readonly string[]; load: () => Promise<Register> }> = [
  { names: ['start'], load: async () => (await import('./start-command.js')).registerStartCommand },
  { names: ['migrate'], load: async () => (await import('./migrate-command.js')).registerMigrateCommand },
  { names: ['doctor'], load: async () => (await import('./doctor-command.js')).registerDoctorCommand },
  { names: ['runs'], load: async () => (await import('./runs-commands.js')).registerRunsCommands },
  { names: ['purge', 'contexts'], load: async () => (await import('./retention-commands.js')).registerRetentionCommands },
  { names: ['push'], load: async () => (await import('./push-commands.js')).registerPushCommands },
  { names: ['remote', 'deps'], load: async () => (await import('./remote-commands.js')).registerRemoteCommands },
  { names: ['cards'], load: async () => (await import('./cards-commands.js')).registerCardsCommands },
  { names: ['keys'], load: async () => (await import('./keys-commands.js')).registerKeysCommands },
  { names: ['clients'], load: async () => (await import('./clients-commands.js')).registerClientsCommands },
  { names: ['admin', 'machines'], load: async () => (await import('./admin-commands.js')).registerAdminCommands },
  { names: ['new'], load: async () => (await import('./new-command.js')).registerNewCommand },
];

/** The first argument that is not a global option (or its value): the command's name, if any. */
export function commandNameIn(args: readonly string[]): string | undefined {
  for (let i = 0; i < args.length; i += 1) {
    const arg = args[i]!;
    if (arg === '--') return args[i + 1];
    if (arg === '-c' || arg === '--config') i += 1;
    else if (!arg.startsWith('-')) return arg;
  }
  return undefined;
}

/**
 * The program with the command `args` names, or with every command when they name none that
 * exists (`keel --help`, a mistyped name: commander then lists them all or suggests one).
 */
export async function buildProgram(args: readonly string[] = [], harness: HarnessStartOptions = {}): Promise<Command> {
  const program = new Command('keel')
    .description('Keel: a durable Agent2Agent (A2A 1.0) runtime')
    .option('-c, --config <path>', 'config file (default: $KEEL_CONFIG, else ./keel.config.yaml if present)')
    .showHelpAfterError()
    .exitOverride();
  const globals = () => program.opts<GlobalOptions>();
  const name = commandNameIn(args);
  const named = COMMANDS.filter((command) => name !== undefined && command.names.includes(name));
  for (const command of named.length > 0 ? named : COMMANDS) (await command.load())(program, globals, harness);
  program.commands.forEach((command) => command.exitOverride());
  return program;
}

export async function main(argv: readonly string[], harness: HarnessStartOptions = {}): Promise<void> {
  const program = await buildProgram(argv.slice(2), harness);
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
