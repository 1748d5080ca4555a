import { describe, expect, it } from 'vitest';
import type { StreamResponse } from '../../../src/protocol/wire.js';
import { scrubEventContent } from '../../../src/tasks/journal.js';

// One journal event brought down to a tightened answer ceiling: content only, ids and states kept.

const SECRET = `sk-${'a1B2c3D4e5'.repeat(4)}`;
const base = { taskId: 'task-1', contextId: 'ctx alice@example.com' };
const prompt = { messageId: 'm-1', role: 'ROLE_AGENT' as const, parts: [{ text: `send ${SECRET} to bob@example.com?` }], taskId: 'task-1' };
const inputRequired: StreamResponse = { statusUpdate: { ...base, status: { state: 'TASK_STATE_INPUT_REQUIRED', message: prompt, timestamp: '2026-01-01T00:00:00.000Z' } } };
const working: StreamResponse = { statusUpdate: { ...base, status: { state: 'TASK_STATE_WORKING', timestamp: '2026-01-01T00:00:00.000Z' } } };
const artifact: StreamResponse = { artifactUpdate: { ...base, artifact: { artifactId: 'a-1', parts: [{ text: `key ${SECRET}` }] }, lastChunk: true } };
const direct: StreamResponse = { message: { messageId: 'm-2', role: 'ROLE_AGENT', parts: [{ text: `mail bob@example.com` }], contextId: base.contextId } };

describe('scrubEventContent', () => {
  it('at redacted masks the status message (an INPUT_REQUIRED prompt) and keeps the envelope as it is', () => {
    expect(scrubEventContent(inputRequired, 'redacted')).toEqual({
      kind: 'rewritten',
      response: { statusUpdate: { ...base, status: { state: 'TASK_STATE_INPUT_REQUIRED', message: { ...prompt, parts: [{ text: 'send *** to ***?' }] }, timestamp: '2026-01-01T00:00:00.000Z' } } },
    });
  });

  it('at redacted masks artifacts and direct messages', () => {
    expect(scrubEventContent(artifact, 'redacted')).toMatchObject({ kind: 'rewritten', response: { artifactUpdate: { ...base, artifact: { artifactId: 'a-1', parts: [{ text: 'key ***' }] } } } });
    expect(scrubEventContent(direct, 'redacted')).toMatchObject({ kind: 'rewritten', response: { message: { parts: [{ text: 'mail ***' }] } } });
  });

  it('leaves an event without content, or already redacted, unchanged', () => {
    expect(scrubEventContent(working, 'redacted')).toEqual({ kind: 'unchanged' });
    const once = scrubEventContent(inputRequired, 'redacted');
    if (once.kind !== 'rewritten') throw new Error('expected a rewrite');
    expect(scrubEventContent(once.response, 'redacted')).toEqual({ kind: 'unchanged' });
  });

  it('at metadata and none keeps a status event without its message and removes artifacts and messages', () => {
    for (const level of ['metadata', 'none'] as const) {
      expect(scrubEventContent(inputRequired, level)).toEqual({
        kind: 'rewritten',
        response: { statusUpdate: { ...base, status: { state: 'TASK_STATE_INPUT_REQUIRED', timestamp: '2026-01-01T00:00:00.000Z' } } },
      });
      expect(scrubEventContent(working, level)).toEqual({ kind: 'unchanged' });
      expect(scrubEventContent(artifact, level)).toEqual({ kind: 'removed' });
      expect(scrubEventContent(direct, level)).toEqual({ kind: 'removed' });
    }
  });
});
