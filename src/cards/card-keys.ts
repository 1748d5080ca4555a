/**
 * The keys of card signing (decision 0021): the private key Keel signs its cards with, from a file
 * or sealed under the master key, and the public keys a verifier trusts, from a file or a JWKS.
 *
 * Keys are read with node:crypto (PEM in PKCS#8, SEC1 or SPKI form, X.509 certificates, JWK and
 * JWKS) and handed to jose as KeyObjects. Only Ed25519 and P-256 keys are taken. Failures are
 * values whose message names the file or URL and what is wrong, never the key material.
 */
import { createPrivateKey, createPublicKey, type JsonWebKey, type KeyObject } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import type { GuardedFetch } from '../net/guarded-fetch.js';
import { describeRefusal } from '../net/guarded-fetch.js';
import type { Sealer } from '../sealing/sealer.js';
import type { CardSigner, VerificationKey } from './card-signature.js';

/** `security.cardSigning.alg`: the key's algorithm as an operator names it. */
export type CardKeyAlg = 'Ed25519' | 'ES256';

/** The shape of `security.cardSigning` (src/config/config-schema.ts). */
export type CardSigningSettings = { alg: CardKeyAlg; kid: string; keyFile?: string | undefined; keySealed?: string | undefined; jku?: string | undefined };

export type SigningKeyResult = { ok: true; signer: CardSigner } | { ok: false; message: string };

/** Where `keel cards seal-key` seals a private key: a config value, bound to its key path. */
export const CARD_SIGNING_KEY_CONTEXT = { table: 'config', column: 'security.cardSigning.keySealed', rowId: 'cardSigning' } as const;

// A key file is a few hundred bytes, a JWKS a few keys: anything far larger is not one.
const MAX_KEY_FILE_BYTES = 64 * 1024;
const MAX_JWKS_BYTES = 256 * 1024;
const JWKS_TIMEOUT_MS = 10_000;

/** The JWS alg a key type signs with: Ed25519 as `EdDSA` (RFC 8037), which every JOSE library reads. */
const JWS_ALG: Record<CardKeyAlg, 'EdDSA' | 'ES256'> = { Ed25519: 'EdDSA', ES256: 'ES256' };

const errorCode = (error: unknown) => (typeof error === 'object' && error !== null && 'code' in error ? String((error as { code: unknown }).code) : undefined);

