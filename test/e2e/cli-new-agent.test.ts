import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkStatechart, loadStatechart } from '../../src/statecharts/statechart-definition.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { tempDir } from '../support/test-keel.js';

// `keel new agent <name>` as a user runs it in a project of their own: a temp directory with Keel
// installed (node_modules/keel, as npm would link it) and no config or database. The scaffolded
// machine loads as Keel loads an agent's machine, and its scaffolded test passes under vitest.

let project: string;
const env = cleanEnv({ KEEL_LOG_LEVEL: 'warn' });
const keelCli = (...args: string[]) => runKeel(args, { cwd: project, env });

/** Runs vitest in the project, as `npx vitest run` there would. */
function vitestIn(dir: string): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, [join(REPO_ROOT, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '--root', dir], { cwd: dir, env: { ...env, NO_COLOR: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, output })));
}

beforeAll(() => {
  project = tempDir('keel-new-agent-');
  writeFileSync(join(project, 'package.json'), `${JSON.stringify({ name: 'my-agents', private: true, type: 'module' }, null, 2)}\n`);
  mkdirSync(join(project, 'node_modules'));
  symlinkSync(REPO_ROOT, join(project, 'node_modules', 'keel'), 'dir');
  for (const dependency of ['xstate', 'vitest']) symlinkSync(join(REPO_ROOT, 'node_modules', dependency), join(project, 'node_modules', dependency), 'dir');
});
afterAll(() => {
  if (project) rmSync(project, { recursive: true, force: true });
});

describe('keel new agent', () => {
  it('scaffolds agents/<name>.machine.ts and its test, and prints the config lines', async () => {
    const created = await keelCli('new', 'agent', 'support-desk');
    expect(created.stderr).toBe('');
    expect(created.code).toBe(0);
    expect(created.stdout).toBe(
      [
        'created agents/support-desk.machine.ts',
        'created agents/support-desk.machine.test.ts',
        '',
        'Add the agent to keel.config.yaml (its machine path is relative to that file):',
        '',
        'agents:',
        '  - id: support-desk',
        '    name: Support desk',
        '    machine: ./agents/support-desk.machine.ts',
        '    provider: <a provider under providers>   # what its callModel steps call',
        '    tools: []                                # what its callTool steps may call',
        '',
        'Test it:  npx vitest run agents/support-desk.machine.test.ts',
        'Then start Keel and send it a message (docs/statechart-agents.md).',
        '',
      ].join('\n'),
    );
    const source = readFileSync(join(project, 'agents', 'support-desk.machine.ts'), 'utf8');
    expect(source).toContain("from 'keel/statechart'");
    expect(source).toContain("id: 'support-desk'");
  });

  it('the scaffolded machine loads as an agent machine and passes checkStatechart', async () => {
    const loaded = await loadStatechart('./agents/support-desk.machine.ts', project, 'agents.0 (support-desk)');
    if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
    expect([...loaded.definition.steps.keys()].sort()).toEqual(['askInput', 'callModel']);
    expect(loaded.definition.hash).toMatch(/^[0-9a-f]{16}$/);
    expect(checkStatechart(loaded.definition.machine, 'support-desk')).toMatchObject({ ok: true });
    expect(loaded.definition.machine.root.states.answering?.meta).toEqual({ status: 'Working on an answer' });
  });

  it('the scaffolded test passes under vitest', async () => {
    const run = await vitestIn(project);
    expect(run.output).toMatch(/Tests\s+2 passed \(2\)/);
    expect(run.code).toBe(0);
  });

  it('--dir chooses the directory, and the machine path is relative to --config', async () => {
    const created = await keelCli('--config', 'config/keel.config.yaml', 'new', 'agent', 'triage', '--dir', 'src/bots');
    expect(created.code).toBe(0);
    expect(existsSync(join(project, 'src', 'bots', 'triage.machine.ts'))).toBe(true);
    expect(existsSync(join(project, 'src', 'bots', 'triage.machine.test.ts'))).toBe(true);
    expect(created.stdout).toContain('Add the agent to config/keel.config.yaml (its machine path is relative to that file):');
    expect(created.stdout).toContain('    machine: ../src/bots/triage.machine.ts\n');
  });

  it('refuses an existing file, writes nothing and leaves the file as it was', async () => {
    const machineFile = join(project, 'agents', 'support-desk.machine.ts');
    writeFileSync(machineFile, '// mine\n');
    const again = await keelCli('new', 'agent', 'support-desk');
    expect(again.code).toBe(1);
    expect(again.stdout).toBe('');
    expect(again.stderr).toBe(`keel: cannot create agent "support-desk": ${machineFile} exists already; choose another name or --dir\n`);
    expect(readFileSync(machineFile, 'utf8')).toBe('// mine\n');

    // Only the test file exists: the machine is not left behind alone.
    writeFileSync(join(project, 'agents', 'billing.machine.test.ts'), '// mine\n');
    const half = await keelCli('new', 'agent', 'billing');
    expect(half.code).toBe(1);
    expect(half.stderr).toBe(`keel: cannot create agent "billing": ${join(project, 'agents', 'billing.machine.test.ts')} exists already; choose another name or --dir\n`);
    expect(existsSync(join(project, 'agents', 'billing.machine.ts'))).toBe(false);
    expect(readFileSync(join(project, 'agents', 'billing.machine.test.ts'), 'utf8')).toBe('// mine\n');
  });

  it('refuses an invalid name with a usage error and writes nothing', async () => {
    for (const bad of ['Support', 'has space', '../escape', 'a'.repeat(64)]) {
      const refused = await keelCli('new', 'agent', bad);
      expect(refused.code, bad).toBe(64);
      expect(refused.stdout).toBe('');
      expect(refused.stderr).toBe(
        `keel: cannot create agent "${bad}": a name is 1 to 63 lowercase letters, digits, - or _, starting with a letter or digit (it becomes the agent's id and file name)\n`,
      );
    }
    expect(existsSync(join(project, 'escape.machine.ts'))).toBe(false);
    const missing = await keelCli('new', 'agent');
    expect(missing.code).toBe(64);
    expect(missing.stderr).toMatch(/missing required argument 'name'/);
    const unknown = await keelCli('new', 'workflow', 'x');
    expect(unknown.code).toBe(64);
    expect(unknown.stderr).toMatch(/unknown command 'workflow'/);
  });
});
