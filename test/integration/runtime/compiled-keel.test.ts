import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
// @ts-expect-error bin/ is plain JavaScript without declarations (it runs before any TypeScript can)
import { compiledKeel } from '../../../bin/compiled-keel.js';
import { REPO_ROOT } from '../../support/keel-process.js';

// bin/keel.js runs the build compiledKeel returns (decision 0034). These tests give it a small
// checkout of their own: sources under src/, machines/ and workers/, and a sql/ folder.

const compile = compiledKeel as (repoRoot: string) => Promise<string>;
const run = promisify(execFile);
const checkouts: string[] = [];

function checkout(): string {
  const root = mkdtempSync(join(tmpdir(), 'keel-compiled-'));
  checkouts.push(root);
  const write = (path: string, text: string) => {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  };
  write('src/cli/main.ts', "import { greeting } from '../greeting.js';\nexport async function main(argv: string[]): Promise<void> {\n  process.stdout.write(`${greeting(argv.length)}\\n`);\n}\n");
  write('src/greeting.ts', 'export const greeting = (count: number): string => `one build, ${count as number} arguments`;\n');
  write('machines/demo.machine.ts', "export const id: string = 'demo';\n");
  write('workers/demo-worker.ts', 'export const worker = (): number => 1;\n');
  write('sql/0001_demo.sql', 'SELECT 1;\n');
  return root;
}

const buildsOf = (root: string) => readdirSync(join(root, 'node_modules', '.cache', 'keel')).sort();

afterEach(() => {
  for (const root of checkouts.splice(0)) rmSync(root, { recursive: true, force: true });
});

describe('compiledKeel', () => {
  it('builds JavaScript an ES module import runs, beside the linked sql folder, and reuses it while the sources are unchanged', async () => {
    const root = checkout();
    const entry = await compile(root);
    expect(entry).toMatch(new RegExp(`^${root}/node_modules/\\.cache/keel/[0-9a-f]{24}/src/cli/main\\.js$`));
    const build = dirname(dirname(dirname(entry)));
    expect(readFileSync(join(build, 'machines', 'demo.machine.js'), 'utf8')).toContain("const id = \"demo\"");
    expect(existsSync(join(build, 'workers', 'demo-worker.js'))).toBe(true);
    expect(readFileSync(join(build, 'sql', '0001_demo.sql'), 'utf8')).toBe('SELECT 1;\n');
    const { stdout } = await run(process.execPath, ['--input-type=module', '-e', `const { main } = await import(${JSON.stringify(entry)}); await main(['a', 'b']);`]);
    expect(stdout).toBe('one build, 2 arguments\n');

    const builtAt = statSync(entry).mtimeMs;
    expect(await compile(root)).toBe(entry);
    expect(statSync(entry).mtimeMs).toBe(builtAt);
    expect(buildsOf(root)).toHaveLength(1);
  });

  it('an edited source is built again under a new hash; a build unused for a day is removed', async () => {
    const root = checkout();
    const first = await compile(root);
    writeFileSync(join(root, 'src', 'greeting.ts'), 'export const greeting = (count: number): string => `edited, ${count}`;\n');
    const second = await compile(root);
    expect(second).not.toBe(first);
    expect(readFileSync(join(dirname(dirname(second)), 'greeting.js'), 'utf8')).toContain('edited');
    // The first build was used a moment ago: kept, a process may still be running from it.
    expect(buildsOf(root)).toHaveLength(2);

    const firstBuild = dirname(dirname(dirname(first)));
    const twoDaysAgo = new Date(Date.now() - 2 * 24 * 60 * 60 * 1000);
    utimesSync(firstBuild, twoDaysAgo, twoDaysAgo);
    writeFileSync(join(root, 'src', 'greeting.ts'), 'export const greeting = (count: number): string => `again, ${count}`;\n');
    const third = await compile(root);
    expect(buildsOf(root)).toEqual([dirname(dirname(dirname(second))), dirname(dirname(dirname(third)))].map((path) => path.split('/').at(-1)).sort());
  });

  it('builds into the temp directory when node_modules/.cache cannot be written, and the build still finds the dependencies', async () => {
    const root = checkout();
    mkdirSync(join(root, 'node_modules', 'demo-dependency'), { recursive: true });
    writeFileSync(join(root, 'node_modules', 'demo-dependency', 'package.json'), JSON.stringify({ name: 'demo-dependency', type: 'module', exports: './index.js' }));
    writeFileSync(join(root, 'node_modules', 'demo-dependency', 'index.js'), "export const word = 'dependency';\n");
    writeFileSync(join(root, 'src', 'greeting.ts'), "import { word } from 'demo-dependency';\nexport const greeting = (count: number): string => `${word}, ${count}`;\n");
    // A file where the cache folder would go: it cannot be created.
    writeFileSync(join(root, 'node_modules', '.cache'), '');
    const entry = await compile(root);
    checkouts.push(dirname(dirname(dirname(entry))));
    expect(entry.startsWith(join(tmpdir(), 'keel-build'))).toBe(true);
    const { stdout } = await run(process.execPath, ['--input-type=module', '-e', `const { main } = await import(${JSON.stringify(entry)}); await main(['a']);`]);
    expect(stdout).toBe('dependency, 1\n');
  });

  it('processes that start together on an unbuilt checkout all run the one build, and leave no half-built folder', async () => {
    const root = checkout();
    const script = `import { compiledKeel } from ${JSON.stringify(join(REPO_ROOT, 'bin', 'compiled-keel.js'))}; process.stdout.write(await compiledKeel(${JSON.stringify(root)}));`;
    const entries = await Promise.all(Array.from({ length: 4 }, async () => (await run(process.execPath, ['--input-type=module', '-e', script])).stdout));
    expect(new Set(entries).size).toBe(1);
    expect(existsSync(entries[0]!)).toBe(true);
    expect(buildsOf(root)).toHaveLength(1);
  });
});
