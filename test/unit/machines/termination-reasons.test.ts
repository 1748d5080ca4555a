import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  REASONS_BY_TERMINAL_STATUS,
  RETRYABLE_REASONS,
  RUN_STATUSES,
  TERMINAL_RUN_STATUSES,
  TERMINATION_REASONS,
  TRUNCATING_REASONS,
} from '../../../machines/run.machine.js';

// The CHECK constraints of `runs` repeat the run machine's vocabulary in SQL, which cannot import
// the TypeScript table: this test holds the two equal. Landed migrations are never edited, so a
// constraint redefined by a later migration counts in its last form.

const SQL_DIR = join(import.meta.dirname, '../../../sql');
const migrations = readdirSync(SQL_DIR)
  .filter((name) => /^\d{4}_.*\.sql$/.test(name))
  .sort()
  .map((name) => readFileSync(join(SQL_DIR, name), 'utf8').replace(/--[^\n]*/g, ''))
  .join('\n');

/** The text inside the parentheses that open at `open` (an index of '('). */
function parenthesised(text: string, open: number): string {
  let depth = 0;
  for (let index = open; index < text.length; index += 1) {
    if (text[index] === '(') depth += 1;
    else if (text[index] === ')' && --depth === 0) return text.slice(open + 1, index);
  }
  throw new Error(`unbalanced parentheses after ${text.slice(open, open + 40)}`);
}

/** The body of the last CHECK that follows `prefix` (a column definition or a named constraint). */
function lastCheck(prefix: RegExp): string {
  const matches = [...migrations.matchAll(new RegExp(`${prefix.source}\\s*CHECK\\s*\\(`, 'g'))];
  const last = matches.at(-1);
  if (!last) throw new Error(`no CHECK after ${prefix.source} in sql/`);
  return parenthesised(migrations, last.index + last[0].length - 1);
}

const quoted = (list: string) => [...list.matchAll(/'([^']*)'/g)].map((match) => match[1]!);
const sorted = (values: readonly string[]) => [...values].sort();

describe('the termination reasons of machines/run.machine.ts and the CHECK constraints of runs', () => {
  it('the status column allows exactly the run statuses', () => {
    expect(quoted(lastCheck(/(?:\bstatus text NOT NULL DEFAULT 'queued'|CONSTRAINT runs_status_check)/))).toEqual([...RUN_STATUSES]);
  });

  it('the termination_reason column allows exactly the termination reasons', () => {
    expect(sorted(quoted(lastCheck(/\btermination_reason text/)))).toEqual(sorted(TERMINATION_REASONS));
  });

  it('a reason is present exactly when the status is terminal', () => {
    const body = lastCheck(/CONSTRAINT runs_reason_iff_terminal/);
    const statuses = /status IN \(([^)]*)\)\s*\)\s*=\s*\(termination_reason IS NOT NULL\)/.exec(body);
    expect(statuses, body).not.toBeNull();
    expect(sorted(quoted(statuses![1]!))).toEqual(sorted(TERMINAL_RUN_STATUSES));
  });

  it('each terminal status carries exactly the reasons the table gives it', () => {
    const body = lastCheck(/CONSTRAINT runs_reason_matches_status/);
    const pairs: Record<string, string[]> = {};
    for (const match of body.matchAll(/status = '([^']+)' AND termination_reason (?:IN \(([^)]*)\)|= '([^']+)')/g)) {
      pairs[match[1]!] = match[2] === undefined ? [match[3]!] : quoted(match[2]);
    }
    const expected = Object.fromEntries(TERMINAL_RUN_STATUSES.map((status) => [status, sorted(REASONS_BY_TERMINAL_STATUS[status])]));
    expect(Object.fromEntries(Object.entries(pairs).map(([status, reasons]) => [status, sorted(reasons)]))).toEqual(expected);
  });

  it('derives every list from the one table', () => {
    expect(sorted(Object.values(REASONS_BY_TERMINAL_STATUS).flat())).toEqual(sorted(TERMINATION_REASONS));
    expect(TRUNCATING_REASONS.every((reason) => REASONS_BY_TERMINAL_STATUS.completed.includes(reason))).toBe(true);
    expect(RETRYABLE_REASONS.every((reason) => REASONS_BY_TERMINAL_STATUS.failed.includes(reason))).toBe(true);
  });
});
