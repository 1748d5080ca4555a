import { createHash } from 'node:crypto';
import { sql } from 'slonik';

// Named prepared statements for the hot path's constant statements (decision 0030). Postgres plans
// an unnamed statement every time it runs it; a statement whose text never changes (its values all
// parameters, arrays through unnest) can be prepared on a connection under a name, and then
// runs from its cached plan (a generic plan once Postgres finds it as good as the custom ones).
// node-postgres prepares a statement given a name on its first use on a connection and skips the
// parse afterwards; the slonik driver passes the query through untouched, so the pool's driver
// (crash-safe-driver.ts) names the statements that open with the marker below.

/** The text PREPARED opens a statement with (the same characters). */
const MARKER = '/* keel:prepared */';

/** Opens a statement to be prepared on each connection: its text must not vary from call to call. */
export const PREPARED = sql.fragment`/* keel:prepared */`;

/** Names by text: a name is derived from the text, so two texts can never share one. */
const names = new Map<string, string>();
/** A statement text that varies would fill the cache: past this many texts, the rest go unnamed. */
const MAX_NAMES = 64;

/**
 * A connection's statements are prepared again, under a new name, after 100, 1,000, 10,000 and
 * 100,000 runs on it. Postgres keeps a cached generic plan until DDL or new statistics invalidate
 * it; one made while the tables were nearly empty (a new installation) may scan them, and stays
 * that way as they grow if autovacuum is off. Planning again at each tenfold step sees the tables'
 * current size (the planner reads it from the files even without ANALYZE), and the number of
 * statements a connection keeps stays bounded (five per text).
 */
const GENERATIONS = [100, 1_000, 10_000, 100_000];

/** How many times each named statement ran on one connection (one per pool connection, see crash-safe-driver.ts). */
export type PreparedCounts = Map<string, number>;

/**
 * The query as node-postgres takes it: a marked text with the name of its prepared statement on
 * this connection (`counts`), any other text as it is.
 */
export function namedIfPrepared(text: string, counts: PreparedCounts): string | { text: string; name: string } {
  if (!text.startsWith(MARKER)) return text;
  let name = names.get(text);
  if (name === undefined) {
    if (names.size >= MAX_NAMES) return text;
    name = `keel_${createHash('sha1').update(text).digest('hex').slice(0, 24)}`;
    names.set(text, name);
  }
  const runs = counts.get(name) ?? 0;
  counts.set(name, runs + 1);
  let generation = 0;
  while (generation < GENERATIONS.length && runs >= GENERATIONS[generation]!) generation += 1;
  return { text, name: `${name}_${generation}` };
}
