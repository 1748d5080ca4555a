import { describe, expect, it } from 'vitest';
import { SEQUENCED_EVENTS_URI } from '../../src/a2a/sequenced-events.js';
import { readJournal } from '../../src/tasks/journal.js';
import { TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { BACKEND } from './support/installation.js';
import { SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario for the sequenced-events extension (docs/extensions/sequenced-events.md): an API
// process and a worker process; twelve tasks, each with a push config to a slow receiver (half of
// them created with the extension activated, so their bodies carry the number too). The worker is
// SIGKILLed while deliveries are in flight and started again. A receiver that keeps, per task, the
// X-A2A-Event-Sequence numbers it has processed and drops a repeat must then have seen every
// journal event of every task exactly once, and a repeat must be the same body as the first copy.

const suite = useFaultSuite({ receiver: () => ({ kind: 'ok', delayMs: 200 + Math.random() * 200 }), model: null });

const TASKS = 12;
const STEPS = {
  type: 'scripted',
  steps: [
    { delayMs: 50, artifact: { artifactId: 'notes', name: 'notes', text: 'one; ' }, toolCalls: [{ name: 'lookup', arguments: {} }] },
    { delayMs: 50, artifact: { artifactId: 'notes', text: 'two', append: true, lastChunk: true }, toolCalls: [{ name: 'lookup', arguments: {} }] },
    { delayMs: 50, reply: 'done' },
  ],
};

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;
const taskOf = (body: Json): string | undefined => body?.statusUpdate?.taskId ?? body?.artifactUpdate?.taskId ?? body?.task?.id ?? body?.message?.taskId;
const entryOf = (body: Json): Json => (Object.values(body ?? {})[0] as Json)?.metadata?.[SEQUENCED_EVENTS_URI];

describe(`push sequences across a worker SIGKILL on the ${BACKEND} queue backend`, () => {
  it(
    'a receiver deduplicating by X-A2A-Event-Sequence sees every event of every task exactly once',
    async () => {
      const { receiver } = suite;
      const installation = await suite.install({
        env: {
          KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
          KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
          KEEL_PROVIDERS: JSON.stringify({ steps: STEPS }),
          KEEL_AGENTS: JSON.stringify([{ id: 'steps', name: 'Steps', provider: 'steps', tools: ['lookup'], privacy: { answerLevel: 'full' } }]),
        },
      });
      const api = await installation.addNode('api');
      const worker = await installation.addNode('worker');
      const pool = await installation.pool();

      const send = async (index: number): Promise<{ taskId: string; sequenced: boolean }> => {
        const sequenced = index % 2 === 0;
        const response = await fetch(`${api.url}/a2a/steps`, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            'a2a-version': '1.0',
            authorization: `Bearer ${installation.token}`,
            ...(sequenced ? { 'a2a-extensions': SEQUENCED_EVENTS_URI } : {}),
          },
          body: JSON.stringify({
            jsonrpc: '2.0',
            id: index,
            method: 'SendMessage',
            params: {
              message: { messageId: `push-${index}`, role: 'ROLE_USER', parts: [{ text: `task ${index}` }] },
              configuration: { returnImmediately: true, taskPushNotificationConfig: { url: receiver.url } },
            },
          }),
        });
        const body = (await response.json()) as Json;
        if (!body.result?.task?.id) throw new Error(`SendMessage failed: ${JSON.stringify(body)}`);
        return { taskId: body.result.task.id as string, sequenced };
      };
      const tasks = await Promise.all(Array.from({ length: TASKS }, (_, index) => send(index)));

      expect(await until(() => receiver.inFlight() >= 2, 30_000, 5), 'deliveries in flight').toBe(true);
      const inFlightAtKill = receiver.inFlight();
      await worker.kill();
      await worker.start();

      const journals = new Map<string, number[]>();
      const complete = await until(async () => {
        for (const { taskId } of tasks) {
          const journal = await readJournal(pool, installation.sealer, taskId, 0);
          const last = journal[journal.length - 1];
          if (last?.state !== 'TASK_STATE_COMPLETED') return false;
          journals.set(taskId, journal.map((event) => event.sequence));
          const numbers = new Set(receiver.receipts.filter((receipt) => taskOf(receipt.body) === taskId && receipt.ackedAt !== null).map((receipt) => receipt.sequence));
          if (numbers.size < journal.length) return false;
        }
        return true;
      }, 90_000, 200);
      expect(complete, 'every event of every task delivered').toBe(true);

      let repeats = 0;
      for (const { taskId, sequenced } of tasks) {
        const processed = new Map<number, Json>();
        for (const receipt of receiver.receipts.filter((entry) => taskOf(entry.body) === taskId)) {
          const sequence = Number(receipt.sequence);
          expect(Number.isInteger(sequence) && sequence > 0, `X-A2A-Event-Sequence ${receipt.sequence}`).toBe(true);
          if (sequenced) expect(entryOf(receipt.body)).toEqual({ sequence });
          else expect(JSON.stringify(receipt.body)).not.toContain(SEQUENCED_EVENTS_URI);
          const first = processed.get(sequence);
          if (first === undefined) processed.set(sequence, receipt.body);
          else {
            repeats += 1;
            expect(receipt.body, `the repeat of ${taskId}/${sequence}`).toEqual(first);
          }
        }
        expect([...processed.keys()].sort((a, b) => a - b), `the events of ${taskId}`).toEqual(journals.get(taskId));
      }
      console.log(`[faults] ${JSON.stringify({ scenario: 'push-sequences', backend: BACKEND, tasks: TASKS, receipts: receiver.receipts.length, inFlightAtKill, repeats })}`);
      // A request in flight at the kill was never answered to its sender: it came again, and was dropped by its number.
      expect(repeats).toBeGreaterThan(0);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
