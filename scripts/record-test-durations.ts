import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FILE_DURATIONS_PATH, readFileDurations } from '../test/support/suite-sequencer.js';
import type { TestQueueKind } from '../test/support/test-queues.js';

// npm run test:durations — after a whole run of the suite (`.ci/run`, or `npm test -- --reporter=json
// --outputFile=.tmp/test-results-<backend>.json` per backend), records each file's duration in
// test/support/file-durations.json, which the suite's sequencer plans the next runs with
// (test/support/suite-sequencer.ts). A backend without a results file keeps its recorded durations.

const root = fileURLToPath(new URL('..', import.meta.url));
const results = (backend: TestQueueKind) => `${root}.tmp/test-results-${backend}.json`;
type VitestJson = { testResults: Array<{ name: string; startTime: number; endTime: number }> };

const durations = readFileDurations();
for (const backend of ['postgres', 'redis'] as const) {
  if (!existsSync(results(backend))) {
    console.log(`${backend}: no ${relative(root, results(backend))}; its durations are kept`);
    continue;
  }
  const run = JSON.parse(readFileSync(results(backend), 'utf8')) as VitestJson;
  const files = run.testResults
    .map((file) => [relative(root, file.name), Math.round((file.endTime - file.startTime) / 100) / 10] as const)
    .sort(([a], [b]) => a.localeCompare(b));
  durations[backend] = Object.fromEntries(files);
  const total = files.reduce((sum, [, seconds]) => sum + seconds, 0);
  console.log(`${backend}: ${files.length} files, ${Math.round(total)} s in all`);
}
writeFileSync(FILE_DURATIONS_PATH, `${JSON.stringify(durations, null, 2)}\n`);
