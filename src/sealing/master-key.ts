/**
 * Master keys for sealed columns (envelope encryption: docs/architecture.md, "Privacy").
 *
 * A master key only ever wraps per-value data keys; it never encrypts column data directly. Each key
 * carries a short id that is written in clear into every sealed value, so the id must be derivable
 * from the key alone (the same key file on two hosts yields the same ids) and must reveal nothing
 * about the key: it is a truncated HMAC under the key itself.
 */
import { createHmac, randomBytes } from 'node:crypto';

export const MASTER_KEY_BYTES = 32;
/** Raw length of a key id; sealed values store these bytes at offsets 1..8. */
export const MASTER_KEY_ID_BYTES = 8;

const KEY_ID_LABEL = 'keel master key id v1';
const KEY_ID_PATTERN = /^[0-9a-f]{16}$/;

export type MasterKey = { readonly id: string; readonly key: Buffer };

export type ParseResult = { ok: true; key: MasterKey } | { ok: false; error: string };
export type ParseListResult = { ok: true; keys: MasterKey[] } | { ok: false; error: string };

/** 16 lowercase hex chars: the first 8 bytes of HMAC-SHA256(key, label). */
export function deriveMasterKeyId(key: Buffer): string {
  return createHmac('sha256', key).update(KEY_ID_LABEL).digest().subarray(0, MASTER_KEY_ID_BYTES).toString('hex');
}

/** Wraps raw key bytes; throws on a wrong length because that is a programming error, not input. */
export function masterKeyFromBytes(bytes: Buffer): MasterKey {
  if (bytes.length !== MASTER_KEY_BYTES) {
    throw new RangeError(sizeError(bytes.length));
  }
  // Copy so a caller zeroing or reusing its buffer cannot change a key the ring holds.
  const key = Buffer.from(bytes);
  return { id: deriveMasterKeyId(key), key };
}

export function generateMasterKey(): MasterKey {
  return masterKeyFromBytes(randomBytes(MASTER_KEY_BYTES));
}

export function encodeMasterKey(k: MasterKey): string {
  return k.key.toString('base64');
}

function sizeError(n: number): string {
  return `master key must be base64 of exactly ${MASTER_KEY_BYTES} bytes (got ${n} bytes)`;
}

// Buffer.from(s, 'base64') silently skips characters it does not understand, so a mangled key could
// decode to some other 32 bytes. Validate the alphabet and padding first. Error texts never echo the
// input: it is a secret and error texts end up in logs.
const BASE64_BODY = /^[A-Za-z0-9+/_-]*$/;

/** Accepts standard and url-safe base64, padded or not, surrounded by whitespace. */
export function parseMasterKey(base64: string): ParseResult {
  const text = base64.trim();
  const body = text.replace(/={1,2}$/, '');
  const padded = body.length !== text.length;
  if (!BASE64_BODY.test(body) || body.length % 4 === 1 || (padded && text.length % 4 !== 0)) {
    return { ok: false, error: `master key must be base64 of exactly ${MASTER_KEY_BYTES} bytes (not valid base64)` };
  }
  const bytes = Buffer.from(body.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
  if (bytes.length !== MASTER_KEY_BYTES) {
    return { ok: false, error: sizeError(bytes.length) };
  }
  return { ok: true, key: masterKeyFromBytes(bytes) };
}

/**
 * Parses keys separated by commas or newlines; the first is the active key, the rest stay readable
 * until rotation has rewrapped everything under the active one. Blank entries and lines starting with
 * '#' are ignored. Positions in errors count keys, not lines, so they match what the operator listed.
 */
export function parseMasterKeyList(text: string): ParseListResult {
  const entries = text
    .split(/\r?\n|\r/)
    .filter((line) => !line.trim().startsWith('#'))
    .flatMap((line) => line.split(','))
    .map((entry) => entry.trim())
    .filter((entry) => entry.length > 0);
  if (entries.length === 0) {
    return { ok: false, error: 'no master key given' };
  }
  const keys: MasterKey[] = [];
  const positionById = new Map<string, number>();
  for (const [index, entry] of entries.entries()) {
    const parsed = parseMasterKey(entry);
    if (!parsed.ok) {
      return { ok: false, error: `key ${index + 1}: ${parsed.error}` };
    }
    const seen = positionById.get(parsed.key.id);
    if (seen !== undefined) {
      // Same id and same bytes: an operator listed a key twice, harmless. Same id, other bytes: a
      // 64-bit id collision; refusing is the only safe answer since values name keys by id alone.
      if (!keys[seen].key.equals(parsed.key.key)) {
        return { ok: false, error: `key ${index + 1}: key id collides with key ${seen + 1}` };
      }
      continue;
    }
    positionById.set(parsed.key.id, keys.length);
    keys.push(parsed.key);
  }
  return { ok: true, keys };
}

/**
 * The keys a process may use: `active` seals and rewraps, every key opens. The ring does not check
 * that an id matches its key's derived id (tests build forged rings); keys built by this module always
 * do.
 */
export class MasterKeyRing {
  readonly keys: readonly MasterKey[];
  readonly active: MasterKey;
  readonly #byId = new Map<string, MasterKey>();

  constructor(keys: readonly MasterKey[]) {
    if (keys.length === 0) {
      throw new RangeError('a master key ring needs at least one key');
    }
    for (const k of keys) {
      if (!KEY_ID_PATTERN.test(k.id)) {
        throw new RangeError('master key id must be 16 lowercase hex chars');
      }
      if (k.key.length !== MASTER_KEY_BYTES) {
        throw new RangeError(sizeError(k.key.length));
      }
      const other = this.#byId.get(k.id);
      if (other !== undefined && !other.key.equals(k.key)) {
        throw new RangeError(`two different master keys share the id ${k.id}`);
      }
      if (other === undefined) {
        this.#byId.set(k.id, k);
      }
    }
    this.keys = Object.freeze([...this.#byId.values()]);
    this.active = keys[0];
  }

  byId(id: string): MasterKey | undefined {
    return this.#byId.get(id);
  }
}
