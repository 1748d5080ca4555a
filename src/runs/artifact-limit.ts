import type { ArtifactEmission } from '../providers/provider.js';

// a2a.maxArtifactBytes (docs/reliability.md, "Large tasks"): an agent (its provider's reply, a
// tool's or a statechart's output) that produces an artifact larger than the limit ends its run
// FAILED (`not_retryable`, failure detail `artifact_too_large`) before anything of that artifact
// is written: no half-written row, no journal event a stream or push would carry.

export type OversizedArtifact = { bytes: number; maxBytes: number; artifact: string };

/** The JSON size of one artifact as it would be stored. */
const artifactBytes = (emission: ArtifactEmission | { parts: Array<{ text: string }> }) => Buffer.byteLength(JSON.stringify(emission));

/**
 * The first artifact over `maxBytes` among `emissions` and the answer text (which becomes the
 * answer artifact), or null. Each emission is measured on its own (an appended chunk by itself).
 */
export function oversizedArtifact(emissions: readonly ArtifactEmission[], answer: string | null, maxBytes: number): OversizedArtifact | null {
  for (const [index, emission] of emissions.entries()) {
    const bytes = artifactBytes(emission);
    if (bytes > maxBytes) return { bytes, maxBytes, artifact: emission.artifactId ?? emission.name ?? `#${index}` };
  }
  if (answer !== null) {
    // Cheap first: a text of fewer UTF-16 units than a third of the limit cannot exceed it.
    if (answer.length * 3 < maxBytes - 64) return null;
    const bytes = artifactBytes({ parts: [{ text: answer }] });
    if (bytes > maxBytes) return { bytes, maxBytes, artifact: 'answer' };
  }
  return null;
}

/** The run's failure detail (runs.failure_detail, shown in the task's status message and the operator UI). */
export function artifactTooLargeDetail(oversized: OversizedArtifact): Record<string, unknown> {
  return { reason: 'artifact_too_large', limit: 'a2a.maxArtifactBytes', maxBytes: oversized.maxBytes, bytes: oversized.bytes, artifact: oversized.artifact };
}

/** The text of a task's FAILED status for that detail. */
export function artifactTooLargeText(detail: Record<string, unknown>): string {
  return `the agent produced an artifact (${String(detail.artifact)}) of ${String(detail.bytes)} bytes, over this server's limit of ${String(detail.maxBytes)} bytes (a2a.maxArtifactBytes)`;
}
