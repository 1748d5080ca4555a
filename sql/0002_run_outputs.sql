-- What a run produced that may be shown to its client: artifacts (and chunks of them) emitted
-- during the run, and its final answer. Content is sealed and kept at `level`, never above the run's
-- answer ceiling; a tightened ceiling rewrites these rows in the transaction that tightens it.
CREATE TABLE run_outputs (
  run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  ordinal integer NOT NULL,
  kind text NOT NULL CHECK (kind IN ('artifact', 'answer')),
  artifact_id text,
  append boolean NOT NULL DEFAULT false,
  last_chunk boolean NOT NULL DEFAULT false,
  level text NOT NULL CHECK (level IN ('metadata', 'redacted', 'full')),
  content bytea NOT NULL,
  run_revision bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, ordinal)
);

-- Why a run failed, without content: the guardrail's name and configured reason, the provider
-- error class and status, the tool that was running when a lease was lost.
ALTER TABLE runs ADD COLUMN failure_detail jsonb;
-- The provider of the chain currently in use (fallbacks are sticky within a run).
ALTER TABLE runs ADD COLUMN provider text;

-- A resume handed over to a worker: claimed_by 'handoff:<nonce>' until a worker takes it.
CREATE INDEX runs_handoff_idx ON runs (id) WHERE status = 'running' AND claimed_by LIKE 'handoff:%';