/** The algorithm a key is for, or a description of the key when it is none Keel takes. */
function algOfKey(key: KeyObject): { ok: true; alg: CardKeyAlg } | { ok: false; kind: string } {
  if (key.asymmetricKeyType === 'ed25519') return { ok: true, alg: 'Ed25519' };
  if (key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1') return { ok: true, alg: 'ES256' };
  const curve = key.asymmetricKeyDetails?.namedCurve;
  return { ok: false, kind: `${(key.asymmetricKeyType ?? 'unknown').toUpperCase()}${curve ? ` (${curve})` : ''}` };
}

/** Reads a private key given as PEM or as a JWK; `where` names it in messages. */
export function parsePrivateKey(text: string, where: string): { ok: true; key: KeyObject; alg: CardKeyAlg } | { ok: false; message: string } {
  const trimmed = text.trim();
  let key: KeyObject;
  try {
    if (trimmed.startsWith('{')) {
      const jwk = JSON.parse(trimmed) as JsonWebKey;
      if (typeof jwk !== 'object' || jwk === null || typeof jwk.d !== 'string') return { ok: false, message: `${where}: a public JWK; card signing needs the private key (with "d")` };
      key = createPrivateKey({ key: jwk, format: 'jwk' });
    } else {
      if (/-----BEGIN (PUBLIC KEY|CERTIFICATE)-----/.test(trimmed)) return { ok: false, message: `${where}: a public key or certificate; card signing needs the private key` };
      key = createPrivateKey(trimmed);
    }
  } catch (error) {
    const encrypted = /ENCRYPTED/.test(trimmed) || errorCode(error) === 'ERR_MISSING_PASSPHRASE';
    return { ok: false, message: encrypted ? `${where}: an encrypted private key; give it unencrypted (mode 0600) or sealed (keel cards seal-key)` : `${where}: not a PEM or JWK private key` };
  }
  const alg = algOfKey(key);
  if (!alg.ok) return { ok: false, message: `${where}: key type ${alg.kind}; card signing takes Ed25519 or ES256 (P-256) keys` };
  return { ok: true, key, alg: alg.alg };
}

function signerFrom(text: string, where: string, settings: CardSigningSettings): SigningKeyResult {
  const parsed = parsePrivateKey(text, where);
  if (!parsed.ok) return parsed;
  if (parsed.alg !== settings.alg) return { ok: false, message: `${where}: an ${parsed.alg} key, but security.cardSigning.alg is ${settings.alg}` };
  return { ok: true, signer: { alg: JWS_ALG[settings.alg], kid: settings.kid, jku: settings.jku, privateKey: parsed.key } };
}

/** Reads a key file of at most 64 KiB, with its permission bits. */
function readKeyFileText(path: string): { ok: true; text: string; mode: number } | { ok: false; message: string } {
  try {
    const stats = statSync(path);
    if (!stats.isFile()) return { ok: false, message: `${path} is not a regular file` };
    if (stats.size > MAX_KEY_FILE_BYTES) return { ok: false, message: `${path} is larger than ${MAX_KEY_FILE_BYTES} bytes: not a key file` };
    return { ok: true, text: readFileSync(path, 'utf8'), mode: stats.mode & 0o777 };
  } catch (error) {
    return { ok: false, message: errorCode(error) === 'ENOENT' ? `${path}: not found` : `${path}: cannot be read (${errorCode(error) ?? (error as Error).message})` };
  }
}

/**
 * The signing key of a `keyFile` setting (checked before the database is opened). Like the master
 * key file, a file holding a private key must not be readable by group or others: a signing key
 * others can read lets them sign cards in this installation's name.
 */
export function loadSigningKeyFile(settings: CardSigningSettings & { keyFile: string }): SigningKeyResult {
  const file = readKeyFileText(settings.keyFile);
  if (!file.ok) return { ok: false, message: `security.cardSigning.keyFile: ${file.message}` };
  const loaded = signerFrom(file.text, `security.cardSigning.keyFile ${settings.keyFile}`, settings);
  // Mode bits mean nothing on Windows; everywhere else they are the only protection the key has.
  if (loaded.ok && process.platform !== 'win32' && (file.mode & 0o077) !== 0) {
    return { ok: false, message: `security.cardSigning.keyFile: ${settings.keyFile}: mode ${file.mode.toString(8)} lets other users read the private key; run chmod 600 ${settings.keyFile}` };
  }
  return loaded;
}

/** The signing key of a `keySealed` setting, opened with the master keys. */
export function openSealedSigningKey(settings: CardSigningSettings & { keySealed: string }, sealer: Sealer): SigningKeyResult {
  const opened = sealer.openJson<unknown>(CARD_SIGNING_KEY_CONTEXT, Buffer.from(settings.keySealed, 'base64'));
  if (!opened.ok) {
    const why = opened.reason === 'unknown_key' ? `sealed under master key ${opened.keyId}, which is not available` : 'not a value `keel cards seal-key` printed for this master key';
    return { ok: false, message: `security.cardSigning.keySealed: ${why}` };
  }
  if (typeof opened.value !== 'string') return { ok: false, message: 'security.cardSigning.keySealed: not a value `keel cards seal-key` printed' };
  return signerFrom(opened.value, 'security.cardSigning.keySealed', settings);
}

/** Seals a private key for `security.cardSigning.keySealed` (stored as PKCS#8 PEM). */
export function sealSigningKey(text: string, sealer: Sealer): { ok: true; sealed: string; alg: CardKeyAlg } | { ok: false; message: string } {
  const parsed = parsePrivateKey(text, 'the key on stdin');
  if (!parsed.ok) return parsed;
  const pem = parsed.key.export({ type: 'pkcs8', format: 'pem' }).toString();
  return { ok: true, sealed: sealer.sealJson(CARD_SIGNING_KEY_CONTEXT, pem).toString('base64'), alg: parsed.alg };
}

/** The public JWKS of a signing key: what `/.well-known/jwks.json` serves and a verifier's `--key` reads. */
export function publicJwks(signer: CardSigner): { keys: Array<JsonWebKey & { kid: string; alg: string; use: 'sig' }> } {
  const jwk = createPublicKey(signer.privateKey).export({ format: 'jwk' });
  return { keys: [{ ...jwk, kid: signer.kid, alg: signer.alg, use: 'sig' }] };
}

// ---------------------------------------------------------------------------------------------
// Keys a verifier trusts
// ---------------------------------------------------------------------------------------------

export type VerificationKeysResult = { ok: true; keys: VerificationKey[] } | { ok: false; message: string };

function publicKeyFromJwk(jwk: unknown, source: string): { ok: true; key: VerificationKey } | { ok: false; message: string } {
  if (typeof jwk !== 'object' || jwk === null) return { ok: false, message: `${source}: a key is not a JWK object` };
  const { d: _private, ...publicPart } = jwk as JsonWebKey;
  let key: KeyObject;
  try {
    key = createPublicKey({ key: publicPart, format: 'jwk' });
  } catch {
    return { ok: false, message: `${source}: not a usable JWK (kty ${String((jwk as JsonWebKey).kty)})` };
  }
  const alg = algOfKey(key);
  if (!alg.ok) return { ok: false, message: `${source}: key type ${alg.kind}; only Ed25519 and P-256 keys check card signatures` };
  const kid = typeof (jwk as { kid?: unknown }).kid === 'string' ? (jwk as { kid: string }).kid : undefined;
  return { ok: true, key: { kid, key, source: kid ? `${source} (kid ${kid})` : source } };
}

/**
 * Public keys from text: a PEM public key, certificate or private key (its public half), a JWK, or
 * a JWKS. In a JWKS, keys of other types are skipped (a JWKS may also hold RSA keys for other uses);
 * one usable key is needed.
 */
export function parseVerificationKeys(text: string, source: string): VerificationKeysResult {
  const trimmed = text.trim();
  if (trimmed.startsWith('{')) {
    let json: unknown;
    try {
      json = JSON.parse(trimmed);
    } catch {
      return { ok: false, message: `${source}: not JSON (expected a JWK or a JWKS)` };
    }
    const set = json as { keys?: unknown };
    if (Array.isArray(set.keys)) {
      const keys = set.keys.map((jwk) => publicKeyFromJwk(jwk, source)).flatMap((result) => (result.ok ? [result.key] : []));
      return keys.length > 0 ? { ok: true, keys } : { ok: false, message: `${source}: the JWKS holds no Ed25519 or P-256 key` };
    }
    const single = publicKeyFromJwk(json, source);
    return single.ok ? { ok: true, keys: [single.key] } : single;
  }
  let key: KeyObject;
  try {
    key = createPublicKey(trimmed);
  } catch {
    return { ok: false, message: `${source}: not a PEM public key, certificate, JWK or JWKS` };
  }
  const alg = algOfKey(key);
  if (!alg.ok) return { ok: false, message: `${source}: key type ${alg.kind}; only Ed25519 and P-256 keys check card signatures` };
  return { ok: true, keys: [{ key, source }] };
}

/** Public keys from a file (`keel cards verify --key`, `remoteAgents[].cardKey`). */
export function readVerificationKeyFile(path: string): VerificationKeysResult {
  const file = readKeyFileText(path);
  return file.ok ? parseVerificationKeys(file.text, path) : file;
}

/** A JWKS fetched through the address guard (a signature's `jku`). */
export async function fetchJwks(url: string, fetch: GuardedFetch): Promise<VerificationKeysResult> {
  const fetched = await fetch({ url, method: 'GET', headers: { accept: 'application/jwk-set+json, application/json' }, timeoutMs: JWKS_TIMEOUT_MS, maxResponseBytes: MAX_JWKS_BYTES });
  if (!fetched.ok) {
    return { ok: false, message: `JWKS ${url}: ${fetched.kind === 'refused' ? `refused by the address guard: ${describeRefusal(fetched.refusal)}` : `request failed (${fetched.failure.class})`}` };
  }
  if (fetched.response.status !== 200) return { ok: false, message: `JWKS ${url}: answered ${fetched.response.status}` };
  return parseVerificationKeys(fetched.response.body.toString('utf8'), `JWKS ${url}`);
}

/** The keys among `keys` for a signature's kid: those named by it, else all (a kid is a hint). */
export function keysForKid(keys: readonly VerificationKey[], kid: string | undefined): VerificationKey[] {
  const named = keys.filter((key) => key.kid !== undefined && key.kid === kid);
  return named.length > 0 ? named : [...keys];
}
