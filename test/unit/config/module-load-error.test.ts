import { describe, expect, it } from 'vitest';
import { codeFrame, formatLoadError, loadErrorReports, problemList, type LoadErrorReport, type SourceAccess } from '../../../src/config/module-load-error.js';

// The reasons a module named by the config did not load, as the shapes Node 20 with tsx's loader
// gives them (copied from real runs: docs/statechart-agents.md, "Diagnosing"), and how they print.

const MACHINE = '/repo/agents/typo.machine.ts';
const TOOLS = '/repo/tools.ts';

const files: Record<string, string> = {
  [MACHINE]: ["import { setup } from 'xstate';", "import { helper } from './helper.js';", '', 'export const machine = setup({}).createMachine({', "  states: { a: { type: 'final' }, , },", '});'].join('\n'),
  [TOOLS]: ["import { lookup } from 'lookup-client/v2';", "import { notThere } from './shared.js';", '', 'function required(name) {', '  throw new Error(`${name} is not set`);', '}', "export const url = required('URL');"].join('\n'),
};
const sources = (syntax: LoadErrorReport[] = []): SourceAccess => ({ read: (file) => files[file] ?? null, syntaxErrors: () => syntax });
const named = (name: string, message: string, stack: string) => Object.assign(new Error(message), { name, stack });

describe('loadErrorReports', () => {
  it('an esbuild error through the loader thread: every message line, placed (its 0-based column made 1-based)', () => {
    const error = named('TransformError', `Transform failed with 2 errors:\n${MACHINE}:5:34: ERROR: Expected identifier but found ","\nerror: Cannot use "import.meta" here`, '');
    expect(loadErrorReports(error, MACHINE, sources())).toEqual([
      { place: { file: MACHINE, line: 5, column: 35 }, reason: 'Expected identifier but found ","' },
      { place: null, reason: 'Cannot use "import.meta" here' },
    ]);
  });

  it('an esbuild error in the same thread: its errors[] with their locations', () => {
    const error = Object.assign(new Error('Transform failed with 1 error'), { errors: [{ text: 'Unexpected "}"', location: { file: MACHINE, line: 5, column: 2 } }] });
    expect(loadErrorReports(error, MACHINE, sources())).toEqual([{ place: { file: MACHINE, line: 5, column: 3 }, reason: 'Unexpected "}"' }]);
  });

  it('a missing export: the place Node puts at the head of the stack, the caret its column', () => {
    const stack = `${TOOLS}:2\nimport { notThere } from './shared.js';\n         ^\n\nSyntaxError: The requested module './shared.js' does not provide an export named 'notThere'\n    at ModuleJob._instantiate (node:internal/modules/esm/module_job:213:21)`;
    const error = named('SyntaxError', "The requested module './shared.js' does not provide an export named 'notThere'", stack);
    expect(loadErrorReports(error, TOOLS, sources())).toEqual([
      { place: { file: TOOLS, line: 2, column: 10 }, reason: "SyntaxError: The requested module './shared.js' does not provide an export named 'notThere'" },
    ]);
  });

  it('the line Node shows is looked for in the source when the transform moved it', () => {
    const stack = `${TOOLS}:9\nimport { notThere } from './shared.js';\n         ^\n\nSyntaxError: x`;
    expect(loadErrorReports(named('SyntaxError', 'x', stack), TOOLS, sources())[0]!.place).toEqual({ file: TOOLS, line: 2, column: 10 });
  });

  it('a file or package not found: the line of the importer that imports it', () => {
    const file = named('Error', `Cannot find module '/repo/agents/helper.js' imported from ${MACHINE}`, 'Error [ERR_MODULE_NOT_FOUND]: …');
    expect(loadErrorReports(file, MACHINE, sources())).toEqual([
      { place: { file: MACHINE, line: 2, column: 24 }, reason: `Error: Cannot find module '/repo/agents/helper.js' imported from ${MACHINE}` },
    ]);
    const pkg = named('Error', `Cannot find package 'lookup-client' imported from ${TOOLS}`, '');
    expect(loadErrorReports(pkg, TOOLS, sources())[0]!.place).toEqual({ file: TOOLS, line: 1, column: 24 });
  });

  it('a throw while the module runs: the first frame in a file of the team\'s, past node: and node_modules', () => {
    const stack = [
      'Error: URL is not set',
      '    at check (/repo/node_modules/some-lib/index.js:3:9)',
      `    at required (${TOOLS}:5:9)`,
      `    at ${TOOLS}:7:20`,
      '    at ModuleJob.run (node:internal/modules/esm/module_job:325:25)',
    ].join('\n');
    expect(loadErrorReports(named('Error', 'URL is not set', stack), TOOLS, sources())).toEqual([{ place: { file: TOOLS, line: 5, column: 9 }, reason: 'Error: URL is not set' }]);
    const fromUrl = named('TypeError', 'x is not a function', `TypeError: x is not a function\n    at file://${TOOLS}:7:20`);
    expect(loadErrorReports(fromUrl, TOOLS, sources())[0]!.place).toEqual({ file: TOOLS, line: 7, column: 20 });
  });

  it('a JavaScript syntax error Node places nowhere: the module\'s own text is checked; clean, the error is in an import', () => {
    const error = named('SyntaxError', "Unexpected token ','", "SyntaxError: Unexpected token ','\n    at compileSourceTextModule (node:internal/modules/esm/utils:346:16)");
    const found: LoadErrorReport = { place: { file: TOOLS, line: 2, column: 16 }, reason: 'Expected identifier but found ","' };
    expect(loadErrorReports(error, TOOLS, sources([found]))).toEqual([found]);
    expect(loadErrorReports(error, TOOLS, sources())).toEqual([{ place: null, reason: "SyntaxError: Unexpected token ',' (in a module tools.ts imports: Node does not say which)" }]);
  });

  it('something not an Error', () => {
    expect(loadErrorReports('boom', TOOLS, sources())).toEqual([{ place: null, reason: 'threw "boom"' }]);
  });
});

