import type { StoredRunOutput } from '../runs/run-output-repository.js';
import type { Artifact, Part } from '../protocol/wire.js';

/**
 * The task's artifacts from a run's stored outputs: chunks of one artifactId are concatenated in
 * order (a chunk with `append` adds its parts; one without replaces them), as a client applying
 * the artifactUpdate events would. Outputs kept at `metadata` carry no content and are skipped.
 */
export function mergeArtifacts(outputs: readonly StoredRunOutput[]): Artifact[] {
  const byId = new Map<string, Artifact>();
  for (const output of outputs) {
    if (output.kind !== 'artifact' || output.level === 'metadata') continue;
    const content = output.content as { artifactId?: string; name?: string; description?: string; parts?: Part[] };
    const artifactId = output.artifactId ?? content.artifactId ?? `artifact-${output.ordinal}`;
    const parts = content.parts ?? [];
    const existing = byId.get(artifactId);
    if (existing && output.append) {
      existing.parts = mergeParts(existing.parts, parts);
      continue;
    }
    byId.set(artifactId, {
      artifactId,
      ...(content.name ? { name: content.name } : {}),
      ...(content.description ? { description: content.description } : {}),
      parts: [...parts],
    });
  }
  return [...byId.values()];
}

/** Appending text to text joins them into one part, as streamed text chunks are meant to be read. */
function mergeParts(existing: Part[], added: Part[]): Part[] {
  const last = existing[existing.length - 1];
  const first = added[0];
  if (last?.text !== undefined && first?.text !== undefined && added.length === 1 && Object.keys(first).length === 1) {
    return [...existing.slice(0, -1), { ...last, text: last.text + first.text }];
  }
  return [...existing, ...added];
}
