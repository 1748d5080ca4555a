import { randomBytes } from 'node:crypto';
import { describe, it, expect } from 'vitest';
import {
  SEALED_HEADER_BYTES,
  openBytes,
  openJson,
  rewrapSealed,
  sealBytes,
  sealJson,
  sealedKeyId,
  type SealContext,
} from '../../../src/sealing/envelope.js';
import { MasterKeyRing, generateMasterKey } from '../../../src/sealing/master-key.js';

const ctx: SealContext = { table: 'tasks', column: 'result', rowId: '018f2c4e-7b1a-7000-8000-000000000001' };

function ringOf(...keys: ReturnType<typeof generateMasterKey>[]): MasterKeyRing {
  return new MasterKeyRing(keys);
}

describe('seal and open', () => {
  const ring = ringOf(generateMasterKey());

  it('round-trips bytes, including empty and binary values', () => {
    for (const plaintext of [Buffer.from('hello'), Buffer.alloc(0), randomBytes(4096), Buffer.from([0, 255, 0])]) {
      const sealed = sealBytes(ring, ctx, plaintext);
      expect(sealed.length).toBe(SEALED_HEADER_BYTES + plaintext.length);
      const opened = openBytes(ring, ctx, sealed);
      expect(opened.ok).toBe(true);
      if (opened.ok) expect(opened.value.equals(plaintext)).toBe(true);
    }
  });

  it('round-trips JSON values, including unicode and empty ones', () => {
    const values: unknown[] = [
      { answer: 'Grüße, 世界 🚀', nested: [1, 2.5, null, true, { a: '' }] },
      '',
      [],
      {},
      0,
      null,
      'e\u0301 \u2028 \ud83d\ude00',
    ];
    for (const value of values) {
      expect(openJson(ring, ctx, sealJson(ring, ctx, value))).toEqual({ ok: true, value });
    }
  });

  it('refuses to seal values JSON cannot represent', () => {
    expect(() => sealJson(ring, ctx, undefined)).toThrow(TypeError);
    expect(() => sealJson(ring, ctx, () => 1)).toThrow(TypeError);
  });

  it('writes the documented layout: version 1, then the key id', () => {
    const sealed = sealBytes(ring, ctx, Buffer.from('x'));
    expect(sealed[0]).toBe(0x01);
    // SQL substring(col from 2 for 8) is 1-based: bytes at offsets 1..8.
    expect(sealed.subarray(1, 9).toString('hex')).toBe(ring.active.id);
    expect(sealedKeyId(sealed)).toBe(ring.active.id);
  });

  it('seals the same plaintext differently every time (fresh data key and IVs)', () => {
    const plaintext = Buffer.from('same plaintext');
    const a = sealBytes(ring, ctx, plaintext);
    const b = sealBytes(ring, ctx, plaintext);
    expect(a.equals(b)).toBe(false);
    const region = (buf: Buffer, from: number, to: number) => buf.subarray(from, to).toString('hex');
    expect(region(a, 9, 21)).not.toBe(region(b, 9, 21)); // wrap IV
    expect(region(a, 21, 53)).not.toBe(region(b, 21, 53)); // wrapped key
    expect(region(a, 69, 81)).not.toBe(region(b, 69, 81)); // data IV
    expect(region(a, 97, a.length)).not.toBe(region(b, 97, b.length)); // ciphertext
  });

  it('throws on a context that could make two places share additional data', () => {
    expect(() => sealBytes(ring, { ...ctx, table: 'a|b' }, Buffer.from('x'))).toThrow(TypeError);
    expect(() => sealBytes(ring, { ...ctx, column: '' }, Buffer.from('x'))).toThrow(TypeError);
    expect(() => openBytes(ring, { ...ctx, rowId: '' }, sealBytes(ring, ctx, Buffer.from('x')))).toThrow(TypeError);
    // rowId is the last field, so it may contain the separator.
    const odd = { ...ctx, rowId: 'a|b' };
    expect(openBytes(ring, odd, sealBytes(ring, odd, Buffer.from('x'))).ok).toBe(true);
  });
});

