-- Operators of the web UI (/ui). An admin token is `keel_admin_` followed by 43 base64url
-- characters (256 random bits), created by `keel admin token` and shown once; only its SHA-256 is
-- kept, with its last four characters to tell tokens apart. A revoked token keeps its row.
CREATE TABLE admin_tokens (
  id uuid PRIMARY KEY,
  name text NOT NULL CONSTRAINT admin_tokens_name_format CHECK (name ~ '^[a-zA-Z0-9._-]{1,64}$'),
  token_hash bytea NOT NULL CONSTRAINT admin_tokens_token_hash_key UNIQUE
    CONSTRAINT admin_tokens_token_hash_length CHECK (octet_length(token_hash) = 32),
  token_hint text NOT NULL CONSTRAINT admin_tokens_token_hint_format CHECK (token_hint ~ '^[A-Za-z0-9_-]{4}$'),
  created_at timestamptz NOT NULL DEFAULT now(),
  last_used_at timestamptz,
  revoked_at timestamptz
);

-- Browser sessions opened by logging in with an admin token. The cookie carries a random session
-- id; only its SHA-256 is stored. A session ends at expires_at, at logout, or when its token is
-- revoked. The CSRF token of a session is derived from its id and never stored.
CREATE TABLE admin_sessions (
  id_hash bytea PRIMARY KEY CONSTRAINT admin_sessions_id_hash_length CHECK (octet_length(id_hash) = 32),
  token_id uuid NOT NULL REFERENCES admin_tokens (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  last_seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX admin_sessions_expires_idx ON admin_sessions (expires_at);
CREATE INDEX admin_sessions_token_idx ON admin_sessions (token_id);
