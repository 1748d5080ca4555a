import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import type { Command } from 'commander';
import { CliExit, EXIT, type GlobalOptions } from './cli-support.js';
import { AGENT_ID } from '../config/config-schema.js';
import { agentMachineSource, agentTestSource } from './agent-scaffold-sources.js';

// `keel new agent <name>`: scaffolds a statechart agent (docs/statechart-agents.md): a small machine
// that uses Keel's steps, and a vitest test that runs it in memory with stand-ins for the steps. It
// writes only new files and prints the config lines that serve the agent; it needs no config,
// database or running Keel. The sources it writes are in agent-scaffold-sources.ts.

export type ScaffoldAgentInput = {
  name: string;
  /** Where the files go (created if missing). */
  dir: string;
  /** The directory of the config file the agent will be added to: its `machine` path is relative to it. */
  configDir: string;
};

export type ScaffoldAgentResult =
  | { ok: true; files: string[]; configLines: string }
  | { ok: false; reason: 'invalid_name' | 'exists' | 'unwritable'; message: string };

/** "refund-desk" → "Refund desk": the agent's display name in the printed config. */
function displayName(name: string): string {
  const words = name.split(/[-_]+/).filter((word) => word !== '');
  const text = words.join(' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** A path as the config names it: relative, with forward slashes, starting with ./ or ../. */
function configPath(from: string, to: string): string {
  const path = relative(from, to).split(sep).join('/');
  return path.startsWith('../') ? path : `./${path}`;
}

/** Writes the machine and its test; refuses an invalid name or an existing file, and writes nothing then. */
export function scaffoldAgent(input: ScaffoldAgentInput): ScaffoldAgentResult {
  const { name } = input;
  // The config's agent id rule, so the name serves as the agent's id and its files' name.
  if (!AGENT_ID.test(name)) {
    return {
      ok: false,
      reason: 'invalid_name',
      message: `cannot create agent "${name}": a name is 1 to 63 lowercase letters, digits, - or _, starting with a letter or digit (it becomes the agent's id and file name)`,
    };
  }
  const dir = resolve(input.dir);
  const machineFile = join(dir, `${name}.machine.ts`);
  const testFile = join(dir, `${name}.machine.test.ts`);
  const planned: Array<[string, string]> = [
    [machineFile, agentMachineSource(name)],
    [testFile, agentTestSource(name)],
  ];
  const written: string[] = [];
  try {
    mkdirSync(dir, { recursive: true });
    for (const [file, source] of planned) {
      // 'wx' fails on an existing file, so a file is never overwritten, also by a concurrent run.
      writeFileSync(file, source, { flag: 'wx' });
      written.push(file);
    }
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const failed = planned[written.length]?.[0] ?? dir;
    // Nothing half-made stays behind: a file written before the failure is removed again.
    for (const file of written) rmSync(file, { force: true });
    if (code === 'EEXIST' && failed !== dir) {
      return { ok: false, reason: 'exists', message: `cannot create agent "${name}": ${failed} exists already; choose another name or --dir` };
    }
    return { ok: false, reason: 'unwritable', message: `cannot create agent "${name}" in ${dir}: ${(error as Error).message}` };
  }
  const configLines = [
    'agents:',
    `  - id: ${name}`,
    `    name: ${displayName(name)}`,
    `    machine: ${configPath(input.configDir, machineFile)}`,
    '    provider: <a provider under providers>   # what its callModel steps call',
    '    tools: []                                # what its callTool steps may call',
  ].join('\n');
  return { ok: true, files: [machineFile, testFile], configLines };
}

export function registerNewCommand(program: Command, globals: () => GlobalOptions): void {
  const create = program.command('new').description('scaffold a project, or an agent in one');
  create
    .command('project <dir>')
    .description('scaffold a repository that serves a statechart agent with Keel as a dependency: package.json, keel.config.yaml, the machine and its vitest test, .gitignore, README.md')
    .option('--agent <name>', "the agent's id and file name", 'assistant')
    .option('--keel <spec>', 'the keel dependency in package.json: a version, a tarball path or a git URL (default: where this Keel came from)')
    .action(async (dir: string, options: { agent: string; keel?: string }) => {
      const { defaultKeelSpec, runningKeel, scaffoldProject } = await import('./new-project.js');
      const keel = runningKeel();
      const keelSpec = options.keel ?? defaultKeelSpec(keel);
      const result = scaffoldProject({ dir, agent: options.agent, keelSpec, keel: keel.manifest });
      if (!result.ok) throw new CliExit(result.reason === 'unwritable' ? EXIT.failure : EXIT.usage, result.message);
      const shown = relative(process.cwd(), result.dir) || '.';
      process.stdout.write(
        [
          ...result.files.map((file) => `created ${relative(process.cwd(), file) || file}`),
          '',
          `keel: ${keelSpec}`,
          '',
          'Next:',
          ...(shown === '.' ? [] : [`  cd ${shown}`]),
          '  npm install',
          '  npm test       # the agent machine\'s test',
          `  npm start      # serves the agent at http://127.0.0.1:8080/a2a/${options.agent} (README.md: how to call it)`,
          '',
        ].join('\n'),
      );
    });
  create
    .command('agent <name>')
    .description('scaffold a statechart agent: <dir>/<name>.machine.ts and its vitest test, and print the config lines that serve it')
    .option('--dir <dir>', 'the directory for the files (created if missing)', 'agents')
    .action((name: string, options: { dir: string }) => {
      const configFile = globals().config ?? process.env.KEEL_CONFIG ?? 'keel.config.yaml';
      const result = scaffoldAgent({ name, dir: options.dir, configDir: dirname(resolve(configFile)) });
      if (!result.ok) throw new CliExit(result.reason === 'invalid_name' ? EXIT.usage : EXIT.failure, result.message);
      const shown = (file: string) => relative(process.cwd(), file) || file;
      const testFile = shown(result.files[1]!);
      process.stdout.write(
        [
          ...result.files.map((file) => `created ${shown(file)}`),
          '',
          `Add the agent to ${relative(process.cwd(), resolve(configFile)) || configFile} (its machine path is relative to that file):`,
          '',
          result.configLines,
          '',
          `Test it:  npx vitest run ${testFile}`,
          'Then start Keel and send it a message (docs/statechart-agents.md).',
          '',
        ].join('\n'),
      );
    });
}
