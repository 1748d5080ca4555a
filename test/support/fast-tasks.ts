import { randomUUID } from 'node:crypto';
import { pino } from 'pino';
import { AuditTrail } from '../../src/runs/audit-trail.js';
import type { FastRun } from '../../src/runs/fast-runs.js';
import type { Sealer } from '../../src/sealing/sealer.js';
import type { HeldCompletion } from '../../src/writes/complete-held-runs.js';
import { heldRowsOfFastRun, type TaskCreation } from '../../src/writes/task-creation.js';
import { sealTaskHistory } from '../../src/tasks/task-repository.js';

// A task on the fast path as the API writes it (its creation), the fast run the executor gets for
// it, and the held completion the executor submits when its echo run ends (decisions 0025, 0029).

const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });

/** A fast run's claim: its worker, lease and token (each fast task's own when not given). */
export type FastClaim = { workerId: string; leaseMs: number; token?: string };

export type FastTask = { creation: TaskCreation; run: FastRun; audit: AuditTrail; claim: FastClaim; rolledBack: number };

export type FastTaskOptions = {
  sealer: Sealer;
  owner: string;
  claim: FastClaim;
  text?: string;
  /** The task's context (default: a new one under the task's own id). */
  contextId?: string;
  metadata?: Record<string, unknown>;
};

export function fastTask(options: FastTaskOptions): FastTask {
  const { sealer, owner } = options;
  const claim = { ...options.claim, token: options.claim.token ?? randomUUID() };
  const id = randomUUID();
  const contextId = options.contextId ?? id;
  const text = options.text ?? 'hello';
  const metadata = options.metadata ?? {};
  const at = Date.now();
  const message = { messageId: `m-${id}`, role: 'ROLE_USER' as const, parts: [{ text }], contextId, taskId: id };
  const task = { id, contextId, owner, agent: 'echo', answerLevel: 'full' as const, history: [message], metadata };
  const sealedHistory = sealTaskHistory(sealer, task);
  const request = { messages: [{ role: 'user' as const, content: text }] };
  return {
    creation: {
      task: { ...task, sealedHistory },
      run: { id, agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', provider: 'echo', taskId: id, request },
      fast: { claim, at },
    },
    run: { id, agent: 'echo', taskId: id, auditLevel: 'metadata', answerLevel: 'full', provider: 'echo', request, at, claimToken: claim.token, task: { contextId, owner, metadata, history: sealedHistory, pushConfigured: false } },
    audit: new AuditTrail(id, 'metadata', 0, logger),
    claim,
    rolledBack: 0,
  };
}

/** The echo run's end as the executor submits it: its audit rows (claimed, completed) recorded, `rolledBack` counted. */
export function heldCompletion(fast: FastTask): HeldCompletion {
  fast.audit.record({ kind: 'claimed', meta: { worker: fast.claim.workerId, fastPath: true } });
  fast.audit.record({ kind: 'completed', meta: { reason: 'completed' } });
  return {
    runId: fast.run.id,
    holder: { workerId: fast.claim.workerId, token: fast.claim.token! },
    reason: 'completed',
    answer: `echo: ${fast.run.id}`,
    totals: { iterations: 1, toolCalls: 0, inputTokens: 2, outputTokens: 3 },
    taskId: fast.run.id,
    hasOutputs: false,
    held: heldRowsOfFastRun(fast.run),
    takeAuditRows: (transaction) => fast.audit.takeUnrefusableRows(transaction),
    beforeSettle: (transaction) => fast.audit.flushWithin(transaction),
    rolledBack: () => {
      fast.rolledBack += 1;
      fast.audit.restoreTaken();
    },
  };
}
