import type { Command } from 'commander';
import { loadMachineCatalog } from '../ui/machine-catalog.js';
import { standaloneSvg, toMermaid } from '../ui/statechart.js';
import { CliExit, EXIT } from './cli-support.js';

// `keel machines`: the statecharts of machines/ as the operator UI draws them, generated from the
// XState definitions: Mermaid text (stateDiagram-v2), JSON (states and transitions), or SVG.

const FORMATS = ['mermaid', 'json', 'svg'] as const;
type Format = (typeof FORMATS)[number];

export function registerMachinesCommand(program: Command): void {
  program
    .command('machines [machine]')
    .description('print the statecharts (run, task, delivery, pushConfig, dependency, ...) generated from their definitions')
    .option('--format <format>', `${FORMATS.join(' | ')}`, 'mermaid')
    .action(async (only: string | undefined, options: { format: string }) => {
      if (!FORMATS.includes(options.format as Format)) throw new CliExit(EXIT.usage, `--format must be one of ${FORMATS.join(', ')}`);
      const catalog = await loadMachineCatalog();
      const chosen = only === undefined ? catalog : catalog.filter((entry) => entry.id === only);
      if (chosen.length === 0) throw new CliExit(EXIT.notFound, `no machine ${only}; there are ${catalog.map((entry) => entry.id).join(', ')}`);
      switch (options.format as Format) {
        case 'json':
          process.stdout.write(
            `${JSON.stringify(
              {
                machines: chosen.map((entry) => ({
                  id: entry.id,
                  file: `machines/${entry.file}`,
                  initial: entry.model.initial,
                  states: entry.model.states,
                  transitions: entry.model.edges,
                })),
              },
              null,
              2,
            )}\n`,
          );
          return;
        case 'mermaid':
          process.stdout.write(`${chosen.map((entry) => `%% ${entry.id} (machines/${entry.file})\n${toMermaid(entry.model)}\n`).join('\n')}`);
          return;
        case 'svg':
          if (chosen.length !== 1) throw new CliExit(EXIT.usage, `--format svg draws one machine: name it (${catalog.map((entry) => entry.id).join(', ')})`);
          process.stdout.write(`${standaloneSvg(chosen[0]!.model)}\n`);
          return;
      }
    });
}
