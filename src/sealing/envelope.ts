/**
 * Envelope encryption for sealed columns (docs/architecture.md, "Privacy").
 *
 * Every value gets a fresh random 32-byte data key. The plaintext is encrypted with the data key and
 * the data key is wrapped with the active master key, both with AES-256-GCM. Rotating a master key
 * then only rewraps 32 bytes per value; the ciphertext is never rewritten.
 *
 * Binary format (stored in bytea columns; offsets are 0-based, SQL substring is 1-based):
 *
 *   offset  length  field
 *   0       1       version, 0x01
 *   1       8       master key id, raw bytes (hex of these is MasterKey.id);
 *                   SQL: encode(substring(col from 2 for 8), 'hex')
 *   9       12      wrap IV
 *   21      32      wrapped data key
 *   53      16      wrap tag
 *   69      12      data IV
 *   81      16      data tag
 *   97      rest    ciphertext (same length as the plaintext, may be empty)
 *
 * Additional authenticated data:
 *   data: `keel:v1|<table>|<column>|<rowId>`: a value copied into another row, column or table
 *         fails to open. It leaves out the key id so that rewrapping never touches the ciphertext.
 *   wrap: `keel:v1:wrap|<keyId>|<table>|<column>|<rowId>`: a wrapped key is bound to the key id
 *         written beside it and to the same place, so neither can be swapped on its own.
 *
 * Every failure returns a reason and never any plaintext: callers cannot mistake a forged or moved
 * value for a real one.
 */
import { createCipheriv, createDecipheriv, randomFillSync } from 'node:crypto';
import { MASTER_KEY_ID_BYTES, type MasterKeyRing } from './master-key.js';

export type SealContext = { table: string; column: string; rowId: string };

export type OpenFailure =
  | { ok: false; reason: 'unknown_key'; keyId: string }
  | { ok: false; reason: 'malformed' }
  | { ok: false; reason: 'authentication_failed' };
export type OpenResult = { ok: true; value: Buffer } | OpenFailure;
export type OpenJsonResult = { ok: true; value: unknown } | OpenFailure;
export type RewrapResult = { ok: true; sealed: Buffer; changed: boolean } | OpenFailure;

export const SEALED_VERSION = 0x01;
const IV_BYTES = 12;
const TAG_BYTES = 16;
const DATA_KEY_BYTES = 32;

const KEY_ID_AT = 1;
const WRAP_IV_AT = KEY_ID_AT + MASTER_KEY_ID_BYTES;
const WRAPPED_KEY_AT = WRAP_IV_AT + IV_BYTES;
const WRAP_TAG_AT = WRAPPED_KEY_AT + DATA_KEY_BYTES;
const DATA_IV_AT = WRAP_TAG_AT + TAG_BYTES;
const DATA_TAG_AT = DATA_IV_AT + IV_BYTES;
/** Length of everything before the ciphertext, which is the shortest valid sealed value (97). */
export const SEALED_HEADER_BYTES = DATA_TAG_AT + TAG_BYTES;

const MALFORMED = Object.freeze({ ok: false, reason: 'malformed' } as const);
const AUTH_FAILED = Object.freeze({ ok: false, reason: 'authentication_failed' } as const);

// '|' separates the fields, so a '|' in table or column would let two different places share an AAD
// ("a|b","c" vs "a","b|c"). rowId is last and may contain anything. Bad contexts are programming
// errors, so they throw instead of producing a result.
function checkContext(ctx: SealContext): void {
  for (const [name, value] of [['table', ctx.table], ['column', ctx.column]] as const) {
    if (typeof value !== 'string' || value.length === 0 || value.includes('|')) {
      throw new TypeError(`seal context ${name} must be a non-empty string without '|'`);
    }
  }
  if (typeof ctx.rowId !== 'string' || ctx.rowId.length === 0) {
    throw new TypeError('seal context rowId must be a non-empty string');
  }
}

function dataAad(ctx: SealContext): Buffer {
  return Buffer.from(`keel:v1|${ctx.table}|${ctx.column}|${ctx.rowId}`, 'utf8');
}

function wrapAad(keyId: string, ctx: SealContext): Buffer {
  return Buffer.from(`keel:v1:wrap|${keyId}|${ctx.table}|${ctx.column}|${ctx.rowId}`, 'utf8');
}

