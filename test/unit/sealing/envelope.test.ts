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

describe('fresh randomness for every sealed value', () => {
  // The data keys and IVs come from a pool of random bytes refilled every few dozen values: a key
  // must never change between its wrap and its use, and no byte handed out once may be handed out
  // again (a data key's bytes reappearing as a later, public, IV would give the value away).
  it('unwraps to a distinct data key per value, none of whose bytes appear in any IV, across many pool refills', async () => {
    const { createDecipheriv } = await import('node:crypto');
    const { MASTER_KEY_ID_BYTES } = await import('../../../src/sealing/master-key.js');
    const master = generateMasterKey();
    const ring = ringOf(master);
    const old = generateMasterKey();
    const retired = ringOf(old);
    const rotating = ringOf(master, old);
    const wrapIvAt = 1 + MASTER_KEY_ID_BYTES;
    const wrappedAt = wrapIvAt + 12;
    const wrapTagAt = wrappedAt + 32;
    const dataIvAt = wrapTagAt + 16;
    const keys: string[] = [];
    const ivs: string[] = [];
    for (let index = 0; index < 400; index += 1) {
      // A rewrap draws one IV: it shifts where in the pool the refills fall (between a data key
      // and the IVs of its own seal, sometimes), as key rotation does in a running process.
      if (index % 5 === 4) expect(rewrapSealed(rotating, ctx, sealBytes(retired, ctx, Buffer.from('shift')))).toMatchObject({ ok: true, changed: true });
      const rowCtx = { ...ctx, rowId: `row-${index}` };
      const plaintext = Buffer.from(`value ${index}`);
      const sealed = sealBytes(ring, rowCtx, plaintext);
      const decipher = createDecipheriv('aes-256-gcm', master.key, sealed.subarray(wrapIvAt, wrappedAt), { authTagLength: 16 });
      decipher.setAAD(Buffer.from(`keel:v1:wrap|${master.id}|${rowCtx.table}|${rowCtx.column}|${rowCtx.rowId}`, 'utf8'));
      decipher.setAuthTag(sealed.subarray(wrapTagAt, wrapTagAt + 16));
      const dataKey = Buffer.concat([decipher.update(sealed.subarray(wrappedAt, wrapTagAt)), decipher.final()]);
      // The unwrapped key is the key the value was encrypted with.
      const data = createDecipheriv('aes-256-gcm', dataKey, sealed.subarray(dataIvAt, dataIvAt + 12), { authTagLength: 16 });
      data.setAAD(Buffer.from(`keel:v1|${rowCtx.table}|${rowCtx.column}|${rowCtx.rowId}`, 'utf8'));
      data.setAuthTag(sealed.subarray(dataIvAt + 12, dataIvAt + 28));
      expect(Buffer.concat([data.update(sealed.subarray(SEALED_HEADER_BYTES)), data.final()]).equals(plaintext)).toBe(true);
      keys.push(dataKey.toString('hex'));
      ivs.push(sealed.subarray(wrapIvAt, wrappedAt).toString('hex'), sealed.subarray(dataIvAt, dataIvAt + 12).toString('hex'));
    }
    expect(new Set(keys).size).toBe(keys.length);
    expect(new Set(ivs).size).toBe(ivs.length);
    // No 8-byte run of any data key shows up in any IV.
    const ivText = ivs.join('|');
    for (const key of keys) for (let at = 0; at + 16 <= key.length; at += 2) expect(ivText.includes(key.slice(at, at + 16))).toBe(false);
  });
});
