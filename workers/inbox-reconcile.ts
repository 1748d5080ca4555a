import type { Job } from 'bullmq';
import { reconcileDependency } from '../src/remote/reconcile.js';
import type { RemoteAgents } from '../src/remote/remote-agents.js';
import type { KeelContext } from '../src/context/keel-context.js';

// The inbox queue's processor: reconcile one dependency by asking the remote (callbacks, the
// executor right after it suspends, and the poller all enqueue it).
export function createInboxReconcileProcessor(context: KeelContext, remotes: RemoteAgents) {
  return async (job: Job<{ dependencyId: string }>) => reconcileDependency(context, remotes, job.data.dependencyId);
}
