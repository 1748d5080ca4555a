import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { GroupCommit } from '../db/group-commit.js';
import { PREPARED } from '../db/prepared-statements.js';
import { SameTextStatement } from '../db/same-text-statement.js';
import type { Sealer } from '../sealing/sealer.js';
import {
  HELD_COMPLETION_SHAPES,
  heldCompletionCtes,
  heldCompletionResults,
  heldCompletionRows,
  heldOutcome,
  outcomeRow,
  prepareHeldCompletions,
  type HeldCompletion,
  type HeldCompletionRows,
  type HeldItem,
  writeHeldItems,
} from './complete-held-runs.js';
import type { CompletionResult } from './completion-input.js';
import {
  checkCreated,
  CREATED_COUNTS,
  creationCtes,
  CREATION_SHAPES,
  creationRows,
  writeCreationRows,
  type CreationRows,
  type TaskCreation,
  type TaskCreator,
} from './task-creation.js';
import { newRunLink } from '../tracing/run-trace.js';

// The hot path's two writes of a task, its creation and its held completion (decisions 0025 and
// 0029), written together when concurrent requests have both ready at the same moment: one
// statement, one round trip and one commit for the creations of new tasks and the completions of
// tasks created earlier (docs/decisions/0048-creations-and-completions-in-one-statement.md). A
// task's own two writes are never in one statement: its completion waits for its run, which waits
// for its creation's commit, so the design's two commit points per task stay.

/** Completes a held run (complete-held-runs.ts): the completion as committed, or null when its rows had changed. */
export type HeldCompleter = { completeHeld(completion: HeldCompletion): Promise<CompletionResult | null> };

/**
 * A write as its caller submitted it, its values already built and sealed: the caller does that
 * work while the statement in flight runs, instead of the lane doing it between two statements.
 * A completion's `item` (its audit rows taken) is null once a failed statement gave them back.
 */
type Write = { kind: 'creation'; creation: TaskCreation; rows: CreationRows } | { kind: 'completion'; completion: HeldCompletion; item: HeldItem | null };
/** A creation's `created` is false when its message key was used before (nothing written for it). */
type Written = { kind: 'creation'; created: boolean } | { kind: 'completion'; result: CompletionResult | null };
export type WriteKind = Write['kind'];

const togetherRow = outcomeRow.extend({ tasks: z.number(), events: z.number(), created: z.array(z.string()) });

type TogetherRows = [...CreationRows, ...HeldCompletionRows];

/**
 * The creations' CTEs and the held completions' in one statement (one text for any batch, either
 * part possibly empty). They touch different tasks: a completion locks rows committed before, the
 * creations insert new ones. The completions' count check fails the whole statement, creations
 * included.
 */
export const creationsAndCompletionsStatement = new SameTextStatement(
  (sets: TogetherRows) => {
    const creations = sets.slice(0, CREATION_SHAPES.length) as unknown as CreationRows;
    const completions = sets.slice(CREATION_SHAPES.length) as unknown as HeldCompletionRows;
    return sql.type(togetherRow)`${PREPARED}
    WITH ${creationCtes(creations)},
    ${heldCompletionCtes(completions)}
    ${heldOutcome(sql.fragment`, ${CREATED_COUNTS}`)}`;
  },
  [...CREATION_SHAPES, ...HELD_COMPLETION_SHAPES],
);

/** The rows of several creations, each built alone (creationRows), as one batch's. */
function concatCreationRows(all: readonly CreationRows[]): CreationRows {
  return [all.flatMap((rows) => rows[0]), all.flatMap((rows) => rows[1]), all.flatMap((rows) => rows[2]), all.flatMap((rows) => rows[3])];
}

/** The held completions' items, each prepared alone, as one batch's (each at its place among them). */
function batchItems(items: readonly HeldItem[]): HeldItem[] {
  return items.map((item, index) => ({ ...item, index }));
}

/**
 * Writes the creations and the held completions in one statement, from their rows as built for
 * each. Which creations were inserted (false: a repeated message key), and the completions'
 * results in their order (null: rows had changed, nothing of it written). A statement that fails
 * writes nothing.
 */
export async function writeCreationsAndCompletions(
  db: CommonQueryMethods,
  creations: ReadonlyArray<{ creation: TaskCreation; rows: CreationRows }>,
  completions: ReadonlyArray<{ completion: HeldCompletion; item: HeldItem }>,
): Promise<{ created: boolean[]; completed: Array<CompletionResult | null> }> {
  const items = batchItems(completions.map(({ item }) => item));
  const sets = [...concatCreationRows(creations.map(({ rows }) => rows)), ...heldCompletionRows(items)] as TogetherRows;
  const rows = await db.many(creationsAndCompletionsStatement.with(sets));
  const created = checkCreated(
    rows[0]!,
    creations.map(({ creation }) => creation),
  );
  const completed = heldCompletionResults(
    completions.map(({ completion }) => completion),
    items,
    rows,
  );
  return { created, completed };
}

