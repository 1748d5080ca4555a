import { afterAll, beforeAll } from 'vitest';
import type { PushTestTimings } from '../../../src/push/delivery-options.js';
import { BACKEND, Installation } from './installation.js';
import { startFakeModel, startPushReceiver, type FakeModel, type PushReceiver, type ReceiverAction } from './peers.js';
import { startPrivatePostgres, startPrivateRedis, type PrivatePostgres, type PrivateRedis } from './services.js';

// The services a fault scenario file runs against, started once before its scenarios and stopped
// after them: the suite's private Postgres (or none: each installation's own embedded one), a
// private Redis on the Redis queue backend, the fake model and the push receiver. Installations
// made with `install` are disposed first, then the services in reverse order of their start.

export type FaultSuiteOptions = {
  /** How the push receiver answers each request; null: no receiver (the scenarios send no push). */
  receiver: (() => ReceiverAction) | null;
  /** The fake model's delay per answer; null: no model server (every agent of the file is scripted). */
  model?: { minDelayMs: number; maxDelayMs: number } | null;
  /** `private` (default): the suite's own Postgres. `embedded`: each installation's embedded Postgres. */
  postgres?: 'private' | 'embedded';
  /**
   * `backend` (default): one private Redis for the suite on the Redis queue backend, none on the
   * Postgres one. `none`: none for the suite (a scenario that needs one starts it with `startRedis`).
   */
  redis?: 'backend' | 'none';
  /** Start nothing: the file's scenarios do not apply to this queue backend and are skipped. */
  skip?: boolean;
};

export type FaultSuite = {
  /** The suite's private Postgres (not with `postgres: 'embedded'`). */
  readonly postgres: PrivatePostgres;
  /** The suite's private Redis, or null on the Postgres queue backend. */
  readonly redis: PrivateRedis | null;
  readonly model: FakeModel;
  readonly receiver: PushReceiver;
  /** A new installation on the suite's services (or on `redis` when given), disposed after the file. */
  install: (options?: { env?: Record<string, string>; redis?: PrivateRedis; pushTestTimings?: PushTestTimings }) => Promise<Installation>;
  /** One more private Redis, stopped after the file. */
  startRedis: () => Promise<PrivateRedis>;
};

const DEFAULT_MODEL = { minDelayMs: 200, maxDelayMs: 600 };

/** An Installation wants a model for its default agent; this one is never called. */
const NO_MODEL: FakeModel = { baseUrl: 'http://127.0.0.1:9/v1', calls: () => 0, close: async () => undefined };

/** Registers the file's beforeAll and afterAll; the services are there once beforeAll has run. */
export function useFaultSuite(options: FaultSuiteOptions): FaultSuite {
  let postgres: PrivatePostgres | null = null;
  let suiteRedis: PrivateRedis | null = null;
  let model: FakeModel | null = null;
  let receiver: PushReceiver | null = null;
  const redises: PrivateRedis[] = [];
  const installations: Installation[] = [];

  beforeAll(async () => {
    if (options.skip) return;
    if (options.postgres !== 'embedded') postgres = await startPrivatePostgres();
    if ((options.redis ?? 'backend') === 'backend' && BACKEND === 'redis') suiteRedis = await startPrivateRedis();
    model = options.model === null ? NO_MODEL : await startFakeModel(options.model ?? DEFAULT_MODEL);
    if (options.receiver) receiver = await startPushReceiver(options.receiver);
  });

  afterAll(async () => {
    for (const installation of installations) await installation.dispose();
    await receiver?.close();
    await model?.close();
    for (const redis of redises) await redis.stop();
    await suiteRedis?.stop();
    await postgres?.stop();
  });

  const started = <T>(value: T | null, what: string): T => {
    if (value === null) throw new Error(`the fault suite has no ${what} (see its options, or beforeAll has not run)`);
    return value;
  };

  return {
    get postgres() {
      return started(postgres, 'private Postgres');
    },
    get redis() {
      return suiteRedis;
    },
    get model() {
      return started(model, 'model');
    },
    get receiver() {
      return started(receiver, 'push receiver');
    },
    async install(installOptions = {}) {
      const installation = await Installation.create({
        postgres: options.postgres === 'embedded' ? null : started(postgres, 'private Postgres'),
        redis: installOptions.redis ?? suiteRedis,
        model: started(model, 'model'),
        ...(installOptions.env ? { env: installOptions.env } : {}),
        ...(installOptions.pushTestTimings ? { pushTestTimings: installOptions.pushTestTimings } : {}),
      });
      installations.push(installation);
      return installation;
    },
    async startRedis() {
      const redis = await startPrivateRedis();
      redises.push(redis);
      return redis;
    },
  };
}
