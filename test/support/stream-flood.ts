import { readFileSync } from 'node:fs';

// What the stream cut-off tests share (test/integration/a2a/*stream-cut-off.test.ts): an agent
// whose task emits far more than any stream buffer holds, the cut-off counter as /metrics shows it,
// whether Keel still holds the server side of a TCP connection, and the process's peak memory.

/** Characters of each artifact chunk the flood agent emits. */
export const FLOOD_CHUNK_CHARS = 1_000_000;

/**
 * A scripted provider that waits (so subscribers attach to a WORKING task), then emits `chunks`
 * artifacts of 1 MB each, one per iteration (a tool call between them keeps the loop going; each
 * iteration's artifact has its own id), and answers "flooded".
 */
export function floodProvider(chunks: number, delayMs: number): Record<string, unknown> {
  const chunk = (index: number) => ({ artifact: { name: `chunk-${index}`, text: 'abcdefghij'[index % 10]!.repeat(FLOOD_CHUNK_CHARS) }, toolCalls: [{ name: 'lookup', arguments: {} }] });
  const steps: Array<Record<string, unknown>> = Array.from({ length: chunks }, (_, index) => chunk(index));
  steps[0] = { ...steps[0], delayMs };
  steps.push({ reply: 'flooded' });
  return { type: 'scripted', steps };
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

/** Samples this process's RSS every 50 ms; `stop` gives the peak growth over the RSS at the start, in MB. */
export function rssSampler(): { stop: () => number } {
  const baseline = process.memoryUsage.rss();
  let peak = baseline;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), 50);
  return {
    stop: () => {
      clearInterval(timer);
      return (Math.max(peak, process.memoryUsage.rss()) - baseline) / 1024 / 1024;
    },
  };
}
