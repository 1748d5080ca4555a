import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config/load-config.js';
import { deliveryOptionsFor } from '../../../src/push/delivery-options.js';
import { REPO_ROOT } from '../../support/keel-process.js';
import { tempDir } from '../../support/test-keel.js';

// What the push worker runs with: the push section of the config (15 s and 8 attempts by
// default), or the test suites' own timings, which only the test harness passes to startKeel
// (decision 0052): no configuration key and no environment variable.

function load(env: NodeJS.ProcessEnv = {}) {
  const dir = tempDir('keel-push-options-');
  const path = join(dir, 'keel.config.yaml');
  writeFileSync(path, '');
  return loadConfig({ configPath: path, env, cwd: dir });
}

describe('the default delivery options', () => {
  it('are a 15 s timeout and 8 attempts', () => {
    const result = load();
    if (!result.ok) throw new Error(result.problems.join('\n'));
    expect(deliveryOptionsFor(result.config.push)).toEqual({
      options: { timeoutMs: 15_000, connectTimeoutMs: 5_000, maxAttempts: 8, retryBaseMs: 2000, retryMaxMs: 300_000, destinationSlots: 4, breakerFailures: 5, breakerCooldownMs: 30_000 },
      warnings: [],
    });
  });
});

describe('the test-only timings (not configuration)', () => {
  const push = { timeoutSeconds: 15, maxAttempts: 8, retryBaseSeconds: 2, retryMaxSeconds: 300, concurrency: 16, connectTimeoutSeconds: 5, destinationShare: 0.25, breakerFailures: 5, breakerCooldownSeconds: 30 } as Parameters<typeof deliveryOptionsFor>[0];

  it('are not config keys: the loader ignores the variables that once carried them and the bounds still hold', () => {
    const result = load({ KEEL_TEST_PUSH_TIMEOUT_SECONDS: '0.5', KEEL_TEST_PUSH_MAX_ATTEMPTS: '30' });
    expect(result.ok && result.config.push).toMatchObject({ timeoutSeconds: 15, maxAttempts: 8 });
  });

  it('are read from no environment variable anywhere in the program (src, machines, workers, bin)', () => {
    const files = (dir: string): string[] =>
      readdirSync(join(REPO_ROOT, dir), { withFileTypes: true }).flatMap((entry) =>
        entry.isDirectory() ? files(join(dir, entry.name)) : /\.(ts|js)$/.test(entry.name) ? [join(dir, entry.name)] : [],
      );
    const readers = ['src', 'machines', 'workers', 'bin'].flatMap(files).filter((file) => readFileSync(join(REPO_ROOT, file), 'utf8').includes('KEEL_TEST_'));
    expect(readers).toEqual([]);
  });

  it('replace the worker timeout and attempt limit, each with a warning', () => {
    const { options, warnings } = deliveryOptionsFor(push, { timeoutSeconds: 0.5, maxAttempts: 30 });
    expect(options).toEqual({ timeoutMs: 500, connectTimeoutMs: 500, maxAttempts: 30, retryBaseMs: 2000, retryMaxMs: 300_000, destinationSlots: 4, breakerFailures: 5, breakerCooldownMs: 30_000 });
    expect(warnings).toEqual([
      'test push timeout of 0.5 s in effect, not push.timeoutSeconds',
      'test push attempt limit of 30 in effect, not push.maxAttempts',
    ]);
  });

  it('ignore a value out of range, saying so', () => {
    const { options, warnings } = deliveryOptionsFor(push, { timeoutSeconds: 0, maxAttempts: 2.5 });
    expect(options).toMatchObject({ timeoutMs: 15_000, maxAttempts: 8 });
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toContain('test push timeout 0 ignored');
    expect(warnings[1]).toContain('test push attempt limit 2.5 ignored');
  });
});
