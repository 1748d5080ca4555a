import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { canonicalizeAgentCard, generateAgentCardSignature, verifyAgentCardSignature, type AgentCard } from '@a2a-js/sdk';
import { base64url } from 'jose';
import { describe, expect, it, vi } from 'vitest';
import { buildAgentCard } from '../../../src/a2a/agent-card.js';
import { SEQUENCED_EVENTS_URI } from '../../../src/a2a/sequenced-events.js';
import { canonicalCardPayload, signAgentCard, verifyCardSignatures, type CardSigner, type ResolveKeys } from '../../../src/cards/card-signature.js';
import { keyResolver } from '../../../src/cards/card-trust.js';
import { loadConfig, type KeelConfig } from '../../../src/config/load-config.js';
import { createGuardedFetch } from '../../../src/net/guarded-fetch.js';
import { tempDir } from '../../support/test-keel.js';

// Signed agent cards (decision 0021): the JWS Keel writes over its canonical card, checked by
// Keel's verifier and by the official SDK's, both ways, and what a change to any field does.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const keyPairs = {
  EdDSA: () => generateKeyPairSync('ed25519'),
  ES256: () => generateKeyPairSync('ec', { namedCurve: 'P-256' }),
} as const;

/** The config of an installation with two agents, one with an extension and skill examples. */
function config(): KeelConfig {
  const loaded = loadConfig({
    cwd: tempDir(),
    env: {
      KEEL_SERVER_PUBLIC_URL: 'https://agents.example.com',
      KEEL_AGENTS: JSON.stringify([
        { id: 'echo', name: 'Echo', description: 'Answers with what it was sent', provider: 'echo', skills: [{ id: 'echo', name: 'Echo', description: 'Echoes', tags: ['demo'], examples: ['hi'] }] },
        {
          id: 'ext',
          name: 'Ext',
          provider: 'echo',
          extensions: [{ uri: 'https://example.com/ext/v1', description: 'an extension', required: false }],
          skills: [{ id: 'ext', name: 'Ext', tags: [] }],
        },
      ]),
    },
  });
  if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
  return loaded.config;
}

const cardOf = (agent = 0, extended = false) => {
  const keel = config();
  return buildAgentCard(keel.agents[agent]!, keel, { extended });
};

const trusting = (...keys: KeyObject[]): ResolveKeys =>
  keyResolver({ keys: keys.map((key, index) => ({ key, source: `key ${index + 1}` })), jkus: [] }, createGuardedFetch({ allowHosts: [], allowHttp: false }));

const signer = (alg: 'EdDSA' | 'ES256', privateKey: KeyObject, jku?: string): CardSigner => ({ alg, kid: `kid-${alg}`, privateKey, ...(jku ? { jku } : {}) });

const protectedHeader = (card: Json, index = 0) => JSON.parse(new TextDecoder().decode(base64url.decode(card.signatures[index].protected))) as Json;

/** Every leaf of a JSON value, with a path; an empty list counts as a leaf (something may be added). */
function leaves(value: unknown, path: Array<string | number> = []): Array<Array<string | number>> {
  if (Array.isArray(value)) return value.length === 0 ? [path] : value.flatMap((item, index) => leaves(item, [...path, index]));
  if (typeof value === 'object' && value !== null) return Object.entries(value).flatMap(([key, item]) => leaves(item, [...path, key]));
  return [path];
}

/** What an attacker would add to an empty list: an element of its type (a string elsewhere). */
const ADDED_TO_EMPTY: Record<string, unknown> = { skills: { id: 'added', name: 'Added', description: 'an added skill', tags: [] } };

/** A copy of `card` with the leaf at `path` changed the way an attacker might. */
function tampered(card: Json, path: Array<string | number>): Json {
  const copy = structuredClone(card);
  let node = copy;
  for (const segment of path.slice(0, -1)) node = node[segment];
  const last = path.at(-1)!;
  const value = node[last];
  node[last] = Array.isArray(value)
    ? [...value, ADDED_TO_EMPTY[String(last)] ?? 'added']
    : typeof value === 'boolean'
      ? !value
      : typeof value === 'number'
        ? value + 1
        : `${value}x`;
  return copy;
}

