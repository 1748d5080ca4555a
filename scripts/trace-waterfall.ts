import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Task } from '@a2a-js/sdk';
import { createClient } from '../src/auth/client-repository.js';
import { renderWaterfallSvg, waterfallRows, type WaterfallSpan } from '../src/telemetry/waterfall-svg.js';
import { sdkClient, textMessage } from '../test/support/a2a-client.js';
import { startOtlpReceiver, type ReceivedSpan } from '../test/support/otlp-receiver.js';
import { startTestKeel } from '../test/support/test-keel.js';
import { deleteQueueKeys, testQueueKind } from '../test/support/test-queues.js';

// npm run trace:picture — the picture of one task's trace in docs/observability.md, with no
// external service: a Keel in this process exports over OTLP/HTTP (JSON) to a receiver in this
// process; after one task to warm it up, one blocking SendMessage goes to an agent that calls a
// tool once, then answers; Keel stops (its graceful shutdown flushes the spans); the spans of the
// task's trace, and those linked to it (a group-commit batch is a trace of its own, linking each
// task it carried), are drawn as a waterfall into docs/images/task-trace.svg.
//
// Needs the services the tests use: Postgres at 127.0.0.1:5432 (KEEL_TEST_ADMIN_URL) and, with
// KEEL_TEST_QUEUE=redis, Redis. TRACE_PICTURE_OUT writes the picture elsewhere.

const OUT = process.env.TRACE_PICTURE_OUT ?? fileURLToPath(new URL('../docs/images/task-trace.svg', import.meta.url));
const TOOL_MODULE = fileURLToPath(new URL('../test/fixtures/test-tools.ts', import.meta.url));

const providers = {
  planner: {
    type: 'scripted',
    steps: [{ toolCalls: [{ name: 'lookup', arguments: { key: 'order-42' } }], delayMs: 40 }, { reply: 'Order 42 is on its way.', delayMs: 25 }],
  },
};
const agents = [{ id: 'planner', name: 'Planner', description: 'Looks an order up, then answers', provider: 'planner', tools: ['lookup'], privacy: { answerLevel: 'full' } }];

const nanosToMs = (nanos: bigint) => Number(nanos / 1000n) / 1000;

/** The task's trace (found by the span naming the task) and the spans linked to it. */
function taskTrace(spans: readonly ReceivedSpan[], taskId: string): ReceivedSpan[] {
  const request = spans.find((span) => span.attributes['keel.task.id'] === taskId && span.name.startsWith('A2A ')) ?? spans.find((span) => span.attributes['keel.task.id'] === taskId);
  if (!request) return [];
  return spans.filter((span) => span.traceId === request.traceId || span.links.some((link) => link.traceId === request.traceId));
}

async function main(): Promise<number> {
  const receiver = await startOtlpReceiver();
  const keel = await startTestKeel({
    overrides: {
      KEEL_TELEMETRY_ENDPOINT: receiver.url,
      KEEL_TELEMETRY_PROTOCOL: 'http/json',
      KEEL_TOOL_MODULES: [TOOL_MODULE],
      KEEL_PROVIDERS: providers,
      KEEL_AGENTS: agents,
    },
  });
  let taskId = '';
  try {
    const created = await createClient(keel.context.pool, 'trace-picture');
    if (!created.ok) throw new Error(`cannot create a client: ${created.reason}`);
    const client = await sdkClient(keel.url, 'planner', created.token);
    // A first task warms the process up (modules loaded, code compiled, connections open); its
    // trace is not drawn.
    await client.sendMessage(textMessage('Where is order 41?'));
    const task = Task.toJSON((await client.sendMessage(textMessage('Where is order 42?'))) as Task) as { id: string; status: { state: string } };
    taskId = task.id;
    process.stdout.write(`task ${taskId}: ${task.status.state}\n`);
  } finally {
    await keel.dispose();
    await receiver.close();
    if (testQueueKind() === 'redis') await deleteQueueKeys([keel.config.queue.prefix]);
  }
  const spans = taskTrace(receiver.spans, taskId);
  if (spans.length === 0) {
    process.stderr.write(`no span names task ${taskId} (keel.task.id) among the ${receiver.spans.length} spans received: ${[...new Set(receiver.spans.map((span) => span.name))].join(', ') || '(none)'}\n`);
    return 1;
  }
  const picture: WaterfallSpan[] = spans.map((span) => ({
    spanId: span.spanId,
    parentSpanId: span.parentSpanId,
    name: span.name,
    startMs: nanosToMs(span.startNs),
    endMs: nanosToMs(span.endNs),
    kind: span.kind,
  }));
  mkdirSync(dirname(OUT), { recursive: true });
  writeFileSync(OUT, renderWaterfallSvg(picture, { title: 'One task: a blocking SendMessage (JSON-RPC) to an agent that calls one tool, then answers' }));
  for (const { span, depth } of waterfallRows(picture)) process.stdout.write(`${'  '.repeat(depth)}${span.name}  ${(span.endMs - span.startMs).toFixed(2)} ms\n`);
  process.stdout.write(`wrote ${OUT} (${picture.length} spans)\n`);
  return 0;
}

process.exitCode = await main();
