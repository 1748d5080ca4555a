-- Inbound A2A clients. A client authenticates with `Authorization: Bearer keel_<43 base64url>`;
-- only the token's SHA-256 is kept (token_hash), with its last four characters (token_hint) so an
-- operator can tell tokens apart in `keel clients list`. A revoked client keeps its row (tasks
-- reference it) and its name may be reused by a new client.
CREATE TABLE clients (
  id uuid PRIMARY KEY,
  name text NOT NULL CONSTRAINT clients_name_format CHECK (name ~ '^[a-zA-Z0-9._-]{1,64}$'),
  token_hash bytea NOT NULL CONSTRAINT clients_token_hash_key UNIQUE
    CONSTRAINT clients_token_hash_length CHECK (octet_length(token_hash) = 32),
  token_hint text NOT NULL CONSTRAINT clients_token_hint_format CHECK (token_hint ~ '^[A-Za-z0-9_-]{4}$'),
  created_at timestamptz NOT NULL DEFAULT now(),
  last_used_at timestamptz,
  revoked_at timestamptz
);

-- A name is unique among the clients that can still authenticate.
CREATE UNIQUE INDEX clients_active_name_key ON clients (name) WHERE revoked_at IS NULL;

-- The owner of every task when `auth.mode: none` (local development). Its token hash is random
-- bytes of which nobody knows a SHA-256 preimage, and the lookup by token skips this id as well,
-- so it can never be reached with a token. Start-up re-inserts it idempotently should it be missing.
INSERT INTO clients (id, name, token_hash, token_hint)
VALUES ('00000000-0000-0000-0000-000000000000', 'anonymous', sha256(convert_to(gen_random_uuid()::text || clock_timestamp()::text, 'UTF8')), 'none')
ON CONFLICT DO NOTHING;
