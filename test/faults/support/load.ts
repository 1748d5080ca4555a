import { sleep } from './services.js';

// The clients of a fault scenario: SendMessage over raw HTTP (JSON-RPC) with a client token, spread
// over the API processes, blocking or returning immediately, optionally with a push config. A
// request that gets no answer (connection refused, reset, timeout, a 5xx or an error) is sent again,
// to the next API, with a new message id, until the task is accepted. Afterwards every accepted
// task is read back with GetTask until it is terminal.

export const TERMINAL_STATES = new Set(['TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED']);

export type TaskRecord = {
  index: number;
  agent: string;
  text: string;
  blocking: boolean;
  push: boolean;
  /** The task id of the answer that accepted the message; null while (or if never) accepted. */
  taskId: string | null;
  /** The API process that accepted it. */
  acceptedBy: string | null;
  sends: number;
  errors: string[];
  /** The state in the SendMessage answer. */
  answeredState: string | null;
  /** The state, result text and status-message text read with GetTask at the end. */
  finalState: string | null;
  finalText: string | null;
  finalReason: string | null;
  /** Some answer said COMPLETED without the task's result. */
  shownWithoutResult: boolean;
};

export type LoadOptions = {
  apis: () => string[];
  token: string;
  count: number;
  ratePerSecond: number;
  maxInFlight: number;
  agentOf?: (index: number) => string;
  blocking?: (index: number) => boolean;
  /** A push receiver URL: every task (or those `pushFor` picks) gets a config `hook` to it. */
  pushUrl?: string | null;
  pushFor?: (index: number) => boolean;
  /** The result text a completed task must carry, from the text sent (any of several). */
  expected: (agent: string, text: string) => string | string[];
  /** How long one task keeps being sent before the client gives up (it then counts as not accepted). */
  sendDeadlineMs?: number;
};

export type Load = {
  records: TaskRecord[];
  accepted: () => number;
  done: Promise<void>;
};

type Json = Record<string, unknown>;

/** The text of every artifact part of a wire Task, joined. */
export function artifactText(task: Json): string {
  const artifacts = (task.artifacts as Array<{ parts?: Array<{ text?: string }> }> | undefined) ?? [];
  return artifacts.flatMap((artifact) => (artifact.parts ?? []).map((part) => part.text ?? '')).join('\n');
}

function statusText(task: Json): string {
  const status = task.status as { message?: { parts?: Array<{ text?: string }> } } | undefined;
  return (status?.message?.parts ?? []).map((part) => part.text ?? '').join('\n');
}

/** Whether a result text carries (one of) the expected texts. */
export function carries(text: string, expected: string | string[]): boolean {
  return (Array.isArray(expected) ? expected : [expected]).some((want) => text.includes(want));
}

export async function rpc(api: string, token: string, agent: string, method: string, params: Json, timeoutMs: number): Promise<Json> {
  const response = await fetch(`${api}/a2a/${agent}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await response.text();
  if (response.status >= 500) throw new Error(`HTTP ${response.status}: ${text.slice(0, 200)}`);
  const body = JSON.parse(text) as { result?: Json; error?: { code: number; message: string } };
  if (body.error) throw new Error(`JSON-RPC ${body.error.code}: ${body.error.message}`);
  return body.result ?? {};
}

export function startLoad(options: LoadOptions): Load {
  const records: TaskRecord[] = [];
  const agentOf = options.agentOf ?? (() => 'model');
  const blocking = options.blocking ?? ((index) => index % 2 === 0);
  const pushFor = options.pushFor ?? (() => true);
  let inFlight = 0;
  let waiters: Array<() => void> = [];
  const release = () => {
    inFlight -= 1;
    const next = waiters.shift();
    next?.();
  };

  const sendTask = async (record: TaskRecord) => {
    const deadline = Date.now() + (options.sendDeadlineMs ?? 90_000);
    while (Date.now() < deadline) {
      const apis = options.apis();
      const api = apis[(record.index + record.sends) % apis.length]!;
      record.sends += 1;
      const push = record.push && options.pushUrl ? { taskPushNotificationConfig: { id: 'hook', url: options.pushUrl } } : {};
      try {
        const result = await rpc(
          api,
          options.token,
          record.agent,
          'SendMessage',
          {
            message: { messageId: `fault-${record.index}-${record.sends}`, role: 'ROLE_USER', parts: [{ text: record.text }] },
            configuration: { returnImmediately: !record.blocking, ...push },
          },
          20_000,
        );
        const task = result.task as Json | undefined;
        if (!task || typeof task.id !== 'string') throw new Error(`no task in the answer: ${JSON.stringify(result).slice(0, 200)}`);
        record.taskId = task.id;
        record.acceptedBy = api;
        const state = (task.status as { state?: string } | undefined)?.state ?? null;
        record.answeredState = state;
        if (state === 'TASK_STATE_COMPLETED' && !carries(artifactText(task), options.expected(record.agent, record.text))) record.shownWithoutResult = true;
        return;
      } catch (error) {
        record.errors.push(`${api}: ${(error as Error).message}`.slice(0, 300));
        await sleep(200);
      }
    }
  };

  const done = (async () => {
    const started = Date.now();
    const pending: Promise<void>[] = [];
    for (let index = 0; index < options.count; index += 1) {
      const due = started + (index * 1000) / options.ratePerSecond;
      if (due > Date.now()) await sleep(due - Date.now());
      if (inFlight >= options.maxInFlight) await new Promise<void>((resolve) => waiters.push(resolve));
      inFlight += 1;
      const agent = agentOf(index);
      const record: TaskRecord = {
        index,
        agent,
        text: `fault task ${index} ${Math.random().toString(36).slice(2, 8)}`,
        blocking: blocking(index),
        push: Boolean(options.pushUrl) && pushFor(index),
        taskId: null,
        acceptedBy: null,
        sends: 0,
        errors: [],
        answeredState: null,
        finalState: null,
        finalText: null,
        finalReason: null,
        shownWithoutResult: false,
      };
      records.push(record);
      pending.push(sendTask(record).finally(release));
    }
    await Promise.all(pending);
    waiters = [];
  })();

  return { records, accepted: () => records.filter((record) => record.taskId !== null).length, done };
}

/** Reads every accepted task with GetTask (any API) until it is terminal or `timeoutMs` passed. */
export async function settleClients(load: Load, apis: () => string[], token: string, expected: LoadOptions['expected'], timeoutMs = 90_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let round = 0;
  for (;;) {
    const open = load.records.filter((record) => record.taskId !== null && !TERMINAL_STATES.has(record.finalState ?? ''));
    if (open.length === 0 || Date.now() > deadline) return;
    round += 1;
    for (let start = 0; start < open.length; start += 16) {
      await Promise.all(
        open.slice(start, start + 16).map(async (record) => {
          const list = apis();
          const api = list[(record.index + round) % list.length]!;
          try {
            const task = await rpc(api, token, record.agent, 'GetTask', { id: record.taskId, historyLength: 0 }, 10_000);
            const state = (task.status as { state?: string } | undefined)?.state ?? null;
            record.finalState = state;
            record.finalText = artifactText(task);
            record.finalReason = statusText(task);
            if (state === 'TASK_STATE_COMPLETED' && !carries(record.finalText, expected(record.agent, record.text))) record.shownWithoutResult = true;
          } catch {
            // that API is down or busy: read it again next round
          }
        }),
      );
    }
    await sleep(300);
  }
}
