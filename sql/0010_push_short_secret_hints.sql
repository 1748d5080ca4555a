-- A push credential or token of eight characters or fewer keeps no hint in clear (docs/push.md,
-- "Credentials and token"): its last four characters would be half of it or more. Rows written
-- before that rule kept a hint for any length. The secret itself is sealed, but its length is
-- not hidden: a sealed value is a 97-byte header followed by a ciphertext as long as the
-- plaintext (src/sealing/envelope.ts), and the plaintext is the secret as a JSON string. Eight
-- characters are at most 50 bytes of JSON (two quotes and at most six bytes per character, a
-- \u escape), so every hint whose secret may have had eight characters or fewer is cleared. Some
-- longer secrets (up to 48 ASCII characters) lose their hint too: they are shown by the scheme
-- alone, which reveals less, never more.
UPDATE push_configs
SET token_hint = CASE WHEN token IS NOT NULL AND octet_length(token) - 97 <= 50 THEN NULL ELSE token_hint END,
    credentials_hint = CASE WHEN credentials IS NOT NULL AND octet_length(credentials) - 97 <= 50 THEN NULL ELSE credentials_hint END
WHERE (token_hint IS NOT NULL AND token IS NOT NULL AND octet_length(token) - 97 <= 50)
   OR (credentials_hint IS NOT NULL AND credentials IS NOT NULL AND octet_length(credentials) - 97 <= 50);
