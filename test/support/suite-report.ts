import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { Reporter, SerializedError, TestModule, Vitest } from 'vitest/node';

// The record of a whole run that CI keeps (`npm test -- --reporter=default
// --reporter=./test/support/suite-report.ts`, .ci/run): each project's files with how long each
// took, which `npm run test:durations` turns into the plan of the next runs
// (test/support/file-durations.json), and the counts and failures by project. vitest's own JSON
// report names a file once per project without saying which, and the suite runs several files in
// two or three projects (test/support/suite-plan.ts). Its last lines say which test failed where,
// so the end of a CI log names the failure.

/** Where the record is written, under the run's root. */
export const SUITE_RESULTS_FILE = '.tmp/test-results.json';

export type SuiteResults = {
  /** Per project (suite-plan.ts), each file's seconds from its start to its end (less a fault file's wait for its slot), by repository-relative path. */
  projects: Record<string, Record<string, number>>;
  passed: number;
  failed: number;
  skipped: number;
  /** One line per failed test, file or unhandled error: `<project>: <file> > <test>: <first line of the error>`. */
  failures: string[];
};

export default class SuiteReport implements Reporter {
  private root = process.cwd();

  onInit(vitest: Vitest): void {
    this.root = vitest.config.root;
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<SerializedError>): void {
    const results: SuiteResults = { projects: {}, passed: 0, failed: 0, skipped: 0, failures: [] };
    for (const module of modules) {
      const project = module.project.name;
      const path = module.relativeModuleId;
      const diagnostic = module.diagnostic();
      // A fault file's wait for the fault slot (test/faults/support/fault-slot.ts) is another
      // file's time, not its own: the plan made from these durations must not count it twice.
      const waited = module.meta().faultSlotWaitMs ?? 0;
      const ms = diagnostic.environmentSetupDuration + diagnostic.prepareDuration + diagnostic.collectDuration + diagnostic.setupDuration + diagnostic.duration - waited;
      (results.projects[project] ??= {})[path] = Math.round(ms / 100) / 10;
      let failedTests = 0;
      for (const test of module.children.allTests()) {
        const result = test.result();
        if (result.state === 'passed') results.passed += 1;
        else if (result.state === 'failed') {
          failedTests += 1;
          results.failures.push(`${project}: ${path} > ${test.fullName}: ${firstLine(result.errors[0]?.message)}`);
        } else results.skipped += 1;
      }
      results.failed += failedTests;
      // A file that failed outside its tests (its import, a hook): one failure, with the file's error.
      if (module.state() === 'failed' && failedTests === 0) {
        results.failed += 1;
        results.failures.push(`${project}: ${path}: ${firstLine(module.errors()[0]?.message)}`);
      }
    }
    for (const error of unhandledErrors) {
      results.failed += 1;
      results.failures.push(`unhandled: ${firstLine(error.message)}`);
    }
    const file = join(this.root, SUITE_RESULTS_FILE);
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);
    for (const failure of results.failures) console.log(`FAILED ${failure}`);
    const files = Object.entries(results.projects).map(([project, durations]) => `${project} ${Object.keys(durations).length}`);
    console.log(`${results.passed} passed, ${results.failed} failed, ${results.skipped} skipped (files: ${files.join(', ')})`);
  }
}

function firstLine(message: string | undefined): string {
  return (message ?? 'no message').split('\n')[0]!.slice(0, 300);
}
