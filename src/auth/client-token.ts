import { createHash, randomBytes } from 'node:crypto';

// Inbound client tokens (docs/architecture.md, "A2A server"): `keel_` followed by 43 base64url
// characters, the unpadded encoding of 32 random bytes (256 bits). The prefix lets secret scanners
// recognise a leaked token.

export const CLIENT_TOKEN_PREFIX = 'keel_';
const TOKEN_BYTES = 32;
/** base64url without padding of 32 bytes. */
const ENCODED_LENGTH = 43;
export const CLIENT_TOKEN_LENGTH = CLIENT_TOKEN_PREFIX.length + ENCODED_LENGTH;
const TOKEN_PATTERN = /^keel_[A-Za-z0-9_-]{43}$/;
/** How many trailing characters of a token are kept in clear to tell tokens apart in listings. */
export const TOKEN_HINT_LENGTH = 4;

export function generateClientToken(): string {
  return `${CLIENT_TOKEN_PREFIX}${randomBytes(TOKEN_BYTES).toString('base64url')}`;
}

/** Whether `value` has the shape of a client token (says nothing about whether it is valid). */
export function looksLikeClientToken(value: string): boolean {
  return TOKEN_PATTERN.test(value);
}

/**
 * The value stored for a token and looked up when it is presented: SHA-256 of the whole token.
 *
 * A fast, unsalted hash is the right tool here, unlike for passwords. Slow salted hashes (scrypt,
 * argon2, bcrypt) exist to make guessing low-entropy secrets expensive; a token is 256 random bits,
 * so there is nothing to guess however fast the hash, and a stolen table of hashes yields no token
 * (SHA-256 preimage resistance). Being deterministic, the hash is also the lookup key: a token is
 * checked by one indexed equality on its hash, so no comparison ever runs over the secret itself
 * and the work does not depend on how much of a guess is right. And it costs about a microsecond on
 * the request path.
 */
export function hashClientToken(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}

/** The last characters of a token, stored in clear for listings. */
export function tokenHint(token: string): string {
  return token.slice(-TOKEN_HINT_LENGTH);
}

/** How a token is shown in listings: `keel_…abcd`. */
export function formatTokenHint(hint: string): string {
  return `${CLIENT_TOKEN_PREFIX}…${hint}`;
}