describe('codeFrame and formatLoadError', () => {
  it('two lines either side, the line marked, a caret under the column', () => {
    expect(codeFrame(files[MACHINE]!, 5, 35)).toBe(
      [
        "  3 | ",
        '  4 | export const machine = setup({}).createMachine({',
        "> 5 |   states: { a: { type: 'final' }, , },",
        '    |                                   ^',
        '  6 | });',
      ].map((line) => line.trimEnd()).join('\n'),
    );
  });

  it('at the first line, with tabs kept in the caret line, wide line numbers aligned', () => {
    const source = ['\tlet a = ;', ...Array.from({ length: 11 }, (_, index) => `line ${index + 2}`)].join('\n');
    expect(codeFrame(source, 1, 10)).toBe(['> 1 | \tlet a = ;', '    | \t        ^', '  2 | line 2', '  3 | line 3'].join('\n'));
    expect(codeFrame(source, 12, 1)).toBe(['  10 | line 10', '  11 | line 11', '> 12 | line 12', '     | ^'].join('\n'));
    expect(codeFrame(source, 13, 1)).toBeNull();
  });

  it('a long line is cut around the column', () => {
    const frame = codeFrame(`${'x'.repeat(500)}!${'y'.repeat(500)}`, 1, 501)!;
    const [line, caret] = frame.split('\n');
    expect(line!.length).toBeLessThan(200);
    expect(line![caret!.indexOf('^')]).toBe('!');
  });

  it('each report as file:line:column: reason with its frame indented under it; a report without a place is its reason', () => {
    const text = formatLoadError(
      [
        { place: { file: MACHINE, line: 5, column: 35 }, reason: 'Expected identifier but found ","' },
        { place: null, reason: 'Cannot use "import.meta" here' },
      ],
      (file) => files[file] ?? null,
      (file) => file.replace('/repo/', ''),
    );
    expect(text.split('\n')).toEqual([
      'agents/typo.machine.ts:5:35: Expected identifier but found ","',
      '      3 |',
      '      4 | export const machine = setup({}).createMachine({',
      "    > 5 |   states: { a: { type: 'final' }, , },",
      '        |                                   ^',
      '      6 | });',
      'Cannot use "import.meta" here',
    ]);
    expect(problemList(['a:\n  b', 'c'])).toBe('  - a:\n      b\n  - c');
  });
});
