import type { Task } from '../protocol/wire.js';
import type { Sealer } from '../sealing/sealer.js';
import { openTaskContent, taskViewOf, type TaskContent, type TaskViewOptions, type VersionedTaskHead, type VersionedTaskRow } from './task-repository.js';

// One task revision opened and serialized once for all its concurrent readers (docs/reliability.md,
// "Large tasks"). A reader checks ownership with the task's head (a small read with the row
// version, per request); the content of that version is then opened (two AES-GCM operations and a
// JSON parse per column) and each view of it serialized once, shared by every reader that asks for
// the same version while the first is still opening it, and kept for later readers within a bound
// of bytes (least recently used out first). A row version is the tuple's xmin: every committed
// write of the row makes a new one, so a cached revision is never shown for a newer row.

/** A task view as readers share it: the Task (never changed by a reader) and its JSON, encoded once. */
export type SharedTask = { task: Task; json: Buffer };

/** A row version opened: its head (the sealed columns dropped once opened), content, and the views made of it. */
export type Revision = { row: VersionedTaskRow; content: TaskContent; bytes: number; views: Map<string, SharedTask> };
type Entry = { value: Revision | SharedTask; bytes: number };

export type TaskRevisionCacheStats = { opened: number; serialized: number; hits: number; joined: number; bytes: number; entries: number };

/** The key of a view: which history and whether artifacts are in it. */
function variantKey(options: TaskViewOptions): string {
  return `${options.historyLength === undefined ? '*' : options.historyLength}${options.includeArtifacts === false ? '-' : '+'}`;
}

/** What the view shows that is not in the task row's own version: the run's end (the task row follows its status). */
function revisionKey(head: Pick<VersionedTaskHead, 'id' | 'version' | 'termination_reason' | 'failure_detail'>): string {
  return `${head.id}|${head.version}|${head.termination_reason ?? ''}|${head.failure_detail === null ? '' : JSON.stringify(head.failure_detail)}`;
}

export class TaskRevisionCache {
  readonly #entries = new Map<string, Entry>();
  /** The keys kept for each task, so a new revision drops the old one's. */
  readonly #byTask = new Map<string, Set<string>>();
  readonly #pending = new Map<string, Promise<Revision | SharedTask | null>>();
  #bytes = 0;
  readonly #stats = { opened: 0, serialized: 0, hits: 0, joined: 0 };

  constructor(
    private readonly sealer: Sealer,
    private readonly maxBytes: number,
  ) {}

  stats(): TaskRevisionCacheStats {
    return { ...this.#stats, bytes: this.#bytes, entries: this.#entries.size };
  }

  /**
   * The view of the task whose head the caller read (and checked: owner, agent), shared with every
   * other reader of that revision. `readRow` reads the whole row; a row that moved on since the
   * head was read is shown as it is now (never older than the head). Null: the row is gone.
   */
  async view(head: VersionedTaskHead, options: TaskViewOptions, readRow: () => Promise<VersionedTaskRow | null>): Promise<SharedTask | null> {
    const kept = this.#entries.get(`${revisionKey(head)}|${variantKey(options)}`);
    if (kept) {
      this.#stats.hits += 1;
      return kept.value as SharedTask;
    }
    const revision = await this.revision(head, readRow);
    return revision ? this.viewOf(revision, options) : null;
  }

  /** A view of an opened revision, serialized once (a revision that moved on is kept under its own version). */
  viewOf(revision: Revision, options: TaskViewOptions): SharedTask {
    const key = `${revisionKey(revision.row)}|${variantKey(options)}`;
    const kept = this.#entries.get(key);
    if (kept) {
      this.#stats.hits += 1;
      return kept.value as SharedTask;
    }
    // Readers that shared the revision's opening share its views too, kept or not.
    const made = revision.views.get(variantKey(options));
    if (made) {
      this.#stats.joined += 1;
      return made;
    }
    const { content } = revision;
    const task = taskViewOf(revision.row, { statusMessage: () => content.statusMessage, artifacts: () => content.artifacts, history: () => content.history }, options);
    this.#stats.serialized += 1;
    const shared: SharedTask = { task, json: Buffer.from(JSON.stringify(task)) };
    revision.views.set(variantKey(options), shared);
    this.#keep(key, shared, shared.json.length);
    return shared;
  }

  /** The row of the head's version (or newer) with its content opened, shared like a view. */
  async revision(head: VersionedTaskHead, readRow: () => Promise<VersionedTaskRow | null>): Promise<Revision | null> {
    return (await this.#shared(revisionKey(head), async () => {
      const row = await readRow();
      if (!row) return null;
      this.#stats.opened += 1;
      const content = openTaskContent(this.sealer, row);
      // The opened content holds about what the sealed columns do (the AES-GCM overhead aside).
      const bytes = (row.status_message?.length ?? 0) + (row.artifacts?.length ?? 0) + (row.history?.length ?? 0);
      const revision: Revision = { row: { ...row, status_message: null, artifacts: null, history: null }, content, bytes, views: new Map() };
      this.#keep(revisionKey(row), revision, bytes);
      return revision;
    })) as Revision | null;
  }

  /** A kept value, the one being made for an earlier reader, or a new one made (and shared) now. */
  async #shared(key: string, make: () => Promise<Revision | SharedTask | null>): Promise<Revision | SharedTask | null> {
    const kept = this.#entries.get(key);
    if (kept) {
      // Most recently used last: Map keeps insertion order, so the first key is the one to drop.
      this.#entries.delete(key);
      this.#entries.set(key, kept);
      this.#stats.hits += 1;
      return kept.value;
    }
    const pending = this.#pending.get(key);
    if (pending) {
      this.#stats.joined += 1;
      return pending;
    }
    const made = make().finally(() => this.#pending.delete(key));
    this.#pending.set(key, made);
    return made;
  }

  #keep(key: string, value: Revision | SharedTask, bytes: number): void {
    // A value larger than the whole bound is shared while it is made, never kept.
    if (bytes > this.maxBytes) return;
    const [taskId, version] = key.split('|') as [string, string];
    // One revision of a task is kept: an older one is never shown again (its readers find the new
    // version in the head), and content a tightened privacy level scrubbed leaves memory with it.
    const keys = this.#byTask.get(taskId) ?? new Set<string>();
    for (const other of keys) if (other.split('|')[1] !== version) this.#drop(other);
    this.#drop(key);
    this.#entries.set(key, { value, bytes });
    keys.add(key);
    this.#byTask.set(taskId, keys);
    this.#bytes += bytes;
    for (const oldest of this.#entries.keys()) {
      if (this.#bytes <= this.maxBytes) break;
      this.#drop(oldest);
    }
  }

  #drop(key: string): void {
    const entry = this.#entries.get(key);
    if (!entry) return;
    this.#entries.delete(key);
    this.#bytes -= entry.bytes;
    const taskId = key.slice(0, key.indexOf('|'));
    const keys = this.#byTask.get(taskId);
    keys?.delete(key);
    if (keys?.size === 0) this.#byTask.delete(taskId);
  }
}
