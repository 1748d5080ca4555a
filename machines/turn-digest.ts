import { createHash } from 'node:crypto';

/** JSON with sorted object keys, so the same value always hashes the same. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, child]) => child !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([key, child]) => `${JSON.stringify(key)}:${canonicalJson(child)}`).join(',')}}`;
}

/**
 * The digest an operator's decision is bound to: SHA-256 over what was shown (the pending calls,
 * or the guardrail and stage that asked), so a decision about an older turn is refused.
 */
export function turnDigest(pending: unknown): string {
  return createHash('sha256').update(canonicalJson(pending)).digest('hex');
}
