import { createHmac, timingSafeEqual } from 'node:crypto';
import type { MasterKey, MasterKeyRing } from '../sealing/master-key.js';
import { MASTER_KEY_ID_BYTES } from '../sealing/master-key.js';
import type { SendMessageParams } from '../protocol/wire.js';

// What a repeated SendMessage is compared by (docs/decisions/0065-message-fingerprints-under-the-master-key.md):
// a keyed hash of everything the request asks that a repeat must repeat, stored beside the
// message's key. A plain hash of a short message could be reversed by guessing its text, so the
// hash is an HMAC under a key derived from a master key; the row then tells a reader of the
// database nothing of the content, whatever the task's privacy level. The first bytes name the
// master key, so a fingerprint stays comparable after a rotation while the ring holds that key.

const FINGERPRINT_LABEL = 'keel message fingerprint v1';
const HASH_BYTES = 32;

/** What a fingerprint covers: the request without its key and without how the answer is awaited. */
export type FingerprintInput = {
  /** The agent the message went to: the same key sent to another agent is another request. */
  agent: string;
  message: {
    role: string;
    parts: readonly unknown[];
    contextId?: string | undefined;
    taskId?: string | undefined;
    referenceTaskIds?: readonly string[] | undefined;
    extensions?: readonly string[] | undefined;
    metadata?: Record<string, unknown> | undefined;
  };
  /** SendMessageRequest.metadata (the task's metadata). */
  metadata?: Record<string, unknown> | undefined;
  /** The push config sent with the message, if any. */
  pushConfig?: unknown;
};

/** The part of a SendMessage a fingerprint covers, taken field by field (nothing else of the request gets in). */
export function fingerprintInputOf(agent: string, params: SendMessageParams): FingerprintInput {
  const { message } = params;
  return {
    agent,
    message: {
      role: message.role,
      parts: message.parts,
      contextId: message.contextId,
      taskId: message.taskId,
      referenceTaskIds: message.referenceTaskIds,
      extensions: message.extensions,
      metadata: message.metadata,
    },
    metadata: params.metadata,
    pushConfig: params.configuration?.taskPushNotificationConfig,
  };
}

const derivedKeys = new WeakMap<MasterKey, Buffer>();

function fingerprintKey(master: MasterKey): Buffer {
  let key = derivedKeys.get(master);
  if (key === undefined) {
    key = createHmac('sha256', master.key).update(FINGERPRINT_LABEL).digest();
    derivedKeys.set(master, key);
  }
  return key;
}

/**
 * JSON with object keys sorted at every depth and undefined members left out: the same request
 * gives the same text whatever order its client wrote the fields in.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map((item) => (item === undefined ? 'null' : canonicalJson(item))).join(',')}]`;
  const entries = Object.keys(value)
    .sort()
    .filter((key) => (value as Record<string, unknown>)[key] !== undefined)
    .map((key) => `${JSON.stringify(key)}:${canonicalJson((value as Record<string, unknown>)[key])}`);
  return `{${entries.join(',')}}`;
}

function digest(master: MasterKey, input: FingerprintInput): Buffer {
  return createHmac('sha256', fingerprintKey(master)).update(canonicalJson(input)).digest();
}

/** The request's fingerprint under the ring's active key: the key's id, then the HMAC. */
export function messageFingerprint(ring: MasterKeyRing, input: FingerprintInput): Buffer {
  return Buffer.concat([Buffer.from(ring.active.id, 'hex'), digest(ring.active, input)]);
}

/**
 * Whether a stored fingerprint is of this request: 'same', 'different', or 'unknown' when the
 * master key that made it is no longer in the ring (retired after a rotation and removed).
 */
export function compareFingerprint(ring: MasterKeyRing, stored: Buffer, input: FingerprintInput): 'same' | 'different' | 'unknown' {
  if (stored.length !== MASTER_KEY_ID_BYTES + HASH_BYTES) return 'unknown';
  const master = ring.byId(stored.subarray(0, MASTER_KEY_ID_BYTES).toString('hex'));
  if (master === undefined) return 'unknown';
  return timingSafeEqual(stored.subarray(MASTER_KEY_ID_BYTES), digest(master, input)) ? 'same' : 'different';
}
