import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { generateMasterKey, MasterKeyRing } from '../../../src/sealing/master-key.js';
import { createSealer, type Sealer } from '../../../src/sealing/sealer.js';
import { prepareTaskResult, sealTaskHistory, taskView, type TaskRow } from '../../../src/tasks/task-repository.js';
import type { Message } from '../../../src/protocol/wire.js';

// A task row this process sealed (a blocking answer from the completion it committed) is shown
// from the values it sealed, without opening them; the bytes stay what a reader of the database
// opens, and a row read back (fresh buffers) is opened as always.

/** A sealer that counts its openings. */
function countingSealer(): Sealer & { opened: number } {
  const inner = createSealer(new MasterKeyRing([generateMasterKey()]));
  const counting = {
    ...inner,
    opened: 0,
    openJson: <T>(...args: Parameters<Sealer['openJson']>) => {
      counting.opened += 1;
      return inner.openJson<T>(...args);
    },
  };
  return counting;
}

function rowOf(taskId: string, sealed: { artifacts: Buffer | null; statusMessage: Buffer | null; history: Buffer | null }): TaskRow {
  return {
    id: taskId,
    context_id: 'ctx-1',
    owner: 'client',
    agent: 'echo',
    run_id: taskId,
    state: 'TASK_STATE_COMPLETED',
    status_timestamp: Date.UTC(2026, 11, 1),
    status_message: sealed.statusMessage,
    artifacts: sealed.artifacts,
    history: sealed.history,
    answer_level: 'full',
    metadata: {},
    projected_revision: 2,
    last_sequence: 2,
    projected_state: 'TASK_STATE_COMPLETED',
    direct_message: false,
    created_at: Date.UTC(2026, 11, 1),
    termination_reason: 'completed',
    failure_detail: null,
  };
}

describe('a task row sealed by this process', () => {
  for (const level of ['full', 'redacted'] as const) {
    it(`is shown without opening what was sealed here, as the stored bytes open (${level})`, () => {
      const sealer = countingSealer();
      const taskId = randomUUID();
      const asked: Message = { messageId: 'm-1', role: 'ROLE_USER', parts: [{ text: 'mail me at someone@example.com' }], contextId: 'ctx-1', taskId };
      const history = sealTaskHistory(sealer, { id: taskId, answerLevel: level, history: [asked] });
      const stored = prepareTaskResult(
        sealer,
        taskId,
        level,
        {
          artifacts: [{ artifactId: 'a-1', parts: [{ text: 'reply to someone@example.com' }] }],
          statusMessage: { messageId: 'm-2', role: 'ROLE_AGENT', parts: [{ text: 'done for someone@example.com' }], contextId: 'ctx-1', taskId },
          directMessage: false,
        },
        history,
      );
      const answered = taskView(sealer, rowOf(taskId, stored.sealed));
      expect(sealer.opened).toBe(0);

      // The same row as a reader of the database gets it: fresh buffers, opened.
      const copy = (value: Buffer | null) => (value === null ? null : Buffer.from(value));
      const read = taskView(sealer, rowOf(taskId, { artifacts: copy(stored.sealed.artifacts), statusMessage: copy(stored.sealed.statusMessage), history: copy(stored.sealed.history) }));
      expect(sealer.opened).toBe(3);
      expect(JSON.stringify(answered)).toBe(JSON.stringify(read));
      if (level === 'redacted') expect(JSON.stringify(answered)).not.toContain('someone@example.com');
    });
  }
});
