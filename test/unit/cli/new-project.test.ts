import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { defaultKeelSpec, runningKeel, scaffoldProject } from '../../../src/cli/new-project.js';
import { loadConfig } from '../../../src/config/load-config.js';
import { loadStatechart } from '../../../src/statecharts/statechart-definition.js';
import { REPO_ROOT } from '../../support/keel-process.js';
import { tempDir } from '../../support/test-keel.js';

// `keel new project`: where the new project gets Keel from, what it writes, and what it refuses
// (the whole flow, packed and installed: test/e2e/outside-checkout.test.ts).

const work = tempDir('keel-new-project-');
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** A Keel installed as a dependency of a project whose package.json names it by `spec`. */
let installs = 0;
function installedKeel(spec: string | null): string {
  installs += 1;
  const projectDir = join(work, `installed-${installs}`);
  mkdirSync(projectDir);
  writeFileSync(join(projectDir, 'package.json'), JSON.stringify({ name: 'tools', ...(spec === null ? {} : { dependencies: { keel: spec } }) }));
  const root = join(projectDir, 'node_modules', 'keel');
  mkdirSync(join(root, 'dist'), { recursive: true });
  return root;
}

describe('keel new project', () => {
  const keel = runningKeel();

  it('finds the Keel it runs from, and a checkout names itself by its path', () => {
    expect(join(keel.root, '/')).toBe(REPO_ROOT);
    expect(keel.manifest.dependencies?.xstate).toEqual(expect.any(String));
    expect(defaultKeelSpec(keel)).toBe(`file:${keel.root}`);
  });

  it("an installed Keel is named by its project's spec, a relative file: made absolute, else by its version", () => {
    const fromTarball = installedKeel('file:../keel-0.1.0.tgz');
    expect(defaultKeelSpec({ root: fromTarball, manifest: keel.manifest })).toBe(`file:${join(fromTarball, '..', '..', '..', 'keel-0.1.0.tgz')}`);
    const fromGit = installedKeel('git+https://example.com/keel.git#v1');
    expect(defaultKeelSpec({ root: fromGit, manifest: keel.manifest })).toBe('git+https://example.com/keel.git#v1');
    const unnamed = installedKeel(null);
    expect(defaultKeelSpec({ root: unnamed, manifest: keel.manifest })).toBe(keel.manifest.version);
  });

  it('writes a project whose config loads and whose machine Keel accepts', async () => {
    const dir = join(work, 'My Agents');
    const result = scaffoldProject({ dir, agent: 'helpdesk', keelSpec: 'file:/tmp/keel.tgz', keel: keel.manifest });
    if (!result.ok) throw new Error(result.message);
    expect(result.files.map((file) => file.slice(dir.length + 1)).sort()).toEqual(
      ['.gitignore', 'README.md', 'agents/helpdesk.machine.test.ts', 'agents/helpdesk.machine.ts', 'keel.config.yaml', 'package.json'],
    );
    const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as Record<string, unknown>;
    expect(manifest).toMatchObject({
      name: 'my-agents',
      type: 'module',
      scripts: { start: 'keel start', test: 'vitest run' },
      dependencies: { keel: 'file:/tmp/keel.tgz', xstate: keel.manifest.dependencies!.xstate },
      devDependencies: { vitest: keel.manifest.devDependencies!.vitest },
      overrides: keel.manifest.overrides,
      allowScripts: { ...keel.manifest.allowScripts, keel: true },
    });
    const loaded = loadConfig({ configPath: join(dir, 'keel.config.yaml'), env: {}, cwd: dir });
    if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
    expect(loaded.config.agents.map((agent) => [agent.id, agent.machine, agent.provider])).toEqual([['helpdesk', './agents/helpdesk.machine.ts', 'model']]);
    expect(loaded.config.agents[0]!.skills.map((skill) => skill.description)).toEqual(['Answers, or asks for more detail first']);
    // Resolves keel/statechart through a node_modules/keel of its own, as an installed project does.
    mkdirSync(join(dir, 'node_modules'));
    symlinkSync(REPO_ROOT, join(dir, 'node_modules', 'keel'), 'dir');
    symlinkSync(join(REPO_ROOT, 'node_modules', 'xstate'), join(dir, 'node_modules', 'xstate'), 'dir');
    const machine = await loadStatechart('./agents/helpdesk.machine.ts', dir, 'agents.0 (helpdesk)');
    if (!machine.ok) throw new Error(machine.problems.join('\n'));
    expect([...machine.definition.steps.keys()].sort()).toEqual(['askInput', 'callModel']);
  });

  it('refuses a directory that is not empty, and an agent name Keel would refuse, writing nothing', () => {
    const dir = join(work, 'taken');
    mkdirSync(dir);
    writeFileSync(join(dir, 'notes.txt'), 'mine\n');
    const refused = scaffoldProject({ dir, agent: 'assistant', keelSpec: '0.1.0', keel: keel.manifest });
    expect(refused).toEqual({ ok: false, reason: 'not_empty', message: `cannot create project in ${dir}: the directory is not empty (notes.txt); name a new or empty directory` });
    expect(readdirSync(dir)).toEqual(['notes.txt']);

    const badName = scaffoldProject({ dir: join(work, 'fresh'), agent: 'Help Desk', keelSpec: '0.1.0', keel: keel.manifest });
    expect(badName).toMatchObject({ ok: false, reason: 'invalid_name' });
    expect(existsSync(join(work, 'fresh'))).toBe(false);
  });
});
