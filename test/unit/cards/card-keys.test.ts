import { generateKeyPairSync } from 'node:crypto';
import { chmodSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { openSealedSigningKey, parseVerificationKeys, publicJwks, readVerificationKeyFile, sealSigningKey } from '../../../src/cards/card-keys.js';
import { cardSignerFor, loadCardKeyFiles } from '../../../src/cards/card-trust.js';
import { loadConfig, type KeelConfig } from '../../../src/config/load-config.js';
import { tempDir } from '../../support/test-keel.js';
import { testSealer } from '../../support/test-sealer.js';

// The keys of card signing as an operator configures them: what a wrong file, key type or
// algorithm says at start, sealed keys, and the public keys a verifier reads (decision 0021).

const dir = tempDir('keel-card-keys-');
const ed = generateKeyPairSync('ed25519');
const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });

function keyFile(name: string, text: string, mode = 0o600): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  chmodSync(path, mode);
  return path;
}

const edPem = keyFile('ed.pem', ed.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
const ecPem = keyFile('ec.pem', ec.privateKey.export({ type: 'sec1', format: 'pem' }).toString());
const ecJwk = keyFile('ec.jwk', JSON.stringify(ec.privateKey.export({ format: 'jwk' })));

function configWith(env: Record<string, string>): { ok: true; config: KeelConfig } | { ok: false; problems: string[] } {
  return loadConfig({ cwd: dir, env });
}

function configOrThrow(env: Record<string, string>): KeelConfig {
  const loaded = configWith(env);
  if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
  return loaded.config;
}

const signingEnv = (signing: Record<string, unknown>) => ({ KEEL_SECURITY_CARD_SIGNING_KID: 'k1', ...Object.fromEntries(Object.entries(signing).map(([key, value]) => [`KEEL_SECURITY_CARD_SIGNING_${key.replace(/([a-z])([A-Z])/g, '$1_$2').toUpperCase()}`, String(value)])) });

const startProblems = (signing: Record<string, unknown>) => {
  const result = loadCardKeyFiles(configOrThrow(signingEnv(signing)));
  return result.ok ? [] : result.problems;
};

describe('security.cardSigning in the config', () => {
  it('takes an Ed25519 PEM, a SEC1 P-256 PEM and a P-256 JWK, resolving a relative path against the working directory', () => {
    for (const [alg, keyFile, jwsAlg] of [['Ed25519', 'ed.pem', 'EdDSA'], ['ES256', 'ec.pem', 'ES256'], ['ES256', 'ec.jwk', 'ES256']] as const) {
      const config = configOrThrow(signingEnv({ alg, keyFile, jku: 'https://agents.example.com/.well-known/jwks.json' }));
      expect(config.security.cardSigning?.keyFile).toBe(join(dir, keyFile));
      const loaded = loadCardKeyFiles(config);
      expect(loaded.ok && loaded.fileSigner).toMatchObject({ alg: jwsAlg, kid: 'k1', jku: 'https://agents.example.com/.well-known/jwks.json' });
    }
    expect(edPem && ecPem && ecJwk).toBeTruthy();
  });

  it('is refused by the config loader for an unsupported alg, or without exactly one key source', () => {
    expect(configWith(signingEnv({ alg: 'RS256', keyFile: 'ed.pem' }))).toEqual({
      ok: false,
      problems: ['security.cardSigning.alg: expected one of "Ed25519", "ES256", received "RS256" (from KEEL_SECURITY_CARD_SIGNING_ALG)'],
    });
    expect(configWith(signingEnv({ alg: 'Ed25519' }))).toEqual({ ok: false, problems: ['security.cardSigning: give exactly one of keyFile and keySealed'] });
    expect(configWith(signingEnv({ alg: 'Ed25519', keyFile: 'ed.pem', keySealed: 'AAAA' }))).toEqual({ ok: false, problems: ['security.cardSigning: give exactly one of keyFile and keySealed'] });
    const noKid = loadConfig({ cwd: dir, env: { KEEL_SECURITY_CARD_SIGNING_ALG: 'Ed25519', KEEL_SECURITY_CARD_SIGNING_KEY_FILE: 'ed.pem' } });
    expect(noKid).toEqual({ ok: false, problems: ['security.cardSigning.kid: expected string, received undefined'] });
  });

  it('names a missing file, a key of the wrong type, a key Keel does not take, a public key and a readable file at start', () => {
    expect(startProblems({ alg: 'Ed25519', keyFile: 'missing.pem' })).toEqual([`security.cardSigning.keyFile: ${join(dir, 'missing.pem')}: not found`]);
    expect(startProblems({ alg: 'Ed25519', keyFile: 'ec.pem' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'ec.pem')}: an ES256 key, but security.cardSigning.alg is Ed25519`]);
    expect(startProblems({ alg: 'ES256', keyFile: 'ed.pem' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'ed.pem')}: an Ed25519 key, but security.cardSigning.alg is ES256`]);
    keyFile('rsa.pem', rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
    expect(startProblems({ alg: 'ES256', keyFile: 'rsa.pem' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'rsa.pem')}: key type RSA; card signing takes Ed25519 or ES256 (P-256) keys`]);
    keyFile('ec384.pem', generateKeyPairSync('ec', { namedCurve: 'P-384' }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
    expect(startProblems({ alg: 'ES256', keyFile: 'ec384.pem' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'ec384.pem')}: key type EC (secp384r1); card signing takes Ed25519 or ES256 (P-256) keys`]);
    keyFile('public.pem', ed.publicKey.export({ type: 'spki', format: 'pem' }).toString());
    expect(startProblems({ alg: 'Ed25519', keyFile: 'public.pem' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'public.pem')}: a public key or certificate; card signing needs the private key`]);
    keyFile('public.jwk', JSON.stringify(ed.publicKey.export({ format: 'jwk' })));
    expect(startProblems({ alg: 'Ed25519', keyFile: 'public.jwk' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'public.jwk')}: a public JWK; card signing needs the private key (with "d")`]);
    keyFile('garbage.pem', 'not a key at all');
    expect(startProblems({ alg: 'Ed25519', keyFile: 'garbage.pem' })).toEqual([`security.cardSigning.keyFile ${join(dir, 'garbage.pem')}: not a PEM or JWK private key`]);
    keyFile('encrypted.pem', ed.privateKey.export({ type: 'pkcs8', format: 'pem', cipher: 'aes-256-cbc', passphrase: 'secret' }).toString());
    expect(startProblems({ alg: 'Ed25519', keyFile: 'encrypted.pem' })).toEqual([
      `security.cardSigning.keyFile ${join(dir, 'encrypted.pem')}: an encrypted private key; give it unencrypted (mode 0600) or sealed (keel cards seal-key)`,
    ]);
    keyFile('open.pem', ed.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), 0o644);
    expect(startProblems({ alg: 'Ed25519', keyFile: 'open.pem' })).toEqual([
      `security.cardSigning.keyFile: ${join(dir, 'open.pem')}: mode 644 lets other users read the private key; run chmod 600 ${join(dir, 'open.pem')}`,
    ]);
  });

  it('opens a sealed key with the master key that sealed it, and names the master key otherwise', () => {
    const sealer = testSealer();
    const sealed = sealSigningKey(ec.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), sealer);
    expect(sealed).toMatchObject({ ok: true, alg: 'ES256' });
    if (!sealed.ok) return;
    const config = configOrThrow(signingEnv({ alg: 'ES256', keySealed: sealed.sealed }));
    const files = loadCardKeyFiles(config);
    expect(files.ok && files.fileSigner).toBeNull();
    const opened = cardSignerFor(config, null, sealer);
    expect(opened).toMatchObject({ ok: true, signer: { alg: 'ES256', kid: 'k1' } });
    // The private key it holds is the one that was sealed.
    if (opened?.ok) expect(publicJwks(opened.signer).keys[0]).toMatchObject({ ...ec.publicKey.export({ format: 'jwk' }), kid: 'k1', alg: 'ES256', use: 'sig' });

    const other = testSealer();
    const wrongMaster = cardSignerFor(config, null, other);
    expect(wrongMaster).toEqual({ ok: false, message: `security.cardSigning.keySealed: sealed under master key ${sealer.activeKeyId}, which is not available` });
    expect(openSealedSigningKey({ alg: 'Ed25519', kid: 'k1', keySealed: sealed.sealed }, sealer)).toEqual({
      ok: false,
      message: 'security.cardSigning.keySealed: an ES256 key, but security.cardSigning.alg is Ed25519',
    });
    expect(sealSigningKey(rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), sealer)).toEqual({
      ok: false,
      message: 'the key on stdin: key type RSA; card signing takes Ed25519 or ES256 (P-256) keys',
    });
    // A JWK on stdin is sealed as PEM, and opens as the same key.
    const fromJwk = sealSigningKey(JSON.stringify(ed.privateKey.export({ format: 'jwk' })), sealer);
    expect(fromJwk).toMatchObject({ ok: true, alg: 'Ed25519' });
    if (fromJwk.ok) expect(openSealedSigningKey({ alg: 'Ed25519', kid: 'k1', keySealed: fromJwk.sealed }, sealer).ok).toBe(true);
  });
});

