import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { RunSlots, type FastRunHandling } from '../../../workers/run-slots.js';

// The run slots' rule for fair slots (decision 0062), without I/O: a client with runs in flight
// leaves one free slot per other client seen in the last 2 s with none (at most a quarter of the
// slots), the queue's worker is told the share that leaves, and a client alone uses every slot.

const claim = { workerId: 'worker-1', leaseMs: 60_000 };
/** Runs that stay in their slot until the test ends them. */
function heldRuns() {
  const ends: (() => void)[] = [];
  const handling: FastRunHandling = {
    run: () => new Promise<void>((resolve) => ends.push(resolve)),
    handBack: async () => undefined,
  };
  return { handling, endOne: () => ends.shift()?.() };
}
const run = (id: string) => ({ id }) as never;
const settle = () => new Promise((resolve) => setImmediate(resolve));

let shares: number[];
const slotsOf = (concurrency: number) => new RunSlots({ concurrency, fastSlots: concurrency - 1, onQueueShare: (slots) => shares.push(slots) });

beforeEach(() => {
  shares = [];
  vi.useFakeTimers({ toFake: ['Date'] });
  vi.setSystemTime(1_000_000);
});
afterEach(() => vi.useRealTimers());

describe('fair run slots', () => {
  it('a client alone takes every fast slot', () => {
    const slots = slotsOf(8);
    const { handling } = heldRuns();
    const taken = Array.from({ length: 7 }, () => slots.reserveFast(claim, handling, 'heavy'));
    expect(taken.every((slot) => slot !== null)).toBe(true);
    taken.forEach((slot, index) => slot!.start(run(`h${index}`)));
    expect(slots.keptFree).toBe(0);
    expect(shares.at(-1), 'the queue keeps at least one slot').toBe(1);
  });

  it('keeps a slot free for a client seen lately with none in flight: the heavy client cannot take it, the light one can', async () => {
    const slots = slotsOf(8);
    const { handling, endOne } = heldRuns();
    // The light client sends a task and its run ends: seen, nothing in flight.
    const first = slots.reserveFast(claim, handling, 'light')!;
    first.start(run('l1'));
    endOne();
    await settle();
    expect(slots.keptFree).toBe(1);
    expect(shares.at(-1), 'the queue leaves the kept slot').toBe(7);
    // The heavy client holds 4 fast runs (the fast path's half once the queue is full) and the queue's worker the rest of its share.
    for (let index = 0; index < 3; index += 1) slots.reserveFast(claim, handling, 'heavy')!.start(run(`h${index}`));
    const queued = Array.from({ length: 4 }, (_, index) => slots.queued(`q${index}`, () => new Promise(() => undefined), 'heavy'));
    expect(queued).toHaveLength(4);
    expect(slots.reserveFast(claim, handling, 'heavy'), 'the last free slot is kept for the light client').toBeNull();
    const light = slots.reserveFast(claim, handling, 'light');
    expect(light, 'the light client takes it at once').not.toBeNull();
    light!.cancel();
  });

  it('forgets a client quiet for more than 2 s, and keeps at most a quarter of the slots', () => {
    const slots = slotsOf(8);
    const { handling } = heldRuns();
    for (const client of ['a', 'b', 'c']) slots.reserveFast(claim, handling, client)!.cancel();
    expect(slots.keptFree, 'three clients seen, two slots of eight kept').toBe(2);
    vi.setSystemTime(1_000_000 + 2_001);
    expect(slots.keptFree).toBe(0);
  });

  it('keeps nothing without the fast path: only it could start a run in a kept slot', async () => {
    const slots = new RunSlots({ concurrency: 8, fastSlots: 0 });
    await slots.queued('q1', async () => ({ kind: 'skipped' }), 'light');
    expect(slots.keptFree).toBe(0);
  });
});
