import type { ArtifactEmission, Provider, ProviderCallInput, ProviderReply, ReplyOutcome } from './provider.js';

// The `conformance` provider: the built-in agent the A2A conformance kit (a2aproject/a2a-tck,
// 1.0-dev) drives. It picks its behaviour by the prefix of the A2A messageId of the latest message
// (`requestMetadata.messageId`), as the table in `behaviours` below lists (docs/conformance.md).
// Everything it does goes through the ordinary pipeline: artifacts are committed run steps, outcomes
// are the executor's own (status message, direct message, rejection, input required), so the kit
// tests Keel itself.

export type ConformanceOptions = {
  /** The kit's streaming timeout; `test-resubscribe-message-id` waits twice this long. */
  streamTimeoutMs: number;
};

type Behaviour = {
  /** Artifacts emitted (committed as one run step before the run completes). */
  artifacts?: ArtifactEmission[];
  outcome?: ReplyOutcome;
  /** Wait this long before answering (the kit resubscribes meanwhile). */
  delayMs?: number;
};

const FILE_NAME = 'output.txt';
const FILE_MEDIA_TYPE = 'text/plain';
/** The bytes of the `raw` file part ("tck", as the kit's reference agent sends). */
const FILE_BYTES = Buffer.from('tck').toString('base64');

const textArtifact = (text: string): ArtifactEmission => ({ name: 'output', parts: [{ text }] });
const rawFileArtifact = (): ArtifactEmission => ({ name: FILE_NAME, parts: [{ raw: FILE_BYTES, filename: FILE_NAME, mediaType: FILE_MEDIA_TYPE }] });

/** What the agent does, by messageId prefix (artifact ids are filled in per call). */
function behaviours(options: ConformanceOptions): Record<string, Behaviour> {
  return {
    'tck-complete-task': { outcome: { kind: 'status_message', text: 'Hello from TCK' } },
    'tck-artifact-text': { artifacts: [textArtifact('Generated text content')] },
    'tck-artifact-file-url': {
      artifacts: [{ name: FILE_NAME, parts: [{ url: 'https://example.com/output.txt', filename: FILE_NAME, mediaType: FILE_MEDIA_TYPE }] }],
    },
    'tck-artifact-file': { artifacts: [rawFileArtifact()] },
    'tck-artifact-data': { artifacts: [{ name: 'output', parts: [{ data: { key: 'value', count: 42 } }] }] },
    'tck-message-response': { outcome: { kind: 'direct_message', text: 'Direct message response' } },
    'tck-input-required': { outcome: { kind: 'input_required', prompt: 'Input required by TCK' } },
    'tck-reject-task': { outcome: { kind: 'reject', reason: 'rejected' } },
    'tck-stream-001': { artifacts: [textArtifact('Stream hello from TCK')] },
    'tck-stream-002': {},
    'tck-stream-003': { artifacts: [textArtifact('Stream task lifecycle')] },
    'tck-stream-ordering-001': { artifacts: [textArtifact('Ordered output')] },
    'tck-stream-artifact-text': { artifacts: [textArtifact('Streamed text content')] },
    'tck-stream-artifact-file': { artifacts: [rawFileArtifact()] },
    // Two chunks of one artifact: the first creates it, the second appends and closes it.
    'tck-stream-artifact-chunked': {
      artifacts: [
        { name: 'output', parts: [{ text: 'chunk-1 ' }], lastChunk: false },
        { name: 'output', parts: [{ text: 'chunk-2' }], append: true, lastChunk: true },
      ],
    },
    'test-resubscribe-message-id': { delayMs: 2 * options.streamTimeoutMs },
  };
}

/**
 * The behaviour for a messageId: the longest matching prefix wins (`tck-artifact-file-url` before
 * `tck-artifact-file`); anything else completes the task. `prefix` is '' for the default.
 */
export function conformanceBehaviour(messageId: string, options: ConformanceOptions): Behaviour & { prefix: string } {
  const table = behaviours(options);
  const prefix = Object.keys(table)
    .filter((candidate) => messageId.startsWith(candidate))
    .sort((a, b) => b.length - a.length)[0];
  return prefix === undefined ? { prefix: '' } : { ...table[prefix]!, prefix };
}

const waitFor = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (ms <= 0 || signal.aborted) return resolve();
    const timer = setTimeout(() => (signal.removeEventListener('abort', stop), resolve()), ms);
    const stop = () => (clearTimeout(timer), resolve());
    signal.addEventListener('abort', stop, { once: true });
  });

export function createConformanceProvider(name: string, options: ConformanceOptions): Provider {
  return {
    name,
    type: 'conformance',
    call: async (input: ProviderCallInput) => {
      const messageId = typeof input.requestMetadata?.messageId === 'string' ? input.requestMetadata.messageId : '';
      const behaviour = conformanceBehaviour(messageId, options);
      if (behaviour.delayMs) {
        await waitFor(behaviour.delayMs, input.signal);
        if (input.signal.aborted) return { ok: false, failure: { class: 'connection', message: 'the run was stopped while the conformance agent waited' } };
      }
      const reply: ProviderReply = {
        text: null,
        toolCalls: [],
        // One artifact per call, its chunks sharing the id (unique within the task: the call index).
        artifacts: (behaviour.artifacts ?? []).map((artifact) => ({ ...artifact, artifactId: `${behaviour.prefix}-${input.iteration}` })),
        usage: { inputTokens: 0, outputTokens: 0 },
        ...(behaviour.outcome ? { outcome: behaviour.outcome } : {}),
      };
      return { ok: true, reply };
    },
  };
}
