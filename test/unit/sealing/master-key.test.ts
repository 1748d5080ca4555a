import { createHmac, randomBytes } from 'node:crypto';
import { describe, it, expect } from 'vitest';
import {
  MasterKeyRing,
  deriveMasterKeyId,
  encodeMasterKey,
  generateMasterKey,
  masterKeyFromBytes,
  parseMasterKey,
  parseMasterKeyList,
} from '../../../src/sealing/master-key.js';

describe('master key id', () => {
  it('is the first 8 bytes of HMAC-SHA256(key, label) in lowercase hex', () => {
    const key = randomBytes(32);
    const expected = createHmac('sha256', key).update('keel master key id v1').digest().subarray(0, 8).toString('hex');
    expect(deriveMasterKeyId(key)).toBe(expected);
    expect(masterKeyFromBytes(key).id).toMatch(/^[0-9a-f]{16}$/);
    expect(masterKeyFromBytes(key).id).toBe(expected);
  });

  it('is deterministic per key and differs between keys', () => {
    const key = randomBytes(32);
    expect(masterKeyFromBytes(key).id).toBe(masterKeyFromBytes(Buffer.from(key)).id);
    expect(generateMasterKey().id).not.toBe(generateMasterKey().id);
  });

  it('copies the key bytes so the caller cannot change them later', () => {
    const bytes = randomBytes(32);
    const k = masterKeyFromBytes(bytes);
    const copy = Buffer.from(bytes);
    bytes.fill(0);
    expect(k.key.equals(copy)).toBe(true);
  });

  it('rejects raw keys of the wrong length', () => {
    expect(() => masterKeyFromBytes(randomBytes(31))).toThrow(/exactly 32 bytes \(got 31 bytes\)/);
  });
});

describe('parseMasterKey', () => {
  it('round-trips generate/encode/parse', () => {
    const k = generateMasterKey();
    expect(k.key.length).toBe(32);
    const parsed = parseMasterKey(encodeMasterKey(k));
    expect(parsed).toEqual({ ok: true, key: k });
  });

  it('accepts url-safe base64, missing padding and surrounding whitespace', () => {
    // 0xfb/0xff bytes make '+' and '/' (or '-' and '_') appear in the encoding.
    const bytes = Buffer.alloc(32, 0xfb);
    bytes[31] = 0xff;
    const std = bytes.toString('base64');
    expect(std).toMatch(/[+/]/);
    const url = bytes.toString('base64url');
    for (const text of [std, url, std.replace(/=+$/, ''), `  ${std}\n`, `\t${url}  `]) {
      const parsed = parseMasterKey(text);
      expect(parsed.ok, text).toBe(true);
      if (parsed.ok) expect(parsed.key.key.equals(bytes)).toBe(true);
    }
  });

  it('rejects a wrong length with the byte count', () => {
    expect(parseMasterKey(randomBytes(16).toString('base64'))).toEqual({
      ok: false,
      error: 'master key must be base64 of exactly 32 bytes (got 16 bytes)',
    });
    expect(parseMasterKey(randomBytes(33).toString('base64'))).toEqual({
      ok: false,
      error: 'master key must be base64 of exactly 32 bytes (got 33 bytes)',
    });
    expect(parseMasterKey('')).toEqual({ ok: false, error: 'master key must be base64 of exactly 32 bytes (got 0 bytes)' });
  });

  it('rejects characters outside base64 instead of skipping them, and never echoes the input', () => {
    const good = encodeMasterKey(generateMasterKey());
    for (const bad of [`${good.slice(0, 10)}!${good.slice(11)}`, `${good.slice(0, 20)} ${good.slice(20)}`, `${good}=`, 'a'.repeat(41) + '=']) {
      const parsed = parseMasterKey(bad);
      expect(parsed.ok, bad).toBe(false);
      if (!parsed.ok) {
        expect(parsed.error).toMatch(/^master key must be base64 of exactly 32 bytes/);
        expect(parsed.error).not.toContain(good.slice(0, 10));
      }
    }
  });
});

describe('parseMasterKeyList', () => {
  const a = generateMasterKey();
  const b = generateMasterKey();
  const c = generateMasterKey();
  const ea = encodeMasterKey(a);
  const eb = encodeMasterKey(b);
  const ec = encodeMasterKey(c);

  it('splits on commas and keeps the first key first (active)', () => {
    expect(parseMasterKeyList(`${ea}, ${eb},${ec}`)).toEqual({ ok: true, keys: [a, b, c] });
  });

  it('splits on newlines (LF and CRLF), ignoring blank lines and # comments', () => {
    const text = `# active key\n${ea}\r\n\n   \n  # retired 2024\n${eb}\n${ec}\n`;
    expect(parseMasterKeyList(text)).toEqual({ ok: true, keys: [a, b, c] });
  });

  it('mixes commas and newlines', () => {
    expect(parseMasterKeyList(`${ea},${eb}\n${ec},`)).toEqual({ ok: true, keys: [a, b, c] });
  });

  it('collapses duplicates, keeping the first position', () => {
    const urlB = b.key.toString('base64url');
    expect(parseMasterKeyList(`${eb}\n${ea}\n${eb}\n${urlB}\n${ea}`)).toEqual({ ok: true, keys: [b, a] });
  });

  it('names the position of a bad entry (counting keys, not lines or comments)', () => {
    expect(parseMasterKeyList(`# c\n${ea}\n\n${randomBytes(31).toString('base64')}`)).toEqual({
      ok: false,
      error: 'key 2: master key must be base64 of exactly 32 bytes (got 31 bytes)',
    });
    const bad = parseMasterKeyList(`${ea},${eb},not*base64`);
    expect(bad.ok).toBe(false);
    if (!bad.ok) expect(bad.error).toMatch(/^key 3: master key must be base64/);
  });

  it('refuses an empty list', () => {
    for (const text of ['', '  \n\n', '# only a comment\n', ',,']) {
      expect(parseMasterKeyList(text), JSON.stringify(text)).toEqual({ ok: false, error: 'no master key given' });
    }
  });
});

describe('MasterKeyRing', () => {
  it('makes the first key active and finds every key by id', () => {
    const a = generateMasterKey();
    const b = generateMasterKey();
    const ring = new MasterKeyRing([a, b]);
    expect(ring.active).toBe(a);
    expect(ring.keys).toEqual([a, b]);
    expect(ring.byId(a.id)).toBe(a);
    expect(ring.byId(b.id)).toBe(b);
    expect(ring.byId('0000000000000000')).toBeUndefined();
  });

  it('refuses an empty ring, bad ids, bad key sizes and two keys under one id', () => {
    const a = generateMasterKey();
    expect(() => new MasterKeyRing([])).toThrow(RangeError);
    expect(() => new MasterKeyRing([{ id: 'ABCDEF0123456789', key: a.key }])).toThrow(RangeError);
    expect(() => new MasterKeyRing([{ id: a.id, key: randomBytes(16) }])).toThrow(RangeError);
    expect(() => new MasterKeyRing([a, { id: a.id, key: randomBytes(32) }])).toThrow(/share the id/);
  });

  it('collapses the same key listed twice', () => {
    const a = generateMasterKey();
    expect(new MasterKeyRing([a, a]).keys).toEqual([a]);
  });
});
