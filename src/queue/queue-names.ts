export const QUEUE_NAMES = ['runs', 'projector', 'push', 'inbox', 'maintenance'] as const;
export type QueueName = (typeof QUEUE_NAMES)[number];
