import { randomUUID } from 'node:crypto';
import { SendMessageRequest, TaskPushNotificationConfig } from '@a2a-js/sdk';
import type { DatabasePool } from 'slonik';
import type { KeelConfig } from '../config/load-config.js';
import type { Sealer } from '../sealing/sealer.js';
import type { ToolDefinition, ToolResult } from '../tools/tool.js';
import { acknowledgeDependency, createDependency, createRegistration, dependencyResult, findDependency, resolveDependency, setRemoteConfigId } from './dependency-repository.js';
import type { RemoteAgents } from './remote-agents.js';
import { judgeRemoteTask, type SdkTask } from './remote-task.js';

// The `remote_agent` tool: sends a message to a configured remote A2A agent and makes the run wait
// on a dependency. Registration follows this order for each case (docs/client-role.md,
// "Registration"):
//  - embedded push config (the remote takes push, registration "embedded"): the pending local
//    registration is written first, then the message goes out carrying the callback config;
//  - separate: send, store the acknowledged remote task id, create the local registration, create
//    the remote push config, then GetTask once to close the gap;
//  - a remote without push: send, store, and the poller reconciles.

export const inboxUrl = (config: KeelConfig, registrationId: string) => `${config.server.publicUrl}/a2a/inbox/${registrationId}`;

export type RemoteToolDeps = { pool: DatabasePool; sealer: Sealer; remotes: RemoteAgents; config: KeelConfig };

/**
 * The tool is defined before the database is open (agents are checked first at start-up); its
 * dependencies are bound once they exist.
 */
export function createRemoteAgentTool(config: KeelConfig, bind: () => RemoteToolDeps | null): ToolDefinition {
  const remoteIds = config.remoteAgents.map((remote) => remote.id);
  return {
    name: 'remote_agent',
    description: `Delegate to a remote A2A agent (${remoteIds.join(', ') || 'none configured'}) and wait for its result.`,
    parameters: {
      type: 'object',
      properties: { agent: { type: 'string', enum: remoteIds }, message: { type: 'string', minLength: 1 } },
      required: ['agent', 'message'],
      additionalProperties: false,
    },
    effect: 'idempotent_write',
    needsApproval: false,
    run: async (args, context): Promise<ToolResult> => {
      const deps = bind();
      if (!deps) return { kind: 'error', message: 'remote agents are not available in this process' };
      const { pool, sealer, remotes } = deps;
      const agentId = String(args.agent);
      // The same call after a crash: its dependency exists already; wait on it instead of sending twice.
      const earlier = await findDependency(pool, context.runId, context.toolCallId);
      if (earlier && (earlier.state === 'pending' || earlier.state === 'waiting')) return { kind: 'dependency', dependencyId: earlier.id };
      if (earlier) {
        // Already resolved (the run was retried after the remote answered): never send twice.
        const stored = await dependencyResult(pool, sealer, earlier.id);
        return { kind: 'ok', content: stored ?? JSON.stringify({ state: earlier.outcome ?? earlier.state }) };
      }
      const lookup = await remotes.get(agentId);
      if (!lookup.ok) return { kind: 'error', message: lookup.message };
      const { remote } = lookup;
      const embedded = remote.pushSupported && (remote.config.registration ?? 'embedded') === 'embedded';
      const messageId = randomUUID();
      const send = (push?: { id: string; credential: string }) =>
        remote.client.sendMessage(
          SendMessageRequest.fromJSON({
            message: { messageId, role: 'ROLE_USER', parts: [{ text: String(args.message) }] },
            configuration: {
              returnImmediately: true,
              ...(push ? { taskPushNotificationConfig: { url: inboxUrl(config, push.id), authentication: { scheme: 'Bearer', credentials: push.credential } } } : {}),
            },
          }),
        ) as Promise<SdkTask | { messageId: string }>;

      const dependency = { runId: context.runId, toolCallId: context.toolCallId, toolName: 'remote_agent', remoteAgent: agentId, messageId };
      let createdId: string | null = null;
      try {
        if (embedded) {
          // The messageId is recorded with the pending dependency before the send: if this process
          // dies before storing the remote task id, it is what proves which remote task is ours.
          const created = await createDependency(pool, { ...dependency, withRegistration: true });
          createdId = created.dependencyId;
          const task = await send(created.registration!);
          return settleFirstAnswer(created.dependencyId, task);
        }
        const task = await send();
        if (!('id' in task)) return { kind: 'ok', content: JSON.stringify({ state: 'completed', result: 'direct message' }) };
        const created = await createDependency(pool, {
          ...dependency,
          remoteTaskId: task.id,
          remoteContextId: task.contextId,
          withRegistration: false,
        });
        createdId = created.dependencyId;
        const verdict = judgeRemoteTask(task);
        if (verdict.kind !== 'waiting') return finish(created.dependencyId, verdict);
        if (remote.pushSupported) {
          const registration = await createRegistration(pool, created.dependencyId);
          const pushConfig = await remote.client.createTaskPushNotificationConfig(
            TaskPushNotificationConfig.fromJSON({ taskId: task.id, url: inboxUrl(config, registration.id), authentication: { scheme: 'Bearer', credentials: registration.credential } }),
          );
          await setRemoteConfigId(pool, registration.id, pushConfig.id);
          // GetTask once: the remote may have finished before the push config existed.
          const now = (await remote.client.getTask({ id: task.id, historyLength: 0, tenant: '' } as never)) as SdkTask;
          const closing = judgeRemoteTask(now);
          if (closing.kind !== 'waiting') return finish(created.dependencyId, closing);
        }
        return { kind: 'dependency', dependencyId: created.dependencyId };
      } catch (error) {
        const message = `remote agent ${agentId} could not be reached: ${(error as Error).message}`;
        if (createdId) await resolveDependency(pool, sealer, createdId, 'FAILED', 'unreachable', JSON.stringify({ state: 'failed', message }));
        return { kind: 'error', message };
      }

      async function settleFirstAnswer(dependencyId: string, task: SdkTask | { messageId: string }): Promise<ToolResult> {
        if (!('id' in task)) {
          await resolveDependency(pool, sealer, dependencyId, 'FAILED', 'direct_message', JSON.stringify({ state: 'completed', result: 'direct message' }));
          return { kind: 'ok', content: JSON.stringify({ state: 'completed', result: 'direct message' }) };
        }
        await acknowledgeDependency(pool, dependencyId, task.id, task.contextId);
        const verdict = judgeRemoteTask(task);
        return verdict.kind === 'waiting' ? { kind: 'dependency', dependencyId } : finish(dependencyId, verdict);
      }

      async function finish(dependencyId: string, verdict: Exclude<ReturnType<typeof judgeRemoteTask>, { kind: 'waiting' }>): Promise<ToolResult> {
        await resolveDependency(pool, sealer, dependencyId, verdict.kind === 'resolved' ? 'RESOLVED' : 'FAILED', verdict.kind === 'resolved' ? 'completed' : verdict.outcome, verdict.result);
        return { kind: 'ok', content: verdict.result };
      }
    },
  };
}
