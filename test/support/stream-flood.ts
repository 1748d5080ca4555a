import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { expect } from 'vitest';

// What the stream cut-off tests share (test/integration/a2a/*stream-cut-off.test.ts): an agent
// whose task emits far more than any stream buffer holds, the cut-off counter as /metrics shows it,
// whether Keel still holds the server side of a TCP connection, and the process's peak memory.

/**
 * A scripted provider that waits (so subscribers attach to a WORKING task), then emits `chunks`
 * artifacts of `chunkChars` each, one per iteration (a tool call between them keeps the loop
 * going; each iteration's artifact has its own id), and answers "flooded". Letters, not digits: a
 * long run of digits is what the privacy scrubbers look at longest.
 */
export function floodProvider(chunks: number, chunkChars: number, delayMs: number): Record<string, unknown> {
  const chunk = (index: number) => ({ artifact: { name: `chunk-${index}`, text: 'abcdefghij'[index % 10]!.repeat(chunkChars) }, toolCalls: [{ name: 'lookup', arguments: {} }] });
  const steps: Array<Record<string, unknown>> = Array.from({ length: chunks }, (_, index) => chunk(index));
  steps[0] = { ...steps[0], delayMs };
  steps.push({ reply: 'flooded' });
  return { type: 'scripted', steps };
}

/** Sends a flood agent a message (JSON-RPC, returned at once while the agent waits); the task's id. */
export async function startFloodTask(baseUrl: string, token: string, agent = 'flood'): Promise<string> {
  const response = await fetch(`${baseUrl}/a2a/${agent}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: `m-${Math.random()}`, role: 'ROLE_USER', parts: [{ text: 'flood' }] }, configuration: { returnImmediately: true } } }),
  });
  const answer = (await response.json()) as { result?: { task?: { id: string } } };
  expect(answer.result?.task?.id, JSON.stringify(answer)).toBeDefined();
  return answer.result!.task!.id;
}

/** keel_a2a_stream_cutoffs_total for one binding and reason (0 before the first cut-off). */
export async function cutOffs(baseUrl: string, binding: 'sse' | 'grpc', reason: 'stalled' | 'unflushed_end'): Promise<number> {
  const metrics = await (await fetch(`${baseUrl}/metrics`)).text();
  const line = metrics.split('\n').find((entry) => entry.startsWith('keel_a2a_stream_cutoffs_total{') && entry.includes(`binding="${binding}"`) && entry.includes(`reason="${reason}"`));
  return line ? Number(line.split(' ').pop()) : 0;
}

/**
 * The TCP socket in this network namespace with local port `localPort` and remote port
 * `remotePort`, or null when there is none: the kernel's own table. `state` is hex as
 * /proc/net/tcp shows it (01 ESTABLISHED, 04 FIN_WAIT1, 08 CLOSE_WAIT, ...); `inode` is 0 once no
 * process holds the socket (an orphan the kernel still sends from). A reset takes a socket out of
 * the table at once, on both sides; after a FIN the receiving side stays in it, CLOSE_WAIT, until
 * its process closes it.
 */
export function tcpSocket(localPort: number, remotePort: number): { state: string; inode: number } | null {
  const hex = (port: number) => port.toString(16).toUpperCase().padStart(4, '0');
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields[1]?.endsWith(`:${hex(localPort)}`) && fields[2]?.endsWith(`:${hex(remotePort)}`)) return { state: fields[3] ?? '', inode: Number(fields[9]) };
    }
  }
  return null;
}

/**
 * This process's memory that is live (its heap and its buffers) after a full garbage collection,
 * in MB: what the Keel under test, which runs in this process, holds, garbage not counted.
 */
export function liveMemoryMb(): number {
  setFlagsFromString('--expose-gc');
  (runInNewContext('gc') as () => void)();
  const usage = process.memoryUsage();
  return (usage.heapUsed + usage.arrayBuffers) / 1024 / 1024;
}

/** SubscribeToTask over HTTP+JSON (GET :subscribe) or JSON-RPC, as a raw request's parts. */
export function sseSubscribeRequest(agent: string, taskId: string, jsonRpc: boolean): { method: string; path: string; body: string | undefined } {
  return jsonRpc
    ? { method: 'POST', path: `/a2a/${agent}`, body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'SubscribeToTask', params: { id: taskId } }) }
    : { method: 'GET', path: `/a2a/${agent}/tasks/${taskId}:subscribe`, body: undefined };
}

export type StalledSubscriber = {
  socket: Socket;
  localPort: number;
  /** The start of the response (its status line and headers). */
  head: string;
  /** Bytes received, and the last 4 KiB of them. */
  received: () => number;
  tail: () => string;
  /** How the connection ended once read again: an error code (ECONNRESET) or 'close'. */
  ended: Promise<string>;
};

/**
 * A raw connection that sends SubscribeToTask, takes the response's first chunk and then reads
 * nothing (until the test resumes the socket). It is added to `sockets` for the file to destroy.
 */
export function stalledSseSubscriber(options: { port: number; token: string; agent: string; taskId: string; jsonRpc: boolean; sockets: Socket[] }): Promise<StalledSubscriber> {
  const { port, token, agent, taskId, jsonRpc, sockets } = options;
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    sockets.push(socket);
    let received = 0;
    let tail = '';
    const ended = new Promise<string>((settle) => {
      socket.on('error', (error: NodeJS.ErrnoException) => settle(error.code ?? error.message));
      socket.on('close', () => settle('close'));
    });
    socket.once('connect', () => {
      const { method, path, body } = sseSubscribeRequest(agent, taskId, jsonRpc);
      const length = body === undefined ? '' : `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n`;
      socket.write(`${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAuthorization: Bearer ${token}\r\nA2A-Version: 1.0\r\n${length}\r\n${body ?? ''}`);
    });
    socket.once('error', reject);
    socket.on('data', (chunk: Buffer) => {
      if (received === 0) {
        // Stop reading: Node takes nothing more from the kernel once its small buffer is full, and
        // the kernel's receive window closes.
        socket.pause();
        socket.off('error', reject);
        resolve({ socket, localPort: socket.localPort!, head: chunk.toString('latin1', 0, 400), received: () => received, tail: () => tail, ended });
      }
      received += chunk.length;
      tail = (tail + chunk.toString('latin1')).slice(-4096);
    });
  });
}
