import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { createClient } from '../../../src/auth/client-repository.js';
import type { KeelLogger } from '../../../src/log/logger.js';
import type { PushTestTimings } from '../../../src/push/delivery-options.js';
import type { Sealer } from '../../../src/sealing/sealer.js';
import { readJournal, type JournalEvent } from '../../../src/tasks/journal.js';
import { rawRpc, type WireResponse } from '../../support/a2a-wire.js';
import { waitFor } from '../../support/wait-for.js';

// Shared by the push tests: real HTTP receivers on 127.0.0.1 (node:http), A2A calls that create
// tasks with push configs, and reads of the outbox (deliveries, attempts, configs).

export const LOOPBACK = '127.0.0.1';

/** Overrides every push test starts from: loopback receivers allowed over plain HTTP, fast retries. */
export const PUSH_TEST_OVERRIDES: Record<string, unknown> = {
  KEEL_PRIVACY_LEVEL: 'full',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: LOOPBACK,
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
  KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
  KEEL_PUSH_RETRY_BASE_SECONDS: '0.02',
  KEEL_PUSH_RETRY_MAX_SECONDS: '2',
  KEEL_PUSH_MAX_ATTEMPTS: '8',
  // A receiver's breaker (docs/push.md, "Isolation") probes again after 0.5 s, at the scale of the
  // tests' 0.5 s timeout, not after the configured 30 s.
  KEEL_PUSH_BREAKER_COOLDOWN_SECONDS: '0.5',
};

/** The push timeout the push tests run with (0.5 s, below the configuration's 10-30 s): passed to startKeel by the harness. */
export const PUSH_TEST_TIMINGS: PushTestTimings = { timeoutSeconds: 0.5 };

// ---------------------------------------------------------------------------------------------
// Receivers
// ---------------------------------------------------------------------------------------------

export type Received = {
  /** 0-based order of arrival at this receiver. */
  index: number;
  /** Date.now() when the request's body had arrived. */
  at: number;
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  raw: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  body: any;
  deliveryId: string;
  /** Whether the connection closed before this receiver answered (a killed sender, a timeout). */
  aborted: boolean;
  /** Date.now() when the answer was sent or the connection closed unanswered (null while in flight). */
  endedAt: number | null;
};

/** What a receiver does with one request: answer (after an optional delay) or never answer. */
export type Reply = { status: number; headers?: Record<string, string>; delayMs?: number; body?: string } | 'hang';
export type Responder = (request: Received, receiver: Receiver) => Reply | Promise<Reply>;

export type Receiver = {
  url: string;
  port: number;
  requests: Received[];
  /** Requests whose handler has not answered yet. */
  inFlight: () => number;
  /** The most requests ever in flight at once. */
  maxInFlight: () => number;
  /** Requests per delivery id, in arrival order. */
  byDelivery: (deliveryId: string) => Received[];
  setResponder: (responder: Responder) => void;
  close: () => Promise<void>;
};

const OK: Reply = { status: 200 };

export async function startReceiver(responder: Responder = () => OK, path = '/hook'): Promise<Receiver> {
  let current = responder;
  const requests: Received[] = [];
  const sockets = new Set<Socket>();
  let inFlight = 0;
  let maxInFlight = 0;
  const server: Server = createServer((request, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const raw = Buffer.concat(chunks).toString('utf8');
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch {
        body = undefined;
      }
      const received: Received = {
        index: requests.length,
        at: Date.now(),
        method: request.method ?? '',
        path: request.url ?? '',
        headers: request.headers,
        raw,
        body,
        deliveryId: String(request.headers['x-keel-delivery-id'] ?? ''),
        aborted: false,
        endedAt: null,
      };
      requests.push(received);
      inFlight += 1;
      maxInFlight = Math.max(maxInFlight, inFlight);
      let done = false;
      const finish = () => {
        if (done) return;
        done = true;
        received.endedAt = Date.now();
        inFlight -= 1;
      };
      response.on('close', () => {
        if (!response.writableEnded) received.aborted = true;
        finish();
      });
      void (async () => {
        const reply = await current(received, receiver);
        if (reply === 'hang') return;
        if (reply.delayMs) await new Promise((resolve) => setTimeout(resolve, reply.delayMs));
        if (response.destroyed) return;
        response.writeHead(reply.status, { 'content-type': 'text/plain', ...reply.headers });
        response.end(reply.body ?? '');
        finish();
      })();
    });
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, LOOPBACK, resolve));
  const port = (server.address() as AddressInfo).port;
  const receiver: Receiver = {
    url: `http://${LOOPBACK}:${port}${path}`,
    port,
    requests,
    inFlight: () => inFlight,
    maxInFlight: () => maxInFlight,
    byDelivery: (deliveryId) => requests.filter((request) => request.deliveryId === deliveryId),
    setResponder: (next) => {
      current = next;
    },
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return receiver;
}

