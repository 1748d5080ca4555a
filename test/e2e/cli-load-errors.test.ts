import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { tempDir } from '../support/test-keel.js';

// A machine module with a typo, and tool modules with a syntax error, a throw while imported, an
// import of an export that is not there and one of a package that is not installed: `keel doctor`, `keel start` and `keel machines <agent>` name each file:line:column,
// the reason and the lines around it with a caret, every module at once. No database is needed:
// each stops at the config's modules, before touching one.

const dir = tempDir('keel-load-errors-');
const file = (name: string) => join(dir, name);

const TYPO = [
  "import { setup } from 'xstate';",
  '',
  'export const machine = setup({}).createMachine({',
  "  id: 'typo',",
  "  initial: 'a',",
  "  states: { a: { type: 'final' }, , },",
  '});',
  '',
].join('\n');

const SYNTAX = [
  'export const tools = [',
  '  {',
  "    name: 'lookup',",
  "    description: 'looks up',",
  '    parameters: {},',
  "    effect: 'read_only',",
  '    needsApproval: false,',
  "    run: async () => ({ kind: 'ok', content: 1 ),",
  '  },',
  '];',
  '',
].join('\n');

const THROWS = [
  'function required(name: string): string {',
  '  const value = process.env[name];',
  '  if (value === undefined) throw new Error(`${name} is not set`);',
  '  return value;',
  '}',
  '',
  "export const baseUrl = required('KEEL_TEST_NEVER_SET_URL');",
  'export const tools = [];',
  '',
].join('\n');

const HELPER = "export const lookup = () => 42;\n";
const MISSING_EXPORT = ["import { lookUp } from './helper.js';", '', 'export const tools = [lookUp];', ''].join('\n');
const MISSING_PACKAGE = ["import { client } from 'keel-test-no-such-package';", '', 'export const tools = [client];', ''].join('\n');

const env = () =>
  cleanEnv({
    KEEL_LOG_LEVEL: 'error',
    KEEL_PROVIDERS: JSON.stringify({ echo: { type: 'echo' } }),
    KEEL_TOOL_MODULES: JSON.stringify([file('syntax.tools.ts'), file('throws.tools.ts'), file('export.tools.ts'), file('package.tools.ts')]),
    KEEL_AGENTS: JSON.stringify([
      { id: 'echo', name: 'Echo', provider: 'echo' },
      { id: 'typo', name: 'Typo', machine: file('typo.machine.ts') },
    ]),
  });
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env: env() });

beforeAll(() => {
  // A team's repository is an ES module package (the modules are loaded as ES modules).
  writeFileSync(file('package.json'), '{ "type": "module" }\n');
  writeFileSync(file('typo.machine.ts'), TYPO);
  writeFileSync(file('syntax.tools.ts'), SYNTAX);
  writeFileSync(file('throws.tools.ts'), THROWS);
  writeFileSync(file('helper.ts'), HELPER);
  writeFileSync(file('export.tools.ts'), MISSING_EXPORT);
  writeFileSync(file('package.tools.ts'), MISSING_PACKAGE);
});

/** What a report must hold: the place and the reason, then the frame's line in error with a caret under the column. */
type Report = { head: string; source: string; column: number };
const report = (name: string, text: string, line: number, column: number, reason: string): Report => ({
  head: `${file(name)}:${line}:${column}: ${reason}`,
  source: `${line} | ${text.split('\n')[line - 1]}`,
  column,
});
const machineReport = () => report('typo.machine.ts', TYPO, 6, 35, 'Expected identifier but found ","');
const syntaxReport = () => report('syntax.tools.ts', SYNTAX, 8, 48, 'Expected "}" but found ")"');
const throwsReport = () => report('throws.tools.ts', THROWS, 3, 34, 'Error: KEEL_TEST_NEVER_SET_URL is not set');
const exportReport = () => report('export.tools.ts', MISSING_EXPORT, 1, 10, "SyntaxError: The requested module './helper.js' does not provide an export named 'lookUp'");
const packageReport = () => report('package.tools.ts', MISSING_PACKAGE, 1, 24, `Error: Cannot find package 'keel-test-no-such-package' imported from ${file('package.tools.ts')}`);
const allReports = () => [machineReport(), syntaxReport(), throwsReport(), exportReport(), packageReport()];

function expectReports(output: string, reports: Report[]) {
  const lines = output.split('\n');
  for (const expected of reports) {
    const at = lines.findIndex((line) => line.trim() === expected.head);
    expect(at, `${expected.head} in:\n${output}`).toBeGreaterThanOrEqual(0);
    // The frame follows its place: the line in error marked among the two before and after it,
    // and under it the caret, in the column.
    const marked = lines.slice(at + 1, at + 5).findIndex((line) => /^\s*>/.test(line) && line.trim().replace(/^>\s+/, '') === expected.source);
    expect(marked, `the frame of ${expected.head}:\n${output}`).toBeGreaterThanOrEqual(0);
    const markedLine = lines[at + 1 + marked]!;
    const caret = lines[at + 2 + marked]!;
    expect(caret.trim()).toMatch(/^\| +\^$/);
    expect(caret.indexOf('|')).toBe(markedLine.indexOf('|'));
    expect(caret.indexOf('^') - caret.indexOf('|') - 2, 'the caret stands under the column').toBe(expected.column - 1);
  }
}

describe('a module that cannot be loaded', () => {
  it('keel doctor names every module: file:line:column, the reason and a code frame', async () => {
    const result = await keelCli('doctor');
    expect(result.code).toBe(2);
    expect(result.stdout).toContain('FAIL  config     5 problem(s):');
    expect(result.stdout).toContain(`- toolModules: ${file('syntax.tools.ts')}: cannot be loaded:`);
    expect(result.stdout).toContain(`- toolModules: ${file('throws.tools.ts')}: cannot be loaded:`);
    expect(result.stdout).toContain(`- agents.1 (typo): machine ${file('typo.machine.ts')} cannot be loaded:`);
    expectReports(result.stdout, allReports());
  });

  it('keel start stops with the same reports, all of them', async () => {
    const result = await keelCli('start');
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('start failed (agents): 5 problem(s):');
    expectReports(result.stderr, allReports());
  });

  it('keel machines <agent> names the machine\'s error the same way', async () => {
    const result = await keelCli('machines', 'typo');
    expect(result.code).toBe(2);
    expect(result.stdout).toBe('');
    expect(result.stderr).toContain(`the machine of agent typo cannot be used:\n  - agents.1 (typo): machine ${file('typo.machine.ts')} cannot be loaded:`);
    expectReports(result.stderr, [machineReport()]);
  });
});
