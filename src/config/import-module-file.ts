import { readFileSync } from 'node:fs';
import { extname, isAbsolute, relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { transformSync, type Loader } from 'esbuild';
import { formatLoadError, loadErrorReports, type LoadErrorReport, type SourceAccess } from './module-load-error.js';

// Operators name module files in the config (tool modules, guardrail hooks, statechart
// machines), in JavaScript or TypeScript. Keel itself runs compiled (bin/keel.js; decision
// 0034), and Node 20 cannot load TypeScript on its own, so tsx's loader is registered the first
// time a TypeScript file is imported, and only then: a Keel whose modules are all JavaScript
// never pays for it. When this file is itself TypeScript, whatever runs it (tsx, vitest) already
// loads TypeScript.

const TYPESCRIPT_FILE = /\.(ts|mts|cts|tsx)$/;
const RUNNING_COMPILED = import.meta.url.endsWith('.js');

let typescriptLoader: Promise<void> | null = null;

/** A module file imported, or why it could not be (each reason placed, and as text with code frames). */
export type ModuleFile = { ok: true; module: Record<string, unknown> } | { ok: false; reports: LoadErrorReport[]; text: string };

const readSource = (file: string): string | null => {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return null;
  }
};

const LOADERS: Record<string, Loader> = { '.ts': 'ts', '.mts': 'ts', '.cts': 'ts', '.tsx': 'tsx', '.jsx': 'jsx' };

/** esbuild's parse of a module's own text: the syntax errors Node reports without a place. */
function syntaxErrors(file: string): LoadErrorReport[] {
  const source = readSource(file);
  if (source === null) return [];
  try {
    transformSync(source, { loader: LOADERS[extname(file)] ?? 'js', sourcefile: file });
    return [];
  } catch (error) {
    return loadErrorReports(error, file, { read: () => null, syntaxErrors: () => [] }).filter((report) => report.place !== null);
  }
}

const SOURCES: SourceAccess = { read: readSource, syntaxErrors };

/** A path as the reader finds it: relative to the working directory when inside it. */
const display = (file: string): string => {
  const shown = relative(process.cwd(), file);
  return shown === '' || shown.startsWith('..') || isAbsolute(shown) ? file : shown;
};

/** Imports a module file by its absolute path, TypeScript included. */
export async function loadModuleFile(absolutePath: string): Promise<ModuleFile> {
  try {
    if (RUNNING_COMPILED && TYPESCRIPT_FILE.test(absolutePath)) {
      typescriptLoader ??= import('tsx/esm/api').then(({ register }) => {
        register();
      });
      await typescriptLoader;
    }
    return { ok: true, module: (await import(pathToFileURL(absolutePath).href)) as Record<string, unknown> };
  } catch (error) {
    const reports = loadErrorReports(error, absolutePath, SOURCES);
    return { ok: false, reports, text: formatLoadError(reports, readSource, display) };
  }
}