/**
 * Fresh random bytes from a pool filled 4 KiB at a time (as crypto.randomUUID does): one call into
 * the CSPRNG per ~73 sealed values instead of three per value, which cost ~5 µs each under load.
 * Each slice is copied out and wiped in the pool: a view would be rewritten by the next refill
 * (a data key changing between its wrap and its use, and its bytes handed out again later, as a
 * public IV for instance). The caller zeroes a data key after use.
 */
const RANDOM_POOL_BYTES = 4096;
const randomPool = Buffer.alloc(RANDOM_POOL_BYTES);
let randomPoolAt = RANDOM_POOL_BYTES;

/** Fills `target[at, at + length)` with fresh random bytes from the pool. */
function takeRandomInto(target: Buffer, at: number, length: number): void {
  if (randomPoolAt + length > RANDOM_POOL_BYTES) {
    randomFillSync(randomPool);
    randomPoolAt = 0;
  }
  const end = randomPoolAt + length;
  randomPool.copy(target, at, randomPoolAt, end);
  randomPool.fill(0, randomPoolAt, end);
  randomPoolAt = end;
}

/** Returns null when the tag does not verify; never returns unauthenticated bytes. */
function gcmDecrypt(key: Buffer, aad: Buffer, iv: Buffer, tag: Buffer, ciphertext: Buffer): Buffer | null {
  const decipher = createDecipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_BYTES });
  decipher.setAAD(aad);
  decipher.setAuthTag(tag);
  const head = decipher.update(ciphertext);
  try {
    return Buffer.concat([head, decipher.final()]);
  } catch {
    head.fill(0);
    return null;
  }
}

type Unwrapped = { ok: true; keyId: string; dataKey: Buffer } | OpenFailure;

function unwrapDataKey(ring: MasterKeyRing, ctx: SealContext, sealed: Buffer): Unwrapped {
  checkContext(ctx);
  if (!Buffer.isBuffer(sealed) || sealed.length < SEALED_HEADER_BYTES || sealed[0] !== SEALED_VERSION) {
    return MALFORMED;
  }
  const keyId = sealed.subarray(KEY_ID_AT, WRAP_IV_AT).toString('hex');
  const master = ring.byId(keyId);
  if (master === undefined) {
    return { ok: false, reason: 'unknown_key', keyId };
  }
  const dataKey = gcmDecrypt(
    master.key,
    wrapAad(keyId, ctx),
    sealed.subarray(WRAP_IV_AT, WRAPPED_KEY_AT),
    sealed.subarray(WRAP_TAG_AT, DATA_IV_AT),
    sealed.subarray(WRAPPED_KEY_AT, WRAP_TAG_AT),
  );
  return dataKey === null ? AUTH_FAILED : { ok: true, keyId, dataKey };
}

function decryptData(dataKey: Buffer, ctx: SealContext, sealed: Buffer): Buffer | null {
  return gcmDecrypt(
    dataKey,
    dataAad(ctx),
    sealed.subarray(DATA_IV_AT, DATA_TAG_AT),
    sealed.subarray(DATA_TAG_AT, SEALED_HEADER_BYTES),
    sealed.subarray(SEALED_HEADER_BYTES),
  );
}

/**
 * Seals into one buffer of the final size: the IVs are drawn into it, and each cipher's output and
 * tag are copied to their offsets (no intermediate buffers to concatenate: sealing is on every
 * task's hot path, several times). The data key lives in a scratch buffer that is wiped before
 * this returns; sealing is synchronous, so no two seals share it.
 */
const dataKeyScratch = Buffer.alloc(DATA_KEY_BYTES);