describe('remoteAgents[].requireSignedCard in the config', () => {
  const remote = (extra: Record<string, unknown>) => ({ KEEL_REMOTE_AGENTS: JSON.stringify([{ id: 'peer', cardUrl: 'https://peer.example.com/.well-known/agent-card.json', ...extra }]) });

  it('needs cardKey or cardJku, which take effect only with it', () => {
    expect(configWith(remote({ requireSignedCard: true }))).toEqual({
      ok: false,
      problems: ['remoteAgents.0 (peer): requireSignedCard needs cardKey or cardJku, the key the card must be signed with'],
    });
    expect(configWith(remote({ cardKey: 'peer.pem' }))).toEqual({ ok: false, problems: ['remoteAgents.0 (peer): cardKey and cardJku take effect only with requireSignedCard: true'] });
    expect(configWith(remote({ requireSignedCard: true, cardJku: ['not a url'] })).ok).toBe(false);
    expect(configWith(remote({ requireSignedCard: true, cardJku: ['https://peer.example.com/.well-known/jwks.json'] })).ok).toBe(true);
  });

  it('reads cardKey at start: a missing file or a key Keel cannot check with is named', () => {
    keyFile('peer-public.pem', ed.publicKey.export({ type: 'spki', format: 'pem' }).toString(), 0o644);
    const good = loadCardKeyFiles(configOrThrow(remote({ requireSignedCard: true, cardKey: 'peer-public.pem' })));
    expect(good.ok && good.remoteTrust.get('peer')).toMatchObject({ keys: [{ source: join(dir, 'peer-public.pem') }], jkus: [] });
    const missing = loadCardKeyFiles(configOrThrow(remote({ requireSignedCard: true, cardKey: 'nope.pem' })));
    expect(missing).toEqual({ ok: false, problems: [`remoteAgents.0 (peer).cardKey: ${join(dir, 'nope.pem')}: not found`] });
    keyFile('rsa-public.pem', rsa.publicKey.export({ type: 'spki', format: 'pem' }).toString(), 0o644);
    const wrong = loadCardKeyFiles(configOrThrow(remote({ requireSignedCard: true, cardKey: 'rsa-public.pem' })));
    expect(wrong).toEqual({ ok: false, problems: [`remoteAgents.0 (peer).cardKey: ${join(dir, 'rsa-public.pem')}: key type RSA; only Ed25519 and P-256 keys check card signatures`] });
  });
});