describe.each(['EdDSA', 'ES256'] as const)('a card signed with %s', (alg) => {
  const { privateKey, publicKey } = keyPairs[alg]();
  const other = keyPairs[alg]();

  it('carries one detached JWS whose protected header names alg, typ JOSE, kid and jku', async () => {
    const card = (await signAgentCard(cardOf(), signer(alg, privateKey, 'https://agents.example.com/.well-known/jwks.json'))) as Json;
    expect(card.signatures).toHaveLength(1);
    expect(Object.keys(card.signatures[0]).sort()).toEqual(['protected', 'signature']);
    expect(protectedHeader(card)).toEqual({ alg, typ: 'JOSE', kid: `kid-${alg}`, jku: 'https://agents.example.com/.well-known/jwks.json' });
    // Everything else is the card as it was.
    const { signatures: _signatures, ...rest } = card;
    expect(rest).toEqual(cardOf());
  });

  it('verifies with the public key (sign, then verify)', async () => {
    for (const unsigned of [cardOf(0), cardOf(1), cardOf(0, true)]) {
      const card = await signAgentCard(unsigned, signer(alg, privateKey));
      const verdict = await verifyCardSignatures(card, trusting(publicKey));
      expect(verdict).toMatchObject({ ok: true, verified: { index: 1, outcome: 'verified', header: { alg, kid: `kid-${alg}` } } });
    }
  });

  it('verifies after a JSON round trip with the keys in another order', async () => {
    const card = (await signAgentCard(cardOf(), signer(alg, privateKey))) as Json;
    const reordered = Object.fromEntries(Object.entries(JSON.parse(JSON.stringify(card)) as Json).reverse());
    expect((await verifyCardSignatures(reordered, trusting(publicKey))).ok).toBe(true);
  });

  it("is accepted by the official SDK's verifier, given the card as fetched", async () => {
    vi.spyOn(console, 'debug').mockImplementation(() => undefined);
    const card = JSON.parse(JSON.stringify(await signAgentCard(cardOf(), signer(alg, privateKey))));
    const seen: Array<[string, string | undefined]> = [];
    const verify = verifyAgentCardSignature(async (kid, jku) => {
      seen.push([kid, jku]);
      return publicKey;
    });
    await expect(verify(card as AgentCard)).resolves.toBeUndefined();
    expect(seen).toEqual([[`kid-${alg}`, undefined]]);
    // And it refuses the same card signed by another key.
    await expect(verifyAgentCardSignature(async () => other.publicKey)(card as AgentCard)).rejects.toThrow('No valid signatures');
  });

  it("verifies a card the official SDK signed, and refuses it with another key", async () => {
    const sdkSigned = await generateAgentCardSignature(privateKey, { alg, kid: 'sdk-key', typ: 'JOSE' })(JSON.parse(JSON.stringify(cardOf())) as AgentCard);
    const card = JSON.parse(JSON.stringify(sdkSigned));
    expect((await verifyCardSignatures(card, trusting(publicKey))).ok).toBe(true);
    expect(await verifyCardSignatures(card, trusting(other.publicKey))).toMatchObject({ ok: false, reason: 'mismatch' });
  });

  it('refuses the card signed by another key of the same type', async () => {
    const card = await signAgentCard(cardOf(), signer(alg, other.privateKey));
    const verdict = await verifyCardSignatures(card, trusting(publicKey));
    expect(verdict).toMatchObject({ ok: false, reason: 'mismatch', signatures: [{ outcome: 'mismatch' }] });
    if (!verdict.ok) expect(verdict.message).toContain('the card was changed after it was signed, or another key signed it');
  });

  it('fails when any field of the card is changed, added to or removed', async () => {
    // The token-mode card of the agent with an extension: security schemes, requirements, extensions.
    const card = (await signAgentCard(cardOf(1, true), signer(alg, privateKey))) as Json;
    const paths = leaves(card).filter((path) => path[0] !== 'signatures');
    expect(paths.length).toBeGreaterThan(25);
    const survived: string[] = [];
    for (const path of paths) {
      if ((await verifyCardSignatures(tampered(card, path), trusting(publicKey))).ok) survived.push(path.join('.'));
    }
    expect(survived).toEqual([]);
    // Removing a field is a change too, with one exception both official SDKs share: a security
    // requirement whose scheme lists no scopes is empty to their canonical form (decision 0021).
    for (const field of Object.keys(card).filter((key) => key !== 'signatures')) {
      const { [field]: _removed, ...without } = card;
      expect((await verifyCardSignatures(without, trusting(publicKey))).ok, `without ${field}`).toBe(field === 'securityRequirements');
    }
  });

  it('fails when the protected header or the signature is changed', async () => {
    const card = (await signAgentCard(cardOf(), signer(alg, privateKey))) as Json;
    const header = { ...protectedHeader(card), kid: 'another-kid' };
    const forgedHeader = { ...card, signatures: [{ ...card.signatures[0], protected: base64url.encode(JSON.stringify(header)) }] };
    expect(await verifyCardSignatures(forgedHeader, trusting(publicKey))).toMatchObject({ ok: false, reason: 'mismatch' });
    const bytes = base64url.decode(card.signatures[0].signature);
    bytes[5] ^= 0x01;
    const forgedSignature = { ...card, signatures: [{ ...card.signatures[0], signature: base64url.encode(bytes) }] };
    expect(await verifyCardSignatures(forgedSignature, trusting(publicKey))).toMatchObject({ ok: false, reason: 'mismatch' });
  });
});

