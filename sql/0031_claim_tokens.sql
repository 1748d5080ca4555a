-- Fencing (docs/reliability.md, "Fencing"; decision 0088). Every claim of a run stamps a new
-- token; every write a worker makes for the run it holds (a lease renewal, an output, a step's
-- progress, a suspension, the run's end with its result, journal rows and push deliveries, its
-- audit rows) carries the token of its claim and is refused unless the row still holds it. The
-- reaper's requeue and dead-letter and a worker's release clear it, so a worker that comes back
-- after its lease expired writes nothing, even when the same process claimed the run again.
-- Not indexed: a claim and a renewal stay HOT updates (decision 0024).
-- Every statement here may run again on a database that already has it.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS claim_token uuid;
