import type { CommonQueryMethods } from 'slonik';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { runJobId } from '../queue/job-ids.js';
import type { Sealer } from '../sealing/sealer.js';
import { createRun } from './run-repository.js';
import type { RunRequest } from './run-request.js';
import type { RunRow } from './run-row.js';

export type CreateAgentRunResult = { ok: true; run: RunRow } | { ok: false; reason: 'unknown_agent' };

/**
 * Records a QUEUED run for an agent, with the ceilings of its primary provider. The QUEUED row is
 * the debt; the caller enqueues its job after the commit (`enqueueRun`), and the sweeper restores
 * the job if that never happens.
 */
export async function createAgentRun(
  db: CommonQueryMethods,
  sealer: Sealer,
  registry: AgentRegistry,
  agentId: string,
  request: RunRequest,
  id?: string,
): Promise<CreateAgentRunResult> {
  const agent = registry.get(agentId);
  if (!agent) return { ok: false, reason: 'unknown_agent' };
  const primary = agent.chain[0]!;
  const run = await createRun(db, sealer, {
    ...(id ? { id } : {}),
    agent: agentId,
    auditLevel: primary.ceilings.auditLevel,
    answerLevel: primary.ceilings.answerLevel,
    provider: primary.provider.name,
    request,
  });
  return { ok: true, run };
}

/**
 * The job of a new task's QUEUED run. With its client (`owner`) and its rank in that client's
 * backlog (`rank`, 1 for the oldest waiting), the job is prioritized by the rank: the queue hands
 * out every client's first waiting task, then every client's second, and so on, so one client's
 * backlog does not delay another client's task (decision 0062). The owner rides in the job for the
 * run slots' count of each client's runs in flight.
 */
export async function enqueueRun(queues: KeelQueues, runId: string, fair?: { owner: string; rank: number }): Promise<void> {
  await queues.addJob('runs', runJobId(runId), fair ? { runId, owner: fair.owner } : { runId }, fair ? { priority: fair.rank } : {});
}
