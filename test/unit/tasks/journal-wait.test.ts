import { pino } from 'pino';
import type { CommonQueryMethods } from 'slonik';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { JournalListener, JournalWait } from '../../../src/tasks/journal-listener.js';

// A blocking request waits on the journal listener with a timer for its cap (30 s by default). A
// wait ended by its notice clears that timer: left to run out, every answered request would keep
// a timer, its closure and its wait alive for the rest of the cap (thousands under load).

const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });
// No statement is expected: the notices alone decide while the listener is connected.
const db = new Proxy({}, { get: () => () => Promise.reject(new Error('the journal was read')) }) as unknown as CommonQueryMethods;

/** A listener as if its LISTEN connection were up, woken by hand. */
function connectedListener(): { listener: JournalListener; notify: (taskId: string, lastSequence: number, ends: boolean) => void } {
  const listener = new JournalListener('postgres://unused', logger);
  (listener as unknown as { client: object }).client = {};
  const wake = (listener as unknown as { wake: (notice: { taskId: string; lastSequence: number; ends: boolean }) => void }).wake.bind(listener);
  return { listener, notify: (taskId, lastSequence, ends) => wake({ taskId, lastSequence, ends }) };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('JournalWait.until', () => {
  it('ends on the notice of the end and leaves no timer behind', async () => {
    vi.useFakeTimers();
    const { listener, notify } = connectedListener();
    const wait = new JournalWait(listener, 'task-1');
    const waited = wait.until(db, 1, 30_000);
    await Promise.resolve();
    expect(vi.getTimerCount(), 'the cap is armed while waiting').toBe(1);
    notify('task-1', 2, false);
    await vi.advanceTimersByTimeAsync(0);
    notify('task-1', 3, true);
    expect(await waited).toBe(true);
    expect(vi.getTimerCount(), 'no timer outlives the wait').toBe(0);
    wait.close();
  });

  it('gives up at its cap when no end comes', async () => {
    vi.useFakeTimers();
    const { listener } = connectedListener();
    const wait = new JournalWait(listener, 'task-2');
    const waited = wait.until(db, 1, 30_000);
    await vi.advanceTimersByTimeAsync(30_000);
    expect(await waited).toBe(false);
    expect(vi.getTimerCount()).toBe(0);
    wait.close();
  });
});
