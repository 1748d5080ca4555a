// Deterministic job ids: a job is only a wake-up, and the same debt always maps to the same id, so
// enqueueing twice is harmless. BullMQ refuses ':' in custom ids, hence '-' where DESIGN.md
// writes `run:<id>`.
export const runJobId = (runId: string) => `run-${runId}`;
export const projectionJobId = (runId: string, revision: number) => `proj-${runId}-${revision}`;
export const deliveryJobId = (deliveryId: string) => `dlv-${deliveryId}`;
export const inboxJobId = (inboxId: string) => `inbox-${inboxId}`;
