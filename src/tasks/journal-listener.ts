import pg from 'pg';
import type { KeelLogger } from '../log/logger.js';
import type { CommonQueryMethods } from 'slonik';
import { JOURNAL_CHANNEL, journalEndedAfter, parseJournalNotice, type JournalNotice } from './journal.js';
import type { TaskRow } from './task-repository.js';
import { isConnectionError } from '../db/pool.js';
import { clientKeepAlive, DEFAULT_LINK_TIMEOUT_SECONDS, silentLinkUrl } from '../db/silent-link.js';

/**
 * A journal commit this process is making for a task (a run's completion journals its end,
 * docs/decisions/0022-completion-writes-the-journal.md): once its COMMIT has returned, `committed`
 * hands the task as the transaction wrote it to this process's waiters; `unknown` says there is
 * nothing to hand (nothing journaled, or a COMMIT whose outcome is not known), and wakes them to
 * read the journal once: a fast run's end is NOTIFYd only to a watched task (decision 0047), so
 * without that read a blocking request would wait out its cap for an end that did commit.
 * The executor calls it once the end, written again after a lost connection, was refused, or
 * when it gave up (workers/run-settling.ts).
 */
export type LocalCommit = { committed: (task: TaskRow, notice: JournalNotice) => void; unknown: () => void };

type Waiter = (notice: JournalNotice | null, committed?: TaskRow) => void;

/**
 * Resolves once `woken` settles or `ms` have passed, whichever is first. The timer is cleared
 * either way: left to run out, it would keep the wait's closure (a request's, a stream's) alive
 * for the whole delay after the wait ended, one per answer or event under load.
 */
