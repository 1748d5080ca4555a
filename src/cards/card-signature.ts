/**
 * Agent card signatures (A2A 1.0 specification 8.4; decision 0021): a JWS with a detached payload,
 * the payload being the card's canonical form without its `signatures`.
 *
 * The canonical form is the official SDK's `canonicalizeAgentCard`, given the card as JSON: the
 * card read through the proto's field presence (fields outside the schema and unset defaults
 * dropped), empty strings, lists and objects removed, then RFC 8785 (sorted keys, ECMAScript
 * number and string forms, no whitespace). The Python SDK computes the same bytes. Calling the
 * SDK's function rather than a second implementation keeps Keel's bytes identical to the official
 * verifiers' by construction. It must be given the JSON form: given the SDK's parsed `AgentCard`
 * object it drops `securitySchemes` (a2a-js issue 663), so every path here passes JSON.
 *
 * Verification never throws: each signature gets an outcome, and the card a verdict.
 */
import { canonicalizeAgentCard, type AgentCard } from '@a2a-js/sdk';
import type { KeyObject } from 'node:crypto';
import { base64url, errors, FlattenedSign, flattenedVerify } from 'jose';

/** The JWS algorithms Keel signs with and accepts: Ed25519 (as `EdDSA` or `Ed25519`) and ES256. */
export const CARD_JWS_ALGORITHMS = ['EdDSA', 'Ed25519', 'ES256'] as const;

/** What a signing key carries into the protected header. */
export type CardSigner = { alg: 'EdDSA' | 'ES256'; kid: string; jku?: string | undefined; privateKey: KeyObject };

export type AgentCardSignatureJson = { protected: string; signature: string; header?: Record<string, unknown> };

/** The protected header of one signature, as far as verification reads it. */
export type SignatureHeader = { alg?: string; kid?: string; jku?: string; typ?: string };

/** A key a verifier trusts, with where it came from (printed by `keel cards verify`). */
export type VerificationKey = { kid?: string | undefined; key: KeyObject; source: string };

export type KeyLookup = { ok: true; keys: VerificationKey[] } | { ok: false; message: string };

/** Finds the keys to try for one signature; the header's kid and jku are hints, never authority. */
export type ResolveKeys = (header: SignatureHeader) => Promise<KeyLookup>;

export type SignatureOutcome = {
  /** 1-based position in `signatures`. */
  index: number;
  header: SignatureHeader | null;
  outcome: 'verified' | 'mismatch' | 'no_key' | 'unsupported_alg' | 'malformed';
  detail: string;
  /** The key that verified it. */
  key?: string;
};

export type CardVerification =
  | { ok: true; verified: SignatureOutcome; signatures: SignatureOutcome[] }
  | { ok: false; reason: 'not_a_card' | 'unsigned' | 'mismatch' | 'no_key' | 'unsupported_alg' | 'malformed'; message: string; signatures: SignatureOutcome[] };

const isObject = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);

/** The bytes a card's signatures cover (its `signatures` are left out). */
export function canonicalCardPayload(card: Record<string, unknown>): string {
  // The SDK types its parameter as its parsed AgentCard; it reads it with AgentCard.fromJSON, which
  // is what the JSON form needs (see the header comment).
  return canonicalizeAgentCard(card as unknown as AgentCard);
}

/** The card with one signature by `signer` in place of any it had. */
export async function signAgentCard(card: Record<string, unknown>, signer: CardSigner): Promise<Record<string, unknown>> {
  const { signatures: _old, ...unsigned } = card;
  const payload = new TextEncoder().encode(canonicalCardPayload(unsigned));
  const jws = await new FlattenedSign(payload)
    .setProtectedHeader({ alg: signer.alg, typ: 'JOSE', kid: signer.kid, ...(signer.jku ? { jku: signer.jku } : {}) })
    .sign(signer.privateKey);
  const signature: AgentCardSignatureJson = { protected: jws.protected!, signature: jws.signature };
  return { ...unsigned, signatures: [signature] };
}

function decodeHeader(entry: Record<string, unknown>): SignatureHeader | null {
  if (typeof entry.protected !== 'string') return null;
  try {
    const decoded: unknown = JSON.parse(new TextDecoder().decode(base64url.decode(entry.protected)));
    if (!isObject(decoded)) return null;
    const text = (key: string) => (typeof decoded[key] === 'string' ? { [key]: decoded[key] as string } : {});
    return { ...text('alg'), ...text('kid'), ...text('jku'), ...text('typ') };
  } catch {
    return null;
  }
}

