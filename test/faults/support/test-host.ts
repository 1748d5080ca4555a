import { execFileSync, spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';

// One host of a TestNetwork: a Linux network namespace with one interface (eth0) on the network's
// bridge and an address of its own. Whatever runs on the host is started inside the namespace
// (`ip netns exec`, which execs the program: the child's pid is the program's own).

export class TestHost {
  constructor(
    /** What the test calls it (`postgres`, `api1`, …). */
    readonly name: string,
    /** The namespace (`kh<pid>-<name>`). */
    readonly netns: string,
    /** The host's address on the test network. */
    readonly address: string,
    /** Its link's end in the switch namespace (set down to cut the host off). */
    readonly switchPort: string,
  ) {}

  /** A child process on this host. */
  spawn(command: string, args: readonly string[], options: SpawnOptions = {}): ChildProcess {
    return spawn('ip', ['netns', 'exec', this.netns, command, ...args], { stdio: ['ignore', 'pipe', 'pipe'], ...options });
  }

  /** A command on this host, run to its end (throws with its stderr when it fails). */
  run(command: string, args: readonly string[]): string {
    return execFileSync('ip', ['netns', 'exec', this.netns, command, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  }

  /** `iptables` on this host. */
  iptables(args: readonly string[]): void {
    this.run('iptables', ['-w', ...args]);
  }

  /** The pids of every process on this host. */
  pids(): number[] {
    return execFileSync('ip', ['netns', 'pids', this.netns], { encoding: 'utf8' })
      .split('\n')
      .filter((line) => /^\d+$/.test(line.trim()))
      .map(Number);
  }
}
