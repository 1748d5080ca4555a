import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { applyLevel, scrubToCeiling } from '../privacy/apply-level.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { ArtifactEmission } from '../providers/provider.js';
import type { Sealer } from '../sealing/sealer.js';

// run_outputs: the artifacts and the answer a run produced, sealed and kept at the run's answer
// level. Writers pass the level they read under the run-row lock.

export type RunOutputKind = 'artifact' | 'answer' | 'status';

/** What is stored (before the level is applied): the emission itself. */
export type RunOutputContent = { artifactId?: string; name?: string; description?: string; parts: unknown[] };

export type NewRunOutput = {
  kind: RunOutputKind;
  artifactId: string | null;
  append: boolean;
  lastChunk: boolean;
  content: RunOutputContent;
};

export type StoredRunOutput = {
  ordinal: number;
  kind: RunOutputKind;
  artifactId: string | null;
  append: boolean;
  lastChunk: boolean;
  level: Exclude<PrivacyLevel, 'none'>;
  /** The content as kept: full, redacted, or a metadata summary. */
  content: unknown;
  runRevision: number;
};

const outputRow = z.object({
  ordinal: z.number(),
  kind: z.enum(['artifact', 'answer', 'status']),
  artifact_id: z.string().nullable(),
  append: z.boolean(),
  last_chunk: z.boolean(),
  level: z.enum(['metadata', 'redacted', 'full']),
  content: z.instanceof(Buffer),
  run_revision: z.number(),
});

export const runOutputContext = (runId: string, ordinal: number) => ({ table: 'run_outputs', column: 'content', rowId: `${runId}/${ordinal}` });

export function outputFromEmission(kind: RunOutputKind, emission: ArtifactEmission, fallbackId: string): NewRunOutput {
  const artifactId = emission.artifactId ?? fallbackId;
  return {
    kind,
    artifactId,
    append: emission.append ?? false,
    lastChunk: emission.lastChunk ?? false,
    content: {
      artifactId,
      ...(emission.name === undefined ? {} : { name: emission.name }),
      ...(emission.description === undefined ? {} : { description: emission.description }),
      parts: emission.parts,
    },
  };
}

/**
 * Appends outputs at `level` (read under the run-row lock by the caller). At `none` nothing is
 * kept. Returns the ordinals written.
 */
export async function appendRunOutputs(
  db: CommonQueryMethods,
  sealer: Sealer,
  runId: string,
  runRevision: number,
  level: PrivacyLevel,
  outputs: readonly NewRunOutput[],
): Promise<number[]> {
  if (level === 'none' || outputs.length === 0) return [];
  const base = await db.oneFirst(sql.type(z.object({ next: z.number() }))`
    SELECT coalesce(max(ordinal), 0) + 1 AS next FROM run_outputs WHERE run_id = ${runId}`);
  const rows = outputs.map((output, index) => {
    const ordinal = base + index;
    const sealed = sealer.sealJson(runOutputContext(runId, ordinal), applyLevel(level, output.content));
    return [runId, ordinal, output.kind, output.artifactId, output.append, output.lastChunk, level, sealed, runRevision] as const;
  });
  // One multi-row insert; the sealed bytes travel as a bytea array through unnest.
  await db.query(sql.unsafe`
    INSERT INTO run_outputs (run_id, ordinal, kind, artifact_id, append, last_chunk, level, content, run_revision)
    SELECT run_id, ordinal, kind, artifact_id, append, last_chunk, level, content, run_revision
    FROM ${sql.unnest(
      rows.map((row) => [...row]),
      ['uuid', 'int4', 'text', 'text', 'bool', 'bool', 'text', 'bytea', 'int8'],
    )} AS t(run_id, ordinal, kind, artifact_id, append, last_chunk, level, content, run_revision)`);
  return rows.map((row) => row[1]);
}

export async function listRunOutputs(db: CommonQueryMethods, sealer: Sealer, runId: string): Promise<StoredRunOutput[]> {
  const rows = await db.any(sql.type(outputRow)`
    SELECT ordinal, kind, artifact_id, append, last_chunk, level, content, run_revision
    FROM run_outputs WHERE run_id = ${runId} ORDER BY ordinal`);
  return rows.map((row) => {
    const opened = sealer.openJson(runOutputContext(runId, row.ordinal), row.content);
    if (!opened.ok) throw new Error(`run output ${runId}/${row.ordinal} cannot be opened (${opened.reason})`);
    return {
      ordinal: row.ordinal,
      kind: row.kind,
      artifactId: row.artifact_id,
      append: row.append,
      lastChunk: row.last_chunk,
      level: row.level,
      content: opened.value,
      runRevision: row.run_revision,
    };
  });
}

/** Removes every stored output of the run: its answer ceiling no longer lets a result be kept. */
export async function deleteRunOutputs(db: CommonQueryMethods, runId: string): Promise<void> {
  await db.query(sql.unsafe`DELETE FROM run_outputs WHERE run_id = ${runId}`);
}

/**
 * Rewrites every stored output of the run down to `ceiling` (never up): called in the transaction
 * that tightened the run's answer ceiling. At `none` the rows are removed.
 */
export async function scrubRunOutputs(db: CommonQueryMethods, sealer: Sealer, runId: string, ceiling: PrivacyLevel): Promise<number> {
  const stored = await listRunOutputs(db, sealer, runId);
  let changed = 0;
  for (const output of stored) {
    const scrubbed = scrubToCeiling(output.level, ceiling, output.content);
    if (scrubbed.level === output.level) continue;
    changed += 1;
    if (scrubbed.level === 'none') {
      await db.query(sql.unsafe`DELETE FROM run_outputs WHERE run_id = ${runId} AND ordinal = ${output.ordinal}`);
      continue;
    }
    const sealed = sealer.sealJson(runOutputContext(runId, output.ordinal), scrubbed.value);
    await db.query(sql.unsafe`
      UPDATE run_outputs SET level = ${scrubbed.level}, content = ${sql.binary(sealed)}
      WHERE run_id = ${runId} AND ordinal = ${output.ordinal}`);
  }
  return changed;
}
