import { execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync, rmdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TestHost } from './test-host.js';

// Test hosts on one machine: each host a Linux network namespace whose eth0 is a veth into a bridge
// in a switch namespace of the network's own, on a private /24 (10.244.X.0/24, X free on this
// machine when the network is made). The test's own (root) namespace joins the bridge as X.1, so
// it reaches every host and every host reaches the peers the test serves (the model, the push
// receiver) at X.1. Nothing is routed off the machine: the bridge has no other port, no host has
// a default route.
//
// Faults:
//   cut(host) / heal(host)            its link set down (the host is cut off from everything) / up
//   partition(a, b)                   every packet between two hosts dropped (iptables, both hosts)
//   impair(from, to, {delay, loss})   packets from hosts `from` to host `to` delayed (NFQUEUE and
//                                     link-delay.py: the kernel of the CI machine has no netem) and
//                                     a share of them dropped (iptables' statistic match)
// Every fault returns its healing; dispose() heals what is left, ends every process on every host,
// and deletes the namespaces and the bridge. Everything is named kh<pid>-…, and a network made
// when the process of an earlier one is gone (a crashed run) deletes that one's leftovers first.

const LINK_DELAY = fileURLToPath(new URL('./link-delay.py', import.meta.url));
const SUBNET_LOCKS = join(tmpdir(), 'keel-test-subnets');

export type Impairment = { delayMs?: number; jitterMs?: number; lossPercent?: number };

