import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig, type KeelConfig } from '../../src/config/load-config.js';
import { silentLogger, type KeelLogger } from '../../src/log/logger.js';
import { encodeMasterKey, generateMasterKey } from '../../src/sealing/master-key.js';
import type { PushTestTimings } from '../../src/push/delivery-options.js';
import { startKeel, type KeelInstance, type StartOptions } from '../../src/runtime/start-keel.js';
import { createMigratedDatabase } from './test-database.js';
import { TEST_REDIS_URL, testQueueKind, testQueuePrefix } from './test-queues.js';
import { SUITE_WRITE_PATH_ENV } from './suite-write-path.js';

export type TestKeel = KeelInstance & { config: KeelConfig; databaseUrl: string; masterKey: string; dispose: () => Promise<void> };

export function tempDir(prefix = 'keel-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/**
 * Two files run at once on the machine's Postgres (max_connections 100), some with two or three
 * Keels alive: each test Keel, in-process or a `keel start` child, sizes its pools down (decision
 * 0040): 10 of its own, 11 for its queues on the Postgres queue backend.
 */
export const TEST_POOL_ENV = { KEEL_DATABASE_MAX_CONNECTIONS: '10', KEEL_QUEUE_CONNECTIONS_PER_WORKER: '2' } as const;

const stringValues = (values: Record<string, unknown>): Record<string, string> =>
  Object.fromEntries(Object.entries(values).map(([key, value]) => [key, typeof value === 'string' ? value : JSON.stringify(value)]));

/**
 * Builds a config the way an operator would (YAML-shaped input through the real loader) on a
 * database of its own and the suite's queue backend.
 */
export function testConfig(databaseUrl: string, overrides: Record<string, unknown> = {}, env: Record<string, string> = {}): KeelConfig {
  const loaded = loadConfig({
    configPath: undefined,
    cwd: tempDir(),
    env: {
      KEEL_DATABASE_URL: databaseUrl,
      KEEL_SERVER_PORT: '0',
      // Stopped at once: no load balancer to drain in a test (docs/deploy.md, "Shutdown timing").
      KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: '0',
      KEEL_DATA_DIR: tempDir('keel-data-'),
      KEEL_QUEUE_PREFIX: testQueuePrefix(),
      ...(testQueueKind() === 'redis' ? { KEEL_QUEUE_REDIS_URL: TEST_REDIS_URL } : {}),
      ...TEST_POOL_ENV,
      ...SUITE_WRITE_PATH_ENV,
      ...stringValues(overrides),
      ...env,
    },
  });
  if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
  return loaded.config;
}

export async function startTestKeel(
  options: {
    env?: Record<string, string>;
    overrides?: Record<string, unknown>;
    logger?: KeelLogger;
    start?: StartOptions;
    databaseUrl?: string;
    /** Push timings beyond the configuration's bounds (src/push/delivery-options.ts): only a test's start can pass them. */
    pushTestTimings?: PushTestTimings;
  } = {},
): Promise<TestKeel> {
  const database = options.databaseUrl ? null : await createMigratedDatabase();
  const databaseUrl = options.databaseUrl ?? database!.url;
  const masterKey = options.env?.KEEL_MASTER_KEY ?? encodeMasterKey(generateMasterKey());
  const config = testConfig(databaseUrl, options.overrides, options.env);
  const started = await startKeel(config, options.logger ?? silentLogger(), {
    env: { ...stringValues(options.overrides ?? {}), ...options.env, KEEL_MASTER_KEY: masterKey },
    notice: () => undefined,
    ...(options.pushTestTimings ? { pushTestTimings: options.pushTestTimings } : {}),
    ...options.start,
  });
  if (!started.ok) {
    await database?.drop();
    throw new Error(`keel did not start (${started.stage}): ${started.message}`);
  }
  return {
    ...started.keel,
    config,
    databaseUrl,
    masterKey,
    dispose: async () => {
      await started.keel.stop();
      await database?.drop();
    },
  };
}

/** The environment a `keel` CLI child needs to reach the same database, queues and key as `keel`. */
export function cliEnvFor(keel: TestKeel): Record<string, string> {
  return {
    KEEL_DATABASE_URL: keel.databaseUrl,
    KEEL_MASTER_KEY: keel.masterKey,
    KEEL_DATA_DIR: keel.config.dataDir,
    KEEL_QUEUE_PREFIX: keel.config.queue.prefix,
    ...(keel.config.queue.redisUrl ? { KEEL_QUEUE_REDIS_URL: keel.config.queue.redisUrl } : {}),
  };
}