/**
 * Prepares a held completion (its audit rows taken, its values sealed); null when the transaction
 * must write it. A preparation that throws gives back what it took, as a failed statement does.
 */
function prepareHeld(sealer: Sealer, completion: HeldCompletion): HeldItem | null {
  try {
    return prepareHeldCompletions(sealer, [completion])[0] ?? null;
  } catch (error) {
    completion.rolledBack?.();
    throw error;
  }
}

export type TaskWriteOptions = {
  /** At most this many writes per statement, creations and completions together. */
  maxBatch: number;
  /** How many statements may be in flight at once, each on its own connection. */
  lanes?: number;
  /** A lane beyond the first starts only when this many writes wait (group-commit.ts). */
  spareLaneBacklog?: number;
  /** Per statement: how many writes of each kind it carried (metrics). */
  onBatch?: (sizes: { creations: number; completions: number }) => void;
  /** Per statement and kind: how long each write of that kind waited for it, and how long it took, in milliseconds. */
  onWritten?: (kind: WriteKind, waitedMs: readonly number[], writeMs: number) => void;
};

/**
 * The creations and held completions of concurrent requests, as one group commit: a write waits
 * at most for the statements in flight, then goes with every other write, of either kind, that
 * arrived meanwhile. A statement that fails with an error of its own is written again write by
 * write (a creation alone, a completion alone), so one bad task fails alone.
 */
export class TaskWriteBatch implements TaskCreator, HeldCompleter {
  private readonly group: GroupCommit<Write, Written>;

  constructor(
    pool: DatabasePool,
    private readonly sealer: Sealer,
    options: TaskWriteOptions,
  ) {
    const { onBatch, onWritten } = options;
    this.group = new GroupCommit<Write, Written>({
      maxBatch: options.maxBatch,
      gatherAfterBatch: true,
      // A creation links to its run's stored span; a completion to the stretch that completed it.
      trace: { name: 'keel.write_batch', linkOf: (write) => (write.kind === 'creation' ? newRunLink(write.creation.run.trace, write.creation.task.id) : null) },
      ...(options.lanes === undefined ? {} : { lanes: options.lanes }),
      ...(options.spareLaneBacklog === undefined ? {} : { spareLaneBacklog: options.spareLaneBacklog }),
      writeBatch: async (writes) => {
        const creations: Array<{ creation: TaskCreation; rows: CreationRows }> = [];
        const completions: Array<{ completion: HeldCompletion; item: HeldItem }> = [];
        for (const write of writes) {
          if (write.kind === 'creation') creations.push(write);
          // A statement that rolled back is never batched again (its writes go alone), so every item is here.
          else if (write.item !== null) completions.push({ completion: write.completion, item: write.item });
          else throw new Error(`task write batch: run ${write.completion.runId}'s completion was batched after its audit rows were given back`);
        }
        const { created, completed } = await writeCreationsAndCompletions(pool, creations, completions);
        let nextCreation = 0;
        let nextCompletion = 0;
        return writes.map(
          (write): Written => (write.kind === 'creation' ? { kind: 'creation', created: created[nextCreation++]! } : { kind: 'completion', result: completed[nextCompletion++]! }),
        );
      },
      writeOne: async (write) => {
        if (write.kind === 'creation') {
          const [created] = await writeCreationRows(pool, [write.creation], write.rows);
          return { kind: 'creation', created: created! };
        }
        // Written again alone after a failed statement gave its audit rows back: prepared again.
        const item = write.item ?? prepareHeld(sealer, write.completion);
        const [result] = await writeHeldItems(pool, [write.completion], item === null ? [] : batchItems([item]));
        return { kind: 'completion', result: result! };
      },
      rolledBack: (write) => {
        if (write.kind !== 'completion') return;
        write.completion.rolledBack?.();
        write.item = null;
      },
      ...(onBatch || onWritten
        ? {
            onWritten: (waitedMs: readonly number[], writeMs: number, writes: readonly Write[]) => {
              const creations = writes.filter((write) => write.kind === 'creation').length;
              onBatch?.({ creations, completions: writes.length - creations });
              for (const kind of ['creation', 'completion'] as const) {
                const waits = waitedMs.filter((_, index) => writes[index]!.kind === kind);
                if (waits.length > 0) onWritten?.(kind, waits, writeMs);
              }
            },
          }
        : {}),
    });
  }

  async create(creation: TaskCreation): Promise<boolean> {
    const written = await this.group.submit({ kind: 'creation', creation, rows: creationRows(this.sealer, [creation]) });
    return written.kind === 'creation' && written.created;
  }

  async completeHeld(completion: HeldCompletion): Promise<CompletionResult | null> {
    const item = prepareHeld(this.sealer, completion);
    // Its audit rows could be refused: the transaction writes it (nothing was taken).
    if (item === null) return null;
    const written = await this.group.submit({ kind: 'completion', completion, item });
    return written.kind === 'completion' ? written.result : null;
  }
}
