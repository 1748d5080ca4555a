import type { DatabasePool } from 'slonik';
import type { Sealer } from '../sealing/sealer.js';
import { readJournal, type JournalEvent } from './journal.js';

// The streams of one task read its journal together (docs/reliability.md, "Large tasks"): when an
// event wakes them all, the first read from a position is shared by every stream that wants that
// position and was woken before the read began, so three hundred streams of a task open (and,
// with eventJson, encode) its large artifact once. A stream woken after a read began starts a read
// of its own, which sees everything committed before its wake: sharing never hides an event.

type Read = { startedAt: number; events: Promise<JournalEvent[]> };

export class SharedJournalReads {
  readonly #reads = new Map<string, Read>();
  #readsStarted = 0;

  constructor(
    private readonly pool: DatabasePool,
    private readonly sealer: Sealer,
  ) {}

  /** How many journal reads this process started (the rest were shared). */
  get started(): number {
    return this.#readsStarted;
  }

  /** The events after `afterSequence`, from a read that began no earlier than `notBefore` (performance.now()). */
  read(taskId: string, afterSequence: number, notBefore: number): Promise<JournalEvent[]> {
    const key = `${taskId}/${afterSequence}`;
    const current = this.#reads.get(key);
    if (current && current.startedAt >= notBefore) return current.events;
    const startedAt = performance.now();
    this.#readsStarted += 1;
    const events = readJournal(this.pool, this.sealer, taskId, afterSequence).finally(() => {
      if (this.#reads.get(key)?.events === events) this.#reads.delete(key);
    });
    this.#reads.set(key, { startedAt, events });
    return events;
  }
}
