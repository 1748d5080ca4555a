import { generateKeyPairSync } from 'node:crypto';
import { chmodSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SendMessageRequest, verifyAgentCardSignature, type AgentCard } from '@a2a-js/sdk';
import type { JWK } from 'jose';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sealSigningKey } from '../../src/cards/card-keys.js';
import { verifyCardSignatures } from '../../src/cards/card-signature.js';
import { keyResolver } from '../../src/cards/card-trust.js';
import { createGuardedFetch } from '../../src/net/guarded-fetch.js';
import { encodeMasterKey, generateMasterKey, MasterKeyRing } from '../../src/sealing/master-key.js';
import { createSealer } from '../../src/sealing/sealer.js';
import { sdkClient } from '../support/a2a-client.js';
import { BINDINGS, callA2A, expectA2AResult, type Json } from '../support/a2a-wire.js';
import { startTestKeel, tempDir, type TestKeel } from '../support/test-keel.js';
import { freePort } from '../integration/remote/remote-support.js';

// A Keel with security.cardSigning (decision 0021): every card it serves, public and extended,
// for every agent and on both bindings, carries a signature that Keel's verifier and the official
// SDK's verifier accept with the key set Keel publishes at /.well-known/jwks.json. A signing
// config that cannot work stops start-up with a message that names it.

const dir = tempDir('keel-signed-cards-');
const AGENTS = [
  { id: 'echo', name: 'Echo', description: 'Answers with what it was sent', provider: 'echo', privacy: { answerLevel: 'full' }, skills: [{ id: 'echo', name: 'Echo', tags: ['demo'] }] },
  { id: 'second', name: 'Second', provider: 'echo', privacy: { answerLevel: 'full' }, extensions: [{ uri: 'https://example.com/ext/v1', description: 'optional' }] },
];

function privateKeyFile(name: string, pem: string): string {
  const path = join(dir, name);
  writeFileSync(path, pem);
  chmodSync(path, 0o600);
  return path;
}

const signing = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const keyFile = privateKeyFile('card-signing.pem', signing.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());

let keel: TestKeel;
let token = '';
let jwksUrl = '';
const guard = createGuardedFetch({ allowHosts: ['127.0.0.1'], allowHttp: true });

const signingOverrides = (extra: Record<string, string>) => ({ KEEL_AGENTS: AGENTS, KEEL_SECURITY_CARD_SIGNING_ALG: 'ES256', KEEL_SECURITY_CARD_SIGNING_KID: 'keel-test-1', ...extra });

beforeAll(async () => {
  vi.spyOn(console, 'debug').mockImplementation(() => undefined);
  // The jku names the server's own key set, so the port is chosen before start.
  const port = String(await freePort());
  jwksUrl = `http://127.0.0.1:${port}/.well-known/jwks.json`;
  keel = await startTestKeel({ overrides: { ...signingOverrides({ KEEL_SECURITY_CARD_SIGNING_KEY_FILE: keyFile, KEEL_SECURITY_CARD_SIGNING_JKU: jwksUrl }), KEEL_SERVER_PORT: port } });
  const client = await createClient(keel.context.pool, 'card-reader');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
  await guard.close();
});

const published = async () => (await (await fetch(jwksUrl)).json()) as { keys: JWK[] };

/** Keel's verifier, trusting only the JWKS at the configured jku. */
const keelVerify = (card: unknown) => verifyCardSignatures(card, keyResolver({ keys: [], jkus: [jwksUrl] }, guard));

/** The official SDK's verifier, its key looked up by kid in the published JWKS. */
const sdkVerify = async (card: Json) => {
  const { keys } = await published();
  return verifyAgentCardSignature(async (kid, jku) => {
    expect(jku).toBe(jwksUrl);
    const key = keys.find((candidate) => candidate.kid === kid);
    if (!key) throw new Error(`no key ${kid}`);
    return key;
  })(card as AgentCard);
};