describe('verifying', () => {
  const ed = keyPairs.EdDSA();
  const ec = keyPairs.ES256();

  it('calls a card without signatures unsigned', async () => {
    expect(await verifyCardSignatures(cardOf(), trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'unsigned', message: 'the card carries no signatures (unsigned)' });
    expect(await verifyCardSignatures({ ...cardOf(), signatures: [] }, trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'unsigned' });
  });

  it('refuses a signature by a key of the other type as a mismatch, naming the types', async () => {
    const card = await signAgentCard(cardOf(), signer('ES256', ec.privateKey));
    const verdict = await verifyCardSignatures(card, trusting(ed.publicKey));
    expect(verdict).toMatchObject({ ok: false, reason: 'mismatch' });
    if (!verdict.ok) expect(verdict.message).toContain('signed with ES256, but no trusted key (key 1) is of that type');
  });

  it('accepts the card when one of several signatures verifies (key rotation)', async () => {
    const byOld = (await signAgentCard(cardOf(), signer('ES256', ec.privateKey))) as Json;
    const byNew = (await signAgentCard(cardOf(), signer('EdDSA', ed.privateKey))) as Json;
    const card = { ...byNew, signatures: [...byOld.signatures, ...byNew.signatures] };
    const verdict = await verifyCardSignatures(card, trusting(ed.publicKey));
    expect(verdict).toMatchObject({ ok: true, verified: { index: 2 }, signatures: [{ outcome: 'mismatch' }, { outcome: 'verified' }] });
  });

  it('refuses algorithms other than EdDSA, Ed25519 and ES256, and malformed entries', async () => {
    const card = (await signAgentCard(cardOf(), signer('EdDSA', ed.privateKey))) as Json;
    const withHeader = (header: Json) => ({ ...card, signatures: [{ ...card.signatures[0], protected: base64url.encode(JSON.stringify(header)) }] });
    expect(await verifyCardSignatures(withHeader({ alg: 'none', kid: 'k' }), trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'unsupported_alg' });
    expect(await verifyCardSignatures(withHeader({ alg: 'HS256', kid: 'k' }), trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'unsupported_alg' });
    expect(await verifyCardSignatures(withHeader({ alg: 'EdDSA' }), trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'malformed', message: expect.stringContaining('names no kid') });
    expect(await verifyCardSignatures({ ...card, signatures: [{ protected: '%%%', signature: 'x' }] }, trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'malformed' });
    expect(await verifyCardSignatures({ ...card, signatures: ['text'] }, trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'malformed' });
    expect(await verifyCardSignatures({ ...card, signatures: {} }, trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'malformed' });
    expect(await verifyCardSignatures([card], trusting(ed.publicKey))).toMatchObject({ ok: false, reason: 'not_a_card' });
  });

  it('uses a jku only when it is allowed, and names the refusal', async () => {
    const card = await signAgentCard(cardOf(), signer('EdDSA', ed.privateKey, 'https://evil.example.net/jwks.json'));
    const fetch = createGuardedFetch({ allowHosts: [], allowHttp: false });
    const verdict = await verifyCardSignatures(card, keyResolver({ keys: [], jkus: ['https://agents.example.com/.well-known/jwks.json'] }, fetch));
    expect(verdict).toMatchObject({ ok: false, reason: 'no_key' });
    if (!verdict.ok) expect(verdict.message).toContain('its jku https://evil.example.net/jwks.json is not one of the allowed JWKS URLs (https://agents.example.com/.well-known/jwks.json)');
    const unsignedJku = await signAgentCard(cardOf(), signer('EdDSA', ed.privateKey));
    const without = await verifyCardSignatures(unsignedJku, keyResolver({ keys: [], jkus: ['https://agents.example.com/.well-known/jwks.json'] }, fetch));
    expect(without).toMatchObject({ ok: false, reason: 'no_key', message: expect.stringContaining('it names no jku, and no cardKey is configured') });
    await fetch.close();
  });
});

describe('the canonical payload', () => {
  it("is the official SDK's canonical form of the JSON card, RFC 8785 ordered, without signatures", async () => {
    const card = cardOf(1, true);
    const payload = canonicalCardPayload(card);
    expect(payload).toBe(canonicalizeAgentCard(card as unknown as AgentCard));
    const signed = await signAgentCard(card, signer('EdDSA', keyPairs.EdDSA().privateKey));
    expect(canonicalCardPayload(signed)).toBe(payload);
    // Sorted keys at every level, no whitespace, and the fields Keel serves are in it.
    // The agent's extension, then Keel's own (sequenced events), which every agent declares.
    expect(payload.startsWith('{"capabilities":{"extendedAgentCard":true,"extensions":[{"description":"an extension","uri":"https://example.com/ext/v1"},{"description":')).toBe(true);
    expect(payload).toContain(`"uri":"${SEQUENCED_EVENTS_URI}"}]`);
    expect(payload).not.toMatch(/\s"|":\s/);
    const parsed = JSON.parse(payload) as Json;
    expect(Object.keys(parsed)).toEqual(Object.keys(parsed).sort());
    expect(parsed.securitySchemes.bearer.httpAuthSecurityScheme.scheme).toBe('Bearer');
    expect(parsed.documentationUrl).toBe('https://agents.example.com/a2a/ext/.well-known/agent-card.json');
    // A default (required: false) and an empty list are not part of it, as in both official SDKs.
    expect(payload).not.toContain('"required"');
    expect(parsed.securityRequirements).toBeUndefined();
  });
});
