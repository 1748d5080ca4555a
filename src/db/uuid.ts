// A uuid in its canonical text form (8-4-4-4-12 hex digits, either case): what Keel's uuid columns
// are looked up by. A string that is not one names no row, and casting it would be a Postgres
// error, so callers answer "not found" (or a usage error) before asking.

const CANONICAL_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function isUuid(value: string): boolean {
  return CANONICAL_UUID.test(value);
}
