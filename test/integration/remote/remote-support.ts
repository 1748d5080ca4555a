import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import { createHash, randomUUID } from 'node:crypto';
import type { Server as HttpServer } from 'node:http';
import express from 'express';
import { GetTaskRequest, A2A_PROTOCOL_VERSION, AGENT_CARD_PATH, TaskState, type AgentCard, type Task, type TaskPushNotificationConfig } from '@a2a-js/sdk';
import {
  AgentEvent,
  DefaultPushNotificationSender,
  DefaultRequestHandler,
  InMemoryPushNotificationStore,
  InMemoryTaskStore,
  type AgentExecutor,
  type ExecutionEventBus,
  type PushNotificationSender,
  type RequestContext,
  type ServerCallContext,
} from '@a2a-js/sdk/server';
import { agentCardHandler, jsonRpcHandler, UserBuilder } from '@a2a-js/sdk/server/express';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { createClient } from '../../../src/auth/client-repository.js';
import { callbackBodyContext } from '../../../src/remote/dependency-repository.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import type { TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';

// Shared by the client-role tests: remotes on 127.0.0.1 (the official SDK server with a test
// executor, and a hand-written JSON-RPC remote on node:http for what a well-behaved server will
// not do), raw inbox callbacks, a Keel agent that delegates, and the rows the client role writes.

export const LOOPBACK = '127.0.0.1';

/** Every client-role test starts from these: loopback remotes over plain HTTP, a fast poller. */
export const REMOTE_TEST_OVERRIDES: Record<string, string> = {
  KEEL_PRIVACY_LEVEL: 'full',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: LOOPBACK,
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
  KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
  KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
};

export type RemoteAgentInput = {
  id: string;
  cardUrl: string;
  credentialEnv?: string;
  credentialSealed?: string;
  registration?: 'embedded' | 'separate';
  requireSignedCard?: boolean;
  cardKey?: string;
  cardJku?: string[];
};

/** The message the delegating agent sends to remote `remoteId`. */
export const delegatedText = (remoteId: string) => `please handle ${remoteId}`;

/**
 * Config overrides for a Keel whose agent `to-<remote id>` delegates once to that remote through
 * `remote_agent` and then answers `remote said: <the tool result>`, plus any extra agents.
 */
