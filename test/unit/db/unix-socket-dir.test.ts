import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { unixSocketDirFor } from '../../../src/db/unix-socket-dir.js';

// Where the embedded Postgres puts its Unix socket: its own data directory, unless the socket's
// path would pass the 107 bytes a socket address holds (Postgres would refuse to start), or the
// directory's name would be split by `unix_socket_directories`. Then loopback TCP only.

describe('unixSocketDirFor', () => {
  it('is the data directory when the socket path fits', () => {
    expect(unixSocketDirFor('/home/ops/.keel/pg', 54321)).toBe('/home/ops/.keel/pg');
    // Exactly 107 bytes with the socket's own name still fits.
    const dir = `/${'d'.repeat(107 - '/.s.PGSQL.54321'.length - 1)}`;
    expect(Buffer.byteLength(join(dir, '.s.PGSQL.54321'))).toBe(107);
    expect(unixSocketDirFor(dir, 54321)).toBe(dir);
  });

  it('is none when the path would pass 107 bytes, counted in bytes', () => {
    const dir = `/${'d'.repeat(107 - '/.s.PGSQL.54321'.length)}`;
    expect(unixSocketDirFor(dir, 54321)).toBeNull();
    // The same length in characters, more in bytes.
    const accented = `/${'é'.repeat(50)}`;
    expect(Buffer.byteLength(join(accented, '.s.PGSQL.54321'))).toBeGreaterThan(107);
    expect(unixSocketDirFor(accented, 54321)).toBeNull();
  });

  it('is none when the directory name holds a separator or a quote', () => {
    for (const dir of ['/srv/keel data/pg', '/srv/keel,data/pg', "/srv/keel'data/pg", '/srv/keel"data/pg', '/srv/keel\\data/pg']) {
      expect(unixSocketDirFor(dir, 5432), dir).toBeNull();
    }
  });

  it('is an absolute path, whatever the data directory was given as', () => {
    const absolute = resolve('.keel/pg');
    expect(unixSocketDirFor('.keel/pg', 5432)).toBe(Buffer.byteLength(join(absolute, '.s.PGSQL.5432')) <= 107 ? absolute : null);
  });
});