describe('context binding', () => {
  const ring = ringOf(generateMasterKey());
  const sealed = sealJson(ring, ctx, { secret: 'value' });

  it.each([
    ['another row', { ...ctx, rowId: '018f2c4e-7b1a-7000-8000-000000000002' }],
    ['another column', { ...ctx, column: 'history' }],
    ['another table', { ...ctx, table: 'a2a_events' }],
    ['a shifted separator', { table: 'tasks', column: 'result', rowId: `${ctx.rowId}|` }],
  ])('a value moved to %s fails to open', (_name, moved) => {
    expect(openJson(ring, moved, sealed)).toEqual({ ok: false, reason: 'authentication_failed' });
    expect(openBytes(ring, moved, sealed)).toEqual({ ok: false, reason: 'authentication_failed' });
    expect(rewrapSealed(ringOf(generateMasterKey(), ring.active), moved, sealed)).toEqual({
      ok: false,
      reason: 'authentication_failed',
    });
  });
});

describe('wrong keys fail closed', () => {
  const real = generateMasterKey();
  const sealed = sealBytes(new MasterKeyRing([real]), ctx, Buffer.from('top secret'));

  it('reports unknown_key with the id when the ring lacks the named key', () => {
    const other = ringOf(generateMasterKey(), generateMasterKey());
    expect(openBytes(other, ctx, sealed)).toEqual({ ok: false, reason: 'unknown_key', keyId: real.id });
    expect(openJson(other, ctx, sealed)).toEqual({ ok: false, reason: 'unknown_key', keyId: real.id });
    expect(rewrapSealed(other, ctx, sealed)).toEqual({ ok: false, reason: 'unknown_key', keyId: real.id });
  });

  it('reports authentication_failed when a different key is forged under the same id', () => {
    const forged = new MasterKeyRing([{ id: real.id, key: randomBytes(32) }]);
    expect(openBytes(forged, ctx, sealed)).toEqual({ ok: false, reason: 'authentication_failed' });
    expect(rewrapSealed(forged, ctx, sealed)).toEqual({ ok: false, reason: 'authentication_failed' });
  });
});

describe('tampering', () => {
  const ring = ringOf(generateMasterKey());
  const plaintext = Buffer.from('sixteen+ bytes of plaintext');
  const sealed = sealBytes(ring, ctx, plaintext);

  const regions: [string, number, number][] = [
    ['version', 0, 1],
    ['key id', 1, 9],
    ['wrap IV', 9, 21],
    ['wrapped key', 21, 53],
    ['wrap tag', 53, 69],
    ['data IV', 69, 81],
    ['data tag', 81, 97],
    ['ciphertext', 97, sealed.length],
  ];

  it.each(regions)('flipping any bit pattern of any byte in the %s fails', (name, from, to) => {
    for (let i = from; i < to; i += 1) {
      for (const mask of [0x01, 0x80, 0xff]) {
        const tampered = Buffer.from(sealed);
        tampered[i] ^= mask;
        const opened = openBytes(ring, ctx, tampered);
        expect(opened.ok, `${name} byte ${i} mask ${mask}`).toBe(false);
        if (name === 'version') expect(opened).toEqual({ ok: false, reason: 'malformed' });
        else if (name === 'key id') expect(opened).toMatchObject({ ok: false, reason: 'unknown_key' });
        else expect(opened).toEqual({ ok: false, reason: 'authentication_failed' });
        expect(rewrapSealed(ring, ctx, tampered).ok).toBe(false);
      }
    }
  });

  it('truncated, extended and garbage values fail', () => {
    expect(openBytes(ring, ctx, sealed.subarray(0, SEALED_HEADER_BYTES - 1))).toEqual({ ok: false, reason: 'malformed' });
    expect(openBytes(ring, ctx, Buffer.alloc(0))).toEqual({ ok: false, reason: 'malformed' });
    expect(openBytes(ring, ctx, sealed.subarray(0, sealed.length - 1))).toEqual({ ok: false, reason: 'authentication_failed' });
    expect(openBytes(ring, ctx, Buffer.concat([sealed, Buffer.from([0])]))).toEqual({ ok: false, reason: 'authentication_failed' });
    expect(openBytes(ring, ctx, 'not a buffer' as unknown as Buffer)).toEqual({ ok: false, reason: 'malformed' });
  });

  it('swapping the wrapped key between two values under the same key fails', () => {
    const other = sealBytes(ring, ctx, plaintext);
    const spliced = Buffer.concat([other.subarray(0, 69), sealed.subarray(69)]);
    expect(openBytes(ring, ctx, spliced)).toEqual({ ok: false, reason: 'authentication_failed' });
  });

  it('authentic bytes that are not JSON open as bytes but are malformed as JSON', () => {
    const notJson = sealBytes(ring, ctx, Buffer.from('{not json'));
    expect(openBytes(ring, ctx, notJson).ok).toBe(true);
    expect(openJson(ring, ctx, notJson)).toEqual({ ok: false, reason: 'malformed' });
  });
});

