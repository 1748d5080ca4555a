import pg from 'pg';
import type { KeelLogger } from '../log/logger.js';
import type { CommonQueryMethods } from 'slonik';
import { JOURNAL_CHANNEL, journalEndedAfter, parseJournalNotice, type JournalNotice } from './journal.js';

/**
 * One LISTEN connection per process: the projector NOTIFYs the task id after each journal commit,
 * and waiting requests and streams are woken, never polled. After a reconnect every waiter is
 * woken once, since notifications sent meanwhile were missed; waiters always reread the journal.
 */
export class JournalListener {
  private client: pg.Client | null = null;
  private readonly waiters = new Map<string, Set<(notice: JournalNotice | null) => void>>();
  private closed = false;
  private reconnectTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly databaseUrl: string,
    private readonly logger: KeelLogger,
  ) {}

  async start(): Promise<void> {
    const client = new pg.Client({ connectionString: this.databaseUrl, application_name: 'keel-journal-listener' });
    client.on('notification', (message) => {
      const notice = message.payload ? parseJournalNotice(message.payload) : null;
      if (notice) this.wake(notice);
    });
    client.on('error', (error) => {
      this.logger.warn({ err: error }, 'journal listener connection lost; reconnecting');
      this.scheduleReconnect();
    });
    client.on('end', () => this.scheduleReconnect());
    await client.connect();
    await client.query(`LISTEN ${JOURNAL_CHANNEL}`);
    this.client = client;
  }

  private scheduleReconnect(): void {
    if (this.closed || this.reconnectTimer) return;
    this.client = null;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      this.start().then(
        () => this.wakeAll(),
        (error: Error) => {
          this.logger.warn({ err: error }, 'journal listener could not reconnect; retrying');
          this.scheduleReconnect();
        },
      );
    }, 500);
    this.reconnectTimer.unref();
  }

  private wake(notice: JournalNotice): void {
    const set = this.waiters.get(notice.taskId);
    if (set) for (const waiter of [...set]) waiter(notice);
  }

  /** Wakes everyone without a notice: they must reread the journal (notices may have been missed). */
  private wakeAll(): void {
    for (const set of this.waiters.values()) for (const waiter of [...set]) waiter(null);
  }

  /**
   * Calls `onWake` after every journal commit of the task (with its notice), or with null when
   * notices may have been missed, until the returned function is called.
   */
  subscribe(taskId: string, onWake: (notice: JournalNotice | null) => void): () => void {
    let set = this.waiters.get(taskId);
    if (!set) {
      set = new Set();
      this.waiters.set(taskId, set);
    }
    set.add(onWake);
    return () => {
      set!.delete(onWake);
      if (set!.size === 0) this.waiters.delete(taskId);
    };
  }

  get listening(): boolean {
    return this.client !== null;
  }

  async stop(): Promise<void> {
    this.closed = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.wakeAll();
    await this.client?.end().catch(() => undefined);
    this.client = null;
  }
}

/**
 * A blocking request's wait for the journal to announce an end (terminal or interrupted state,
 * or a direct message) after a given sequence. It is created before the work is enqueued, so the
 * notices alone decide; the journal is only read when notices may have been missed.
 */
export class JournalWait {
  private readonly notices: JournalNotice[] = [];
  private missed = false;
  private wake: () => void = () => undefined;
  private readonly unsubscribe: () => void;

  constructor(
    private readonly listener: JournalListener,
    private readonly taskId: string,
  ) {
    this.unsubscribe = listener.subscribe(taskId, (notice) => {
      if (notice) this.notices.push(notice);
      else this.missed = true;
      this.wake();
    });
  }

  /**
   * Waits until the journal shows the end of the task's current stretch after `afterSequence`,
   * for at most `capMs` or until `stop` is aborted (shutdown); false when it did not end.
   */
  async until(db: CommonQueryMethods, afterSequence: number, capMs: number, checkFirst = false, stop?: AbortSignal): Promise<boolean> {
    const deadline = Date.now() + capMs;
    let mustRead = checkFirst;
    const onStop = () => this.wake();
    stop?.addEventListener('abort', onStop, { once: true });
    try {
      for (;;) {
        const woken = new Promise<void>((resolve) => (this.wake = resolve));
        if (this.notices.some((notice) => notice.ends && notice.lastSequence > afterSequence)) return true;
        if (mustRead || this.missed || stop?.aborted) {
          this.missed = false;
          mustRead = false;
          if (await journalEndedAfter(db, this.taskId, afterSequence)) return true;
        }
        const remaining = deadline - Date.now();
        if (remaining <= 0 || stop?.aborted) return false;
        // While the listener reconnects, read the journal every half second instead.
        const poll = !this.listener.listening;
        await Promise.race([woken, new Promise((resolve) => setTimeout(resolve, poll ? Math.min(remaining, 500) : remaining).unref())]);
        if (poll) mustRead = true;
      }
    } finally {
      stop?.removeEventListener('abort', onStop);
    }
  }

  close(): void {
    this.unsubscribe();
  }
}
