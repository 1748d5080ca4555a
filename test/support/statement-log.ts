import pg from 'pg';

// Every statement this process sends to Postgres, as the pg client sends it (slonik's pg driver,
// the journal listener and the Postgres queue backend all go through pg.Client#query): a log that
// needs no server extension. The wrapper records and calls the real method; nothing is faked.

export type LoggedStatement = { text: string; at: number; inTransaction: boolean; client: object };

export type StatementLog = {
  entries: LoggedStatement[];
  /** Statements sent since `from` (an index into `entries`), optionally only those matching. */
  since: (from: number, match?: RegExp) => LoggedStatement[];
  /** Transactions committed by the statements since `from`: each COMMIT, and each statement sent outside a transaction. */
  commitsSince: (from: number) => number;
  /** Resolves once no statement has been sent for `quietMs` (at most `limitMs`): the process's own start-up work is over. */
  untilQuiet: (quietMs: number, limitMs?: number) => Promise<void>;
  stop: () => void;
};

const textOf = (query: unknown): string => {
  if (typeof query === 'string') return query;
  if (query && typeof query === 'object' && 'text' in query && typeof (query as { text: unknown }).text === 'string') return (query as { text: string }).text;
  return '';
};

export function recordStatements(): StatementLog {
  const entries: LoggedStatement[] = [];
  const open = new WeakSet<object>();
  const prototype = pg.Client.prototype as unknown as { query: (...args: unknown[]) => unknown };
  const original = prototype.query;
  prototype.query = function (this: object, ...args: unknown[]) {
    const text = textOf(args[0]).trim();
    if (text) {
      if (/^(START TRANSACTION|BEGIN)\b/i.test(text)) open.add(this);
      entries.push({ text, at: Date.now(), inTransaction: open.has(this), client: this });
      if (/^(COMMIT|ROLLBACK)\b/i.test(text)) open.delete(this);
    }
    return original.apply(this, args);
  };
  return {
    entries,
    since: (from, match) => entries.slice(from).filter((entry) => !match || match.test(entry.text)),
    commitsSince: (from) => entries.slice(from).filter((entry) => /^COMMIT\b/i.test(entry.text) || !entry.inTransaction).length,
    untilQuiet: async (quietMs, limitMs = 15_000) => {
      const deadline = Date.now() + limitMs;
      while (Date.now() < deadline && Date.now() - (entries.at(-1)?.at ?? 0) < quietMs) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    },
    stop: () => {
      prototype.query = original;
    },
  };
}