/** Whether this process may make network namespaces (root, iproute2 and iptables present); the reason when not. */
export function networkNamespacesUnavailable(): string | null {
  if (process.platform !== 'linux') return `test hosts need Linux network namespaces (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return 'test hosts need root (ip netns add): this test runs as an unprivileged user';
  for (const tool of ['ip', 'iptables', 'python3']) {
    try {
      execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    } catch {
      return `test hosts need ${tool} (${tool === 'ip' ? 'iproute2' : tool}) on the PATH`;
    }
  }
  const probe = `kh${process.pid}-probe`;
  try {
    execFileSync('ip', ['netns', 'add', probe], { stdio: 'pipe' });
    execFileSync('ip', ['netns', 'del', probe], { stdio: 'pipe' });
  } catch (error) {
    return `cannot make a network namespace: ${String((error as { stderr?: Buffer }).stderr ?? error).trim()}`;
  }
  return null;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
};

const quiet = (command: string, args: readonly string[]) => {
  try {
    return execFileSync(command, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch {
    return '';
  }
};

export class TestNetwork {
  readonly hosts: TestHost[] = [];
  private readonly heals = new Set<() => void>();
  private readonly delays = new Set<ChildProcess>();
  private nextQueue = 1;
  private disposed = false;
  private readonly onExit = () => this.disposeSync();

  private constructor(
    /** kh<pid>-<n>: every namespace, link and temp directory of this network starts with it. */
    readonly prefix: string,
    /** The third octet of 10.244.X.0/24. */
    readonly subnet: number,
  ) {}

  /** The test's own address on the network (the root namespace's end of its link). */
  get rootAddress(): string {
    return `10.244.${this.subnet}.1`;
  }

  private get switchNetns(): string {
    return `${this.prefix}-sw`;
  }

  private get rootLink(): string {
    return `${this.prefix}r`;
  }

  private static counter = 0;

  /** A network of its own: a free subnet, the switch namespace, the root's link. */
  static create(): TestNetwork {
    TestNetwork.removeLeftovers();
    TestNetwork.counter += 1;
    const network = new TestNetwork(`kh${process.pid}${String.fromCharCode(96 + TestNetwork.counter)}`, TestNetwork.claimSubnet());
    process.once('exit', network.onExit);
    try {
      const sw = network.switchNetns;
      execFileSync('ip', ['netns', 'add', sw]);
      execFileSync('ip', ['-n', sw, 'link', 'add', 'br0', 'type', 'bridge']);
      execFileSync('ip', ['-n', sw, 'link', 'set', 'br0', 'up']);
      execFileSync('ip', ['link', 'add', network.rootLink, 'type', 'veth', 'peer', 'name', 'root', 'netns', sw]);
      execFileSync('ip', ['-n', sw, 'link', 'set', 'root', 'master', 'br0', 'up']);
      execFileSync('ip', ['addr', 'add', `${network.rootAddress}/24`, 'dev', network.rootLink]);
      execFileSync('ip', ['link', 'set', network.rootLink, 'up']);
    } catch (error) {
      network.disposeSync();
      throw error;
    }
    return network;
  }

  /** One more host on the network, at 10.244.X.(2 + its index). */
  addHost(name: string): TestHost {
    const index = this.hosts.length + 2;
    const netns = `${this.prefix}-${name}`;
    const port = `h${index}`;
    const host = new TestHost(name, netns, `10.244.${this.subnet}.${index}`, port);
    execFileSync('ip', ['netns', 'add', netns]);
    this.hosts.push(host);
    execFileSync('ip', ['-n', netns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', port, 'netns', this.switchNetns]);
    execFileSync('ip', ['-n', this.switchNetns, 'link', 'set', port, 'master', 'br0', 'up']);
    execFileSync('ip', ['-n', netns, 'addr', 'add', `${host.address}/24`, 'dev', 'eth0']);
    execFileSync('ip', ['-n', netns, 'link', 'set', 'eth0', 'up']);
    execFileSync('ip', ['-n', netns, 'link', 'set', 'lo', 'up']);
    return host;
  }

  /** The host's link set down at the switch: no packet in or out until healed. */
  cut(host: TestHost): () => void {
    execFileSync('ip', ['-n', this.switchNetns, 'link', 'set', host.switchPort, 'down']);
    return this.healing(() => quiet('ip', ['-n', this.switchNetns, 'link', 'set', host.switchPort, 'up']));
  }

  /** Every packet between `a` and `b` dropped, both ways (each drops what it sends to and gets from the other). */
  partition(a: TestHost, b: TestHost): () => void {
    const rules = [
      [a, ['OUTPUT', '-d', b.address, '-j', 'DROP']],
      [a, ['INPUT', '-s', b.address, '-j', 'DROP']],
      [b, ['OUTPUT', '-d', a.address, '-j', 'DROP']],
      [b, ['INPUT', '-s', a.address, '-j', 'DROP']],
    ] as const;
    for (const [host, rule] of rules) host.iptables(['-I', ...rule]);
    return this.healing(() => {
      for (const [host, rule] of rules) quiet('ip', ['netns', 'exec', host.netns, 'iptables', '-w', '-D', ...rule]);
    });
  }

  /**
   * Packets from each of `from` to `to` delayed `delayMs` ± `jitterMs` (uniform, per packet) and
   * `lossPercent` of them dropped, as `tc netem` on the senders' links toward `to` would.
   */
  async impair(from: readonly TestHost[], to: TestHost, impairment: Impairment): Promise<() => void> {
    const rules: Array<[TestHost, string[]]> = [];
    const handlers: ChildProcess[] = [];
    for (const host of from) {
      // Loss first: a packet NFQUEUE gives back is accepted for good (the chain is not walked on).
      if (impairment.lossPercent) rules.push([host, ['OUTPUT', '-d', to.address, '-m', 'statistic', '--mode', 'random', '--probability', String(impairment.lossPercent / 100), '-j', 'DROP']]);
      if (impairment.delayMs) {
        const queue = this.nextQueue++;
        handlers.push(await this.startDelay(host, queue, impairment));
        rules.push([host, ['OUTPUT', '-d', to.address, '-j', 'NFQUEUE', '--queue-num', String(queue)]]);
      }
    }
    for (const [host, rule] of rules) host.iptables(['-A', ...rule]);
    return this.healing(() => {
      for (const [host, rule] of rules) quiet('ip', ['netns', 'exec', host.netns, 'iptables', '-w', '-D', ...rule]);
      for (const handler of handlers) {
        handler.kill('SIGKILL');
        this.delays.delete(handler);
      }
    });
  }

  /**
   * Every packet into or out of `host` (but its loopback) delayed `delayMs` ± `jitterMs`, as `tc
   * netem` on both ends of its link would: a round trip to any other host takes 2 × delayMs longer.
   */
  async slowLink(host: TestHost, impairment: Impairment): Promise<() => void> {
    const queue = this.nextQueue++;
    const handler = await this.startDelay(host, queue, impairment);
    const rules = [
      ['OUTPUT', '!', '-o', 'lo', '-j', 'NFQUEUE', '--queue-num', String(queue)],
      ['INPUT', '!', '-i', 'lo', '-j', 'NFQUEUE', '--queue-num', String(queue)],
    ];
    for (const rule of rules) host.iptables(['-A', ...rule]);
    return this.healing(() => {
      for (const rule of rules) quiet('ip', ['netns', 'exec', host.netns, 'iptables', '-w', '-D', ...rule]);
      handler.kill('SIGKILL');
      this.delays.delete(handler);
    });
  }

  /** link-delay.py on `host` for NFQUEUE `queue`, once it has bound the queue. */
  private async startDelay(host: TestHost, queue: number, impairment: Impairment): Promise<ChildProcess> {
    const handler = host.spawn('python3', [LINK_DELAY, String(queue), String(impairment.delayMs ?? 0), String(impairment.jitterMs ?? 0)]);
    this.delays.add(handler);
    await new Promise<void>((resolve, reject) => {
      let output = '';
      handler.stdout!.on('data', (chunk: Buffer) => {
        output += chunk.toString('utf8');
        if (output.includes('ready')) resolve();
      });
      handler.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
      handler.once('exit', (code) => reject(new Error(`link-delay.py exited (${code}): ${output}`)));
    });
    return handler;
  }

  /** A temp directory named after the network (deleted with it, or as a leftover of a crashed run). */
  tempDir(name: string): string {
    const dir = join(tmpdir(), `${this.prefix}-${name}`);
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    return dir;
  }

  private healing(heal: () => void): () => void {
    let done = false;
    const once = () => {
      if (done) return;
      done = true;
      this.heals.delete(once);
      heal();
    };
    this.heals.add(once);
    return once;
  }

  /** Heals every fault, ends every process on the network's hosts, deletes everything it made. */
  async dispose(): Promise<void> {
    this.disposeSync();
  }

  private disposeSync(): void {
    if (this.disposed) return;
    this.disposed = true;
    process.removeListener('exit', this.onExit);
    for (const heal of [...this.heals]) heal();
    for (const handler of this.delays) handler.kill('SIGKILL');
    TestNetwork.removeNetwork(this.prefix, this.subnet);
  }

  /** What a network named `prefix` left: processes, namespaces, the root's link, temp dirs, the subnet's claim. */
  private static removeNetwork(prefix: string, subnet: number | null): void {
    const namespaces = quiet('ip', ['netns', 'list'])
      .split('\n')
      .map((line) => line.split(' ')[0]!)
      .filter((name) => name.startsWith(`${prefix}-`));
    for (const netns of namespaces) {
      for (const pid of quiet('ip', ['netns', 'pids', netns]).split('\n').filter((line) => /^\d+$/.test(line.trim()))) {
        try {
          process.kill(Number(pid), 'SIGKILL');
        } catch {
          // gone already
        }
      }
    }
    for (const netns of namespaces) quiet('ip', ['netns', 'del', netns]);
    quiet('ip', ['link', 'del', `${prefix}r`]);
    for (const entry of readdirSync(tmpdir())) {
      if (entry.startsWith(`${prefix}-`)) rmSync(join(tmpdir(), entry), { recursive: true, force: true });
    }
    if (subnet !== null) {
      try {
        rmdirSync(join(SUBNET_LOCKS, String(subnet)));
      } catch {
        // not claimed
      }
    }
  }

  /** Networks whose process is gone (a run that crashed or was killed): removed. */
  static removeLeftovers(): void {
    const prefixes = new Set<string>();
    for (const line of quiet('ip', ['netns', 'list']).split('\n')) {
      const match = /^(kh(\d+)[a-z])-/.exec(line);
      if (match && !alive(Number(match[2]))) prefixes.add(match[1]!);
    }
    for (const line of quiet('ip', ['-o', 'link', 'show']).split('\n')) {
      const match = /^\d+: (kh(\d+)[a-z])r[@:]/.exec(line);
      if (match && !alive(Number(match[2]))) prefixes.add(match[1]!);
    }
    for (const entry of readdirSync(tmpdir())) {
      const match = /^(kh(\d+)[a-z])-/.exec(entry);
      if (match && !alive(Number(match[2]))) prefixes.add(match[1]!);
    }
    for (const prefix of prefixes) TestNetwork.removeNetwork(prefix, null);
    // A subnet's claim whose address no link carries any more.
    mkdirSync(SUBNET_LOCKS, { recursive: true });
    const addresses = quiet('ip', ['-o', '-4', 'addr', 'show']);
    for (const entry of readdirSync(SUBNET_LOCKS)) {
      if (!addresses.includes(`10.244.${entry}.1/`)) {
        try {
          rmdirSync(join(SUBNET_LOCKS, entry));
        } catch {
          // taken meanwhile
        }
      }
    }
  }

  /** A /24 of 10.244.0.0/16 no link of this machine is on, claimed (mkdir is atomic) until disposal. */
  private static claimSubnet(): number {
    const routes = quiet('ip', ['-o', '-4', 'route', 'show']) + quiet('ip', ['-o', '-4', 'addr', 'show']);
    const start = 40 + (process.pid % 200);
    for (let step = 0; step < 250; step += 1) {
      const subnet = ((start + step) % 250) + 1;
      if (routes.includes(`10.244.${subnet}.`)) continue;
      try {
        mkdirSync(join(SUBNET_LOCKS, String(subnet)));
        return subnet;
      } catch {
        // claimed by another run
      }
    }
    throw new Error('no free 10.244.X.0/24 for a test network');
  }
}