function encryptInto(out: Buffer, key: Buffer, aad: Buffer, ivAt: number, tagAt: number, plaintext: Buffer, textAt: number): void {
  // Random 96-bit IVs: a data key is used once, and a master key wraps far fewer than the 2^32
  // values after which random IV collisions would become a concern.
  takeRandomInto(out, ivAt, IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', key, out.subarray(ivAt, ivAt + IV_BYTES), { authTagLength: TAG_BYTES });
  cipher.setAAD(aad);
  cipher.update(plaintext).copy(out, textAt);
  cipher.final();
  cipher.getAuthTag().copy(out, tagAt);
}

export function sealBytes(ring: MasterKeyRing, ctx: SealContext, plaintext: Buffer): Buffer {
  checkContext(ctx);
  const master = ring.active;
  // Not zero-filled: every byte is written below (version, key id, both IVs and tags, the wrapped
  // key and the ciphertext, which is as long as the plaintext), and a seal that throws midway
  // returns nothing.
  const out = Buffer.allocUnsafe(SEALED_HEADER_BYTES + plaintext.length);
  out[0] = SEALED_VERSION;
  out.write(master.id, KEY_ID_AT, MASTER_KEY_ID_BYTES, 'hex');
  takeRandomInto(dataKeyScratch, 0, DATA_KEY_BYTES);
  try {
    encryptInto(out, master.key, wrapAad(master.id, ctx), WRAP_IV_AT, WRAP_TAG_AT, dataKeyScratch, WRAPPED_KEY_AT);
    encryptInto(out, dataKeyScratch, dataAad(ctx), DATA_IV_AT, DATA_TAG_AT, plaintext, SEALED_HEADER_BYTES);
    return out;
  } finally {
    dataKeyScratch.fill(0);
  }
}

/** Seals JSON.stringify(value); throws a TypeError for values JSON cannot represent (undefined, functions). */
export function sealJson(ring: MasterKeyRing, ctx: SealContext, value: unknown): Buffer {
  const json: string | undefined = JSON.stringify(value);
  if (json === undefined) {
    throw new TypeError('sealJson: value has no JSON representation');
  }
  return sealBytes(ring, ctx, Buffer.from(json, 'utf8'));
}

export function openBytes(ring: MasterKeyRing, ctx: SealContext, sealed: Buffer): OpenResult {
  const unwrapped = unwrapDataKey(ring, ctx, sealed);
  if (!unwrapped.ok) {
    return unwrapped;
  }
  try {
    const value = decryptData(unwrapped.dataKey, ctx, sealed);
    return value === null ? AUTH_FAILED : { ok: true, value };
  } finally {
    unwrapped.dataKey.fill(0);
  }
}

/** Like openBytes, then JSON.parse; authentic bytes that are not JSON count as malformed. */
export function openJson(ring: MasterKeyRing, ctx: SealContext, sealed: Buffer): OpenJsonResult {
  const opened = openBytes(ring, ctx, sealed);
  if (!opened.ok) {
    return opened;
  }
  try {
    return { ok: true, value: JSON.parse(opened.value.toString('utf8')) as unknown };
  } catch {
    return MALFORMED;
  } finally {
    opened.value.fill(0);
  }
}

/** Hex key id of the master key a sealed value names, or null if it is not a sealed value. */
export function sealedKeyId(sealed: Buffer): string | null {
  if (!Buffer.isBuffer(sealed) || sealed.length < SEALED_HEADER_BYTES || sealed[0] !== SEALED_VERSION) {
    return null;
  }
  return sealed.subarray(KEY_ID_AT, WRAP_IV_AT).toString('hex');
}

/**
 * Rewraps the data key under the ring's active key; data IV, tag and ciphertext are copied as they
 * are. The whole value is authenticated first, so rotation reports a damaged value instead of
 * stamping a fresh wrap onto it. When the value is already under the active key the input buffer is
 * returned unchanged.
 */
export function rewrapSealed(ring: MasterKeyRing, ctx: SealContext, sealed: Buffer): RewrapResult {
  const unwrapped = unwrapDataKey(ring, ctx, sealed);
  if (!unwrapped.ok) {
    return unwrapped;
  }
  try {
    const plaintext = decryptData(unwrapped.dataKey, ctx, sealed);
    if (plaintext === null) {
      return AUTH_FAILED;
    }
    plaintext.fill(0);
    if (unwrapped.keyId === ring.active.id) {
      return { ok: true, sealed, changed: false };
    }
    const active = ring.active;
    const rewrapped = Buffer.from(sealed);
    rewrapped.write(active.id, KEY_ID_AT, MASTER_KEY_ID_BYTES, 'hex');
    encryptInto(rewrapped, active.key, wrapAad(active.id, ctx), WRAP_IV_AT, WRAP_TAG_AT, unwrapped.dataKey, WRAPPED_KEY_AT);
    return { ok: true, sealed: rewrapped, changed: true };
  } finally {
    unwrapped.dataKey.fill(0);
  }
}
