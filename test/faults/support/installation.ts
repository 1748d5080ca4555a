import { randomBytes } from 'node:crypto';
import { createWriteStream, existsSync, readFileSync, rmSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type { DatabasePool } from 'slonik';
import { createClient } from '../../../src/auth/client-repository.js';
import { runningEmbeddedUrl } from '../../../src/db/embedded-postgres.js';
import { migrate } from '../../../src/db/migrate.js';
import { createDatabasePool } from '../../../src/db/pool.js';
import { encodeMasterKey, generateMasterKey, MasterKeyRing } from '../../../src/sealing/master-key.js';
import { createSealer, type Sealer } from '../../../src/sealing/sealer.js';
import type { PushTestTimings } from '../../../src/push/delivery-options.js';
import { cleanEnv, runKeel, spawnKeel, type KeelProcess } from '../../support/keel-process.js';
import { testQueueKind } from '../../support/test-queues.js';
import type { FakeModel } from './peers.js';
import { freePort, openTempDir, sleep, type PrivatePostgres, type PrivateRedis } from './services.js';

// One Keel installation of a fault scenario: its database (a database of the suite's private
// Postgres, or Keel's own embedded one), its queue backend (the suite's private Redis, or BullMQ on
// Postgres), a master key, a client token, and any number of real `keel start --role ...` child
// processes sharing them.

export const BACKEND = testQueueKind();

export type Role = 'api' | 'worker' | 'all';

/** The timings the fault suite runs with: short leases and sweeps, so recovery takes seconds. */
export const FAULT_TIMINGS: Record<string, string> = {
  KEEL_RUNS_LEASE_SECONDS: '2',
  KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
  KEEL_RUNS_REQUEUE_BASE_SECONDS: '0.5',
  KEEL_RUNS_REQUEUE_MAX_SECONDS: '2',
  KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
  KEEL_PUSH_RETRY_BASE_SECONDS: '0.05',
  KEEL_PUSH_RETRY_MAX_SECONDS: '1',
  KEEL_A2A_BLOCKING_CAP_SECONDS: '5',
  KEEL_RUNS_SHUTDOWN_GRACE_SECONDS: '2',
  // A node stopped by a scenario closes its listener at once (no load balancer to drain).
  KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: '0',
  // Every task of a scenario pushes to the one test receiver, which stands for many clients'
  // destinations: with the default share (a quarter of the 16 push slots per destination) the
  // outbox drained at 10-15 deliveries/s on the loaded CI machine and most of a scenario's time
  // was that wait. Isolation between destinations has its own tests (test/integration/push/).
  KEEL_PUSH_DESTINATION_SHARE: '1',
  // A breaker that opens probes again after 1 s, not the default 30 s: the flaky receiver fails
  // half its attempts that count (resets and timeouts against successes), so five in a row come
  // every few dozen attempts, and each opening held every delivery for 30 s. In one CI run 123 of
  // its 720 deliveries were still pending after the scenario's 90 s wait.
  KEEL_PUSH_BREAKER_COOLDOWN_SECONDS: '1',
};

/**
 * The push timeout the fault suite runs with (1 s, below the configuration's 10-30 s): handed to
 * each child through the harness's entry (test/support/keel-harness-entry.js), not its environment.
 */
export const FAULT_PUSH_TEST_TIMINGS: PushTestTimings = { timeoutSeconds: 1 };

/** Where a node runs when not on the machine's own network: a test host's namespace and address. */
export type NodePlacement = { netns: string; address: string };

export class KeelNode {
  proc: KeelProcess | null = null;
  readonly url: string;
  /** Every child this node has been, oldest first (for logs). */
  readonly generations: KeelProcess[] = [];

  constructor(
    readonly role: Role,
    readonly port: number,
    /** The process's working and data directory. */
    readonly dataDir: string,
    private readonly env: Record<string, string>,
    private readonly pushTestTimings: PushTestTimings = FAULT_PUSH_TEST_TIMINGS,
    /** A test host (test/faults/support/test-network.ts): the process runs in its namespace. */
    readonly placement: NodePlacement | null = null,
  ) {
    this.url = `http://${placement?.address ?? '127.0.0.1'}:${port}`;
  }

  get alive(): boolean {
    return this.proc !== null && this.proc.child.exitCode === null && this.proc.child.signalCode === null;
  }

  /** The prefix of this process's worker id in `runs.claimed_by` (`host:pid:nonce`). */
  get workerPrefix(): string {
    return `${hostname()}:${this.proc?.child.pid ?? 0}:`;
  }

  async start(): Promise<void> {
    const proc = spawnKeel(['start', '--role', this.role], {
      cwd: this.dataDir,
      // KEEL_FAULTS_LOG_LEVEL (e.g. debug) to see what the processes did, KEEL_FAULTS_LOG_DIR to keep
      // every line of each process in a file of its own (<role>-<address>-<port>.log).
      env: cleanEnv({ ...this.env, KEEL_LOG_LEVEL: process.env.KEEL_FAULTS_LOG_LEVEL ?? 'warn' }),
      harness: { pushTestTimings: this.pushTestTimings },
      ...(this.placement ? { netns: this.placement.netns } : {}),
    });
    this.proc = proc;
    this.generations.push(proc);
    const logDir = process.env.KEEL_FAULTS_LOG_DIR;
    if (logDir) {
      const file = createWriteStream(join(logDir, `${this.role}-${this.placement?.address ?? '127.0.0.1'}-${this.port}.log`), { flags: 'a' });
      proc.child.stdout!.on('data', (chunk: Buffer) => file.write(chunk));
      proc.child.stderr!.on('data', (chunk: Buffer) => file.write(chunk));
      proc.child.on('exit', () => file.end());
    }
    // At warn, "keel is ready" (info) is not logged: readiness is the HTTP endpoint answering.
    const deadline = Date.now() + 90_000;
    for (;;) {
      if (!this.alive) throw new Error(`keel --role ${this.role} exited during start:\n${proc.lines.slice(-40).join('\n')}`);
      try {
        const response = await fetch(`${this.url}/readyz`, { signal: AbortSignal.timeout(2000) });
        if (response.status === 200) return;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`keel --role ${this.role} not ready within 90 s:\n${proc.lines.slice(-40).join('\n')}`);
      await sleep(100);
    }
  }

  async kill(): Promise<void> {
    const proc = this.proc;
    if (!proc || !this.alive) return;
    proc.child.kill('SIGKILL');
    await proc.exited;
  }

  /** SIGTERM (graceful shutdown), SIGKILL after `graceMs`. Returns the exit code. */
  async stop(graceMs = 20_000): Promise<number | null> {
    const proc = this.proc;
    if (!proc || !this.alive) return proc?.child.exitCode ?? null;
    proc.child.kill('SIGTERM');
    const timer = setTimeout(() => proc.child.kill('SIGKILL'), graceMs);
    const exit = await proc.exited;
    clearTimeout(timer);
    return exit.code;
  }

  tail(lines = 30): string {
    return this.generations
      .map((proc, index) => `--- ${this.role} :${this.port} generation ${index + 1} (pid ${proc.child.pid}) ---\n${proc.lines.slice(-lines).join('\n')}`)
      .join('\n');
  }
}

export type InstallationOptions = {
  /** A database of the suite's private Postgres (or a test host's); null: Keel's own embedded Postgres in its data directory. */
  postgres: Pick<PrivatePostgres, 'createDatabase'> | null;
  /** The private Redis (the Redis queue backend, or a test host's), or null for BullMQ on Postgres. */
  redis: Pick<PrivateRedis, 'url'> | null;
  model: FakeModel;
  env?: Record<string, string>;
  /** Push timings beyond the configuration's bounds, over FAULT_PUSH_TEST_TIMINGS. */
  pushTestTimings?: PushTestTimings;
};

export class Installation {
  readonly nodes: KeelNode[] = [];
  readonly masterKey = generateMasterKey();
  readonly sealer: Sealer = createSealer(new MasterKeyRing([this.masterKey]));
  readonly prefix = `kf${randomBytes(5).toString('hex')}`;
  readonly env: Record<string, string>;
  /** Shared by the processes of an embedded installation (one at a time). */
  readonly dataDir = openTempDir('keel-faults-data-');
  databaseUrl = '';
  token = '';
  private poolPromise: Promise<DatabasePool> | null = null;

  private constructor(readonly options: InstallationOptions) {
    this.env = {
      KEEL_MASTER_KEY: encodeMasterKey(this.masterKey),
      KEEL_QUEUE_PREFIX: this.prefix,
      ...(options.redis ? { KEEL_QUEUE_REDIS_URL: options.redis.url } : {}),
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
      KEEL_PROVIDERS: JSON.stringify({ fake: { type: 'openai', baseUrl: options.model.baseUrl, model: 'fake', timeoutSeconds: 10 } }),
      KEEL_AGENTS: JSON.stringify([{ id: 'model', name: 'Model', provider: 'fake', privacy: { answerLevel: 'full' } }]),
      ...FAULT_TIMINGS,
      ...options.env,
    };
  }

  get embedded(): boolean {
    return this.options.postgres === null;
  }

  static async create(options: InstallationOptions): Promise<Installation> {
    const installation = new Installation(options);
    if (options.postgres) {
      installation.databaseUrl = await options.postgres.createDatabase(`keel_faults_${randomBytes(5).toString('hex')}`);
      installation.env.KEEL_DATABASE_URL = installation.databaseUrl;
      const migrated = await migrate(installation.databaseUrl);
      if (!migrated.ok) throw new Error(migrated.message);
      const pool = await installation.pool();
      const created = await createClient(pool, 'faults');
      if (!created.ok) throw new Error('cannot create the fault client');
      installation.token = created.token;
    }
    return installation;
  }

  /** The test's own pool on the installation's database (recreated when an embedded server moved). */
  pool(): Promise<DatabasePool> {
    this.poolPromise ??= createDatabasePool(this.databaseUrl, { maximumPoolSize: 4, applicationName: 'keel-faults-counter' });
    return this.poolPromise;
  }

  /** A node; with `placement`, on a test host (listening on every address of its namespace, at `port` or 8080). */
  async addNode(role: Role, extraEnv: Record<string, string> = {}, port?: number, placement?: NodePlacement): Promise<KeelNode> {
    port ??= placement ? 8080 : await freePort();
    const env = {
      ...this.env,
      KEEL_SERVER_PORT: String(port),
      ...(placement ? { KEEL_SERVER_HOST: '0.0.0.0' } : {}),
      KEEL_DATA_DIR: this.embedded ? this.dataDir : openTempDir('keel-faults-node-'),
      ...extraEnv,
    };
    const node = new KeelNode(role, port, this.embedded ? this.dataDir : env.KEEL_DATA_DIR!, env, { ...FAULT_PUSH_TEST_TIMINGS, ...this.options.pushTestTimings }, placement ?? null);
    this.nodes.push(node);
    await node.start();
    if (this.embedded) await this.afterEmbeddedStart();
    return node;
  }

  /** After an embedded server (re)started: its URL (a new port each start), the pool, the client. */
  async afterEmbeddedStart(): Promise<void> {
    const url = runningEmbeddedUrl(this.dataDir);
    if (!url) throw new Error('the embedded Postgres is not running');
    if (url !== this.databaseUrl) {
      const old = this.poolPromise;
      this.poolPromise = null;
      if (old) await (await old).end().catch(() => undefined);
      this.databaseUrl = url;
    }
    if (!this.token) {
      const added = await runKeel(['clients', 'add', 'faults'], { cwd: this.dataDir, env: cleanEnv({ ...this.env, KEEL_DATA_DIR: this.dataDir }) });
      if (added.code !== 0) throw new Error(`keel clients add failed (${added.code}): ${added.stderr}`);
      this.token = added.stdout.trim();
    }
  }

  apiUrls(): string[] {
    return this.nodes.filter((node) => node.role !== 'worker').map((node) => node.url);
  }

  logs(lines = 30): string {
    return this.nodes.map((node) => node.tail(lines)).join('\n');
  }

  async dispose(): Promise<void> {
    // A node that stops cleanly takes about 100 ms. One that was cut off from Postgres and healed
    // waits for its old connections' TCP retransmissions (backed off during the cut) to meet the
    // server's reset, 7-14 s; the scenario is over and its shutdown is not what it tests
    // (graceful shutdown is streams-across-processes.test.ts's), so it is killed after 3 s.
    await Promise.all(this.nodes.map((node) => node.stop(3_000).catch(() => undefined)));
    const dirs = new Set([this.dataDir, ...this.nodes.map((node) => node.dataDir)]);
    if (this.poolPromise) await (await this.poolPromise).end().catch(() => undefined);
    if (this.embedded) {
      // A SIGKILLed `all` process leaves its embedded server running; the last one stopped it, but be sure.
      const pidFile = join(this.dataDir, 'pg', 'postmaster.pid');
      if (existsSync(pidFile)) {
        try {
          process.kill(Number(readFileSync(pidFile, 'utf8').split('\n')[0]), 'SIGINT');
        } catch {
          // already gone
        }
      }
    }
    for (const dir of dirs) {
      try {
        rmSync(dir, { recursive: true, force: true });
      } catch {
        // a server still shutting down may hold a file a moment longer: the temp dir stays
      }
    }
  }
}
