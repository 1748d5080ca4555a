import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { SUITE_RESULTS_FILE, type SuiteResults } from '../test/support/suite-report.js';
import { FILE_DURATIONS_PATH, readFileDurations } from '../test/support/suite-sequencer.js';

// npm run test:durations — after a whole run of the suite (`.ci/run`, or `npm test --
// --reporter=default --reporter=./test/support/suite-report.ts`), records each file's duration per
// project in test/support/file-durations.json, which the suite's sequencer plans the next runs
// with (test/support/suite-sequencer.ts). A project the run did not hold keeps its recorded durations.

const root = fileURLToPath(new URL('..', import.meta.url));
const resultsPath = `${root}${SUITE_RESULTS_FILE}`;
if (!existsSync(resultsPath)) {
  console.error(`no ${SUITE_RESULTS_FILE}: run the whole suite with --reporter=./test/support/suite-report.ts first (.ci/run does)`);
  process.exit(1);
}
const run = JSON.parse(readFileSync(resultsPath, 'utf8')) as SuiteResults;
const durations = readFileDurations();
for (const [project, files] of Object.entries(run.projects)) {
  const sorted = Object.entries(files).sort(([a], [b]) => a.localeCompare(b));
  durations[project] = Object.fromEntries(sorted);
  const total = sorted.reduce((sum, [, seconds]) => sum + seconds, 0);
  console.log(`${project}: ${sorted.length} files, ${Math.round(total)} s in all`);
}
writeFileSync(FILE_DURATIONS_PATH, `${JSON.stringify(durations, null, 2)}\n`);
