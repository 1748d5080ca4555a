import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { buildProgram, commandNameIn } from '../../../src/cli/main.js';

// `keel <command>` loads only the module of the command it names; anything else loads them all.

const namesOf = async (args: string[]) => (await buildProgram(args)).commands.map((command) => command.name());

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

/** The repository's TypeScript files a module loads through static imports (not `import type`, not `import()`), itself included. */
function staticClosure(entry: string): Set<string> {
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const source = readFileSync(join(ROOT, file), 'utf8').replace(/import type [^;]+;/g, '');
    for (const [, specifier] of source.matchAll(/^(?:import|export)\s[^;]*?from\s+['"](\.[^'"]+)\.js['"]/gms)) {
      const target = relative(ROOT, resolve(ROOT, dirname(file), `${specifier}.ts`));
      if (existsSync(join(ROOT, target))) visit(target);
    }
  };
  visit(entry);
  return seen;
}

describe('the CLI loads the command it runs', () => {
  it('finds the command name after the global options', () => {
    expect(commandNameIn(['clients', 'add', 'ci'])).toBe('clients');
    expect(commandNameIn(['-c', 'keel.yaml', 'runs', 'list'])).toBe('runs');
    expect(commandNameIn(['--config', 'keel.yaml', 'push', 'list'])).toBe('push');
    expect(commandNameIn(['--config=keel.yaml', 'start'])).toBe('start');
    expect(commandNameIn(['--', 'doctor'])).toBe('doctor');
    expect(commandNameIn(['--help'])).toBeUndefined();
    expect(commandNameIn([])).toBeUndefined();
  });

  it('every command registered when all are loaded is found by its own name, alone or with its module siblings', async () => {
    const all = await namesOf([]);
    expect(all).toEqual(
      expect.arrayContaining(['start', 'migrate', 'doctor', 'runs', 'purge', 'contexts', 'push', 'remote', 'deps', 'cards', 'keys', 'clients', 'admin', 'machines', 'new']),
    );
    for (const name of all) {
      const loaded = await namesOf([name, '--help']);
      expect(loaded, name).toContain(name);
      expect(loaded.length, name).toBeLessThanOrEqual(2);
      expect(all).toEqual(expect.arrayContaining(loaded));
    }
  });

  it('a name that is no command loads every command, so commander can list them or suggest one', async () => {
    expect(await namesOf(['nope'])).toEqual(await namesOf(['--help']));
    expect(await namesOf(['help', 'runs'])).toEqual(await namesOf([]));
  });

  it('the runs, push and remote commands load the queues (BullMQ) only when one of them enqueues', () => {
    for (const module of ['src/cli/runs-commands.ts', 'src/cli/push-commands.ts', 'src/cli/remote-commands.ts']) {
      const loaded = staticClosure(module);
      expect(loaded.has('src/cli/command-context.ts'), module).toBe(true);
      expect([...loaded].filter((file) => file.startsWith('src/queue/keel-queues')), module).toEqual([]);
    }
  });
});
