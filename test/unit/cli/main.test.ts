import { describe, expect, it } from 'vitest';
import { buildProgram, commandNameIn } from '../../../src/cli/main.js';

// `keel <command>` loads only the module of the command it names; anything else loads them all.

const namesOf = async (args: string[]) => (await buildProgram(args)).commands.map((command) => command.name());

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
});
