import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config/load-config.js';
import { deliveryOptionsFor } from '../../../src/push/delivery-options.js';
import { tempDir } from '../../support/test-keel.js';

// What the push worker runs with: the push section of the config (15 s and 8 attempts by
// default), or the test suites' own timings, which are environment variables and not config keys.

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
    expect(deliveryOptionsFor(result.config.push, {})).toEqual({
      options: { timeoutMs: 15_000, maxAttempts: 8, retryBaseMs: 2000, retryMaxMs: 300_000 },
      warnings: [],
    });
  });
});

describe('the test-only timings (not configuration)', () => {
  const push = { timeoutSeconds: 15, maxAttempts: 8, retryBaseSeconds: 2, retryMaxSeconds: 300 } as Parameters<typeof deliveryOptionsFor>[0];

  it('are not config keys: the loader ignores them and the bounds still hold', () => {
    const result = load({ KEEL_TEST_PUSH_TIMEOUT_SECONDS: '0.5', KEEL_TEST_PUSH_MAX_ATTEMPTS: '30' });
    expect(result.ok && result.config.push).toMatchObject({ timeoutSeconds: 15, maxAttempts: 8 });
  });

  it('replace the worker timeout and attempt limit, each with a warning', () => {
    const { options, warnings } = deliveryOptionsFor(push, { KEEL_TEST_PUSH_TIMEOUT_SECONDS: '0.5', KEEL_TEST_PUSH_MAX_ATTEMPTS: '30' });
    expect(options).toEqual({ timeoutMs: 500, maxAttempts: 30, retryBaseMs: 2000, retryMaxMs: 300_000 });
    expect(warnings).toEqual([
      'KEEL_TEST_PUSH_TIMEOUT_SECONDS=0.5: test-only push timeout in effect, not push.timeoutSeconds',
      'KEEL_TEST_PUSH_MAX_ATTEMPTS=30: test-only push attempt limit in effect, not push.maxAttempts',
    ]);
  });

  it('ignore a value that is not a valid number, saying so', () => {
    const { options, warnings } = deliveryOptionsFor(push, { KEEL_TEST_PUSH_TIMEOUT_SECONDS: 'soon', KEEL_TEST_PUSH_MAX_ATTEMPTS: '2.5' });
    expect(options).toMatchObject({ timeoutMs: 15_000, maxAttempts: 8 });
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toContain('KEEL_TEST_PUSH_TIMEOUT_SECONDS="soon" ignored');
    expect(warnings[1]).toContain('KEEL_TEST_PUSH_MAX_ATTEMPTS="2.5" ignored');
  });
});
