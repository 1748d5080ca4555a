import { v7 } from 'uuid';

/**
 * A new id for a row Keel inserts: a time-ordered UUID (RFC 9562 version 7: 48 bits of Unix
 * milliseconds, then random bits; ids minted in the same millisecond by this process still
 * increase). Rows inserted together sit next to each other in every index that starts with their
 * id, so an insert lands on the index's newest page instead of a random one, and the pages a busy
 * installation touches stay few however large its tables grow (decision 0045).
 */
export function newRowId(): string {
  return v7();
}
