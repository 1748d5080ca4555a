/**
 * Which keys a card's signature may be checked with, and the key files a config names, read once
 * at start so a missing or wrong file stops start-up with a config error (decision 0021).
 *
 * A signature's `kid` and `jku` are hints from the card's author: the keys tried are the ones the
 * verifier trusts (a key file, or a JWKS at a URL the operator allowed), never ones the card
 * brings along. `keel cards verify` without `--key` is the one exception, and says so.
 */
import type { RemoteAgentConfig } from '../config/config-schema.js';
import type { KeelConfig } from '../config/load-config.js';
import type { GuardedFetch } from '../net/guarded-fetch.js';
import type { Sealer } from '../sealing/sealer.js';
import {
  fetchJwks,
  keysForKid,
  loadSigningKeyFile,
  openSealedSigningKey,
  readVerificationKeyFile,
  type SigningKeyResult,
  type VerificationKeysResult,
} from './card-keys.js';
import type { CardSigner, ResolveKeys, VerificationKey } from './card-signature.js';

/** What a remote agent's card must be signed with (`remoteAgents[].cardKey`, `cardJku`). */
export type RemoteCardTrust = { keys: VerificationKey[]; jkus: readonly string[] };

export type CardKeyFiles =
  | { ok: true; fileSigner: CardSigner | null; remoteTrust: ReadonlyMap<string, RemoteCardTrust> }
  | { ok: false; problems: string[] };

/** Reads the signing key file and every remote agent's `cardKey` file; sealed keys wait for the master key. */
export function loadCardKeyFiles(config: Pick<KeelConfig, 'security' | 'remoteAgents'>): CardKeyFiles {
  const problems: string[] = [];
  let fileSigner: CardSigner | null = null;
  const signing = config.security.cardSigning;
  if (signing?.keyFile) {
    const loaded = loadSigningKeyFile({ ...signing, keyFile: signing.keyFile });
    if (loaded.ok) fileSigner = loaded.signer;
    else problems.push(loaded.message);
  }
  const remoteTrust = new Map<string, RemoteCardTrust>();
  config.remoteAgents.forEach((remote: RemoteAgentConfig, index) => {
    if (!remote.requireSignedCard) return;
    let keys: VerificationKey[] = [];
    if (remote.cardKey) {
      const read = readVerificationKeyFile(remote.cardKey);
      if (read.ok) keys = read.keys;
      else problems.push(`remoteAgents.${index} (${remote.id}).cardKey: ${read.message}`);
    }
    remoteTrust.set(remote.id, { keys, jkus: remote.cardJku ?? [] });
  });
  return problems.length > 0 ? { ok: false, problems } : { ok: true, fileSigner, remoteTrust };
}

/** The key Keel signs its cards with: none, the file's, or the sealed one opened with `sealer` now. */
export function cardSignerFor(config: Pick<KeelConfig, 'security'>, fileSigner: CardSigner | null, sealer: Sealer | null): SigningKeyResult | null {
  const signing = config.security.cardSigning;
  if (!signing) return null;
  if (signing.keySealed) {
    if (!sealer) return { ok: false, message: 'security.cardSigning.keySealed: the master key is needed to open it' };
    return openSealedSigningKey({ ...signing, keySealed: signing.keySealed }, sealer);
  }
  return fileSigner ? { ok: true, signer: fileSigner } : null;
}

/**
 * Finds the keys for one signature: those of `trust.keys` (a file) for its kid, and, when its `jku`
 * is allowed (`'any'` only for `keel cards verify` without `--key`), the JWKS there, fetched
 * through the address guard once per verifier.
 */
export function keyResolver(trust: { keys: readonly VerificationKey[]; jkus: readonly string[] | 'any' }, fetch: GuardedFetch): ResolveKeys {
  const fetched = new Map<string, Promise<VerificationKeysResult>>();
  return async (header) => {
    const keys = keysForKid(trust.keys, header.kid);
    const problems: string[] = [];
    const jkuAllowed = trust.jkus === 'any' || trust.jkus.length > 0;
    if (header.jku !== undefined && jkuAllowed) {
      if (trust.jkus === 'any' || trust.jkus.includes(header.jku)) {
        let jwks = fetched.get(header.jku);
        if (!jwks) fetched.set(header.jku, (jwks = fetchJwks(header.jku, fetch)));
        const result = await jwks;
        if (result.ok) keys.push(...keysForKid(result.keys, header.kid));
        else problems.push(result.message);
      } else {
        problems.push(`its jku ${header.jku} is not one of the allowed JWKS URLs (${trust.jkus.join(', ')})`);
      }
    } else if (header.jku === undefined && trust.keys.length === 0) {
      problems.push(trust.jkus === 'any' ? 'it names no jku; give the signer\'s public key with --key <file>' : 'it names no jku, and no cardKey is configured');
    }
    if (keys.length > 0) return { ok: true, keys };
    return { ok: false, message: problems.join('; ') || 'no trusted key' };
  };
}
