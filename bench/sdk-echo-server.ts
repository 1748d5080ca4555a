import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import express from 'express';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { A2A_PROTOCOL_VERSION, AGENT_CARD_PATH, TaskState, type AgentCard, type Artifact, type Task, type TaskArtifactUpdateEvent, type TaskStatusUpdateEvent } from '@a2a-js/sdk';
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore, type AgentExecutor, type ExecutionEventBus, type RequestContext, type TaskStore } from '@a2a-js/sdk/server';
import { DatabaseTaskStore, type TaskDatabase } from '@a2a-js/sdk/server/database';
import { agentCardHandler, jsonRpcHandler, UserBuilder } from '@a2a-js/sdk/server/express';

// The official @a2a-js/sdk server, as its own samples build it (sample-agent, database-agent), with an
// echo executor, for bench:a2a. Started by bench/a2a.ts in a child process of its own so that it
// does not share an event loop with the load generator.
//
//   tsx bench/sdk-echo-server.ts memory <port>
//   tsx bench/sdk-echo-server.ts postgres <port> <database-url>
//
// The Postgres store's table must exist (bench/a2a.ts runs the SDK's `a2a-db upgrade` first).
// GET /bench/stats answers how many SQL statements the store has sent (counted by Kysely's log hook).

const [kind, portText, databaseUrl] = process.argv.slice(2);
const port = Number(portText);
if ((kind !== 'memory' && kind !== 'postgres') || !Number.isInteger(port) || port <= 0 || (kind === 'postgres' && !databaseUrl)) {
  console.error('usage: sdk-echo-server.ts memory <port> | postgres <port> <database-url>');
  process.exit(2);
}

/** Publishes the task, one artifact `echo: <text>`, then COMPLETED, like the SDK's database-agent sample. */
class EchoExecutor implements AgentExecutor {
  cancelTask = async (_taskId: string, _eventBus: ExecutionEventBus): Promise<void> => {};

  async execute(requestContext: RequestContext, eventBus: ExecutionEventBus): Promise<void> {
    const { userMessage, taskId, contextId } = requestContext;
    const textPart = userMessage.parts.find((part) => part.content?.$case === 'text');
    const text = textPart?.content?.$case === 'text' ? textPart.content.value : '';

    const task: Task = requestContext.task ?? {
      id: taskId,
      contextId,
      status: { state: TaskState.TASK_STATE_SUBMITTED, timestamp: new Date().toISOString(), message: undefined },
      artifacts: [],
      history: [userMessage],
      metadata: userMessage.metadata,
    };
    eventBus.publish(AgentEvent.task(task));

    const artifact: Artifact = {
      artifactId: randomUUID(),
      name: 'echo',
      description: '',
      parts: [{ content: { $case: 'text', value: `echo: ${text}` }, metadata: undefined, filename: '', mediaType: 'text/plain' }],
      metadata: undefined,
      extensions: [],
    };
    const artifactUpdate: TaskArtifactUpdateEvent = { taskId, contextId, artifact, lastChunk: true, append: false, metadata: undefined };
    eventBus.publish(AgentEvent.artifactUpdate(artifactUpdate));

    const finalUpdate: TaskStatusUpdateEvent = {
      taskId,
      contextId,
      status: { state: TaskState.TASK_STATE_COMPLETED, timestamp: new Date().toISOString(), message: undefined },
      metadata: undefined,
    };
    eventBus.publish(AgentEvent.statusUpdate(finalUpdate));
  }
}

const agentCard: AgentCard = {
  name: 'Echo (SDK bench)',
  description: 'Answers with what it was sent',
  supportedInterfaces: [{ url: `http://127.0.0.1:${port}/`, protocolBinding: 'JSONRPC', tenant: '', protocolVersion: A2A_PROTOCOL_VERSION }],
  provider: undefined,
  version: '1.0.0',
  capabilities: { streaming: true, pushNotifications: false, extensions: [], extendedAgentCard: false },
  securitySchemes: {},
  securityRequirements: [],
  defaultInputModes: ['text'],
  defaultOutputModes: ['text'],
  skills: [{ id: 'echo', name: 'Echo', description: 'Echoes the input', tags: ['demo'], examples: [], inputModes: ['text'], outputModes: ['text'], securityRequirements: [] }],
  signatures: [],
};

let statements = 0;
let db: Kysely<TaskDatabase> | undefined;
let taskStore: TaskStore;
if (kind === 'postgres') {
  // pg.Pool's default size (10) unless BENCH_SDK_PG_POOL says otherwise.
  const max = Number(process.env.BENCH_SDK_PG_POOL ?? 10);
  db = new Kysely<TaskDatabase>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: databaseUrl, max }) }),
    log: (event) => {
      if (event.level === 'query') statements += 1;
    },
  });
  taskStore = new DatabaseTaskStore(db);
} else {
  taskStore = new InMemoryTaskStore();
}

const requestHandler = new DefaultRequestHandler(agentCard, taskStore, new EchoExecutor());
const app = express();
app.get('/bench/stats', (_request, response) => {
  response.json({ statements });
});
app.use(`/${AGENT_CARD_PATH}`, agentCardHandler({ agentCardProvider: requestHandler }));
app.use(jsonRpcHandler({ requestHandler, userBuilder: UserBuilder.noAuthentication }));

const server: Server = app.listen(port, '127.0.0.1', () => {
  console.log(`sdk-echo-server (${kind}) listening on http://127.0.0.1:${port}`);
});
server.on('error', (error) => {
  console.error(`sdk-echo-server: ${error.message}`);
  process.exit(1);
});

let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  server.closeAllConnections();
  server.close(() => {
    void (db ? db.destroy() : Promise.resolve()).finally(() => process.exit(0));
  });
  setTimeout(() => process.exit(0), 3000).unref();
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
// The harness's end is ours too: without a parent there is nobody to measure for.
process.on('disconnect', stop);