export async function wokenOrAfter(woken: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([woken, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms).unref()))]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * One LISTEN connection per process: each journal commit (a run's completion, the projector)
 * NOTIFYs the task id, and waiting requests and streams are woken, never polled. After a reconnect every waiter is
 * woken once, since notifications sent meanwhile were missed; waiters always reread the journal.
 */
export class JournalListener {
  private client: pg.Client | null = null;
  private readonly waiters = new Map<string, Set<Waiter>>();
  /** The outcomes of this process's journal commits under way, per task. */
  private readonly localCommits = new Map<string, Set<Promise<void>>>();
  private closed = false;
  private reconnectTimer: NodeJS.Timeout | null = null;
  /** Other channels heard on the same connection (a run's cancel, decision 0066), with their handlers. */
  private readonly channels = new Map<string, Set<(payload: string | null) => void>>();

  constructor(
    private readonly databaseUrl: string,
    private readonly logger: KeelLogger,
    private readonly linkTimeoutSeconds: number = DEFAULT_LINK_TIMEOUT_SECONDS,
  ) {}

  async start(): Promise<void> {
    // The connection only waits for the server: without keepalive a silent link (or a server that
    // ended this session meanwhile) would leave it deaf for hours, every notice missed. With it the
    // link's silence is an error within half the link timeout and ten probes, and it reconnects;
    // the server ends this session too within the link timeout (silent-link.ts).
    const client = new pg.Client({
      connectionString: silentLinkUrl(this.databaseUrl, this.linkTimeoutSeconds),
      application_name: 'keel-journal-listener',
      ...clientKeepAlive(this.linkTimeoutSeconds),
    });
    client.on('notification', (message) => {
      const handlers = message.channel === JOURNAL_CHANNEL ? undefined : this.channels.get(message.channel);
      if (handlers) {
        for (const handler of [...handlers]) handler(message.payload ?? null);
        return;
      }
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
    for (const channel of this.channels.keys()) await client.query(`LISTEN ${channel}`);
    this.client = client;
  }

  /**
   * Hears `channel` on this process's one LISTEN connection too: `onPayload` gets each NOTIFY's
   * payload, and null after a reconnect (notices sent meanwhile were missed). Until the returned
   * function is called. `channel` is a fixed identifier of the code, never input.
   */
  listenTo(channel: string, onPayload: (payload: string | null) => void): () => void {
    let handlers = this.channels.get(channel);
    if (!handlers) {
      handlers = new Set();
      this.channels.set(channel, handlers);
      this.client?.query(`LISTEN ${channel}`).catch((error: Error) => this.logger.warn({ err: error, channel }, 'LISTEN failed; the channel is heard again after the next reconnect'));
    }
    handlers.add(onPayload);
    const set = handlers;
    return () => void set.delete(onPayload);
  }

  private scheduleReconnect(): void {
    if (this.closed || this.reconnectTimer) return;
    this.client = null;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      this.start().then(
        () => {
          this.wakeAll();
          this.channelsMissed();
        },
        (error: Error) => {
          this.logger.warn({ err: error }, 'journal listener could not reconnect; retrying');
          this.scheduleReconnect();
        },
      );
    }, 500);
    this.reconnectTimer.unref();
  }

  private wake(notice: JournalNotice, committed?: TaskRow): void {
    const set = this.waiters.get(notice.taskId);
    if (set) for (const waiter of [...set]) waiter(notice, committed);
  }

  /**
   * Announces a journal commit of the task that this process is about to make. Its waiters are
   * woken by `committed` as soon as the COMMIT has returned (the NOTIFY comes later, or first: a
   * waiter woken by it waits for this outcome rather than read the task).
   */
  beginLocalCommit(taskId: string): LocalCommit {
    let settle: () => void = () => undefined;
    const outcome = new Promise<void>((resolve) => (settle = resolve));
    let pending = this.localCommits.get(taskId);
    if (!pending) {
      pending = new Set();
      this.localCommits.set(taskId, pending);
    }
    pending.add(outcome);
    let ended = false;
    const end = (task?: TaskRow, notice?: JournalNotice) => {
      if (ended) return;
      ended = true;
      if (task && notice) this.wake(notice, task);
      else this.wakeToRead(taskId);
      pending.delete(outcome);
      if (pending.size === 0 && this.localCommits.get(taskId) === pending) this.localCommits.delete(taskId);
      settle();
    };
    return { committed: (task, notice) => end(task, notice), unknown: () => end() };
  }

  /** Resolves when every journal commit of the task this process has under way has its outcome. */
  localCommitsSettled(taskId: string): Promise<void> | null {
    const pending = this.localCommits.get(taskId);
    return pending && pending.size > 0 ? Promise.all(pending).then(() => undefined) : null;
  }

  /** Wakes the task's waiters without a notice: they read the journal. */
  private wakeToRead(taskId: string): void {
    const set = this.waiters.get(taskId);
    if (set) for (const waiter of [...set]) waiter(null);
  }

  /** Wakes everyone without a notice: they must reread the journal (notices may have been missed). */
  private wakeAll(): void {
    for (const set of this.waiters.values()) for (const waiter of [...set]) waiter(null);
  }

  /** After a reconnect: every other channel's handlers hear that notices may have been missed. */
  private channelsMissed(): void {
    for (const handlers of this.channels.values()) for (const handler of [...handlers]) handler(null);
  }

  /**
   * Calls `onWake` after every journal commit of the task (with its notice, and with the task as
   * committed when this process made the commit), or with null when notices may have been missed,
   * until the returned function is called.
   */
  subscribe(taskId: string, onWake: Waiter): () => void {
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
  private committed: TaskRow | null = null;
  private missed = false;
  private wake: () => void = () => undefined;
  private readonly unsubscribe: () => void;

  constructor(
    private readonly listener: JournalListener,
    private readonly taskId: string,
  ) {
    this.unsubscribe = listener.subscribe(taskId, (notice, committed) => {
      if (notice) this.notices.push(notice);
      else this.missed = true;
      if (committed) this.committed = committed;
      this.wake();
    });
  }

  /**
   * After `until` saw the end: the task as this process committed it, when the end was a journal
   * commit of this process (docs/decisions/0022-completion-writes-the-journal.md), without reading
   * it again. A commit of this process still under way when the notice arrived is waited for, at
   * most `capMs`. Null when the end was committed elsewhere (another process, the projector's
   * NOTIFY only) or its COMMIT's outcome is unknown: the caller reads the task.
   */
  async committedTask(capMs: number): Promise<TaskRow | null> {
    if (this.committed) return this.committed;
    const settled = this.listener.localCommitsSettled(this.taskId);
    if (settled) {
      await wokenOrAfter(settled, capMs);
    }
    return this.committed;
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
        let unread = false;
        if (mustRead || this.missed || stop?.aborted) {
          this.missed = false;
          mustRead = false;
          try {
            if (await journalEndedAfter(db, this.taskId, afterSequence)) return true;
          } catch (error) {
            // The database out of reach (a crash): read again shortly rather than fail the request.
            if (!isConnectionError(error)) throw error;
            unread = true;
          }
        }
        const remaining = deadline - Date.now();
        if (remaining <= 0 || stop?.aborted) return false;
        // While the listener reconnects, or the read could not be made, read the journal every half second instead.
        const poll = unread || !this.listener.listening;
        await wokenOrAfter(woken, poll ? Math.min(remaining, 500) : remaining);
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
