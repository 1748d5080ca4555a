import { BackendTerminatedError, ConnectionError, NotFoundError, UniqueIntegrityConstraintViolationError } from 'slonik';
import { describe, expect, it } from 'vitest';
import { isConnectionError } from '../../../src/db/pool.js';

// A lost or refused database connection is transient: work that hits it is left to its lease and
// the reaper. Anything the database answered (a constraint, a missing row) is not.

const withCode = (message: string, code: string) => Object.assign(new Error(message), { code });

describe('isConnectionError', () => {
  it('recognises connections lost, refused, or a server shutting down or starting up', () => {
    expect(isConnectionError(new BackendTerminatedError(withCode('terminating connection due to administrator command', '57P01')))).toBe(true);
    expect(isConnectionError(new ConnectionError('the database system is starting up'))).toBe(true);
    expect(isConnectionError(withCode('the database system is shutting down', '57P03'))).toBe(true);
    expect(isConnectionError(withCode('connect ECONNREFUSED 127.0.0.1:5432', 'ECONNREFUSED'))).toBe(true);
    expect(isConnectionError(new Error('wrapped', { cause: withCode('read ECONNRESET', 'ECONNRESET') }))).toBe(true);
    expect(isConnectionError(new Error('Connection terminated unexpectedly'))).toBe(true);
    expect(isConnectionError(withCode('connection failure', '08006'))).toBe(true);
  });

  it('leaves everything the database answered alone', () => {
    expect(isConnectionError(new NotFoundError({ sql: 'SELECT 1', values: [] } as never))).toBe(false);
    expect(isConnectionError(new UniqueIntegrityConstraintViolationError(withCode('duplicate key', '23505') as never))).toBe(false);
    expect(isConnectionError(withCode('value too long', '22001'))).toBe(false);
    expect(isConnectionError(new Error('the result is too large'))).toBe(false);
    expect(isConnectionError('not an error')).toBe(false);
  });
});
