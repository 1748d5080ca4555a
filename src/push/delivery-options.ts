import type { KeelConfig } from '../config/load-config.js';

// The push worker's timings. They come from the `push` section of the config, whose keys are
// bounded as the A2A specification and docs/push.md require (timeout 10-30 s, at most 8 attempts).
// Keel's own test suites need sub-second timeouts and, in a fault scenario, more attempts; they
// get them through two environment variables that are not configuration keys (the config loader
// neither reads nor lists them, no config file can name them), and setting one is logged as a
// warning at start (docs/decisions/0013-push-bearer-only-and-bounded-timings.md).

export type DeliveryOptions = { timeoutMs: number; maxAttempts: number; retryBaseMs: number; retryMaxMs: number };

export const TEST_PUSH_TIMEOUT_ENV = 'KEEL_TEST_PUSH_TIMEOUT_SECONDS';
export const TEST_PUSH_MAX_ATTEMPTS_ENV = 'KEEL_TEST_PUSH_MAX_ATTEMPTS';

export type DeliveryOptionsResult = { options: DeliveryOptions; warnings: string[] };

/** The delivery options of the config, with the test-only overrides of `env` applied. */
export function deliveryOptionsFor(push: KeelConfig['push'], env: NodeJS.ProcessEnv): DeliveryOptionsResult {
  const options: DeliveryOptions = {
    timeoutMs: push.timeoutSeconds * 1000,
    maxAttempts: push.maxAttempts,
    retryBaseMs: push.retryBaseSeconds * 1000,
    retryMaxMs: push.retryMaxSeconds * 1000,
  };
  const warnings: string[] = [];
  const timeout = testValue(env, TEST_PUSH_TIMEOUT_ENV, (value) => value > 0 && value <= 300);
  if (timeout.kind === 'set') {
    options.timeoutMs = timeout.value * 1000;
    warnings.push(`${TEST_PUSH_TIMEOUT_ENV}=${timeout.value}: test-only push timeout in effect, not push.timeoutSeconds`);
  } else if (timeout.kind === 'invalid') {
    warnings.push(`${TEST_PUSH_TIMEOUT_ENV}="${timeout.raw}" ignored: expected seconds above 0 and at most 300`);
  }
  const attempts = testValue(env, TEST_PUSH_MAX_ATTEMPTS_ENV, (value) => Number.isInteger(value) && value >= 1 && value <= 100);
  if (attempts.kind === 'set') {
    options.maxAttempts = attempts.value;
    warnings.push(`${TEST_PUSH_MAX_ATTEMPTS_ENV}=${attempts.value}: test-only push attempt limit in effect, not push.maxAttempts`);
  } else if (attempts.kind === 'invalid') {
    warnings.push(`${TEST_PUSH_MAX_ATTEMPTS_ENV}="${attempts.raw}" ignored: expected a whole number from 1 to 100`);
  }
  return { options, warnings };
}

type TestValue = { kind: 'unset' } | { kind: 'set'; value: number } | { kind: 'invalid'; raw: string };

function testValue(env: NodeJS.ProcessEnv, name: string, valid: (value: number) => boolean): TestValue {
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return { kind: 'unset' };
  const value = Number(raw.trim());
  return Number.isFinite(value) && valid(value) ? { kind: 'set', value } : { kind: 'invalid', raw };
}
