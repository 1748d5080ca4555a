// The build a packed Keel ships (docs/decisions/0077-a-packed-keel-runs-its-build.md), run by npm's
// `prepare`: before `npm pack` and `npm publish`, when a team installs Keel from a git URL, and on
// `npm install` / `npm ci` in a checkout. It writes dist/:
//
//   dist/src, dist/machines, dist/workers  esbuild's JavaScript of every source (bin/compiled-keel.js),
//                                          what bin/keel.js runs when the package has no src/
//   dist/sql                               the migrations, where dist/src/db/migrate.js reads them
//   dist/src/statecharts/steps.d.ts        the declarations of `keel/statechart` (and what they import)
//
// A checkout keeps running its sources (bin/keel.js prefers src/ when it is there), so a dist/ left
// beside an edited checkout is never what runs.

import { spawnSync } from 'node:child_process';
import { cpSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sourceFiles, transpile } from '../bin/compiled-keel.js';

const repoRoot = fileURLToPath(new URL('..', import.meta.url));
const dist = join(repoRoot, 'dist');
const started = Date.now();

rmSync(dist, { recursive: true, force: true });
await transpile(repoRoot, sourceFiles(repoRoot), dist);
cpSync(join(repoRoot, 'sql'), join(dist, 'sql'), { recursive: true });

// Declarations only for the public entry (tsconfig.package.json names it): tsc follows its imports.
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const declarations = spawnSync(process.execPath, [tsc, '-p', join(repoRoot, 'tsconfig.package.json')], { cwd: repoRoot, stdio: 'inherit' });
if (declarations.status !== 0) {
  process.stderr.write('keel: building the declarations of keel/statechart failed (tsc above)\n');
  process.exit(declarations.status ?? 1);
}
process.stdout.write(`keel: built dist/ in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
