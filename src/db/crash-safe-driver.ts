import { EventEmitter } from 'node:events';
import { createPgDriverFactory } from '@slonik/pg-driver';
import type { DriverClient, DriverFactory } from 'slonik';
import { namedIfPrepared, type PreparedCounts } from './prepared-statements.js';

/**
 * slonik 47's pg driver with one repair: a connection whose socket dies while a query runs on it
 * (a Postgres crash, SIGKILL of the postmaster, a dropped network path) is always given back to
 * the pool.
 *
 * Why: on a socket error the driver starts `destroy()`, which first races the query in flight
 * against a grace timer. The query then fails ("Connection terminated unexpectedly"), the race
 * rejects, and the destroy ends before it emits `destroy`, the event the pool listens to. The
 * connection stays in the pool as PENDING_DESTROY for ever, holding its slot. Under load every
 * slot goes this way at the crash, and every later checkout waits in the pool's queue without
 * end: Keel hung for minutes after a crash although Postgres was back (issue 12, decision 0017).
 * Slonik 48+ needs Node 22, so the repair lives here: when the driver's destroy fails, the
 * wrapper finishes it (reports the client DESTROYED and emits `destroy` once), so the pool drops
 * the connection and opens a fresh one for the next checkout.
 */
export function createCrashSafeDriverFactory(inner: DriverFactory = createPgDriverFactory()): DriverFactory {
  return async (options) => {
    const driver = await inner(options);
    return { createClient: async () => finishFailedDestroy(await driver.createClient()) };
  };
}

type Listener = (...args: unknown[]) => void;

function finishFailedDestroy(client: DriverClient): DriverClient {
  // The pool's `destroy` listeners live here, so that they hear exactly one `destroy`, whether the
  // driver's own destroy got as far as emitting it or failed before.
  const destroyEvents = new EventEmitter();
  let destroyed = false;
  const emitDestroyOnce = () => {
    if (destroyed) return;
    destroyed = true;
    destroyEvents.emit('destroy');
  };
  client.on('destroy', emitDestroyOnce);
  const destroy = () => client.destroy().catch(emitDestroyOnce);
  // The driver reacts to a socket error by destroying the client; this listener, added after the
  // driver's own, settles that destroy when it fails.
  client.on('error', () => void destroy());

  const on = (event: string, listener: Listener) => {
    if (event === 'destroy') destroyEvents.on(event, listener);
    else (client.on as (event: string, listener: Listener) => unknown)(event, listener);
    return wrapped.on;
  };
  const off = (event: string, listener: Listener) => {
    if (event === 'destroy') destroyEvents.off(event, listener);
    else (client.off as (event: string, listener: Listener) => unknown)(event, listener);
    return wrapped.off;
  };
  const prepared: PreparedCounts = new Map();
  const wrapped: DriverClient = {
    ...client,
    // A marked statement goes to node-postgres with a name, prepared on this connection (prepared-statements.ts).
    query: (text, values) => client.query(namedIfPrepared(text, prepared) as string, values),
    destroy,
    state: () => (destroyed ? 'DESTROYED' : client.state()),
    on: on as unknown as DriverClient['on'],
    off: off as unknown as DriverClient['off'],
    removeListener: off as unknown as DriverClient['removeListener'],
  };
  return wrapped;
}
