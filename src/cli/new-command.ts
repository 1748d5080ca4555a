import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import type { Command } from 'commander';
import { CliExit, EXIT, type GlobalOptions } from './cli-support.js';
import { AGENT_ID } from '../config/config-schema.js';

// `keel new agent <name>`: scaffolds a statechart agent (docs/statechart-agents.md): a small machine
// that uses Keel's steps, and a vitest test that runs it in memory with stand-ins for the steps. It
// writes only new files and prints the config lines that serve the agent; it needs no config,
// database or running Keel.


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

export function agentMachineSource(name: string): string {
  return `import { assign, setup } from 'xstate';
import { askInput, callModel, type CallModelOutput, type StatechartOutput } from 'keel/statechart';

// The ${name} agent, written as a statechart (Keel: docs/statechart-agents.md). Keel runs each run of
// it durably: every transition is committed, so a crash resumes from the last state reached. Work
// happens only in Keel's steps, invoked by the names given in setup({ actors }): callModel (the
// agent's provider), callTool (one of its tools), askInput (the client answers), askApproval (an
// operator decides), callRemoteAgent, or a step of your own made with defineStep(). Entering a state
// with meta.status shows that message to the client; the final state's output is the answer.

/** The model answers this when it needs more detail before it can answer. */
export const NEED_DETAIL = 'NEED_DETAIL';

type Context = {
  /** What the client added when asked for detail. */
  detail: string | null;
  answer: string | null;
};

/** The model asked for more detail, and has not had it yet (a named guard: the drawing shows its name). */
const needsDetail = ({ context, event }: { context: Context; event: { output: CallModelOutput } }) =>
  event.output.text?.trim() === NEED_DETAIL && context.detail === null;

export const machine = setup({
  types: {
    context: {} as Context,
    output: {} as StatechartOutput,
  },
  actors: { callModel, askInput },
}).createMachine({
  id: '${name}',
  initial: 'answering',
  context: { detail: null, answer: null },
  states: {
    answering: {
      meta: { status: 'Working on an answer' },
      invoke: {
        // An id of its own: a run waiting here gets its answer by it, also from a later version.
        id: 'answer',
        src: 'callModel',
        // Without a prompt the model reads the task's messages; the detail asked for comes after them.
        input: ({ context }) => ({
          system: \`Answer the user's request. If you cannot without more detail, answer exactly \${NEED_DETAIL}.\`,
          ...(context.detail === null ? {} : { prompt: \`More detail: \${context.detail}\` }),
        }),
        onDone: [
          { guard: needsDetail, target: 'askingDetail' },
          { target: 'answered', actions: assign({ answer: ({ event }) => event.output.text }) },
        ],
      },
    },
    askingDetail: {
      meta: { status: 'Waiting for more detail' },
      invoke: {
        id: 'askDetail',
        src: 'askInput',
        input: { prompt: 'Could you tell me a little more?' },
        // The reply's data part if it has one, else its text.
        onDone: {
          target: 'answering',
          actions: assign({ detail: ({ event }) => (typeof event.output === 'string' ? event.output : JSON.stringify(event.output)) }),
        },
      },
    },
    answered: { type: 'final' },
  },
  output: ({ context }) => ({ text: context.answer ?? '', data: { askedForDetail: context.detail !== null } }),
});

export default machine;
`;
}

export function agentTestSource(name: string): string {
  return `import { describe, expect, it } from 'vitest';
import { createActor, fromPromise, toPromise } from 'xstate';
import type { CallModelInput, CallModelOutput } from 'keel/statechart';
import { machine, NEED_DETAIL } from './${name}.machine.js';

// Runs the ${name} machine in memory: Keel's steps run only inside a Keel run, so the test provides
// stand-ins for them (machine.provide) and checks the path the machine takes and its output.

function run(replies: string[], detail = 'the order number is 42') {
  const calls: CallModelInput[] = [];
  const prompts: string[] = [];
  const actor = createActor(
    machine.provide({
      actors: {
        callModel: fromPromise<CallModelOutput, CallModelInput>(async ({ input }) => {
          calls.push(input);
          return { text: replies.shift() ?? null };
        }),
        askInput: fromPromise<unknown, { prompt: string }>(async ({ input }) => {
          prompts.push(input.prompt);
          return detail;
        }),
      },
    }),
  );
  const output = toPromise(actor);
  actor.start();
  return { output, calls, prompts };
}

describe('${name} machine', () => {
  it('answers with the model\\'s reply', async () => {
    const { output, calls, prompts } = run(['Here is your answer.']);
    expect(await output).toEqual({ text: 'Here is your answer.', data: { askedForDetail: false } });
    expect(calls).toHaveLength(1);
    expect(prompts).toEqual([]);
  });

  it('asks the client for detail when the model needs it, then answers', async () => {
    const { output, calls, prompts } = run([NEED_DETAIL, 'Order 42 ships tomorrow.']);
    expect(await output).toEqual({ text: 'Order 42 ships tomorrow.', data: { askedForDetail: true } });
    expect(prompts).toEqual(['Could you tell me a little more?']);
    expect(calls[1]?.prompt).toBe('More detail: the order number is 42');
  });
});
`;
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
