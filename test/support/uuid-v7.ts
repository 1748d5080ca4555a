// What a version 7 UUID (RFC 9562) looks like, and the Unix milliseconds it carries in its first
// 12 hex digits: how the tests check the ids Keel mints for its rows (decision 0045).

export const VERSION_7_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

export function millisecondsOf(id: string): number {
  return Number.parseInt(id.replace(/-/g, '').slice(0, 12), 16);
}
