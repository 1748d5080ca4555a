#!/usr/bin/env node
// A checkout runs its TypeScript sources compiled by esbuild into a build keyed by their content
// (bin/compiled-keel.js; docs/decisions/0034-run-compiled-sources.md). A packed Keel, installed in
// a team's repository, ships no sources: it runs the build made when it was packed, dist/
// (scripts/build-package.js; docs/decisions/0077-a-packed-keel-runs-its-build.md).
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

// Errors logged with a stack name the TypeScript file and line, not the compiled one.
process.setSourceMapsEnabled(true);
const root = fileURLToPath(new URL('..', import.meta.url));
const entry = existsSync(join(root, 'src'))
  ? await (await import('./compiled-keel.js')).compiledKeel(root)
  : join(root, 'dist', 'src', 'cli', 'main.js');
const { main } = await import(pathToFileURL(entry).href);
await main(process.argv);
