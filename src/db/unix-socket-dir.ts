import { join, resolve } from 'node:path';

/** The longest path a Unix socket may have (sun_path holds 108 bytes with its NUL); Postgres refuses to start past it. */
const SOCKET_PATH_BYTES = 107;

/**
 * `dir` as the Unix socket directory of a Postgres on `port` (its own data directory: private to
 * it and removed with it), absolute. Null, and the server on loopback TCP only, when the socket's
 * path would be too long, or the directory's name holds a character `unix_socket_directories`
 * would read as a separator.
 */
export function unixSocketDirFor(dir: string, port: number): string | null {
  const absolute = resolve(dir);
  if (Buffer.byteLength(join(absolute, `.s.PGSQL.${port}`)) > SOCKET_PATH_BYTES) return null;
  return /[\s,"'\\]/.test(absolute) ? null : absolute;
}
