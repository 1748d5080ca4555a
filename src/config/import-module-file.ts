import { pathToFileURL } from 'node:url';

// Operators name module files in the config (tool modules, guardrail hooks, statechart
// machines), in JavaScript or TypeScript. Keel itself runs compiled (bin/keel.js; decision
// 0034), and Node 20 cannot load TypeScript on its own, so tsx's loader is registered the first
// time a TypeScript file is imported, and only then: a Keel whose modules are all JavaScript
// never pays for it. When this file is itself TypeScript, whatever runs it (tsx, vitest) already
// loads TypeScript.

const TYPESCRIPT_FILE = /\.(ts|mts|cts|tsx)$/;
const RUNNING_COMPILED = import.meta.url.endsWith('.js');

let typescriptLoader: Promise<void> | null = null;

/** Imports a module file by its absolute path, TypeScript included. */
export async function importModuleFile(absolutePath: string): Promise<Record<string, unknown>> {
  if (RUNNING_COMPILED && TYPESCRIPT_FILE.test(absolutePath)) {
    typescriptLoader ??= import('tsx/esm/api').then(({ register }) => {
      register();
    });
    await typescriptLoader;
  }
  return (await import(pathToFileURL(absolutePath).href)) as Record<string, unknown>;
}
