import { describe, expect, it } from 'vitest';
import { canonicalJson, compareFingerprint, messageFingerprint, type FingerprintInput } from '../../../src/a2a/message-fingerprint.js';
import { generateMasterKey, MasterKeyRing } from '../../../src/sealing/master-key.js';

// A repeated message key is compared by a keyed hash of the request
// (docs/decisions/0065-message-fingerprints-under-the-master-key.md).

const request = (text: string, extra: Partial<FingerprintInput> = {}): FingerprintInput => ({
  agent: 'echo',
  message: { role: 'ROLE_USER', parts: [{ text, metadata: { b: 1, a: 2 } }], contextId: 'c-1' },
  metadata: { tag: 'x' },
  ...extra,
});

describe('message fingerprints', () => {
  it('canonical JSON sorts keys at every depth and leaves out undefined members', () => {
    expect(canonicalJson({ b: 1, a: { d: [1, { f: 2, e: undefined }], c: null } })).toBe('{"a":{"c":null,"d":[1,{"f":2}]},"b":1}');
    expect(canonicalJson({ b: 1, a: 2 })).toBe(canonicalJson({ a: 2, b: 1 }));
  });

  it('is the same for the same request written in another order, different for another body, agent or push config', () => {
    const ring = new MasterKeyRing([generateMasterKey()]);
    const stored = messageFingerprint(ring, request('hello'));
    expect(stored).toHaveLength(40);
    const reordered: FingerprintInput = { metadata: { tag: 'x' }, message: { contextId: 'c-1', parts: [{ metadata: { a: 2, b: 1 }, text: 'hello' }], role: 'ROLE_USER' }, agent: 'echo' };
    expect(compareFingerprint(ring, stored, reordered)).toBe('same');
    expect(compareFingerprint(ring, stored, request('hello!'))).toBe('different');
    expect(compareFingerprint(ring, stored, request('hello', { agent: 'other' }))).toBe('different');
    expect(compareFingerprint(ring, stored, request('hello', { pushConfig: { url: 'https://example.com/hook' } }))).toBe('different');
    expect(compareFingerprint(ring, stored, request('hello', { metadata: { tag: 'y' } }))).toBe('different');
  });

  it('holds nothing a reader could check a guess against without the master key', () => {
    const one = messageFingerprint(new MasterKeyRing([generateMasterKey()]), request('yes'));
    const two = messageFingerprint(new MasterKeyRing([generateMasterKey()]), request('yes'));
    expect(one.subarray(8).equals(two.subarray(8))).toBe(false);
  });

  it('is checked under the key that made it after a rotation, and is unknown once that key is gone', () => {
    const old = generateMasterKey();
    const stored = messageFingerprint(new MasterKeyRing([old]), request('hello'));
    const rotated = new MasterKeyRing([generateMasterKey(), old]);
    expect(compareFingerprint(rotated, stored, request('hello'))).toBe('same');
    expect(compareFingerprint(rotated, stored, request('other'))).toBe('different');
    expect(compareFingerprint(new MasterKeyRing([generateMasterKey()]), stored, request('hello'))).toBe('unknown');
    expect(compareFingerprint(rotated, Buffer.alloc(12), request('hello'))).toBe('unknown');
  });
});
