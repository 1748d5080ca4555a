import { describe, expect, it } from 'vitest';
import { conformanceBehaviour, createConformanceProvider } from '../../../src/providers/conformance-provider.js';

const options = { streamTimeoutMs: 40 };
const call = (messageId: string, signal = new AbortController().signal, iteration = 0) =>
  createConformanceProvider('c', options).call({ runId: 'r', iteration, transcript: [], tools: [], signal, requestMetadata: { messageId } });

describe('the conformance provider', () => {
  it('picks the longest matching prefix', () => {
    expect(conformanceBehaviour('tck-artifact-file-url-1', options).prefix).toBe('tck-artifact-file-url');
    expect(conformanceBehaviour('tck-artifact-file-1', options).prefix).toBe('tck-artifact-file');
    expect(conformanceBehaviour('tck-stream-artifact-chunked-x', options).prefix).toBe('tck-stream-artifact-chunked');
    expect(conformanceBehaviour('tck-stream-artifact-file', options).prefix).toBe('tck-stream-artifact-file');
    expect(conformanceBehaviour('hello', options)).toEqual({ prefix: '' });
  });

  it('emits chunks of one artifact with append and lastChunk on the second', async () => {
    const outcome = await call('tck-stream-artifact-chunked-1', undefined, 2);
    if (!outcome.ok) throw new Error('failed');
    expect(outcome.reply.artifacts).toEqual([
      { artifactId: 'tck-stream-artifact-chunked-2', name: 'output', parts: [{ text: 'chunk-1 ' }], lastChunk: false },
      { artifactId: 'tck-stream-artifact-chunked-2', name: 'output', parts: [{ text: 'chunk-2' }], append: true, lastChunk: true },
    ]);
    expect(outcome.reply.toolCalls).toEqual([]);
    expect(outcome.reply.outcome).toBeUndefined();
  });

  it('maps the outcomes', async () => {
    const outcomeOf = async (id: string) => {
      const result = await call(id);
      return result.ok ? result.reply.outcome : null;
    };
    expect(await outcomeOf('tck-complete-task')).toEqual({ kind: 'status_message', text: 'Hello from TCK' });
    expect(await outcomeOf('tck-message-response')).toEqual({ kind: 'direct_message', text: 'Direct message response' });
    expect(await outcomeOf('tck-reject-task')).toEqual({ kind: 'reject', reason: 'rejected' });
    expect(await outcomeOf('tck-input-required')).toMatchObject({ kind: 'input_required' });
    expect(await outcomeOf('anything')).toBeUndefined();
  });

  it('waits twice the stream timeout for test-resubscribe-message-id, and stops when aborted', async () => {
    const started = Date.now();
    expect((await call('test-resubscribe-message-id')).ok).toBe(true);
    expect(Date.now() - started).toBeGreaterThanOrEqual(75);
    const abort = new AbortController();
    const pending = call('test-resubscribe-message-id', abort.signal);
    abort.abort();
    expect(await pending).toMatchObject({ ok: false });
  });
});
