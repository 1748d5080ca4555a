import { z } from 'zod';
import type { TranscriptMessage } from '../providers/provider.js';

// What a run is asked to do, as sealed in `runs.queued_request`: the conversation so far, ending
// with the user's new message. The executor adds the agent's system prompt.

const toolCall = z.object({ id: z.string(), name: z.string(), arguments: z.record(z.unknown()) });
const transcriptMessage = z.discriminatedUnion('role', [
  z.object({ role: z.literal('system'), content: z.string() }),
  z.object({ role: z.literal('user'), content: z.string() }),
  z.object({ role: z.literal('assistant'), content: z.string().nullable(), toolCalls: z.array(toolCall).optional() }),
  z.object({ role: z.literal('tool'), toolCallId: z.string(), name: z.string(), content: z.string() }),
]);

export const runRequestSchema = z.object({
  messages: z.array(transcriptMessage).min(1),
  /** Free-form context for the layer that created the run (A2A task ids); never sent to a model. */
  metadata: z.record(z.unknown()).optional(),
});

export type RunRequest = { messages: TranscriptMessage[]; metadata?: Record<string, unknown> };

export function userRequest(text: string, history: TranscriptMessage[] = []): RunRequest {
  return { messages: [...history, { role: 'user', content: text }] };
}
