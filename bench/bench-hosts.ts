import { spawn, type ChildProcess } from 'node:child_process';
import type { TestHost } from '../test/faults/support/test-host.js';
import { networkNamespacesUnavailable, TestNetwork } from '../test/faults/support/test-network.js';
import { freePort } from './keel-harness.js';

// bench:a2a's hosts mode (BENCH_KEEL_HOSTS=1): the split topology's four Keel processes each on a
// test host of its own (a network namespace on a bridge, test/faults/support/test-network.ts),
// every packet into or out of a Keel host delayed BENCH_HOST_LINK_MS (1 ms): a round trip from a
// Keel process to Postgres, to Redis or to a client takes 2 × that longer. Postgres (the bench's
// private cluster) and a Redis of the bench's own listen on the bench's (root namespace's) address
// on that network, where the load generator runs too: the database host.

export type BenchHosts = {
  network: TestNetwork;
  /** api1, api2, worker1, worker2: the split topology's roles in order. */
  hosts: TestHost[];
  /** The bench's address on the network (Postgres and Redis listen there). */
  address: string;
  cidr: string;
  linkMs: number;
  /** A redis-server of the bench's own on `address` (the Redis queue). */
  redisUrl: string;
  stop: () => Promise<void>;
};

export async function startBenchHosts(linkMs: number): Promise<BenchHosts> {
  const unavailable = networkNamespacesUnavailable();
  if (unavailable) throw new Error(`BENCH_KEEL_HOSTS: ${unavailable}`);
  const network = TestNetwork.create();
  let redis: ChildProcess | null = null;
  try {
    const hosts = ['api1', 'api2', 'worker1', 'worker2'].map((name) => network.addHost(name));
    if (linkMs > 0) for (const host of hosts) await network.slowLink(host, { delayMs: linkMs });
    const port = await freePort();
    const started = spawn('redis-server', ['--bind', network.rootAddress, '--port', String(port), '--save', '', '--appendonly', 'no', '--protected-mode', 'no'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    redis = started;
    await new Promise<void>((resolve, reject) => {
      let output = '';
      const timer = setTimeout(() => reject(new Error(`redis-server did not start:\n${output}`)), 10_000);
      started.stdout!.on('data', (chunk: Buffer) => {
        output += chunk.toString('utf8');
        if (output.includes('Ready to accept connections')) {
          clearTimeout(timer);
          resolve();
        }
      });
      started.once('exit', (code) => reject(new Error(`redis-server exited (${code}):\n${output}`)));
    });
    return {
      network,
      hosts,
      address: network.rootAddress,
      cidr: `${network.rootAddress.replace(/\.1$/, '.0')}/24`,
      linkMs,
      redisUrl: `redis://${network.rootAddress}:${port}`,
      stop: async () => {
        started.kill('SIGKILL');
        await network.dispose();
      },
    };
  } catch (error) {
    redis?.kill('SIGKILL');
    await network.dispose();
    throw error;
  }
}