describe('a Keel with card signing', () => {
  it('publishes its public key at /.well-known/jwks.json', async () => {
    const response = await fetch(jwksUrl);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toContain('application/jwk-set+json');
    const { keys } = (await response.json()) as { keys: JWK[] };
    expect(keys).toEqual([{ ...signing.publicKey.export({ format: 'jwk' }), kid: 'keel-test-1', alg: 'ES256', use: 'sig' }]);
    expect(JSON.stringify(keys)).not.toContain('"d"');
  });

  it('signs the public card of every agent, and both verifiers accept it as fetched', async () => {
    for (const path of ['/.well-known/agent-card.json', '/a2a/echo/.well-known/agent-card.json', '/a2a/second/.well-known/agent-card.json']) {
      const card = (await (await fetch(`${keel.url}${path}`)).json()) as Json;
      expect(card.signatures, path).toHaveLength(1);
      const header = JSON.parse(Buffer.from(card.signatures[0].protected, 'base64url').toString('utf8')) as Json;
      expect(header).toEqual({ alg: 'ES256', typ: 'JOSE', kid: 'keel-test-1', jku: jwksUrl });
      expect(await keelVerify(card), path).toMatchObject({ ok: true });
      await expect(sdkVerify(card)).resolves.toBeUndefined();
    }
  });

  it('serves the same signed bytes each time, so ETag and 304 still hold', async () => {
    const url = `${keel.url}/a2a/second/.well-known/agent-card.json`;
    const first = await fetch(url);
    const body = await first.text();
    const etag = first.headers.get('etag')!;
    const second = await fetch(url);
    expect(await second.text()).toBe(body);
    expect(second.headers.get('etag')).toBe(etag);
    expect((await fetch(url, { headers: { 'if-none-match': etag } })).status).toBe(304);
  });

  it.each(BINDINGS)('signs the extended card on %s, and both verifiers accept it', async (binding) => {
    for (const agent of ['echo', 'second']) {
      const extended = expectA2AResult(binding, await callA2A(keel.url, agent, binding, 'GetExtendedAgentCard', {}, { token })) as Json;
      expect(extended.documentationUrl).toBe(`${keel.config.server.publicUrl}/a2a/${agent}/.well-known/agent-card.json`);
      expect(extended.signatures).toHaveLength(1);
      expect(await keelVerify(extended)).toMatchObject({ ok: true });
      await expect(sdkVerify(extended)).resolves.toBeUndefined();
      // The extended card is a different document: the public card's signature does not cover it.
      const publicCard = (await (await fetch(`${keel.url}/a2a/${agent}/.well-known/agent-card.json`)).json()) as Json;
      expect(await keelVerify({ ...extended, signatures: publicCard.signatures })).toMatchObject({ ok: false, reason: 'mismatch' });
    }
  });

  it('fails verification for a card changed after signing', async () => {
    const card = (await (await fetch(`${keel.url}/.well-known/agent-card.json`)).json()) as Json;
    const redirected = { ...card, supportedInterfaces: card.supportedInterfaces.map((entry: Json) => ({ ...entry, url: 'https://attacker.example.net/a2a/echo' })) };
    expect(await keelVerify(redirected)).toMatchObject({ ok: false, reason: 'mismatch' });
    await expect(sdkVerify(redirected)).rejects.toThrow('No valid signatures');
  });

  it('is still an ordinary card to the official client', async () => {
    for (const binding of BINDINGS) {
      const client = await sdkClient(keel.url, 'echo', token, binding);
      const result = (await client.sendMessage(SendMessageRequest.fromJSON({ message: { messageId: `m-${binding}`, role: 'ROLE_USER', parts: [{ text: 'signed' }] } }))) as { status?: { state: number } };
      expect(result.status?.state).toBe(3);
    }
  });
});

describe('card signing at start', () => {
  it('signs with a sealed key opened with the master key', async () => {
    const master = generateMasterKey();
    const ed = generateKeyPairSync('ed25519');
    const sealed = sealSigningKey(ed.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), createSealer(new MasterKeyRing([master])));
    if (!sealed.ok) throw new Error(sealed.message);
    const sealedKeel = await startTestKeel({
      env: { KEEL_MASTER_KEY: encodeMasterKey(master) },
      overrides: signingOverrides({ KEEL_SECURITY_CARD_SIGNING_ALG: 'Ed25519', KEEL_SECURITY_CARD_SIGNING_KEY_SEALED: sealed.sealed }),
    });
    try {
      const card = (await (await fetch(`${sealedKeel.url}/.well-known/agent-card.json`)).json()) as Json;
      const verdict = await verifyCardSignatures(card, keyResolver({ keys: [{ key: ed.publicKey, source: 'the sealed key' }], jkus: [] }, guard));
      expect(verdict).toMatchObject({ ok: true, verified: { header: { alg: 'EdDSA', kid: 'keel-test-1' } } });
      const jwks = (await (await fetch(`${sealedKeel.url}/.well-known/jwks.json`)).json()) as { keys: JWK[] };
      expect(jwks.keys[0]).toMatchObject({ ...ed.publicKey.export({ format: 'jwk' }), alg: 'EdDSA' });
    } finally {
      await sealedKeel.dispose();
    }
  });

  it('stops with a config error naming a missing file, a key of the wrong type, or a key sealed under another master key', async () => {
    await expect(startTestKeel({ overrides: signingOverrides({ KEEL_SECURITY_CARD_SIGNING_KEY_FILE: join(dir, 'absent.pem') }) })).rejects.toThrow(
      `keel did not start (card signing): security.cardSigning.keyFile: ${join(dir, 'absent.pem')}: not found`,
    );
    const edFile = privateKeyFile('ed.pem', generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
    await expect(startTestKeel({ overrides: signingOverrides({ KEEL_SECURITY_CARD_SIGNING_KEY_FILE: edFile }) })).rejects.toThrow(
      `keel did not start (card signing): security.cardSigning.keyFile ${edFile}: an Ed25519 key, but security.cardSigning.alg is ES256`,
    );
    const other = createSealer(new MasterKeyRing([generateMasterKey()]));
    const sealed = sealSigningKey(signing.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), other);
    if (!sealed.ok) throw new Error(sealed.message);
    await expect(startTestKeel({ overrides: signingOverrides({ KEEL_SECURITY_CARD_SIGNING_KEY_SEALED: sealed.sealed }) })).rejects.toThrow(
      `keel did not start (card signing): security.cardSigning.keySealed: sealed under master key ${other.activeKeyId}, which is not available`,
    );
  });
});
