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
const built = join(root, 'dist', 'src', 'cli', 'main.js');
if (!existsSync(join(root, 'src')) && !existsSync(built)) {
  // npm builds dist/ with Keel's `prepare` when it installs it from a git URL; a blocked script leaves none.
  process.stderr.write(
    `keel: ${root} holds neither Keel's sources nor its build (dist/): it was installed without running its prepare script. ` +
      'List "keel": true under "allowScripts" in your package.json and install it again, or install a tarball made with npm pack.\n',
  );
  process.exit(1);
}
const entry = existsSync(join(root, 'src')) ? await (await import('./compiled-keel.js')).compiledKeel(root) : built;
const { main } = await import(pathToFileURL(entry).href);
await main(process.argv);
