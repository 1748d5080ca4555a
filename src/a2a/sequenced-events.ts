import { A2AErrors, type A2AError, type Result } from './a2a-error.js';
import type { Message, StreamResponse, Task } from '../protocol/wire.js';

// The sequenced-events extension (docs/extensions/sequenced-events.md; decisions 0068, 0069): a
// client that activates it (A2A-Extensions on HTTP, the `a2a-extensions` metadata entry on gRPC)
// sees the journal sequence of every streamed event and of every Task, and may resume a
// SubscribeToTask after a sequence it names. A client that does not see plain A2A 1.0: nothing
// here touches its responses. The values live in the `metadata` of the A2A objects under the
// extension's URI, so every stamped object is still a valid A2A 1.0 object.

export const SEQUENCED_EVENTS_URI = 'https://keel.dev/a2a/extensions/sequenced-events/v1';

/** How the agent card declares it (every agent supports it; no agent requires it). */
export const SEQUENCED_EVENTS_EXTENSION = {
  uri: SEQUENCED_EVENTS_URI,
  description: 'Every streamed event carries its journal sequence number; SubscribeToTask resumes after a sequence number (docs/extensions/sequenced-events.md)',
  required: false,
} as const;

/** The push request header naming the journal sequence of the event a delivery carries (sent on every delivery). */
export const EVENT_SEQUENCE_HEADER = 'x-a2a-event-sequence';

/** The largest sequence a resume point may name (the journal's sequence is an int4). */
export const MAX_SEQUENCE = 2_147_483_647;

type Metadata = Record<string, unknown>;

const withEntry = (metadata: Metadata | undefined, entry: Metadata): Metadata => ({ ...metadata, [SEQUENCED_EVENTS_URI]: entry });

/** A Task stamped with the last journal sequence it reflects: events after it are still to come. */
export function stampTask(task: Task, lastSequence: number): Task {
  return { ...task, metadata: withEntry(task.metadata, { lastSequence }) };
}

/**
 * A stream response stamped with its journal sequence: an event (status, artifact, message) by
 * its own number, a Task snapshot by the last number it reflects. A new object: the journal's
 * events are shared by every stream of the task and never changed.
 */
export function stampResponse(response: StreamResponse, sequence: number): StreamResponse {
  if ('task' in response) return { task: stampTask(response.task, sequence) };
  if ('statusUpdate' in response) return { statusUpdate: { ...response.statusUpdate, metadata: withEntry(response.statusUpdate.metadata, { sequence }) } };
  if ('artifactUpdate' in response) return { artifactUpdate: { ...response.artifactUpdate, metadata: withEntry(response.artifactUpdate.metadata, { sequence }) } };
  const message: Message = response.message;
  return { message: { ...message, metadata: withEntry(message.metadata, { sequence }) } };
}

/** Whether the extension is among the activated ones of a request. */
export const sequencedEventsActivated = (activated: readonly string[]) => activated.includes(SEQUENCED_EVENTS_URI);

/**
 * The resume point a JSON-RPC SubscribeToTask names in `params.metadata[<URI>].afterSequence` (its metadata given):
 * undefined when it names none, an invalid-params error when it names one that is not a sequence.
 */
export function resumePointOfParams(metadata: Metadata | undefined): Result<number | undefined> {
  const entry = metadata?.[SEQUENCED_EVENTS_URI];
  if (entry === undefined) return { ok: true, value: undefined };
  const value = typeof entry === 'object' && entry !== null && !Array.isArray(entry) ? (entry as Metadata).afterSequence : undefined;
  if (typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= MAX_SEQUENCE) return { ok: true, value };
  const field = `metadata.${SEQUENCED_EVENTS_URI}.afterSequence`;
  const description = `an integer from 0 to ${MAX_SEQUENCE}: the journal sequence to resume after`;
  return { ok: false, error: A2AErrors.invalidParams(`invalid params: ${field}: ${description}`, { fieldViolations: [{ field, description }] }) };
}

/** Where a resume point stands against a task's journal: its last sequence and the highest sequence missing from it, if any. */
export type JournalExtent = { lastSequence: number; lastMissing: number | null };

/**
 * The error of a resume point whose events after it are not all in the journal any more (a
 * tightened ceiling removed some) or that is past the journal's end, or null when every event
 * after it is there. The earliest point named is the smallest one a resume is accepted from.
 */
export function unavailableResumePoint(taskId: string, afterSequence: number, extent: JournalExtent): A2AError | null {
  const beyond = afterSequence > extent.lastSequence;
  const gap = !beyond && extent.lastMissing !== null && extent.lastMissing > afterSequence;
  if (!beyond && !gap) return null;
  const earliest = extent.lastMissing ?? 0;
  const why = beyond
    ? `the task's journal ends at sequence ${extent.lastSequence}`
    : `events after it are no longer in the task's journal (removed up to sequence ${earliest})`;
  return A2AErrors.resumePointUnavailable(
    `cannot resume task ${taskId} after sequence ${afterSequence}: ${why}; resume after a sequence from ${earliest} to ${extent.lastSequence}, or subscribe without a resume point for the current task`,
    {
      metadata: { taskId, afterSequence: String(afterSequence), earliestAfterSequence: String(earliest), lastSequence: String(extent.lastSequence) },
    },
  );
}
