import { createHash } from 'node:crypto';

/** The namespace of delivery ids (a fixed random UUID): ids of other kinds never collide with them. */
const DELIVERY_NAMESPACE = Buffer.from('5b0f6e2c9d3a4f1e8c7b2a6d4e9f1c3b', 'hex');

/**
 * The id of the delivery of one journal event to one push config: a name-based UUID (version 5,
 * RFC 9562) of the task, the config and the event's sequence number. A receiver deduplicates by
 * this id (`X-Keel-Delivery-Id`), so the same event projected twice (a projection redone after a
 * crash) must never reach it under a second id: a random id could not promise that.
 */
export function deliveryIdOf(taskId: string, configId: string, eventSequence: number): string {
  const name = Buffer.from(JSON.stringify([taskId, configId, eventSequence]), 'utf8');
  const hash = createHash('sha1').update(DELIVERY_NAMESPACE).update(name).digest();
  hash[6] = (hash[6]! & 0x0f) | 0x50;
  hash[8] = (hash[8]! & 0x3f) | 0x80;
  const hex = hash.subarray(0, 16).toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