describe('sealedKeyId', () => {
  it('reads the key id of a sealed value and null for anything else', () => {
    const ring = ringOf(generateMasterKey());
    const sealed = sealBytes(ring, ctx, Buffer.alloc(0));
    expect(sealedKeyId(sealed)).toBe(ring.active.id);
    expect(sealedKeyId(Buffer.alloc(0))).toBeNull();
    expect(sealedKeyId(sealed.subarray(0, SEALED_HEADER_BYTES - 1))).toBeNull();
    const wrongVersion = Buffer.from(sealed);
    wrongVersion[0] = 0x02;
    expect(sealedKeyId(wrongVersion)).toBeNull();
  });
});

describe('rewrapSealed', () => {
  const oldKey = generateMasterKey();
  const newKey = generateMasterKey();
  const value = { transcript: ['hi', 'hello — ünïcödé'] };
  const sealed = sealJson(ringOf(oldKey), ctx, value);

  it('moves the value to the new active key without touching the data part', () => {
    const result = rewrapSealed(ringOf(newKey, oldKey), ctx, sealed);
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.changed).toBe(true);
    expect(sealedKeyId(result.sealed)).toBe(newKey.id);
    expect(result.sealed.length).toBe(sealed.length);
    expect(result.sealed.subarray(69).equals(sealed.subarray(69))).toBe(true);
    expect(result.sealed.subarray(9, 69).equals(sealed.subarray(9, 69))).toBe(false);

    expect(openJson(ringOf(newKey), ctx, result.sealed)).toEqual({ ok: true, value });
    expect(openJson(ringOf(oldKey), ctx, result.sealed)).toEqual({ ok: false, reason: 'unknown_key', keyId: newKey.id });
    // The original is unchanged and still under the old key only.
    expect(openJson(ringOf(newKey), ctx, sealed)).toEqual({ ok: false, reason: 'unknown_key', keyId: oldKey.id });
  });

  it('forging the new key id in front of the old wrap does not open', () => {
    const forged = Buffer.from(sealed);
    Buffer.from(newKey.id, 'hex').copy(forged, 1);
    expect(openBytes(ringOf(newKey, oldKey), ctx, forged)).toEqual({ ok: false, reason: 'authentication_failed' });
  });

  it('reports changed: false and returns the value as is when already under the active key', () => {
    const ring = ringOf(newKey, oldKey);
    const first = rewrapSealed(ring, ctx, sealed);
    if (!first.ok) throw new Error('rewrap failed');
    const second = rewrapSealed(ring, ctx, first.sealed);
    expect(second).toEqual({ ok: true, sealed: first.sealed, changed: false });
  });

  it('refuses a value whose ciphertext was damaged instead of rewrapping it', () => {
    const damaged = Buffer.from(sealed);
    damaged[damaged.length - 1] ^= 0x01;
    expect(rewrapSealed(ringOf(newKey, oldKey), ctx, damaged)).toEqual({ ok: false, reason: 'authentication_failed' });
    expect(rewrapSealed(ringOf(newKey, oldKey), ctx, Buffer.alloc(10))).toEqual({ ok: false, reason: 'malformed' });
  });
});
