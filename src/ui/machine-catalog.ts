import { readdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { AnyStateMachine } from 'xstate';
import { describeMachine, type MachineModel } from './statechart.js';
import { isMachine } from '../../machines/transitions.js';

// Which statecharts exist is read from machines/: every `*.machine.ts` (or `.js` once built) is
// imported and each XState machine it exports is drawn, so adding a machine file adds its diagram.
// How a machine's states are counted (which table and column hold them) is kept in
// src/ui/machine-rows.ts; a machine without such a binding is drawn without counts.

export const MACHINES_DIR = fileURLToPath(new URL('../../machines/', import.meta.url));

/** Machines that describe an actor's steps inside one worker, not a stored lifecycle: not drawn. */
const NOT_LIFECYCLES = new Set(['agentLoop']);

/** The order operators read them in; machines not listed follow, by id. */
const PREFERRED_ORDER = ['run', 'task', 'delivery', 'pushConfig', 'dependency'];

export type CatalogEntry = { id: string; file: string; machine: AnyStateMachine; model: MachineModel };

const MACHINE_FILE = /^(.+)\.machine\.(ts|js|mjs)$/;

/** The machine files of a directory: one per name (a built `.js` beside its `.ts` counts once). */
export function machineFiles(dir = MACHINES_DIR): string[] {
  const byName = new Map<string, string>();
  for (const file of readdirSync(dir).sort()) {
    if (file.endsWith('.d.ts')) continue;
    const match = MACHINE_FILE.exec(file);
    if (match && !byName.has(match[1]!)) byName.set(match[1]!, join(dir, file));
  }
  return [...byName.values()];
}

/**
 * The file an operator reads and edits. Keel's own machines are TypeScript; run compiled
 * (bin/keel.js), MACHINES_DIR is the build's, whose `run.machine.js` is `machines/run.machine.ts`.
 */
function sourceName(file: string, dir: string): string {
  const name = basename(file);
  return dir === MACHINES_DIR ? name.replace(/\.js$/, '.ts') : name;
}

let cached: Promise<CatalogEntry[]> | null = null;

/** Every lifecycle statechart in machines/, in reading order. Loaded once per process. */
export function loadMachineCatalog(dir = MACHINES_DIR): Promise<CatalogEntry[]> {
  if (dir !== MACHINES_DIR) return readCatalog(dir);
  cached ??= readCatalog(dir).catch((error: unknown) => {
    cached = null;
    throw error;
  });
  return cached;
}

async function readCatalog(dir: string): Promise<CatalogEntry[]> {
  const entries: CatalogEntry[] = [];
  const seen = new Set<string>();
  for (const file of machineFiles(dir)) {
    const module = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
    for (const value of Object.values(module)) {
      if (!isMachine(value) || NOT_LIFECYCLES.has(value.id) || seen.has(value.id)) continue;
      seen.add(value.id);
      entries.push({ id: value.id, file: sourceName(file, dir), machine: value, model: describeMachine(value) });
    }
  }
  const rank = (id: string) => {
    const index = PREFERRED_ORDER.indexOf(id);
    return index === -1 ? PREFERRED_ORDER.length : index;
  };
  return entries.sort((a, b) => rank(a.id) - rank(b.id) || a.id.localeCompare(b.id));
}
