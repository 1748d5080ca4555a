import { randomUUID } from 'node:crypto';
import v8 from 'node:v8';
import { describe, expect, it } from 'vitest';
import { freshLoopState } from '../../../machines/agent-loop.machine.js';
import { auditPayload } from '../../../src/runs/audit-trail.js';
import { journalEventsSince, type CommittedRun, type JournalHead } from '../../../src/tasks/journal-writer.js';

// Node 20's V8 gives every object built as `{ ...a, more }` a hidden class (map) of its own, made
// in old space, where dead maps can keep young objects alive until a full collection
// (docs/decisions/0050-no-leading-spread-on-the-hot-path.md). What a task builds on the hot path
// must share its hidden classes with the same object of the next task. V8's own test helper
// %HaveSameMap tells; natives syntax is allowed only while the helper is compiled.
v8.setFlagsFromString('--allow-natives-syntax');
const haveSameMap = new Function('a', 'b', 'return %HaveSameMap(a, b)') as (a: unknown, b: unknown) => boolean;
v8.setFlagsFromString('--no-allow-natives-syntax');

/** The last two of many calls: a per-object hidden class shows only once V8's caches are warm. */
function lastTwo<T>(build: (index: number) => T): [T, T] {
  let previous = build(0);
  let last = build(1);
  for (let index = 2; index < 200; index += 1) {
    previous = last;
    last = build(index);
  }
  return [previous, last];
}

function head(taskId: string): JournalHead {
  return {
    taskId,
    contextId: randomUUID(),
    projectedRevision: 1,
    lastSequence: 1,
    projectedState: 'TASK_STATE_WORKING',
    directMessage: false,
    statusMessage: () => null,
    artifacts: () => [{ artifactId: `${taskId}-answer`, name: 'answer', parts: [{ text: 'echo: hi' }] }],
  };
}

const completed: CommittedRun = {
  runId: 'run',
  status: 'completed',
  revision: 2,
  startedAt: 1,
  statusChangedAt: 2,
  terminationReason: null,
  failureDetail: null,
};

describe('the hot path builds objects that share hidden classes across tasks', () => {
  it('proves the check: a leading spread followed by a field makes a hidden class per object', () => {
    const [a, b] = lastTwo((index) => ({ ...{ sql: `x${index}`, values: [] }, type: 'query' }));
    expect(haveSameMap(a, b)).toBe(false);
  });

  it('the journal events of a completion (artifact and status updates)', () => {
    const [a, b] = lastTwo((index) => journalEventsSince(head(`task-${index}`), completed, []));
    expect(a.map((event) => event.kind)).toEqual(['artifact', 'status']);
    for (const [first, second] of a.map((event, index) => [event, b[index]!] as const)) {
      const one = Object.values(first.response)[0];
      const two = Object.values(second.response)[0];
      expect(haveSameMap(one, two)).toBe(true);
      expect(haveSameMap(first.response, second.response)).toBe(true);
    }
  });

  it('a run loop state, with and without request metadata', () => {
    const [a, b] = lastTwo((index) => freshLoopState([{ role: 'user', content: `hi ${index}` }]));
    expect(haveSameMap(a, b)).toBe(true);
    const [c, d] = lastTwo((index) => freshLoopState([{ role: 'user', content: `hi ${index}` }], { messageId: `m${index}` }));
    expect(haveSameMap(c, d)).toBe(true);
    expect(d.requestMetadata).toEqual({ messageId: 'm199' });
  });

  it('an audit event of every level that keeps content', () => {
    for (const level of ['full', 'redacted', 'metadata'] as const) {
      const [a, b] = lastTwo((index) => auditPayload(level, { kind: 'model_reply', meta: { provider: 'echo', attempt: index }, content: { text: `echo ${index}` } }));
      expect({ level, same: haveSameMap(a, b) }).toEqual({ level, same: true });
      expect(b).toMatchObject({ provider: 'echo', attempt: 199 });
    }
  });
});
