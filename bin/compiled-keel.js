// Keel's sources compiled ahead of the run (docs/decisions/0034-run-compiled-sources.md).
//
// bin/keel.js runs Keel from JavaScript that esbuild transpiled from the TypeScript sources of
// this checkout, one file for one file (no bundling, no type check: `npm run typecheck` does
// that). Each build lives in a directory named by a hash of the sources it was built from, so a
// build always matches the sources beside it: an edited file hashes to a new directory and is
// built again on the next start, and no stale build can run. Building takes about a second; a
// start whose build exists pays only the hash (a few milliseconds).

import { createHash, randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';

/** The folders whose TypeScript makes up the program. */
const SOURCE_DIRS = ['src', 'machines', 'workers'];
/** What the compiled files read beside them at run time (src/db/migrate.ts: `../../sql`). */
const LINKED_DIRS = ['sql'];
/** Bumped when the way a build is made changes, so older builds are not reused. */
const BUILD_FORMAT = 1;
/** A build no process has started from for this long is removed by the next build. */
const UNUSED_BUILD_MS = 24 * 60 * 60 * 1000;

/**
 * esbuild's JavaScript for each TypeScript source, under outdir at the same relative path: the
 * build a checkout runs and the one a packed Keel ships (scripts/build-package.js).
 */
export async function transpile(repoRoot, files, outdir) {
  const { build: esbuild } = await import('esbuild');
  await esbuild({
    entryPoints: files,
    outdir,
    outbase: repoRoot,
    bundle: false,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    // Stack traces in logs point at the TypeScript lines (bin/keel.js turns source maps on).
    sourcemap: 'linked',
    sourcesContent: false,
    logLevel: 'silent',
  });
}

/** The compiled CLI entry of the sources under repoRoot, built first when missing. */
export async function compiledKeel(repoRoot) {
  const files = sourceFiles(repoRoot);
  const key = buildKey(repoRoot, files);
  const cacheRoot = buildCacheRoot(repoRoot);
  const buildDir = join(cacheRoot, key);
  if (existsSync(join(buildDir, 'package.json'))) {
    markUsed(buildDir);
  } else {
    await build(repoRoot, files, cacheRoot, buildDir);
    pruneUnused(cacheRoot, key);
  }
  return join(buildDir, 'src', 'cli', 'main.js');
}

/** Every TypeScript source of the program under repoRoot, sorted. */
export function sourceFiles(repoRoot) {
  const files = [];
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) files.push(path);
    }
  };
  for (const dir of SOURCE_DIRS) walk(join(repoRoot, dir));
  return files.sort();
}

/**
 * A hash of the checkout's place (a build's links point into it), every source file's path and
 * content, esbuild's version and this file's format.
 */
function buildKey(repoRoot, files) {
  const hash = createHash('sha256');
  const esbuildPackage = createRequire(import.meta.url).resolve('esbuild/package.json');
  hash.update(`${repoRoot}\0format ${BUILD_FORMAT}\0esbuild ${JSON.parse(readFileSync(esbuildPackage, 'utf8')).version}\0`);
  for (const file of files) {
    hash.update(relative(repoRoot, file));
    hash.update('\0');
    hash.update(readFileSync(file));
    hash.update('\0');
  }
  return hash.digest('hex').slice(0, 24);
}

/** node_modules/.cache/keel beside the sources, or the temp directory when that is not writable. */
function buildCacheRoot(repoRoot) {
  const preferred = join(repoRoot, 'node_modules', '.cache', 'keel');
  try {
    mkdirSync(preferred, { recursive: true });
    return preferred;
  } catch {
    const fallback = join(tmpdir(), 'keel-build');
    mkdirSync(fallback, { recursive: true });
    return fallback;
  }
}

/**
 * Builds into a private directory and renames it into place, so processes started together never
 * see half a build: the first rename wins and the others use its result.
 */
async function build(repoRoot, files, cacheRoot, buildDir) {
  const { stop, version } = await import('esbuild');
  const staging = join(cacheRoot, `.staging-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    await transpile(repoRoot, files, staging);
    // Without a package.json of their own the .js files under node_modules/.cache would be read
    // as CommonJS: Node stops looking for the package scope at a node_modules folder.
    writeFileSync(join(staging, 'package.json'), `${JSON.stringify({ type: 'module', private: true, esbuild: version })}\n`);
    for (const dir of LINKED_DIRS) symlinkSync(join(repoRoot, dir), join(staging, dir), 'dir');
    // A build in the temp directory finds Keel's dependencies through a link; one under
    // node_modules/.cache finds them by walking up, as Node resolves packages.
    if (relative(join(repoRoot, 'node_modules'), cacheRoot).startsWith('..')) {
      symlinkSync(join(repoRoot, 'node_modules'), join(staging, 'node_modules'), 'dir');
    }
    try {
      renameSync(staging, buildDir);
    } catch (error) {
      if (!existsSync(join(buildDir, 'package.json'))) throw error;
    }
  } finally {
    // esbuild's service process would otherwise live as long as Keel does.
    await stop();
    rmSync(staging, { recursive: true, force: true });
  }
}

function markUsed(buildDir) {
  const now = new Date();
  try {
    utimesSync(buildDir, now, now);
  } catch {
    // A read-only cache still runs; it only cannot record its use.
  }
}

/** Removes builds of other sources that no process has started from in a day. */
function pruneUnused(cacheRoot, currentKey) {
  const cutoff = Date.now() - UNUSED_BUILD_MS;
  for (const entry of readdirSync(cacheRoot)) {
    if (entry === currentKey) continue;
    const path = join(cacheRoot, entry);
    try {
      if (statSync(path).mtimeMs < cutoff) rmSync(path, { recursive: true, force: true });
    } catch {
      // Removed by another process meanwhile.
    }
  }
}