/** A responder answering per delivery id: `script(n)` for the n-th (1-based) request of a delivery. */
export function perDelivery(script: (attempt: number, request: Received) => Reply): Responder {
  const seen = new Map<string, number>();
  return (request) => {
    const attempt = (seen.get(request.deliveryId) ?? 0) + 1;
    seen.set(request.deliveryId, attempt);
    return script(attempt, request);
  };
}

// ---------------------------------------------------------------------------------------------
// A2A calls
// ---------------------------------------------------------------------------------------------

export type PushConfigInput = { id?: string; url: string; token?: string; authentication?: { scheme: string; credentials?: string } };

export async function newClientToken(pool: DatabasePool, name = `push-${Math.random().toString(36).slice(2, 10)}`): Promise<string> {
  const created = await createClient(pool, name);
  if (!created.ok) throw new Error(`cannot create client ${name}`);
  return created.token;
}

let messageCounter = 0;

/** SendMessage over JSON-RPC, returning immediately, with the push config embedded. Returns the task id. */
export async function sendWithPush(
  baseUrl: string,
  token: string,
  agent: string,
  text: string,
  push?: PushConfigInput,
): Promise<{ taskId: string; response: WireResponse }> {
  messageCounter += 1;
  const response = await rawRpc(
    baseUrl,
    agent,
    {
      jsonrpc: '2.0',
      id: 1,
      method: 'SendMessage',
      params: {
        message: { messageId: `push-m-${Date.now()}-${messageCounter}`, role: 'ROLE_USER', parts: [{ text }] },
        configuration: { returnImmediately: true, ...(push ? { taskPushNotificationConfig: push } : {}) },
      },
    },
    { token },
  );
  const taskId = response.body?.result?.task?.id as string | undefined;
  if (!taskId) throw new Error(`SendMessage did not return a task: ${response.status} ${response.text}`);
  return { taskId, response };
}

export async function rpc(baseUrl: string, token: string, agent: string, method: string, params: Record<string, unknown>): Promise<WireResponse> {
  return rawRpc(baseUrl, agent, { jsonrpc: '2.0', id: 1, method, params }, { token });
}

