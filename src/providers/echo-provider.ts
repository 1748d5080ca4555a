import type { Provider, ProviderCallInput, ProviderReply, TranscriptMessage } from './provider.js';

// The `echo` provider: answers with the last user message, prefixed with "echo: ". Deterministic,
// no tool calls, no artifacts. Token usage is a rough estimate (one token per four characters).

/** A rough token estimate: ceil(characters / 4). */
export function estimateTokens(text: string): number {
  return Math.ceil(text.length / 4);
}

/** The text of the last user message in the transcript, or '' when there is none. */
export function lastUserText(transcript: readonly TranscriptMessage[]): string {
  for (let i = transcript.length - 1; i >= 0; i--) {
    const message = transcript[i];
    if (message !== undefined && message.role === 'user') return message.content;
  }
  return '';
}

/** Estimated input tokens for a transcript: the sum of the estimates of every message's content. */
export function estimateTranscriptTokens(transcript: readonly TranscriptMessage[]): number {
  let total = 0;
  for (const message of transcript) {
    if (message.content !== null) total += estimateTokens(message.content);
    if (message.role === 'assistant' && message.toolCalls !== undefined) {
      for (const call of message.toolCalls) total += estimateTokens(call.name + JSON.stringify(call.arguments));
    }
  }
  return total;
}

/** The echo reply for a transcript (shared with the scripted provider's empty-steps case). */
export function echoReply(transcript: readonly TranscriptMessage[]): ProviderReply {
  const text = 'echo: ' + lastUserText(transcript);
  return {
    text,
    toolCalls: [],
    artifacts: [],
    usage: { inputTokens: estimateTranscriptTokens(transcript), outputTokens: estimateTokens(text) },
  };
}

export function createEchoProvider(name: string): Provider {
  return {
    name,
    type: 'echo',
    call: async (input: ProviderCallInput) => ({ ok: true, reply: echoReply(input.transcript) }),
  };
}
