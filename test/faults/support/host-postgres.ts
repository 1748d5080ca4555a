import { execFileSync, type ChildProcess } from 'node:child_process';
import { appendFileSync, chownSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { sleep } from './services.js';
import type { TestHost } from './test-host.js';
import type { TestNetwork } from './test-network.js';

// A Postgres cluster of its own on a test host: Debian's server binaries (initdb, postgres from
// /usr/lib/postgresql/<version>/bin), a data directory in the network's temp space, run as the
// user postgres (initdb refuses root) inside the host's namespace and listening on the host's
// address only. The machine's own Postgres is never touched.

const PORT = 5432;

function serverBin(): string {
  const versions = readdirSync('/usr/lib/postgresql')
    .filter((entry) => /^\d+$/.test(entry))
    .sort((a, b) => Number(b) - Number(a));
  if (versions.length === 0) throw new Error('no Postgres server in /usr/lib/postgresql (install postgresql)');
  return `/usr/lib/postgresql/${versions[0]}/bin`;
}

/** `setpriv` to the user postgres: it execs the program (the child's pid is the server's). */
const AS_POSTGRES = ['--reuid=postgres', '--regid=postgres', '--init-groups'];

export class HostPostgres {
  private server: ChildProcess | null = null;
  private readonly output: string[] = [];

  private constructor(
    readonly host: TestHost,
    private readonly dataDir: string,
  ) {}

  static async start(network: TestNetwork, host: TestHost): Promise<HostPostgres> {
    const root = network.tempDir('pg');
    chownSync(root, Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' })), Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' })));
    const dataDir = join(root, 'data');
    execFileSync('setpriv', [...AS_POSTGRES, `${serverBin()}/initdb`, '-D', dataDir, '-U', 'postgres', '--auth=trust', '--no-sync', '-E', 'UTF8', '--locale=C'], {
      stdio: 'pipe',
    });
    // Trust on the test network only (a private /24 of the test's own): the hosts connect over TCP.
    appendFileSync(join(dataDir, 'pg_hba.conf'), `host all all ${network.rootAddress.replace(/\.1$/, '.0')}/24 trust\n`);
    const postgres = new HostPostgres(host, dataDir);
    await postgres.launch(root);
    return postgres;
  }

  get url(): string {
    return this.urlOf('postgres');
  }

  urlOf(database: string): string {
    return `postgres://postgres@${this.host.address}:${PORT}/${database}`;
  }

  async createDatabase(name: string): Promise<string> {
    const client = new pg.Client({ connectionString: this.url });
    await client.connect();
    try {
      await client.query(`CREATE DATABASE ${name}`);
    } finally {
      await client.end();
    }
    return this.urlOf(name);
  }

  private async launch(socketDir: string): Promise<void> {
    const server = this.host.spawn('setpriv', [
      ...AS_POSTGRES,
      `${serverBin()}/postgres`,
      '-D',
      this.dataDir,
      '-c',
      `listen_addresses=${this.host.address}`,
      '-c',
      `port=${PORT}`,
      '-c',
      `unix_socket_directories=${socketDir}`,
      // Six Keel processes on the Postgres queue backend hold a few dozen connections each.
      '-c',
      'max_connections=500',
      // A test cluster: no crash here is Postgres's own (the host is cut off, not killed).
      '-c',
      'fsync=off',
      '-c',
      'shared_buffers=64MB',
    ]);
    this.server = server;
    server.stdout!.on('data', (chunk: Buffer) => this.output.push(chunk.toString('utf8')));
    server.stderr!.on('data', (chunk: Buffer) => this.output.push(chunk.toString('utf8')));
    const deadline = Date.now() + 30_000;
    for (;;) {
      if (server.exitCode !== null) throw new Error(`Postgres on ${this.host.name} exited (${server.exitCode}):\n${this.output.join('')}`);
      try {
        const client = new pg.Client({ connectionString: this.url, connectionTimeoutMillis: 1000 });
        await client.connect();
        await client.end();
        return;
      } catch {
        if (Date.now() > deadline) throw new Error(`Postgres on ${this.host.name} did not answer within 30 s:\n${this.output.join('')}`);
        await sleep(100);
      }
    }
  }

  /** Fast shutdown (the network's disposal kills what is left on the host anyway). */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (!server || server.exitCode !== null || server.signalCode !== null) return;
    const exited = new Promise((resolve) => server.once('exit', resolve));
    server.kill('SIGINT');
    const timer = setTimeout(() => server.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}
