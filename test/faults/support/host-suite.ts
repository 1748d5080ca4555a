import { afterAll, beforeAll } from 'vitest';
import { HostPostgres } from './host-postgres.js';
import { HostRedis } from './host-redis.js';
import { BACKEND, Installation, type KeelNode } from './installation.js';
import { startFakeModel, startPushReceiver, type FakeModel, type PushReceiver, type ReceiverAction } from './peers.js';
import type { TestHost } from './test-host.js';
import { networkNamespacesUnavailable, TestNetwork } from './test-network.js';

// The fault suite across test hosts: one host for Postgres, one for Redis (on the Redis queue
// backend), two API hosts and two worker hosts on a TestNetwork; the fake model and the push
// receiver served by the test itself at its own address on the network, the clients sending from
// the test's namespace to both API hosts. `install` makes an installation (a database of its own
// on the Postgres host) with one Keel process on each API and worker host.

/** Why this machine cannot run the host tests (printed, and the file's tests skipped), or null. */
export const HOSTS_UNAVAILABLE = networkNamespacesUnavailable();
if (HOSTS_UNAVAILABLE) console.warn(`[faults] test hosts unavailable, the file's tests are skipped: ${HOSTS_UNAVAILABLE}`);

export type Cluster = {
  installation: Installation;
  apis: [KeelNode, KeelNode];
  workers: [KeelNode, KeelNode];
};

export type HostSuite = {
  readonly network: TestNetwork;
  readonly hosts: { postgres: TestHost; redis: TestHost; api1: TestHost; api2: TestHost; worker1: TestHost; worker2: TestHost };
  readonly postgres: HostPostgres;
  readonly redis: HostRedis | null;
  readonly model: FakeModel;
  readonly receiver: PushReceiver;
  /** An installation with a Keel process of role api on each API host and one of role worker on each worker host. */
  install: (env?: Record<string, string>) => Promise<Cluster>;
};

export type HostSuiteOptions = {
  receiver: () => ReceiverAction;
  model?: { minDelayMs: number; maxDelayMs: number };
  /** Start nothing (the file's scenarios do not apply here). */
  skip?: boolean;
};

export function useHostSuite(options: HostSuiteOptions): HostSuite {
  let network: TestNetwork | null = null;
  let hosts: HostSuite['hosts'] | null = null;
  let postgres: HostPostgres | null = null;
  let redis: HostRedis | null = null;
  let model: FakeModel | null = null;
  let receiver: PushReceiver | null = null;
  const installations: Installation[] = [];

  beforeAll(async () => {
    if (options.skip || HOSTS_UNAVAILABLE) return;
    network = TestNetwork.create();
    const made = {
      postgres: network.addHost('pg'),
      redis: network.addHost('redis'),
      api1: network.addHost('api1'),
      api2: network.addHost('api2'),
      worker1: network.addHost('worker1'),
      worker2: network.addHost('worker2'),
    };
    hosts = made;
    postgres = await HostPostgres.start(network, made.postgres);
    if (BACKEND === 'redis') redis = await HostRedis.start(made.redis);
    model = await startFakeModel({ ...(options.model ?? { minDelayMs: 200, maxDelayMs: 600 }), host: network.rootAddress });
    receiver = await startPushReceiver(options.receiver, network.rootAddress);
  });

  afterAll(async () => {
    for (const installation of installations) await installation.dispose().catch(() => undefined);
    await receiver?.close();
    await model?.close();
    await redis?.stop();
    await postgres?.stop();
    await network?.dispose();
  });

  const started = <T>(value: T | null, what: string): T => {
    if (value === null) throw new Error(`the host suite has no ${what} (beforeAll has not run)`);
    return value;
  };

  return {
    get network() {
      return started(network, 'network');
    },
    get hosts() {
      return started(hosts, 'hosts');
    },
    get postgres() {
      return started(postgres, 'Postgres host');
    },
    get redis() {
      return redis;
    },
    get model() {
      return started(model, 'model');
    },
    get receiver() {
      return started(receiver, 'push receiver');
    },
    async install(env = {}) {
      const net = started(network, 'network');
      const on = started(hosts, 'hosts');
      const installation = await Installation.create({
        postgres: started(postgres, 'Postgres host'),
        redis,
        model: started(model, 'model'),
        // The model and the push receiver are the test's own, at its address on the network.
        env: { KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: `127.0.0.1,${net.rootAddress}`, ...env },
      });
      installations.push(installation);
      const place = (host: TestHost) => ({ netns: host.netns, address: host.address });
      // One after another: six Keels starting at once on a loaded two-core machine take longer than one by one.
      const api1 = await installation.addNode('api', {}, undefined, place(on.api1));
      const api2 = await installation.addNode('api', {}, undefined, place(on.api2));
      const worker1 = await installation.addNode('worker', {}, undefined, place(on.worker1));
      const worker2 = await installation.addNode('worker', {}, undefined, place(on.worker2));
      return { installation, apis: [api1, api2], workers: [worker1, worker2] };
    },
  };
}
