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

export async function enqueueRun(queues: KeelQueues, runId: string, delayMs = 0): Promise<void> {
  await queues.addJob('runs', runJobId(runId), { runId }, { delayMs });
}
