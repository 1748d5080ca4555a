import { readFileSync } from 'node:fs';
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

/** Sends the flood agent a message (JSON-RPC, returned at once while the agent waits); the task's id. */
export async function startFloodTask(baseUrl: string, token: string): Promise<string> {
  const response = await fetch(`${baseUrl}/a2a/flood`, {
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
 * The state (hex, as /proc/net/tcp shows it: 01 ESTABLISHED, 08 CLOSE_WAIT, ...) of the TCP socket
 * in this network namespace with local port `localPort` and remote port `remotePort`, or null when
 * there is none: the kernel's own table. A reset takes a socket out of it at once, on both sides
 * (the one that sent it and the one that received it); after a FIN the receiving side would stay
 * in it, CLOSE_WAIT, until its process closes it.
 */
export function tcpSocketState(localPort: number, remotePort: number): string | null {
  const hex = (port: number) => port.toString(16).toUpperCase().padStart(4, '0');
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const [, local, remote, state] = line.trim().split(/\s+/);
      if (local?.endsWith(`:${hex(localPort)}`) && remote?.endsWith(`:${hex(remotePort)}`)) return state ?? null;
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
