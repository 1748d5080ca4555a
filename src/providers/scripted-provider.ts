import type { ScriptedStep } from '../config/config-schema.js';
import { echoReply } from './echo-provider.js';
import type {
  ArtifactEmission,
  Provider,
  ProviderCallInput,
  ProviderFailure,
  ProviderOutcome,
  ToolCall,
} from './provider.js';

// The `scripted` provider: a declared list of steps, for demos and tests. The step for a call is
// steps[min(iteration, steps.length - 1)], so the last step repeats (a tool-call step then loops
// until the iteration cap). A step may wait (abortable), fail with a class, reply, call tools and
// emit an artifact chunk. An empty list behaves like `echo`.

export type { ScriptedStep };

const ABORTED: ProviderFailure = { class: 'unknown', message: 'aborted' };

/** The step used for a given 0-based iteration (undefined only when there are no steps). */
export function selectStep(steps: readonly ScriptedStep[], iteration: number): ScriptedStep | undefined {
  if (steps.length === 0) return undefined;
  const index = Math.min(Math.max(0, Math.floor(iteration)), steps.length - 1);
  return steps[index];
}

/** Waits `ms`, or less if `signal` aborts; resolves true when it waited fully, false on abort. */
function abortableDelay(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  if (ms <= 0) return Promise.resolve(true);
  return new Promise((resolve) => {
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve(true);
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

function stepArtifact(step: ScriptedStep, iteration: number): ArtifactEmission[] {
  const artifact = step.artifact;
  if (artifact === undefined) return [];
  const emission: ArtifactEmission = {
    artifactId: artifact.artifactId ?? `artifact-${iteration}`,
    parts: [{ text: artifact.text }],
  };
  if (artifact.name !== undefined) emission.name = artifact.name;
  if (artifact.append !== undefined) emission.append = artifact.append;
  if (artifact.lastChunk !== undefined) emission.lastChunk = artifact.lastChunk;
  return [emission];
}

function stepToolCalls(step: ScriptedStep, iteration: number): ToolCall[] {
  return (step.toolCalls ?? []).map((call, index) => ({
    id: `call_${iteration}_${index}`,
    name: call.name,
    // A copy, so a consumer that mutates arguments cannot change the script.
    arguments: structuredClone(call.arguments ?? {}),
  }));
}

export function createScriptedProvider(name: string, steps: readonly ScriptedStep[]): Provider {
  const script = [...steps];
  return {
    name,
    type: 'scripted',
    call: async (input: ProviderCallInput): Promise<ProviderOutcome> => {
      if (input.signal.aborted) return { ok: false, failure: { ...ABORTED } };
      const step = selectStep(script, input.iteration);
      if (step === undefined) return { ok: true, reply: echoReply(input.transcript) };

      if (step.delayMs !== undefined && step.delayMs > 0) {
        const completed = await abortableDelay(step.delayMs, input.signal);
        if (!completed) return { ok: false, failure: { ...ABORTED } };
      }

      if (step.fail !== undefined) {
        const failure: ProviderFailure = { class: step.fail, message: `scripted failure: ${step.fail}` };
        if (step.fail === 'rate_limit') failure.retryAfterMs = 0;
        return { ok: false, failure };
      }

      return {
        ok: true,
        reply: {
          text: step.reply === undefined ? null : withLastToolResult(step.reply, input.transcript),
          toolCalls: stepToolCalls(step, input.iteration),
          artifacts: stepArtifact(step, input.iteration),
          usage: { inputTokens: 0, outputTokens: step.tokens ?? 0 },
        },
      };
    },
  };
}

/** `{{tool_result}}` in a scripted reply stands for the content of the transcript's last tool message. */
function withLastToolResult(reply: string, transcript: ProviderCallInput['transcript']): string {
  if (!reply.includes('{{tool_result}}')) return reply;
  const last = [...transcript].reverse().find((message) => message.role === 'tool');
  return reply.replaceAll('{{tool_result}}', last?.role === 'tool' ? last.content : '');
}