/** CreateTaskPushNotificationConfig over JSON-RPC; throws unless it succeeded. */
export async function createPushConfigRpc(baseUrl: string, token: string, agent: string, taskId: string, config: PushConfigInput): Promise<Record<string, unknown>> {
  const response = await rpc(baseUrl, token, agent, 'CreateTaskPushNotificationConfig', { taskId, ...config });
  if (!response.body?.result) throw new Error(`CreateTaskPushNotificationConfig failed: ${response.text}`);
  return response.body.result as Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------------
// The outbox as rows
// ---------------------------------------------------------------------------------------------

const deliveryRow = z.object({
  id: z.string(),
  config_id: z.string(),
  event_sequence: z.number(),
  state: z.string(),
  attempts: z.number(),
  last_outcome: z.string().nullable(),
  kind: z.string(),
  event_state: z.string().nullable(),
});
export type DeliveryView = z.infer<typeof deliveryRow>;

export async function deliveriesOf(pool: DatabasePool, taskId: string, configId?: string): Promise<readonly DeliveryView[]> {
  return pool.any(sql.type(deliveryRow)`
    SELECT d.id, d.config_id, d.event_sequence, d.state, d.attempts, d.last_outcome, e.kind, e.state AS event_state
    FROM push_deliveries d JOIN a2a_events e ON e.task_id = d.task_id AND e.sequence = d.event_sequence
    WHERE d.task_id = ${taskId} ${configId === undefined ? sql.fragment`` : sql.fragment`AND d.config_id = ${configId}`}
    ORDER BY d.config_id, d.event_sequence`);
}

const attemptRow = z.object({
  delivery_id: z.string(),
  attempt: z.number(),
  started_at: z.number(),
  duration_ms: z.number(),
  status_code: z.number().nullable(),
  outcome: z.string(),
  error_class: z.string().nullable(),
});
export type AttemptView = z.infer<typeof attemptRow>;

export async function attemptsOf(pool: DatabasePool, deliveryId: string): Promise<readonly AttemptView[]> {
  return pool.any(sql.type(attemptRow)`
    SELECT delivery_id, attempt, started_at, duration_ms, status_code, outcome, error_class FROM push_attempts
    WHERE delivery_id = ${deliveryId} ORDER BY attempt`);
}

export async function attemptCount(pool: DatabasePool, taskId: string, configId: string): Promise<number> {
  return pool.oneFirst(sql.type(z.object({ n: z.number() }))`
    SELECT count(*)::int AS n FROM push_attempts a JOIN push_deliveries d ON d.id = a.delivery_id
    WHERE d.task_id = ${taskId} AND d.config_id = ${configId}`);
}

const configStateRow = z.object({ state: z.string(), state_reason: z.string().nullable(), deleted: z.boolean() });

export async function configState(pool: DatabasePool, taskId: string, configId: string): Promise<z.infer<typeof configStateRow> | null> {
  return pool.maybeOne(sql.type(configStateRow)`
    SELECT state, state_reason, deleted_at IS NOT NULL AS deleted FROM push_configs WHERE task_id = ${taskId} AND id = ${configId}`);
}

export async function taskState(pool: DatabasePool, taskId: string): Promise<string | null> {
  return pool.maybeOneFirst(sql.type(z.object({ state: z.string() }))`SELECT state FROM a2a_tasks WHERE id = ${taskId}`);
}

const TERMINAL_TASK_STATES = ['TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED'];

/** Waits until the task's terminal state is in the journal (every event of the task has its delivery rows). */
export async function waitForTerminalEvent(pool: DatabasePool, taskId: string, timeoutMs = 30_000): Promise<void> {
  await waitFor(
    () =>
      pool.oneFirst(sql.type(z.object({ done: z.boolean() }))`
        SELECT EXISTS (SELECT 1 FROM a2a_events WHERE task_id = ${taskId}
          AND (kind = 'message' OR state = ANY(${sql.array(TERMINAL_TASK_STATES, 'text')}))) AS done`),
    `the terminal event of task ${taskId}`,
    timeoutMs,
  );
}

/**
 * A responder that holds each answer until the pushed task's terminal event is in the journal (at
 * most `holdAtMostMs`), then gives `reply`. A task's first event (working) commits before its run
 * ends, so its delivery can be answered before the later events exist: a 404 or 410 then stops the
 * config first and those events get no delivery at all. Held, the answer finds every event's
 * delivery recorded. Keep `holdAtMostMs` under the push timeout, or the attempt times out instead.
 */
export function answerAfterTerminalEvent(pool: DatabasePool, reply: () => Reply, holdAtMostMs: number): Responder {
  return async (request) => {
    const body = request.body ?? {};
    const taskId: unknown = body.statusUpdate?.taskId ?? body.artifactUpdate?.taskId ?? body.task?.id ?? body.message?.taskId;
    if (typeof taskId === 'string') await waitForTerminalEvent(pool, taskId, holdAtMostMs).catch(() => undefined);
    return reply();
  };
}

/** Waits until no delivery of the task (or of one config) is pending. */
export async function waitForSettled(pool: DatabasePool, taskId: string, configId?: string, timeoutMs = 30_000): Promise<readonly DeliveryView[]> {
  await waitForTerminalEvent(pool, taskId, timeoutMs);
  return waitFor(
    async () => {
      const rows = await deliveriesOf(pool, taskId, configId);
      return rows.length > 0 && rows.every((row) => row.state !== 'pending') ? rows : null;
    },
    `every delivery of task ${taskId}${configId ? ` config ${configId}` : ''} to end`,
    timeoutMs,
  );
}

export async function journalOf(pool: DatabasePool, sealer: Sealer, taskId: string): Promise<JournalEvent[]> {
  return readJournal(pool, sealer, taskId, 0, 10_000);
}

// ---------------------------------------------------------------------------------------------
// Logs
// ---------------------------------------------------------------------------------------------

/** A pino logger at trace level, without redaction, writing every line into `text()`. */
export function capturingLogger(): { logger: KeelLogger; text: () => string } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      chunks.push(chunk.toString('utf8'));
      callback();
    },
  });
  const logger = pino<'notice'>({ level: 'trace', customLevels: { notice: 35 } }, stream);
  return { logger, text: () => chunks.join('') };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
