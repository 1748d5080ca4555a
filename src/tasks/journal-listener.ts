import pg from 'pg';
import type { KeelLogger } from '../log/logger.js';
import { JOURNAL_CHANNEL } from './journal.js';

/**
 * One LISTEN connection per process: the projector NOTIFYs the task id after each journal commit,
 * and waiting requests and streams are woken, never polled. After a reconnect every waiter is
 * woken once, since notifications sent meanwhile were missed; waiters always reread the journal.
 */
export class JournalListener {
  private client: pg.Client | null = null;
  private readonly waiters = new Map<string, Set<() => void>>();
  private closed = false;
  private reconnectTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly databaseUrl: string,
    private readonly logger: KeelLogger,
  ) {}

  async start(): Promise<void> {
    const client = new pg.Client({ connectionString: this.databaseUrl, application_name: 'keel-journal-listener' });
    client.on('notification', (message) => {
      if (message.payload) this.wake(message.payload);
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

  private wake(taskId: string): void {
    const set = this.waiters.get(taskId);
    if (set) for (const waiter of [...set]) waiter();
  }

  private wakeAll(): void {
    for (const set of this.waiters.values()) for (const waiter of [...set]) waiter();
  }

  /** Calls `onWake` after every journal commit of the task until the returned function is called. */
  subscribe(taskId: string, onWake: () => void): () => void {
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
