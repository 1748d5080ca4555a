#!/usr/bin/env node
// Keel runs from its TypeScript sources compiled by esbuild into a build keyed by their content
// (bin/compiled-keel.js; docs/decisions/0034-run-compiled-sources.md).
import { fileURLToPath } from 'node:url';
import { compiledKeel } from './compiled-keel.js';

// Errors logged with a stack name the TypeScript file and line, not the compiled one.
process.setSourceMapsEnabled(true);
const entry = await compiledKeel(fileURLToPath(new URL('..', import.meta.url)));
const { main } = await import(entry);
await main(process.argv);
