// A Postgres array in the binary wire format (array_recv), for the hot path's batch statements
// (decision 0037). node-postgres sends a JS array as a text literal: every text element escaped
// by two regular expressions, every bytea element as hex, and Postgres parses it back character
// by character (array_in was 4 % of the bench database's CPU). A Buffer parameter goes out as
// binary instead, so an array encoded here reaches array_recv as it is: lengths, then bytes.
//
// Only the element types the batch statements use are encoded, and only when every element is of
// the JS type that encodes exactly as the text path would: anything else returns null and the
// caller sends the array as before, so Postgres reads (or refuses) it the way it always did.

import { isUuid } from './uuid.js';

/** Element type OIDs (pg_type.oid), fixed since Postgres 8.3. */
const ELEMENT_OIDS = { bool: 16, int8: 20, int4: 23, text: 25, float8: 701, uuid: 2950, bytea: 17, jsonb: 3802 } as const;

export type BinaryElementType = keyof typeof ELEMENT_OIDS;

const INT4_MIN = -(2 ** 31);
const INT4_MAX = 2 ** 31 - 1;
const TWO_32 = 2 ** 32;
const JSONB_VERSION = 1;
const HEADER_BYTES = 20;
/** Strings up to this length are measured and, when ASCII, copied byte by byte here: cheaper than a call into Buffer for the short names and ids these columns hold. */
const SHORT_STRING = 64;
const NOT_ENCODED = -2;

export function isBinaryElementType(type: string): type is BinaryElementType {
  return Object.hasOwn(ELEMENT_OIDS, type);
}

/** UTF-8 length of a string; equal to its length exactly when it is ASCII. */
function utf8Length(value: string): number {
  if (value.length > SHORT_STRING) return Buffer.byteLength(value, 'utf8');
  for (let index = 0; index < value.length; index += 1) {
    if (value.charCodeAt(index) >= 0x80) return Buffer.byteLength(value, 'utf8');
  }
  return value.length;
}

function writeString(out: Buffer, value: string, bytes: number, at: number): void {
  if (bytes !== value.length || bytes > SHORT_STRING) {
    out.write(value, at, bytes, 'utf8');
    return;
  }
  for (let index = 0; index < bytes; index += 1) out[at + index] = value.charCodeAt(index);
}

// uuid_in also takes braces, no hyphens and other hyphen placements; those go the text way.
const UUID_HYPHENS = new Set([8, 13, 18, 23]);

/** Each hex digit's value by its char code (the others are never looked up: the string passed isUuid). */
const HEX_VALUES = new Uint8Array(128);
for (const [digits, first] of [['0123456789', 0], ['abcdef', 10], ['ABCDEF', 10]] as const) {
  for (let index = 0; index < digits.length; index += 1) HEX_VALUES[digits.charCodeAt(index)] = first + index;
}

function writeUuid(out: Buffer, value: string, at: number): void {
  let index = 0;
  for (let byte = 0; byte < 16; byte += 1) {
    if (UUID_HYPHENS.has(index)) index += 1;
    out[at + byte] = (HEX_VALUES[value.charCodeAt(index)]! << 4) | HEX_VALUES[value.charCodeAt(index + 1)]!;
    index += 2;
  }
}

type Codec = {
  /** The element's length in bytes, or NOT_ENCODED when it would not read here exactly as node-postgres's text literal does. */
  measure: (value: unknown) => number;
  /** Writes the element's `bytes` bytes at `at`. */
  write: (out: Buffer, value: never, bytes: number, at: number) => void;
};

const CODECS: Record<BinaryElementType, Codec> = {
  bytea: { measure: (value) => (Buffer.isBuffer(value) ? value.length : NOT_ENCODED), write: (out, value: Buffer, _bytes, at) => void value.copy(out, at) },
  text: { measure: (value) => (typeof value === 'string' ? utf8Length(value) : NOT_ENCODED), write: (out, value: string, bytes, at) => writeString(out, value, bytes, at) },
  // A string is the JSON text itself, as node-postgres sends it; objects go the text way (their
  // JSON.stringify happens there).
  jsonb: {
    measure: (value) => (typeof value === 'string' ? 1 + utf8Length(value) : NOT_ENCODED),
    write: (out, value: string, bytes, at) => {
      out[at] = JSONB_VERSION;
      writeString(out, value, bytes - 1, at + 1);
    },
  },
  uuid: { measure: (value) => (typeof value === 'string' && isUuid(value) ? 16 : NOT_ENCODED), write: (out, value: string, _bytes, at) => writeUuid(out, value, at) },
  int4: {
    measure: (value) => (typeof value === 'number' && Number.isInteger(value) && value >= INT4_MIN && value <= INT4_MAX ? 4 : NOT_ENCODED),
    write: (out, value: number, _bytes, at) => void out.writeInt32BE(value, at),
  },
  // Two 32-bit halves: a safe integer's high half fits an int32, and BigInt would allocate.
  int8: {
    measure: (value) => (typeof value === 'number' && Number.isSafeInteger(value) ? 8 : NOT_ENCODED),
    write: (out, value: number, _bytes, at) => {
      const high = Math.floor(value / TWO_32);
      out.writeInt32BE(high, at);
      out.writeUInt32BE(value - high * TWO_32, at + 4);
    },
  },
  // -0 as +0: node-postgres writes String(-0), "0".
  float8: { measure: (value) => (typeof value === 'number' ? 8 : NOT_ENCODED), write: (out, value: number, _bytes, at) => void out.writeDoubleBE(value === 0 ? 0 : value, at) },
  bool: {
    measure: (value) => (typeof value === 'boolean' ? 1 : NOT_ENCODED),
    write: (out, value: boolean, _bytes, at) => {
      out[at] = value ? 1 : 0;
    },
  },
};

/** Each element's length, -1 for null (as the format writes it); reused, as encoding is synchronous. */
let lengths = new Int32Array(256);

/**
 * `values` as a one-dimensional `type[]` in Postgres's binary format (null elements included), or
 * null when an element is not one this encodes: then send `values` as they are.
 */
export function toBinaryArray(type: BinaryElementType, values: readonly unknown[]): Buffer | null {
  const codec = CODECS[type];
  const oid = ELEMENT_OIDS[type];
  if (values.length === 0) {
    // No dimensions: array_recv gives the empty array.
    const empty = Buffer.alloc(12);
    empty.writeUInt32BE(oid, 8);
    return empty;
  }
  if (lengths.length < values.length) lengths = new Int32Array(values.length * 2);
  let size = HEADER_BYTES;
  let hasNull = false;
  for (let index = 0; index < values.length; index += 1) {
    const value = values[index];
    if (value === null || value === undefined) {
      hasNull = true;
      lengths[index] = -1;
    } else {
      const bytes = codec.measure(value);
      if (bytes === NOT_ENCODED) return null;
      lengths[index] = bytes;
      size += bytes;
    }
    size += 4;
  }
  // Every byte of `out` is written below (header, then each element's length and bytes).
  const out = Buffer.allocUnsafe(size);
  out.writeInt32BE(1, 0);
  out.writeInt32BE(hasNull ? 1 : 0, 4);
  out.writeUInt32BE(oid, 8);
  out.writeInt32BE(values.length, 12);
  out.writeInt32BE(1, 16);
  let at = HEADER_BYTES;
  for (let index = 0; index < values.length; index += 1) {
    const bytes = lengths[index]!;
    at = out.writeInt32BE(bytes, at);
    if (bytes < 0) continue;
    codec.write(out, values[index] as never, bytes, at);
    at += bytes;
  }
  return out;
}
