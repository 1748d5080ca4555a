import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { publicJwks, readVerificationKeyFile, sealSigningKey } from '../cards/card-keys.js';
import { verifyCardSignatures, type SignatureOutcome, type VerificationKey } from '../cards/card-signature.js';
import { cardSignerFor, keyResolver, loadCardKeyFiles } from '../cards/card-trust.js';
import type { KeelConfig } from '../config/load-config.js';
import { createGuardedFetch, describeRefusal } from '../net/guarded-fetch.js';
import { loadMasterKeys } from '../sealing/master-key-store.js';
import { MasterKeyRing } from '../sealing/master-key.js';
import { createSealer, type Sealer } from '../sealing/sealer.js';
import { CliExit, EXIT, loadConfigOrExit, type GlobalOptions } from './cli-support.js';

// `keel cards`: signed agent cards (decision 0021). `verify` checks a remote card as a client
// would; `seal-key` and `jwks` serve the operator of a signing Keel.

const CARD_TIMEOUT_MS = 15_000;
const MAX_CARD_BYTES = 1024 * 1024;

/** A card URL as given, or an agent's base URL with the well-known card path appended. */
export function cardUrlOf(input: string): string {
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    throw new CliExit(EXIT.usage, `"${input}" is not a URL`);
  }
  if (!url.pathname.endsWith('.json')) url.pathname = `${url.pathname.replace(/\/+$/, '')}/.well-known/agent-card.json`;
  return url.href;
}

async function masterKeySealer(config: KeelConfig): Promise<Sealer> {
  const keys = await loadMasterKeys(config.security.masterKeyFile);
  if (!keys.ok) {
    throw new CliExit(EXIT.masterKey, keys.reason === 'invalid' ? keys.message : `no master key at ${config.security.masterKeyFile} or in KEEL_MASTER_KEY (start Keel once to create it)`);
  }
  return createSealer(new MasterKeyRing(keys.keys));
}

function describeSignature(signature: SignatureOutcome): string {
  const header = signature.header;
  const names = header ? [`kid ${header.kid ?? '-'}`, `alg ${header.alg ?? '-'}`, ...(header.jku ? [`jku ${header.jku}`] : [])].join('  ') : 'unreadable header';
  const verdicts: Record<SignatureOutcome['outcome'], string> = {
    verified: 'VERIFIED',
    mismatch: 'MISMATCH',
    no_key: 'NO KEY',
    unsupported_alg: 'UNSUPPORTED',
    malformed: 'MALFORMED',
  };
  return `signature ${signature.index}  ${names}  ${verdicts[signature.outcome]}: ${signature.detail}`;
}

export function registerCardsCommands(program: Command, globals: () => GlobalOptions): void {
  const cards = program.command('cards').description('signed agent cards: verify a remote card, seal a signing key, print the public key set');

  cards
    .command('verify <url>')
    .description("fetch an agent card through the address guard and check its signatures with --key, else with the JWKS at each signature's jku")
    .option('--key <file>', "the signer's public key: PEM (public key, certificate), JWK or JWKS")
    .action(async (input: string, options: { key?: string }) => {
      const config = loadConfigOrExit(globals());
      const url = cardUrlOf(input);
      let trusted: VerificationKey[] = [];
      if (options.key) {
        const read = readVerificationKeyFile(options.key);
        if (!read.ok) throw new CliExit(EXIT.usage, `--key: ${read.message}`);
        trusted = read.keys;
      }
      const fetch = createGuardedFetch(config.security.addressGuard);
      try {
        const fetched = await fetch({ url, method: 'GET', headers: { accept: 'application/json', 'a2a-version': '1.0' }, timeoutMs: CARD_TIMEOUT_MS, maxResponseBytes: MAX_CARD_BYTES });
        if (!fetched.ok) {
          throw new CliExit(
            EXIT.failure,
            fetched.kind === 'refused'
              ? `card ${url}: refused by the address guard: ${describeRefusal(fetched.refusal)} (security.addressGuard.allowHosts / allowHttp)`
              : `card ${url}: request failed (${fetched.failure.class}): ${fetched.failure.message}`,
          );
        }
        if (fetched.response.status !== 200) throw new CliExit(EXIT.failure, `card ${url}: answered HTTP ${fetched.response.status}`);
        let card: unknown;
        try {
          card = JSON.parse(fetched.response.body.toString('utf8'));
        } catch {
          throw new CliExit(EXIT.failure, `card ${url}: not JSON`);
        }
        const name = typeof card === 'object' && card !== null && typeof (card as { name?: unknown }).name === 'string' ? (card as { name: string }).name : '(no name)';
        const lines = [`card  ${url}  ${JSON.stringify(name)}`];
        // Without --key the card's own jku names the key: that shows who publishes that JWKS
        // signed the card, which is worth something only when that is who the card claims to be.
        const verdict = await verifyCardSignatures(card, keyResolver({ keys: trusted, jkus: options.key ? [] : 'any' }, fetch));
        lines.push(...verdict.signatures.map(describeSignature));
        if (!verdict.ok) {
          process.stdout.write(`${lines.join('\n')}\n`);
          throw new CliExit(EXIT.failure, `card NOT verified: ${verdict.message}`);
        }
        lines.push(`verified: signature ${verdict.verified.index} (kid ${verdict.verified.header?.kid}) covers the card's canonical form`);
        if (!options.key && verdict.verified.header?.jku) {
          const jkuOrigin = new URL(verdict.verified.header.jku).origin;
          const cardOrigin = new URL(url).origin;
          lines.push(
            jkuOrigin === cardOrigin
              ? `key: from the signature's jku, on the card's own origin ${cardOrigin}; pin the key with --key to check a known signer`
              : `key: from the signature's jku on ${jkuOrigin}, NOT the card's origin ${cardOrigin}; pin the key with --key to check a known signer`,
          );
        }
        process.stdout.write(`${lines.join('\n')}\n`);
      } finally {
        await fetch.close();
      }
    });

  cards
    .command('seal-key')
    .description('seal a private signing key (Ed25519 or P-256, PEM or JWK, read from stdin) for security.cardSigning.keySealed')
    .action(async () => {
      const config = loadConfigOrExit(globals());
      const text = readFileSync(0, 'utf8');
      if (!text.trim()) throw new CliExit(EXIT.usage, 'pipe the private key (PEM or JWK) on stdin');
      const sealed = sealSigningKey(text, await masterKeySealer(config));
      if (!sealed.ok) throw new CliExit(EXIT.usage, sealed.message);
      process.stdout.write(`${sealed.sealed}\n`);
      process.stderr.write(`an ${sealed.alg} key: set security.cardSigning.alg: ${sealed.alg} and keySealed to the line above\n`);
    });

  cards
    .command('jwks')
    .description("print the public key set of security.cardSigning: what its jku serves, and a verifier's --key")
    .action(async () => {
      const config = loadConfigOrExit(globals());
      if (!config.security.cardSigning) throw new CliExit(EXIT.config, 'security.cardSigning is not configured');
      const files = loadCardKeyFiles({ security: config.security, remoteAgents: [] });
      if (!files.ok) throw new CliExit(EXIT.config, files.problems.join('\n'));
      const sealer = config.security.cardSigning.keySealed ? await masterKeySealer(config) : null;
      const signing = cardSignerFor(config, files.fileSigner, sealer);
      if (!signing) throw new CliExit(EXIT.config, 'security.cardSigning is not configured');
      if (!signing.ok) throw new CliExit(EXIT.config, signing.message);
      process.stdout.write(`${JSON.stringify(publicJwks(signing.signer), null, 2)}\n`);
    });
}