describe('public keys a verifier reads', () => {
  it('takes a PEM public key, a private key (its public half), a JWK and a JWKS (skipping keys of other types)', () => {
    expect(parseVerificationKeys(ed.publicKey.export({ type: 'spki', format: 'pem' }).toString(), 'pem')).toMatchObject({ ok: true, keys: [{ source: 'pem' }] });
    const fromPrivate = parseVerificationKeys(ed.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), 'private');
    expect(fromPrivate.ok && fromPrivate.keys[0]!.key.type).toBe('public');
    expect(parseVerificationKeys(JSON.stringify({ ...ec.publicKey.export({ format: 'jwk' }), kid: 'a' }), 'jwk')).toMatchObject({ ok: true, keys: [{ kid: 'a', source: 'jwk (kid a)' }] });
    const jwks = JSON.stringify({ keys: [{ ...rsa.publicKey.export({ format: 'jwk' }), kid: 'r' }, { ...ed.publicKey.export({ format: 'jwk' }), kid: 'e' }] });
    expect(parseVerificationKeys(jwks, 'set')).toMatchObject({ ok: true, keys: [{ kid: 'e' }] });
    expect(parseVerificationKeys(JSON.stringify({ keys: [rsa.publicKey.export({ format: 'jwk' })] }), 'set')).toEqual({ ok: false, message: 'set: the JWKS holds no Ed25519 or P-256 key' });
    expect(parseVerificationKeys('{nope', 'x')).toEqual({ ok: false, message: 'x: not JSON (expected a JWK or a JWKS)' });
    expect(readVerificationKeyFile(join(dir, 'absent.pem'))).toEqual({ ok: false, message: `${join(dir, 'absent.pem')}: not found` });
  });
});
