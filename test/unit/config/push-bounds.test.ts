import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config/load-config.js';
import { tempDir } from '../../support/test-keel.js';

// The push timings an operator may set: `push.timeoutSeconds` within the 10-30 s the A2A
// specification gives a sender (15 by default), `push.maxAttempts` at most 8 (the default), from
// the config file and from their environment overrides alike. Anything else is refused with a
// message naming the key.

function load(yaml: string, env: NodeJS.ProcessEnv = {}) {
  const dir = tempDir('keel-push-bounds-');
  const path = join(dir, 'keel.config.yaml');
  writeFileSync(path, yaml);
  return loadConfig({ configPath: path, env, cwd: dir });
}

const TIMEOUT_MESSAGE = 'push.timeoutSeconds: must be between 10 and 30 seconds (the A2A push timeout)';
const ATTEMPTS_MESSAGE = 'push.maxAttempts: must be between 1 and 8';

describe('push.timeoutSeconds and push.maxAttempts', () => {
  it('default to 15 s and 8 attempts', () => {
    const result = load('');
    if (!result.ok) throw new Error(result.problems.join('\n'));
    expect(result.config.push).toMatchObject({ timeoutSeconds: 15, maxAttempts: 8 });
  });

  it.each([10, 12.5, 30])('accepts timeoutSeconds %s', (seconds) => {
    const result = load(`push: { timeoutSeconds: ${seconds} }\n`);
    expect(result.ok && result.config.push.timeoutSeconds).toBe(seconds);
  });

  it.each([0.5, 1, 9.99, 30.01, 60, 300])('refuses timeoutSeconds %s from the file, naming the key', (seconds) => {
    expect(load(`push: { timeoutSeconds: ${seconds} }\n`)).toEqual({ ok: false, problems: [TIMEOUT_MESSAGE] });
  });

  it.each(['2', '9', '31', '300'])('refuses KEEL_PUSH_TIMEOUT_SECONDS=%s, naming the key and the variable', (value) => {
    expect(load('', { KEEL_PUSH_TIMEOUT_SECONDS: value })).toEqual({ ok: false, problems: [`${TIMEOUT_MESSAGE} (from KEEL_PUSH_TIMEOUT_SECONDS)`] });
  });

  it('takes a KEEL_PUSH_TIMEOUT_SECONDS within the bounds', () => {
    const result = load('push: { timeoutSeconds: 12 }\n', { KEEL_PUSH_TIMEOUT_SECONDS: '25' });
    expect(result.ok && result.config.push.timeoutSeconds).toBe(25);
  });

  it.each([1, 5, 8])('accepts maxAttempts %s', (attempts) => {
    const result = load(`push: { maxAttempts: ${attempts} }\n`);
    expect(result.ok && result.config.push.maxAttempts).toBe(attempts);
  });

  it.each([0, 9, 30, 100])('refuses maxAttempts %s from the file, naming the key', (attempts) => {
    expect(load(`push: { maxAttempts: ${attempts} }\n`)).toEqual({ ok: false, problems: [ATTEMPTS_MESSAGE] });
  });

  it.each(['0', '9', '30'])('refuses KEEL_PUSH_MAX_ATTEMPTS=%s, naming the key and the variable', (value) => {
    expect(load('', { KEEL_PUSH_MAX_ATTEMPTS: value })).toEqual({ ok: false, problems: [`${ATTEMPTS_MESSAGE} (from KEEL_PUSH_MAX_ATTEMPTS)`] });
  });

  it('reports both keys at once', () => {
    const result = load('push: { timeoutSeconds: 5, maxAttempts: 20 }\n');
    expect(result).toEqual({ ok: false, problems: [TIMEOUT_MESSAGE, ATTEMPTS_MESSAGE] });
  });
});
