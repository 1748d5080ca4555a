import { describe, expect, it } from 'vitest';
import { started, unlessCancelled } from '../../../src/runs/unless-cancelled.js';

// A run's step raced against its cancel (decision 0066): the step's value when it answers first,
// `{ done: false }` at once when the cancel comes first, whatever the step does afterwards.

const never = () => new Promise<string>(() => undefined);

describe('unlessCancelled', () => {
  it('gives the step its value when it answers before any cancel', async () => {
    const cancel = new AbortController();
    await expect(unlessCancelled(Promise.resolve('answer'), cancel.signal)).resolves.toEqual({ done: true, value: 'answer' });
  });

  it('stops waiting at once when the run is cancelled, even for a step that never answers', async () => {
    const cancel = new AbortController();
    const raced = unlessCancelled(never(), cancel.signal);
    cancel.abort();
    await expect(raced).resolves.toEqual({ done: false });
  });

  it('does not start waiting for a step of a run already cancelled', async () => {
    const cancel = new AbortController();
    cancel.abort();
    await expect(unlessCancelled(never(), cancel.signal)).resolves.toEqual({ done: false });
  });

  it("passes a step's error on, and a late error after the cancel goes nowhere", async () => {
    const cancel = new AbortController();
    await expect(unlessCancelled(started(async () => Promise.reject(new Error('broke'))), cancel.signal)).rejects.toThrow('broke');
    let fail: (error: Error) => void = () => undefined;
    const late = new Promise<string>((_, reject) => (fail = reject));
    const raced = unlessCancelled(late, cancel.signal);
    cancel.abort();
    await expect(raced).resolves.toEqual({ done: false });
    fail(new Error('too late'));
    await expect(late).rejects.toThrow('too late');
  });

  it('races a step that throws before its first await like any other', async () => {
    const cancel = new AbortController();
    const throwing = () => {
      throw new Error('at once');
    };
    await expect(unlessCancelled(started(throwing), cancel.signal)).rejects.toThrow('at once');
  });

  it('leaves no listener on the signal once the step answered', async () => {
    const cancel = new AbortController();
    let added = 0;
    let removed = 0;
    const signal = cancel.signal;
    const add = signal.addEventListener.bind(signal);
    const remove = signal.removeEventListener.bind(signal);
    signal.addEventListener = ((...args: Parameters<typeof add>) => ((added += 1), add(...args))) as typeof add;
    signal.removeEventListener = ((...args: Parameters<typeof remove>) => ((removed += 1), remove(...args))) as typeof remove;
    for (let index = 0; index < 3; index += 1) await unlessCancelled(Promise.resolve(index), signal);
    expect({ added, removed }).toEqual({ added: 3, removed: 3 });
  });
});
