-- The sequenced-events extension (docs/extensions/sequenced-events.md; decision 0069).
-- Every statement here may run again on a database that already has it.

-- A push config created by a request that activated the extension gets the event's sequence in the
-- body of each delivery too (the event's metadata under the extension's URI); every delivery
-- carries it in the X-A2A-Event-Sequence header. Configs created before this migration, and those
-- of clients that did not activate it, get plain A2A bodies.
ALTER TABLE push_configs ADD COLUMN IF NOT EXISTS sequenced boolean NOT NULL DEFAULT false;