export function delegatingOverrides(
  remotes: RemoteAgentInput[],
  extra: { providers?: Record<string, unknown>; agents?: Array<Record<string, unknown>>; env?: Record<string, string> } = {},
): Record<string, unknown> {
  const providers: Record<string, unknown> = { echo: { type: 'echo' }, ...extra.providers };
  const agents: Array<Record<string, unknown>> = [{ id: 'echo', name: 'Echo', provider: 'echo' }, ...(extra.agents ?? [])];
  for (const remote of remotes) {
    providers[`p-${remote.id}`] = {
      type: 'scripted',
      steps: [{ toolCalls: [{ name: 'remote_agent', arguments: { agent: remote.id, message: delegatedText(remote.id) } }] }, { reply: 'remote said: {{tool_result}}' }],
    };
    agents.push({ id: `to-${remote.id}`, name: `Delegates to ${remote.id}`, provider: `p-${remote.id}`, tools: ['remote_agent'] });
  }
  return { ...REMOTE_TEST_OVERRIDES, KEEL_PROVIDERS: providers, KEEL_AGENTS: agents, KEEL_REMOTE_AGENTS: remotes, ...extra.env };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A port free right now on 127.0.0.1 (for two Keels that must name each other before they start). */
export async function freePort(): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((resolve) => server.listen(0, LOOPBACK, resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

// ---------------------------------------------------------------------------------------------
// The official SDK server as the remote
// ---------------------------------------------------------------------------------------------

export type SdkRemote = {
  url: string;
  cardUrl: string;
  /** Requests that reached the SDK's request handler, by method (getTaskDone: GetTasks of a task already completed). */
  calls: { sendMessage: number; getTask: number; getTaskDone: number; createPushConfig: number };
  /** Authorization headers of the JSON-RPC requests, in order. */
  authorizations: Array<string | undefined>;
  /** Push configs the SDK stored (embedded in a message or created separately), credentials included. */
  pushConfigs: TaskPushNotificationConfig[];
  /** The SendMessage requests' push configs (null when the message carried none). */
  sentPushConfigs: Array<TaskPushNotificationConfig | null>;
  /** Tasks the executor started, by id, with the text it was sent. */
  tasks: Map<string, { text: string; completed: boolean }>;
  /** Events the push sender was asked to send (whether or not it sent them). */
  pushEvents: () => number;
  /** Lets every task held so far complete (later tasks are held again). */
  release: () => void;
  close: () => Promise<void>;
};

export const sdkResultFor = (text: string) => `sdk remote result for: ${text}`;

export type SdkRemoteOptions = {
  /** The card's capabilities.pushNotifications. */
  push: boolean;
  /** `drop`: the remote stores push configs but never sends a callback (a lost callback). */
  sender?: 'default' | 'drop';
  /** How long the executor works before its artifact and COMPLETED (default 800 ms). */
  completeAfterMs?: number;
  /** Hold every task WORKING until the next release(). */
  hold?: boolean;
};

/**
 * The official @a2a-js/sdk server, assembled as bench/sdk-echo-server.ts does (DefaultRequestHandler,
 * the express JSON-RPC handler), with a test executor: SUBMITTED, WORKING, then after a while an
 * artifact `sdk remote result for: <text>` and COMPLETED. Push goes through the SDK's own
 * InMemoryPushNotificationStore and DefaultPushNotificationSender (Authorization: <scheme> <credentials>).
 */
export async function startSdkRemote(options: SdkRemoteOptions): Promise<SdkRemote> {
  const calls = { sendMessage: 0, getTask: 0, getTaskDone: 0, createPushConfig: 0 };
  const authorizations: Array<string | undefined> = [];
  const pushConfigs: TaskPushNotificationConfig[] = [];
  const sentPushConfigs: Array<TaskPushNotificationConfig | null> = [];
  const tasks = new Map<string, { text: string; completed: boolean }>();
  let pushEvents = 0;
  // Held tasks wait on the current gate; release() opens it and sets a new one for later tasks.
  let releaseAll: () => void = () => undefined;
  let released = Promise.resolve();
  const newGate = () => (released = new Promise<void>((resolve) => (releaseAll = resolve)));
  newGate();

  class TestExecutor implements AgentExecutor {
    cancelTask = async (_taskId: string, _eventBus: ExecutionEventBus): Promise<void> => {};

    async execute(requestContext: RequestContext, eventBus: ExecutionEventBus): Promise<void> {
      const { userMessage, taskId, contextId } = requestContext;
      const textPart = userMessage.parts.find((part) => part.content?.$case === 'text');
      const text = textPart?.content?.$case === 'text' ? textPart.content.value : '';
      tasks.set(taskId, { text, completed: false });
      const now = () => new Date().toISOString();
      const task: Task = requestContext.task ?? {
        id: taskId,
        contextId,
        status: { state: TaskState.TASK_STATE_SUBMITTED, timestamp: now(), message: undefined },
        artifacts: [],
        history: [userMessage],
        metadata: undefined,
      };
      eventBus.publish(AgentEvent.task(task));
      eventBus.publish(AgentEvent.statusUpdate({ taskId, contextId, status: { state: TaskState.TASK_STATE_WORKING, timestamp: now(), message: undefined }, metadata: undefined }));
      await (options.hold ? released : sleep(options.completeAfterMs ?? 800));
      eventBus.publish(
        AgentEvent.artifactUpdate({
          taskId,
          contextId,
          artifact: {
            artifactId: randomUUID(),
            name: 'result',
            description: '',
            parts: [{ content: { $case: 'text', value: sdkResultFor(text) }, metadata: undefined, filename: '', mediaType: 'text/plain' }],
            metadata: undefined,
            extensions: [],
          },
          lastChunk: true,
          append: false,
          metadata: undefined,
        }),
      );
      tasks.get(taskId)!.completed = true;
      eventBus.publish(AgentEvent.statusUpdate({ taskId, contextId, status: { state: TaskState.TASK_STATE_COMPLETED, timestamp: now(), message: undefined }, metadata: undefined }));
    }
  }

  class RecordingPushStore extends InMemoryPushNotificationStore {
    override async save(taskId: string, context: ServerCallContext, config: TaskPushNotificationConfig): Promise<void> {
      await super.save(taskId, context, config);
      pushConfigs.push(structuredClone(config));
    }
  }
  const store = new RecordingPushStore();
  const defaultSender = new DefaultPushNotificationSender(store, { timeout: 5000 });
  const sender: PushNotificationSender = {
    send: async (event, context, task) => {
      pushEvents += 1;
      if (options.sender !== 'drop') await defaultSender.send(event, context, task);
    },
  };

  const card: AgentCard = {
    name: 'SDK test remote',
    description: 'The official SDK server with a test executor',
    supportedInterfaces: [{ url: 'http://127.0.0.1:0/', protocolBinding: 'JSONRPC', tenant: '', protocolVersion: A2A_PROTOCOL_VERSION }],
    provider: undefined,
    version: '1.0.0',
    capabilities: { streaming: true, pushNotifications: options.push, extensions: [], extendedAgentCard: false },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: ['text'],
    defaultOutputModes: ['text'],
    skills: [{ id: 'work', name: 'Work', description: 'Works a while', tags: ['test'], examples: [], inputModes: ['text'], outputModes: ['text'], securityRequirements: [] }],
    signatures: [],
  };

  class CountingHandler extends DefaultRequestHandler {
    override async sendMessage(...args: Parameters<DefaultRequestHandler['sendMessage']>) {
      calls.sendMessage += 1;
      sentPushConfigs.push(args[0].configuration?.taskPushNotificationConfig ? structuredClone(args[0].configuration.taskPushNotificationConfig) : null);
      return super.sendMessage(...args);
    }
    override async getTask(...args: Parameters<DefaultRequestHandler['getTask']>) {
      calls.getTask += 1;
      if (tasks.get(args[0].id)?.completed) calls.getTaskDone += 1;
      return super.getTask(...args);
    }
    override async createTaskPushNotificationConfig(...args: Parameters<DefaultRequestHandler['createTaskPushNotificationConfig']>) {
      calls.createPushConfig += 1;
      return super.createTaskPushNotificationConfig(...args);
    }
  }
  const handler = new CountingHandler(card, new InMemoryTaskStore(), new TestExecutor(), undefined, store, sender);

  const app = express();
  app.use((request, _response, next) => {
    if (request.method === 'POST') authorizations.push(request.headers.authorization);
    next();
  });
  app.use(`/${AGENT_CARD_PATH}`, agentCardHandler({ agentCardProvider: handler }));
  app.use(jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));
  const sockets = new Set<Socket>();
  const server: HttpServer = await new Promise((resolve) => {
    const listening = app.listen(0, LOOPBACK, () => resolve(listening));
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  const { port } = server.address() as AddressInfo;
  const url = `http://${LOOPBACK}:${port}`;
  card.supportedInterfaces[0]!.url = `${url}/`;
  return {
    url,
    cardUrl: `${url}/${AGENT_CARD_PATH}`,
    calls,
    authorizations,
    pushConfigs,
    sentPushConfigs,
    tasks,
    pushEvents: () => pushEvents,
    release: () => {
      const open = releaseAll;
      newGate();
      open();
    },
    close: async () => {
      releaseAll();
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

// ---------------------------------------------------------------------------------------------
// A hand-written JSON-RPC remote on node:http
// ---------------------------------------------------------------------------------------------

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

export type FakeSend = {
  taskId: string;
  contextId: string;
  body: Json;
  /** The push config the message carried, if any (credentials included). */
  pushConfig: { url: string; authentication?: { scheme: string; credentials: string } } | null;
  headers: IncomingHttpHeaders;
  /** Date.now() when the SendMessage answer was written. */
  answeredAt: number;
};

export type FakeTaskState = 'TASK_STATE_WORKING' | 'TASK_STATE_COMPLETED' | 'TASK_STATE_FAILED';

export type FakeRemote = {
  url: string;
  cardUrl: string;
  sends: FakeSend[];
  /** Every JSON-RPC call, by method, in arrival order. */
  methods: string[];
  count: (method: string) => number;
  /** The params of every GetTask, in arrival order. */
  getTaskParams: Json[];
  /** Push configs created with CreateTaskPushNotificationConfig. */
  createdConfigs: Json[];
  /** What GetTask answers for a task (default WORKING). */
  setState: (taskId: string, state: FakeTaskState) => void;
  /** How GetTask is answered: with the task, or with HTTP 503 (the remote cannot be asked). */
  setGetTask: (mode: 'answer' | 'unavailable') => void;
  close: () => Promise<void>;
};

export const fakeResultFor = (taskId: string) => `fake remote result of ${taskId}`;

export type FakeRemoteOptions = {
  push: boolean;
  /** Runs after the task id is chosen and before the SendMessage answer is written. */
  beforeAnswer?: (send: Omit<FakeSend, 'answeredAt'>) => Promise<void>;
  /** Delay of each GetTask answer. */
  getTaskDelayMs?: number;
};

/**
 * A minimal A2A 1.0 JSON-RPC remote: SendMessage answers a WORKING task and records the message
 * (its push config included, so a test can act as the remote with the registration's credential);
 * GetTask answers the state the test set, with the creating message as history;
 * CreateTaskPushNotificationConfig records the config. It serves every caller alike (no owner
 * scoping), so GetTask shows any client's task: what a remote without authentication does.
 */
export async function startFakeRemote(options: FakeRemoteOptions): Promise<FakeRemote> {
  const sends: FakeSend[] = [];
  const methods: string[] = [];
  const createdConfigs: Json[] = [];
  const states = new Map<string, FakeTaskState>();
  const contexts = new Map<string, string>();
  const messages = new Map<string, Json>();
  const getTaskParams: Json[] = [];
  let getTaskMode: 'answer' | 'unavailable' = 'answer';
  let base = '';
  const sockets = new Set<Socket>();

  // History is the message that created the task (as sent, its messageId included), unless the
  // request asked for none (historyLength 0), as an A2A server answers.
  const taskJson = (taskId: string, historyLength: unknown) => {
    const state = states.get(taskId) ?? 'TASK_STATE_WORKING';
    const message = messages.get(taskId);
    return {
      id: taskId,
      contextId: contexts.get(taskId) ?? 'fake-context',
      status: { state, ...(state === 'TASK_STATE_FAILED' ? { message: { messageId: `${taskId}-m`, role: 'ROLE_AGENT', parts: [{ text: 'it broke' }] } } : {}) },
      artifacts: state === 'TASK_STATE_COMPLETED' ? [{ artifactId: 'result', name: 'result', parts: [{ text: fakeResultFor(taskId) }] }] : [],
      ...(message && historyLength !== 0 ? { history: [{ ...message, taskId, contextId: contexts.get(taskId) }] } : {}),
    };
  };

  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      void (async () => {
        const send = (status: number, body: unknown) => {
          response.writeHead(status, { 'content-type': 'application/json' });
          response.end(JSON.stringify(body));
        };
        if (request.method === 'GET' && request.url === '/.well-known/agent-card.json') {
          return send(200, {
            name: 'Fake remote',
            description: 'A hand-written JSON-RPC remote',
            supportedInterfaces: [{ url: `${base}/`, protocolBinding: 'JSONRPC', protocolVersion: A2A_PROTOCOL_VERSION }],
            version: '1.0.0',
            capabilities: { streaming: false, pushNotifications: options.push },
            defaultInputModes: ['text'],
            defaultOutputModes: ['text'],
            skills: [],
          });
        }
        let rpc: Json;
        try {
          rpc = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        } catch {
          return send(400, { error: 'not JSON' });
        }
        methods.push(String(rpc.method));
        const answer = (result: unknown) => send(200, { jsonrpc: '2.0', id: rpc.id, result });
        switch (rpc.method) {
          case 'SendMessage': {
            const taskId = `fake-task-${randomUUID()}`;
            const contextId = `fake-context-${randomUUID()}`;
            contexts.set(taskId, contextId);
            states.set(taskId, 'TASK_STATE_WORKING');
            if (rpc.params?.message) messages.set(taskId, rpc.params.message);
            const record = { taskId, contextId, body: rpc.params, pushConfig: rpc.params?.configuration?.taskPushNotificationConfig ?? null, headers: request.headers };
            if (options.beforeAnswer) await options.beforeAnswer(record);
            sends.push({ ...record, answeredAt: Date.now() });
            return answer({ task: { id: taskId, contextId, status: { state: 'TASK_STATE_WORKING' } } });
          }
          case 'GetTask': {
            // The task as it is when the request arrives, answered after the delay.
            const taskId = String(rpc.params?.id ?? '');
            getTaskParams.push(rpc.params ?? null);
            const mode = getTaskMode;
            const task = contexts.has(taskId) ? taskJson(taskId, rpc.params?.historyLength) : null;
            if (options.getTaskDelayMs) await sleep(options.getTaskDelayMs);
            if (mode === 'unavailable') return send(503, { error: 'unavailable' });
            if (!task) return send(200, { jsonrpc: '2.0', id: rpc.id, error: { code: -32001, message: 'task not found' } });
            return answer(task);
          }
          case 'CreateTaskPushNotificationConfig': {
            const created = { ...rpc.params, id: rpc.params?.id || `cfg-${createdConfigs.length + 1}` };
            createdConfigs.push(created);
            return answer(created);
          }
          default:
            return send(200, { jsonrpc: '2.0', id: rpc.id, error: { code: -32601, message: `method ${String(rpc.method)} not found` } });
        }
      })();
    });
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, LOOPBACK, resolve));
  base = `http://${LOOPBACK}:${(server.address() as AddressInfo).port}`;
  return {
    url: base,
    cardUrl: `${base}/.well-known/agent-card.json`,
    sends,
    methods,
    count: (method) => methods.filter((name) => name === method).length,
    getTaskParams,
    createdConfigs,
    setState: (taskId, state) => states.set(taskId, state),
    setGetTask: (mode) => (getTaskMode = mode),
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Inbox callbacks as a remote sends them
// ---------------------------------------------------------------------------------------------

export type CallbackResponse = { status: number; headers: Headers; text: string };

export async function postCallback(
  url: string,
  body: unknown,
  auth: { bearer?: string; authorization?: string; notificationToken?: string } = {},
): Promise<CallbackResponse> {
  const headers: Record<string, string> = { 'content-type': 'application/a2a+json' };
  if (auth.bearer !== undefined) headers.authorization = `Bearer ${auth.bearer}`;
  if (auth.authorization !== undefined) headers.authorization = auth.authorization;
  if (auth.notificationToken !== undefined) headers['x-a2a-notification-token'] = auth.notificationToken;
  const response = await fetch(url, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

export const completedCallback = (taskId: string, contextId: string) => ({
  statusUpdate: { taskId, contextId, status: { state: 'TASK_STATE_COMPLETED', timestamp: new Date().toISOString() } },
});

export const workingCallback = (taskId: string, contextId: string) => ({
  statusUpdate: { taskId, contextId, status: { state: 'TASK_STATE_WORKING', timestamp: new Date().toISOString() } },
});

/** The registration id is the last path segment of the callback URL Keel handed the remote. */
export const registrationIdOf = (callbackUrl: string) => new URL(callbackUrl).pathname.split('/').at(-1)!;

// ---------------------------------------------------------------------------------------------
// Delegating through A2A, and the rows it leaves
// ---------------------------------------------------------------------------------------------

export async function newToken(pool: DatabasePool, name = `remote-${randomUUID().slice(0, 8)}`): Promise<string> {
  const created = await createClient(pool, name);
  if (!created.ok) throw new Error(`cannot create client ${name}`);
  return created.token;
}

export type LocalTask = { taskId: string; runId: string };

/** SendMessage (returning at once) to a local agent over JSON-RPC with the official client. */
export async function sendLocal(keel: TestKeel, token: string, agentId: string, text: string): Promise<LocalTask> {
  const client = await sdkClient(keel.url, agentId, token);
  const task = (await client.sendMessage(textMessage(text, { returnImmediately: true }))) as { id?: string };
  if (!task.id) throw new Error('SendMessage did not return a task');
  const runId = await keel.context.pool.oneFirst(sql.type(z.object({ run_id: z.string() }))`SELECT run_id FROM a2a_tasks WHERE id = ${task.id}`);
  return { taskId: task.id, runId };
}

export type SdkTaskView = { id: string; status?: { state: number }; artifacts?: Array<{ name?: string; parts?: Array<{ content?: { $case: string; value: unknown } }> }> };

/** GetTask on the local Keel until the task is terminal; returns the A2A task. */
export async function waitForLocalTask(keel: TestKeel, token: string, agentId: string, taskId: string, timeoutMs = 30_000): Promise<SdkTaskView> {
  const client = await sdkClient(keel.url, agentId, token);
  return waitFor(
    async () => {
      const task = (await client.getTask(GetTaskRequest.fromJSON({ id: taskId, historyLength: 0 }))) as SdkTaskView;
      return task.status && [3, 4, 5, 7].includes(task.status.state) ? task : null;
    },
    `local task ${taskId} to end`,
    timeoutMs,
  );
}

/** The text of a task's artifacts, joined. */
export function artifactText(task: SdkTaskView): string {
  return (task.artifacts ?? [])
    .flatMap((artifact) => artifact.parts ?? [])
    .map((part) => (part.content?.$case === 'text' ? String(part.content.value) : ''))
    .join('\n');
}

export const occurrences = (haystack: string, needle: string) => haystack.split(needle).length - 1;

const dependencyView = z.object({
  id: z.string(),
  run_id: z.string(),
  tool_call_id: z.string(),
  remote_agent: z.string(),
  state: z.string(),
  remote_task_id: z.string().nullable(),
  remote_context_id: z.string().nullable(),
  outcome: z.string().nullable(),
  polls: z.number(),
  created_at: z.number(),
  updated_at: z.number(),
  resolved_at: z.number().nullable(),
});
export type DependencyView = z.infer<typeof dependencyView>;

export async function dependenciesOf(pool: DatabasePool, runId: string): Promise<readonly DependencyView[]> {
  return pool.any(sql.type(dependencyView)`
    SELECT id, run_id, tool_call_id, remote_agent, state, remote_task_id, remote_context_id, outcome, polls, created_at, updated_at, resolved_at
    FROM dependencies WHERE run_id = ${runId} ORDER BY created_at`);
}

export async function dependencyById(pool: DatabasePool, id: string): Promise<DependencyView> {
  return pool.one(sql.type(dependencyView)`
    SELECT id, run_id, tool_call_id, remote_agent, state, remote_task_id, remote_context_id, outcome, polls, created_at, updated_at, resolved_at
    FROM dependencies WHERE id = ${id}`);
}

/** Waits until the run has its (first) dependency and returns it. */
export async function waitForDependency(pool: DatabasePool, runId: string, predicate: (row: DependencyView) => boolean = () => true, timeoutMs = 30_000): Promise<DependencyView> {
  return waitFor(async () => (await dependenciesOf(pool, runId)).find(predicate) ?? null, `a dependency of run ${runId}`, timeoutMs);
}

const registrationView = z.object({ id: z.string(), dependency_id: z.string(), remote_config_id: z.string().nullable(), credential_hash_hex: z.string(), created_at: z.number() });
export type RegistrationView = z.infer<typeof registrationView>;

export async function registrationsOf(pool: DatabasePool, dependencyId: string): Promise<readonly RegistrationView[]> {
  return pool.any(sql.type(registrationView)`
    SELECT id, dependency_id, remote_config_id, encode(credential_hash, 'hex') AS credential_hash_hex, created_at
    FROM inbox_registrations WHERE dependency_id = ${dependencyId} ORDER BY created_at`);
}

const callbackView = z.object({ id: z.string(), registration_id: z.string(), kind: z.string(), received_at: z.number(), processed_at: z.number().nullable() });
export type CallbackView = z.infer<typeof callbackView>;

export async function callbacksOfDependency(pool: DatabasePool, dependencyId: string): Promise<readonly CallbackView[]> {
  return pool.any(sql.type(callbackView)`
    SELECT c.id, c.registration_id, c.kind, c.received_at, c.processed_at FROM inbox_callbacks c
    JOIN inbox_registrations g ON g.id = c.registration_id WHERE g.dependency_id = ${dependencyId} ORDER BY c.received_at, c.id`);
}

export async function callbacksOfRegistration(pool: DatabasePool, registrationId: string): Promise<readonly CallbackView[]> {
  return pool.any(sql.type(callbackView)`
    SELECT id, registration_id, kind, received_at, processed_at FROM inbox_callbacks WHERE registration_id = ${registrationId} ORDER BY received_at, id`);
}

export async function countRows(pool: DatabasePool, table: 'inbox_callbacks' | 'inbox_registrations' | 'dependencies'): Promise<number> {
  return pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM ${sql.identifier([table])}`);
}

export async function runEventKinds(pool: DatabasePool, runId: string): Promise<string[]> {
  const kinds = await pool.anyFirst(sql.type(z.object({ kind: z.string() }))`SELECT kind FROM run_events WHERE run_id = ${runId} ORDER BY sequence`);
  return [...kinds];
}

const runView = z.object({ status: z.string(), iterations: z.number(), tool_calls: z.number(), revision: z.number() });

export async function runSummary(pool: DatabasePool, runId: string): Promise<z.infer<typeof runView>> {
  return pool.one(sql.type(runView)`SELECT status, iterations, tool_calls, revision FROM runs WHERE id = ${runId}`);
}

/** The SHA-256 of a credential, hex: what inbox_registrations.credential_hash holds. */
export const sha256Hex = (value: string) => createHash('sha256').update(value).digest('hex');

/** The callbacks' bodies as received (opened from their sealed column), in arrival order. */
export async function callbackBodies(keel: TestKeel, dependencyId: string): Promise<Json[]> {
  const rows = await keel.context.pool.any(sql.type(z.object({ id: z.string(), body: z.instanceof(Buffer) }))`
    SELECT c.id, c.body FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id
    WHERE g.dependency_id = ${dependencyId} ORDER BY c.received_at, c.id`);
  return rows.map((row) => {
    const opened = keel.context.sealer.openJson<Json>(callbackBodyContext(row.id), row.body);
    if (!opened.ok) throw new Error(`callback ${row.id} cannot be opened`);
    return opened.value;
  });
}

export type FakeDelegation = LocalTask & { send: FakeSend; registrationId: string; inboxUrl: string; credential: string; dependency: DependencyView };

/**
 * Delegates through agent `to-<remoteId>` to a fake remote that takes push (embedded) and waits
 * until the run waits on its dependency: returns the callback URL and credential the remote got.
 */
export async function delegateToFake(keel: TestKeel, token: string, remoteId: string, fake: FakeRemote): Promise<FakeDelegation> {
  const local = await sendLocal(keel, token, `to-${remoteId}`, `delegate to ${remoteId}`);
  await waitFor(
    async () => (await runSummary(keel.context.pool, local.runId)).status === 'waiting_for_dependency',
    `run ${local.runId} to wait for its dependency`,
  );
  const dependency = await waitForDependency(keel.context.pool, local.runId, (row) => row.remote_task_id !== null);
  const send = fake.sends.find((candidate) => candidate.taskId === dependency.remote_task_id);
  if (!send?.pushConfig?.authentication) throw new Error('the fake remote got no push config');
  return {
    ...local,
    send,
    registrationId: registrationIdOf(send.pushConfig.url),
    inboxUrl: send.pushConfig.url,
    credential: send.pushConfig.authentication.credentials,
    dependency,
  };
}
