import type { ChildProcess } from 'node:child_process';
import type { TestHost } from './test-host.js';

// A redis-server of its own on a test host, listening on the host's address only, without
// persistence. The machine's own Redis is never touched.

const PORT = 6379;

export class HostRedis {
  private constructor(
    readonly host: TestHost,
    private readonly server: ChildProcess,
  ) {}

  static async start(host: TestHost): Promise<HostRedis> {
    const server = host.spawn('redis-server', ['--bind', host.address, '--port', String(PORT), '--save', '', '--appendonly', 'no', '--daemonize', 'no', '--protected-mode', 'no']);
    await new Promise<void>((resolve, reject) => {
      let output = '';
      const timer = setTimeout(() => reject(new Error(`redis-server on ${host.name} did not start:\n${output}`)), 10_000);
      server.stdout!.on('data', (chunk: Buffer) => {
        output += chunk.toString('utf8');
        if (output.includes('Ready to accept connections')) {
          clearTimeout(timer);
          resolve();
        }
      });
      server.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`redis-server on ${host.name} exited (${code}):\n${output}`));
      });
    });
    return new HostRedis(host, server);
  }

  get url(): string {
    return `redis://${this.host.address}:${PORT}`;
  }

  async stop(): Promise<void> {
    if (this.server.exitCode !== null || this.server.signalCode !== null) return;
    const exited = new Promise((resolve) => this.server.once('exit', resolve));
    this.server.kill('SIGKILL');
    await exited;
  }
}
