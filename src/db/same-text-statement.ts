import type { QuerySqlToken } from 'slonik';
import { isBinaryElementType, toBinaryArray, type BinaryElementType } from './binary-array.js';

// The hot path's batch statements have one text for any batch: their rows go in as arrays through
// unnest (decision 0030). slonik still builds that text again on every call, renumbering the
// placeholders of each nested fragment and escaping each column type: about 100 µs for the
// creation statement, a tenth of a lone task's CPU. A SameTextStatement builds it once, from a
// probe batch of one row whose every cell is a marker, and finds each cell's column among the
// built values. A call then only puts its rows' columns where the markers were
// (docs/decisions/0035-same-text-statements.md).

/**
 * What the build takes, in order: the rows of each unnest, or a list of values that goes in as one
 * array (`sql.array`).
 */
export type RowSets = ReadonlyArray<ReadonlyArray<unknown>>;

/** How a set's values reach the statement: rows of this many cells (an unnest), or one list of values (`sql.array`). */
export type SetShape = number | 'list';

const MARKER = '\u0000keel:cell:';

function marker(set: number, column: number): string {
  return `${MARKER}${set}:${column}`;
}

type Slot = { kind: 'constant'; value: unknown } | { kind: 'column'; set: number; column: number; binary: BinaryElementType | null };

const MARKED_PLACE = /^(\d+):(\d+)$/;

/** The element type slonik casts each array placeholder to (`$slonik_3::"uuid"[]`), by value index. */
export function arrayCasts(text: string): Map<number, string> {
  return new Map([...text.matchAll(/\$slonik_(\d+)::"([a-z0-9_]+)"\[\]/g)].map((cast) => [Number(cast[1]) - 1, cast[2]!]));
}

/**
 * The column a built value holds: an array of exactly one marker, as it was. Anything else is a
 * constant of the statement. A column whose placeholder is cast to an array of a type
 * binary-array.ts encodes is sent in the binary format (decision 0037).
 */
function slotOf(value: unknown, cast: string | undefined): Slot {
  const cell = Array.isArray(value) && value.length === 1 && typeof value[0] === 'string' && value[0].startsWith(MARKER) ? value[0].slice(MARKER.length) : null;
  const place = cell === null ? null : MARKED_PLACE.exec(cell);
  if (place === null) return { kind: 'constant', value };
  return { kind: 'column', set: Number(place[1]), column: Number(place[2]), binary: cast !== undefined && isBinaryElementType(cast) ? cast : null };
}

/** A column's values as they go out: a binary array where its type allows, else the JS array node-postgres writes as text. */
function columnValue(slot: Extract<Slot, { kind: 'column' }>, values: readonly unknown[]): unknown {
  return (slot.binary === null ? null : toBinaryArray(slot.binary, values)) ?? values;
}

function mentionsMarker(value: unknown): boolean {
  if (typeof value === 'string') return value.includes(MARKER);
  return Array.isArray(value) && value.some(mentionsMarker);
}

export class SameTextStatement<Sets extends RowSets, Q extends QuerySqlToken> {
  private readonly template: Q;
  private readonly shapes: readonly SetShape[];
  private readonly slots: readonly Slot[];

  /**
   * `build` makes the statement from its sets with slonik, as a call without this class would;
   * `shapes` says how many cells a row of each set has, or that the set is a list of values. Every
   * cell must reach the statement as a column of an unnest, and every list as one array value,
   * untouched: a build that computes from a cell, or puts one into the text, is refused here, at
   * start-up.
   */
  constructor(
    private readonly build: (sets: Sets) => Q,
    shapes: readonly SetShape[],
  ) {
    this.shapes = shapes;
    const probe = shapes.map((shape, set) =>
      shape === 'list' ? [marker(set, 0)] : [Array.from({ length: shape }, (_, column) => marker(set, column))],
    ) as unknown as Sets;
    this.template = build(probe);
    if (this.template.sql.includes(MARKER)) throw new Error('same-text statement: a cell was written into the text');
    const casts = arrayCasts(this.template.sql);
    this.slots = this.template.values.map((value, index) => slotOf(value, casts.get(index)));
    const found = new Set<string>();
    for (const [index, slot] of this.slots.entries()) {
      if (slot.kind === 'constant') {
        if (mentionsMarker(slot.value)) throw new Error(`same-text statement: value ${index + 1} is derived from a cell`);
        continue;
      }
      const key = `${slot.set}:${slot.column}`;
      if (found.has(key)) throw new Error(`same-text statement: column ${key} is used twice`);
      found.add(key);
    }
    shapes.forEach((shape, set) => {
      for (let column = 0; column < (shape === 'list' ? 1 : shape); column += 1) {
        if (!found.has(`${set}:${column}`)) throw new Error(`same-text statement: column ${set}:${column} does not reach the statement as a column`);
      }
    });
  }

  /** The statement for these rows: the text built once, each column where its marker was. */
  with(sets: Sets): Q {
    return this.place(sets, columnValue);
  }

  /** `with`, every column a JS array that node-postgres writes as a text literal, as before decision 0037 (bench:columns compares the two). */
  withColumnsAsText(sets: Sets): Q {
    return this.place(sets, (_slot, values) => values);
  }

  private place(sets: Sets, send: (slot: Extract<Slot, { kind: 'column' }>, values: readonly unknown[]) => unknown): Q {
    if (sets.length !== this.shapes.length) throw new Error(`same-text statement: ${sets.length} row sets for ${this.shapes.length}`);
    const columns = sets.map((rows, set) => {
      const shape = this.shapes[set]!;
      if (shape === 'list') return [rows];
      const transposed: unknown[][] = Array.from({ length: shape }, () => new Array<unknown>(rows.length));
      for (let row = 0; row < rows.length; row += 1) {
        const cells = rows[row] as readonly unknown[];
        // As slonik's unnest does: a row of another width is a programming error.
        if (cells.length !== shape) throw new Error(`same-text statement: a row of set ${set} has ${cells.length} cells, not ${shape}`);
        for (let column = 0; column < shape; column += 1) transposed[column]![row] = cells[column];
      }
      return transposed;
    });
    const values = this.slots.map((slot) => (slot.kind === 'constant' ? slot.value : send(slot, columns[slot.set]![slot.column]!)));
    return { ...this.template, values: values as Q['values'] };
  }

  /**
   * The statement as slonik builds it for the same rows, fragment by fragment, with its columns sent
   * the way `with` sends them (the equivalence tests compare the two).
   */
  builtBySlonik(sets: Sets): Q {
    const built = this.build(sets);
    const values = built.values.map((value, index) => {
      const slot = this.slots[index];
      return slot?.kind === 'column' && Array.isArray(value) ? columnValue(slot, value) : value;
    });
    return { ...built, values: values as Q['values'] };
  }
}
