#!/usr/bin/env node
// `keel` as the test harness starts it in a child process: bin/keel.js's compiled sources and
// `main`, plus what only the harness may give `keel start`. Its first argument is that, as JSON
// (`{"pushTestTimings":{"timeoutSeconds":1}}`); the rest are keel's own arguments. The `keel`
// binary has no way to pass it: a production start cannot reach the test timings
// (docs/decisions/0052-push-attempts-capped-and-test-timings-by-the-harness.md).
import { fileURLToPath } from 'node:url';
import { compiledKeel } from '../../bin/compiled-keel.js';

process.setSourceMapsEnabled(true);
const [harnessJson, ...keelArgs] = process.argv.slice(2);
const harness = JSON.parse(harnessJson ?? '{}');
const entry = await compiledKeel(fileURLToPath(new URL('../..', import.meta.url)));
const { main } = await import(entry);
await main([process.argv[0], process.argv[1], ...keelArgs], harness);
