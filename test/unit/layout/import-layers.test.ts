import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

// The plan of the code as a check: the folders (machines/, workers/, each src/<feature>/) import
// each other without a loop, so they stack in floors where every import runs down, and the few
// rules docs/architecture.md states hold. Imports are read as text, type-only ones included: a
// type import ties two folders as much as a value import does.

const ROOT = join(dirname(new URL(import.meta.url).pathname), '..', '..', '..');
const SOURCE_ROOTS = ['src', 'workers', 'machines'];
const IMPORT = /(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"](\.{1,2}\/[^'"]+)['"]/g;

function sourceFiles(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((entry) => {
    const path = join(dir, entry);
    if (statSync(join(ROOT, path)).isDirectory()) return sourceFiles(path);
    return path.endsWith('.ts') ? [path] : [];
  });
}

/** The folder a file belongs to: `machines`, `workers` or `src/<feature>`. */
function folderOf(path: string): string {
  const [top, feature] = path.split('/');
  return top === 'src' ? `src/${feature}` : top!;
}

type Edge = { from: string; to: string; file: string; target: string };

function folderImports(): Edge[] {
  const edges: Edge[] = [];
  for (const file of SOURCE_ROOTS.flatMap(sourceFiles)) {
    for (const match of readFileSync(join(ROOT, file), 'utf8').matchAll(IMPORT)) {
      const target = relative(ROOT, normalize(join(ROOT, dirname(file), match[1]!)));
      const from = folderOf(file);
      const to = folderOf(target);
      if (from !== to) edges.push({ from, to, file, target });
    }
  }
  return edges;
}

/** Every folder that takes part in a loop, with the imports that close it. */
function loops(edges: Edge[]): string[] {
  const next = new Map<string, Set<string>>();
  for (const edge of edges) next.set(edge.from, (next.get(edge.from) ?? new Set()).add(edge.to));
  const reaches = (start: string, goal: string): boolean => {
    const seen = new Set<string>();
    const stack = [start];
    while (stack.length) {
      const current = stack.pop()!;
      if (current === goal) return true;
      if (seen.has(current)) continue;
      seen.add(current);
      stack.push(...(next.get(current) ?? []));
    }
    return false;
  };
  return edges.filter((edge) => reaches(edge.to, edge.from)).map((edge) => `${edge.file} imports ${edge.target} (${edge.from} -> ${edge.to}, and ${edge.to} leads back)`);
}

describe('the import plan', () => {
  const edges = folderImports();

  it('reads the imports of every folder', () => {
    expect(new Set(edges.map((edge) => edge.from)).size).toBeGreaterThan(15);
  });

  it('has no loop between folders, so every import runs down a floor', () => {
    expect(loops(edges)).toEqual([]);
  });

  it('keeps machines pure: they import no repository, worker, queue or database module', () => {
    const impure = edges.filter((edge) => edge.from === 'machines' && !['src/protocol', 'src/providers', 'src/privacy'].includes(edge.to));
    expect(impure.map((edge) => `${edge.file} imports ${edge.target}`)).toEqual([]);
  });

  it('lets no library folder import a queue processor or the process wiring', () => {
    // src/runtime wires the process (it starts the workers) and src/cli starts it: they stand on top.
    const wiring = new Set(['src/runtime', 'src/cli']);
    const upward = edges.filter((edge) => edge.from.startsWith('src/') && !wiring.has(edge.from) && (edge.to === 'workers' || wiring.has(edge.to)));
    expect(upward.map((edge) => `${edge.file} imports ${edge.target}`)).toEqual([]);
  });
});
