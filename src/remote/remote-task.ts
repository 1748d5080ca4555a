// What a remote task means to the run that waits on it: terminal states resolve the dependency,
// the rest keep it waiting. The result handed to the model is the remote's artifacts as text.

export const REMOTE_DONE = { 3: 'completed', 4: 'failed', 5: 'canceled', 6: 'input_required', 7: 'rejected', 8: 'auth_required' } as const;

type SdkPart = { content?: { $case: string; value: unknown } };
type SdkTask = {
  id: string;
  contextId: string;
  status?: { state: number; message?: { parts?: SdkPart[] } };
  artifacts?: Array<{ name?: string; parts?: SdkPart[] }>;
  history?: Array<{ messageId?: string; role?: number }>;
};

/** The SDK's Role.ROLE_USER (proto number). */
const ROLE_USER = 1;

export type RemoteVerdict =
  | { kind: 'waiting'; state: number }
  | { kind: 'resolved'; result: string }
  | { kind: 'failed'; outcome: string; result: string };

function partsText(parts: SdkPart[] | undefined): string {
  return (parts ?? [])
    .map((part) => {
      const content = part.content;
      if (!content) return '';
      if (content.$case === 'text') return String(content.value);
      if (content.$case === 'data') return JSON.stringify(content.value);
      if (content.$case === 'url') return `[file at ${String(content.value)}]`;
      return '[binary file]';
    })
    .filter(Boolean)
    .join('\n');
}

/** SDK task states are the proto numbers: 1 submitted, 2 working, 3 completed, 4 failed, 5 canceled, 6 input required, 7 rejected, 8 auth required. */
export function judgeRemoteTask(task: SdkTask): RemoteVerdict {
  const state = task.status?.state ?? 0;
  if (state === 3) {
    const artifacts = (task.artifacts ?? []).map((artifact) => partsText(artifact.parts)).filter(Boolean);
    const text = artifacts.length > 0 ? artifacts.join('\n') : partsText(task.status?.message?.parts);
    return { kind: 'resolved', result: JSON.stringify({ state: 'completed', result: text }) };
  }
  if (state === 4 || state === 5 || state === 7 || state === 6 || state === 8) {
    const outcome = REMOTE_DONE[state as keyof typeof REMOTE_DONE];
    return { kind: 'failed', outcome, result: JSON.stringify({ state: outcome, message: partsText(task.status?.message?.parts) || null }) };
  }
  return { kind: 'waiting', state };
}

export type { SdkTask };

/**
 * Whether a task the remote answered (GetTask as the agent's own client) is the one Keel's message
 * created: the task asked for, whose history holds the user message with the messageId Keel
 * recorded before sending. Nobody else knows that id (it went only to the remote, in the message),
 * so a task id named by a callback body cannot pass for ours; a remote that keeps no history
 * cannot prove it either, and its dependency falls to the give-up rule.
 */
export function createdByMessage(task: SdkTask, askedId: string, messageId: string): boolean {
  return task.id === askedId && (task.history ?? []).some((message) => message.messageId === messageId && message.role === ROLE_USER);
}
