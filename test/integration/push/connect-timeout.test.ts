import { spawn, type ChildProcess } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { LOOPBACK, PUSH_TEST_OVERRIDES, attemptsOf, deliveriesOf, newClientToken, sendWithPush, sleep } from './push-support.js';

// push.connectTimeoutSeconds (docs/push.md, "Isolation"): a destination that never completes the
// TCP handshake fails the attempt after the connect timeout, not after the whole attempt's
// timeout, and that failure counts towards the destination's breaker. The destination is a port on
// loopback whose listening process is stopped (SIGSTOP) after its accept queue (backlog 1) was
// filled by this test: the kernel then drops every further SYN, so a connection never completes.
// Timings: connect timeout 0.5 s, attempt timeout 4 s (the harness's test timing), the breaker
// opens after 2 failures and stays open for 60 s.

const CONNECT_TIMEOUT_MS = 500;
const ATTEMPT_TIMEOUT_MS = 4_000;

let keel: TestKeel;
let token = '';
let listener: ChildProcess | null = null;
const fillers: Socket[] = [];
let port = 0;

/** Opens a connection to the port; whether the handshake completed within `withinMs`. */
function handshake(withinMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, LOOPBACK);
    fillers.push(socket);
    socket.on('error', () => undefined);
    const timer = setTimeout(() => resolve(false), withinMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

beforeAll(async () => {
  // A listener with the smallest accept queue, in a process of its own that is then stopped, so
  // nothing ever accepts: connections complete until the queue is full, later SYNs are dropped.
  const script = "const s = require('node:net').createServer(); s.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => process.stdout.write(s.address().port + '\\n'));";
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  listener = child;
  port = await new Promise<number>((resolve, reject) => {
    child.stdout!.once('data', (chunk: Buffer) => resolve(Number(chunk.toString('utf8').trim())));
    child.once('exit', (code) => reject(new Error(`the listener exited (${String(code)}) before it listened`)));
  });
  process.kill(child.pid!, 'SIGSTOP');
  let filled = 0;
  while (await handshake(300)) filled += 1;
  // Backlog 1 holds two completed connections on Linux; nothing more completes, even given time.
  expect(filled).toBeGreaterThan(0);
  expect(await handshake(1_500)).toBe(false);

  keel = await startTestKeel({
    pushTestTimings: { timeoutSeconds: ATTEMPT_TIMEOUT_MS / 1000 },
    overrides: {
      ...PUSH_TEST_OVERRIDES,
      KEEL_PUSH_CONNECT_TIMEOUT_SECONDS: String(CONNECT_TIMEOUT_MS / 1000),
      KEEL_PUSH_BREAKER_FAILURES: '2',
      KEEL_PUSH_BREAKER_COOLDOWN_SECONDS: '60',
    },
  });
  token = await newClientToken(keel.context.pool, 'connect-timeout');
}, 60_000);

afterAll(async () => {
  for (const socket of fillers) socket.destroy();
  if (listener?.pid !== undefined && listener.exitCode === null) {
    // SIGKILL ends a stopped process too; SIGCONT first lets it go the ordinary way if it can.
    process.kill(listener.pid, 'SIGCONT');
    listener.kill('SIGKILL');
  }
  await keel?.dispose();
});

/** The value of one /metrics series (labels as written), or null when absent. */
async function metric(name: string, labels: string): Promise<number | null> {
  const text = await (await fetch(`${keel.url}/metrics`)).text();
  const line = text.split('\n').find((candidate) => candidate.startsWith(`${name}{${labels}}`));
  return line === undefined ? null : Number(line.split(' ').at(-1));
}

describe('push connect timeout', () => {
  it('fails an attempt to a destination that never accepts after the connect timeout, and counts it towards the breaker', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'to a black hole', { id: 'hook', url: `http://${LOOPBACK}:${port}/hook` });
    const destination = `destination="${LOOPBACK}:${port}"`;

    // Two failed attempts (the breaker's count) open the breaker.
    await waitFor(async () => ((await metric('keel_push_destination_breaker', `${destination},state="open"`)) === 1) || null, 'the breaker open', 20_000);
    const [head] = await deliveriesOf(keel.context.pool, taskId);
    const attempts = await attemptsOf(keel.context.pool, head!.id);
    expect(attempts).toHaveLength(2);
    for (const attempt of attempts) {
      expect(attempt.outcome).toBe('retry');
      expect(attempt.status_code).toBeNull();
      expect(attempt.error_class).toBe('timeout');
      // After about the connect timeout (0.5 s), far from the attempt's 4 s.
      expect(attempt.duration_ms).toBeGreaterThanOrEqual(CONNECT_TIMEOUT_MS - 50);
      expect(attempt.duration_ms).toBeLessThan(ATTEMPT_TIMEOUT_MS / 2);
    }

    // Open: no third attempt while the cool-down lasts, and the deliveries wait.
    await sleep(1_500);
    expect(await attemptsOf(keel.context.pool, head!.id)).toHaveLength(2);
    expect((await deliveriesOf(keel.context.pool, taskId)).every((row) => row.state === 'pending')).toBe(true);
  }, 60_000);
});