/** Whether `key` is of the type `alg` signs with; jose would refuse the pair with a confusing error. */
function keyFitsAlg(key: KeyObject, alg: string): boolean {
  if (alg === 'ES256') return key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1';
  return key.asymmetricKeyType === 'ed25519';
}

async function checkOne(index: number, entry: unknown, payload: string, resolve: ResolveKeys): Promise<SignatureOutcome> {
  if (!isObject(entry) || typeof entry.signature !== 'string' || (entry.header !== undefined && !isObject(entry.header))) {
    return { index, header: null, outcome: 'malformed', detail: 'not an AgentCardSignature (protected, signature, optional header object)' };
  }
  const header = decodeHeader(entry);
  if (!header) return { index, header: null, outcome: 'malformed', detail: 'its protected header is not base64url of a JSON object' };
  if (!header.alg) return { index, header, outcome: 'malformed', detail: 'its protected header names no alg' };
  if (!(CARD_JWS_ALGORITHMS as readonly string[]).includes(header.alg)) {
    return { index, header, outcome: 'unsupported_alg', detail: `alg ${header.alg} is not accepted (${CARD_JWS_ALGORITHMS.join(', ')})` };
  }
  if (!header.kid) return { index, header, outcome: 'malformed', detail: 'its protected header names no kid' };
  const lookup = await resolve(header);
  if (!lookup.ok) return { index, header, outcome: 'no_key', detail: lookup.message };
  const fitting = lookup.keys.filter((candidate) => keyFitsAlg(candidate.key, header.alg!));
  if (fitting.length === 0) {
    return { index, header, outcome: 'mismatch', detail: `signed with ${header.alg}, but no trusted key (${lookup.keys.map((candidate) => candidate.source).join(', ')}) is of that type` };
  }
  const jws = { payload, protected: entry.protected as string, signature: entry.signature, ...(entry.header ? { header: entry.header } : {}) };
  let lastError = '';
  for (const candidate of fitting) {
    try {
      await flattenedVerify(jws, candidate.key, { algorithms: [...CARD_JWS_ALGORITHMS] });
      return { index, header, outcome: 'verified', detail: `verified with ${candidate.source}`, key: candidate.source };
    } catch (error) {
      // A signature that does not verify is the expected failure; a malformed JWS is another.
      if (!(error instanceof errors.JWSSignatureVerificationFailed)) {
        return { index, header, outcome: 'malformed', detail: `not a valid JWS (${(error as Error).message})` };
      }
      lastError = candidate.source;
    }
  }
  return { index, header, outcome: 'mismatch', detail: `does not verify with ${fitting.length === 1 ? lastError : `any of ${fitting.map((candidate) => candidate.source).join(', ')}`}` };
}

const FAILURE_ORDER = ['mismatch', 'no_key', 'unsupported_alg', 'malformed'] as const;

/**
 * Checks every signature of `card` (as JSON) against the keys `resolve` finds; the card is
 * verified when at least one signature is. When none is, the verdict names the most telling
 * failure: a signature that does not match (the card was changed, or another key signed it) before
 * a missing key, an algorithm Keel does not accept, or a malformed entry.
 */
export async function verifyCardSignatures(card: unknown, resolve: ResolveKeys): Promise<CardVerification> {
  if (!isObject(card)) return { ok: false, reason: 'not_a_card', message: 'the card is not a JSON object', signatures: [] };
  const entries = card.signatures;
  if (entries === undefined || (Array.isArray(entries) && entries.length === 0)) {
    return { ok: false, reason: 'unsigned', message: 'the card carries no signatures (unsigned)', signatures: [] };
  }
  if (!Array.isArray(entries)) return { ok: false, reason: 'malformed', message: '`signatures` is not a list', signatures: [] };
  const payload = base64url.encode(canonicalCardPayload(card));
  const signatures: SignatureOutcome[] = [];
  for (const [position, entry] of entries.entries()) signatures.push(await checkOne(position + 1, entry, payload, resolve));
  const verified = signatures.find((signature) => signature.outcome === 'verified');
  if (verified) return { ok: true, verified, signatures };
  const worst = FAILURE_ORDER.map((outcome) => signatures.find((signature) => signature.outcome === outcome)).find(Boolean)!;
  const messages: Record<(typeof FAILURE_ORDER)[number], string> = {
    mismatch: 'no signature matches: the card was changed after it was signed, or another key signed it',
    no_key: 'no key to check the signature with',
    unsupported_alg: 'no signature uses an accepted algorithm',
    malformed: 'no signature is a well-formed JWS',
  };
  const outcome = worst.outcome as (typeof FAILURE_ORDER)[number];
  return { ok: false, reason: outcome, message: `${messages[outcome]} (signature ${worst.index}: ${worst.detail})`, signatures };
}
