import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { configSchema } from '../../../src/config/config-schema.js';
import { listEnvLeaves } from '../../../src/config/env-overrides.js';
import { loadConfig } from '../../../src/config/load-config.js';
import { tempDir } from '../../support/test-keel.js';

function withFile(yaml: string, env: NodeJS.ProcessEnv = {}) {
  const dir = tempDir('keel-config-');
  const path = join(dir, 'keel.config.yaml');
  writeFileSync(path, yaml);
  return loadConfig({ configPath: path, env, cwd: dir });
}

describe('loadConfig', () => {
  it('starts on defaults without any config file', () => {
    const dir = tempDir('keel-config-');
    const result = loadConfig({ env: {}, cwd: dir });
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.config.source).toBeNull();
    expect(result.config.database.url).toBeUndefined();
    expect(result.config.queue.redisUrl).toBeUndefined();
    expect(result.config.server).toEqual({ host: '127.0.0.1', port: 8080, publicUrl: 'http://127.0.0.1:8080', bodyLimitBytes: 1_048_576, shutdownReadyDelaySeconds: 5 });
    expect(result.config.dataDir).toBe(join(dir, '.keel'));
    expect(result.config.security.masterKeyFile).toBe(join(dir, '.keel', 'master.key'));
    expect(result.config.privacy).toEqual({ level: 'metadata', retention: { agentRun: 30 } });
    expect(result.config.agents.map((agent) => agent.id)).toEqual(['echo']);
    expect(result.config.agents[0]!.limits.maxIterations).toBe(20);
  });

  it('reads ./keel.config.yaml from the working directory when present', () => {
    const dir = tempDir('keel-config-');
    writeFileSync(join(dir, 'keel.config.yaml'), 'server: { port: 9999 }\n');
    const result = loadConfig({ env: {}, cwd: dir });
    expect(result.ok && result.config.server.port).toBe(9999);
  });

  it('names the key path and the expectation for a wrong type', () => {
    const result = withFile('server:\n  port: "eighty"\n');
    expect(result).toEqual({ ok: false, problems: ['server.port: expected number, received string'] });
  });

  it('names an unknown key with its path', () => {
    const result = withFile('server:\n  prot: 8080\nqueue: {}\nsurprise: 1\n');
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.problems).toContain('server.prot: unknown key');
    expect(result.problems).toContain('surprise: unknown key');
  });

  it('gives one message per problem', () => {
    const result = withFile('server: { port: -1, host: "" }\nprivacy: { level: secret }\npush: { maxAttempts: 1.5 }\n');
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.problems).toHaveLength(4);
    expect(result.problems.some((problem) => problem.startsWith('privacy.level: expected one of "none", "metadata", "redacted", "full"'))).toBe(true);
    expect(result.problems.some((problem) => problem.startsWith('server.port:'))).toBe(true);
    expect(result.problems.some((problem) => problem.startsWith('server.host:'))).toBe(true);
    expect(result.problems.some((problem) => problem.startsWith('push.maxAttempts:'))).toBe(true);
  });

  it('sizes the connection pools: defaults, environment overrides, and a clear message for a size too small', () => {
    const defaults = withFile('');
    expect(defaults.ok && [defaults.config.database.maxConnections, defaults.config.queue.connectionsPerWorker]).toEqual([20, 6]);
    const overridden = withFile('database: { maxConnections: 8 }\n', { KEEL_QUEUE_CONNECTIONS_PER_WORKER: '3' });
    expect(overridden.ok && [overridden.config.database.maxConnections, overridden.config.queue.connectionsPerWorker]).toEqual([8, 3]);
    const tooSmall = withFile('database: { maxConnections: 1 }\nqueue: { connectionsPerWorker: 1.5 }\n');
    expect(tooSmall).toEqual({
      ok: false,
      problems: [
        'database.maxConnections: Number must be greater than or equal to 2',
        'queue.connectionsPerWorker: expected integer, received float',
        'queue.connectionsPerWorker: Number must be greater than or equal to 2',
      ],
    });
  });

  it('reports YAML syntax errors and a missing explicit file', () => {
    expect(withFile('server: [oops\n').ok).toBe(false);
    const missing = loadConfig({ configPath: '/nonexistent/keel.yaml', env: {} });
    expect(missing).toEqual({ ok: false, problems: ['config file /nonexistent/keel.yaml: not found'] });
  });

  it('takes the path from KEEL_CONFIG', () => {
    const dir = tempDir('keel-config-');
    writeFileSync(join(dir, 'other.yaml'), 'a2a: { blockingCapSeconds: 5 }\n');
    const result = loadConfig({ env: { KEEL_CONFIG: join(dir, 'other.yaml') }, cwd: dir });
    expect(result.ok && result.config.a2a.blockingCapSeconds).toBe(5);
  });

  it('lets an environment variable named by its path override every key', () => {
    const result = withFile('server: { port: 1000 }\n', {
      KEEL_SERVER_PORT: '2000',
      KEEL_DATABASE_URL: 'postgres://u@db:5432/keel',
      KEEL_QUEUE_REDIS_URL: 'redis://cache:6379',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1, localhost',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
      KEEL_PRIVACY_RETENTION_AGENT_RUN: '7',
      KEEL_DATA_DIR: '/var/lib/keel',
    });
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.config.server.port).toBe(2000);
    expect(result.config.server.publicUrl).toBe('http://127.0.0.1:2000');
    expect(result.config.database.url).toBe('postgres://u@db:5432/keel');
    expect(result.config.queue.redisUrl).toBe('redis://cache:6379');
    expect(result.config.security.addressGuard).toEqual({ allowHosts: ['127.0.0.1', 'localhost'], allowHttp: true });
    expect(result.config.privacy.retention.agentRun).toBe(7);
    expect(result.config.dataDir).toBe('/var/lib/keel');
  });

  it('names the variable when an override is invalid', () => {
    const result = withFile('', { KEEL_SERVER_PORT: 'abc', KEEL_AUTH_MODE: 'open' });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.problems).toContain('server.port: expected a number, got "abc" (from KEEL_SERVER_PORT)');
    expect(result.problems.some((problem) => problem.startsWith('auth.mode:') && problem.endsWith('(from KEEL_AUTH_MODE)'))).toBe(true);
  });

  it('has an environment variable for every key of the schema', () => {
    const names = listEnvLeaves(configSchema).map((leaf) => leaf.envName);
    expect(names).toEqual(
      expect.arrayContaining([
        'KEEL_SERVER_HOST',
        'KEEL_SERVER_PORT',
        'KEEL_SERVER_PUBLIC_URL',
        'KEEL_SERVER_BODY_LIMIT_BYTES',
        'KEEL_DATABASE_URL',
        'KEEL_QUEUE_REDIS_URL',
        'KEEL_DATA_DIR',
        'KEEL_AUTH_MODE',
        'KEEL_SECURITY_MASTER_KEY_FILE',
        'KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS',
        'KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP',
        'KEEL_PRIVACY_LEVEL',
        'KEEL_PRIVACY_RETENTION_AGENT_RUN',
        'KEEL_A2A_BLOCKING_CAP_SECONDS',
        'KEEL_PUSH_TIMEOUT_SECONDS',
        'KEEL_PUSH_MAX_ATTEMPTS',
        'KEEL_PUSH_DEADLINE_HOURS',
        'KEEL_PROVIDERS',
        'KEEL_AGENTS',
        'KEEL_REMOTE_AGENTS',
      ]),
    );
  });

  it('checks references between agents and providers, naming the agent', () => {
    const result = withFile('providers: { echo: { type: echo } }\nagents:\n  - { id: helper, name: Helper, provider: missing, fallbacks: [echo, gone] }\n');
    expect(result).toEqual({
      ok: false,
      problems: [
        'agents.0 (helper): provider "missing" is not defined under providers',
        'agents.0 (helper): provider "gone" is not defined under providers',
      ],
    });
  });

  it('refuses auth.mode none unless the server binds only to loopback', () => {
    expect(withFile('auth: { mode: none }\n').ok).toBe(true);
    const result = withFile('auth: { mode: none }\nserver: { host: 0.0.0.0 }\n');
    expect(result).toEqual({ ok: false, problems: ['auth.mode: "none" is only allowed when server.host is a loopback address, not "0.0.0.0"'] });
  });

  it('accepts the documented example file', () => {
    const result = loadConfig({ configPath: new URL('../../../keel.config.example.yaml', import.meta.url).pathname, env: { LLM_API_KEY: 'x' } });
    if (!result.ok) throw new Error(result.problems.join('\n'));
    expect(result.config.agents.length).toBeGreaterThan(0);
  });
});
