import { sql, type FragmentSqlToken } from 'slonik';

// The rows the hot path's batch statements send through unnest (decisions 0030, 0035, 0037) are
// arrays: one cell per column, in the order of the unnest's types and of its alias's column
// names. Written by hand, those are three lists that must agree position by position, and two
// columns of the same type swapped in one of them write each other's values without an error. A
// RowShape is the one list: each column's name and type, in order. A row is built from an object
// keyed by column name, and the unnest's types and alias are read from the same list, so a row's
// values reach the statement's columns by name, whatever the order.

/** One column of a row shape: its name in the unnest's alias, and its element type. */
export type ShapeColumn<Name extends string = string> = { readonly name: Name; readonly type: string };

/** A row as its shape's columns name it. */
export type NamedRow<Name extends string> = { readonly [K in Name]: unknown };

/** A row as it goes out: its cells in the shape's column order. */
export type ShapedRow = readonly unknown[];

export class RowShape<Name extends string> {
  readonly names: readonly Name[];
  readonly types: readonly string[];
  /** How many cells a row has (same-text-statement.ts's set shape). */
  readonly width: number;

  constructor(readonly columns: ReadonlyArray<ShapeColumn<Name>>) {
    this.names = columns.map((column) => column.name);
    this.types = columns.map((column) => column.type);
    this.width = columns.length;
    if (new Set(this.names).size !== this.width) throw new Error(`row shape: a column name is used twice (${this.names.join(', ')})`);
  }

  /**
   * The row's cells in the shape's order. A column without a value is a programming error (the
   * type says so too; a name the shape does not have is refused by the type of a literal).
   */
  row(values: NamedRow<Name>): ShapedRow {
    const cells = new Array<unknown>(this.width);
    for (let index = 0; index < this.width; index += 1) {
      const name = this.names[index]!;
      if (!(name in values)) throw new Error(`row shape: no value for column ${name}`);
      cells[index] = values[name];
    }
    return cells;
  }

  /** `unnest(<columns>) AS alias(<names>)`: the rows as a relation whose columns carry the shape's names. */
  unnest(rows: readonly ShapedRow[], alias: string): FragmentSqlToken {
    const names = sql.join(
      this.names.map((name) => sql.identifier([name])),
      sql.fragment`, `,
    );
    return sql.fragment`${sql.unnest(rows as unknown as unknown[][], [...this.types])} AS ${sql.identifier([alias])}(${names})`;
  }
}

/** A shape from `[name, type]` pairs, in the order the row's cells go out. */
export function rowShape<const Name extends string>(columns: ReadonlyArray<readonly [Name, string]>): RowShape<Name> {
  return new RowShape(columns.map(([name, type]) => ({ name, type })));
}
