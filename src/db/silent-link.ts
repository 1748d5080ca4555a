// A link to Postgres can go silent instead of closing (a cut cable, a partition, a host gone): no
// packet arrives, no reset, and neither end learns anything by itself. Postgres keeps such a
// client's session, and with it every row lock of its open transaction, until the OS gives up on
// the socket (two hours of keepalive by default) or, inside a transaction, until
// idle_in_transaction_session_timeout (slonik's default, 60 s): in the partition tests the other
// worker's reaper waited on those locks for a minute before it could take a run over
// (docs/reliability.md, "Across hosts"; decision 0092). `database.linkTimeoutSeconds` bounds it:
// the server drops a session whose client went silent within that time, and the connections Keel
// makes with node-postgres itself (LISTEN, the queue pools) notice a silent server too.

/** The production default of `database.linkTimeoutSeconds`: a third of the 60 s run lease. */
export const DEFAULT_LINK_TIMEOUT_SECONDS = 20;

/**
 * Server settings of each of Keel's sessions, sent at connect (the startup packet's `options`), in
 * whole seconds as Postgres takes them: TCP keepalive on the server's end of the socket, first
 * probe after half the timeout, then up to three probes spread over the rest (at least two from a
 * timeout of 3 s: with one, a single lost probe on a lossy link ended a live session), so a silent
 * client's session ends within the timeout, its transaction rolled back and its locks released;
 * and tcp_user_timeout, the same bound for what the server sent and the client never acknowledged
 * (a keepalive probe is not sent while such data is outstanding). Ignored on a Unix socket.
 */
export function silentLinkSessionSettings(linkTimeoutSeconds: number): Record<string, number> {
  const idle = Math.max(1, Math.floor(linkTimeoutSeconds / 2));
  const interval = Math.max(1, Math.floor((linkTimeoutSeconds - idle) / 3));
  const count = Math.max(1, Math.floor((linkTimeoutSeconds - idle) / interval));
  return {
    tcp_keepalives_idle: idle,
    tcp_keepalives_interval: interval,
    tcp_keepalives_count: count,
    tcp_user_timeout: Math.round(linkTimeoutSeconds * 1000),
  };
}

/**
 * The idle time before the client's own keepalive probes (node-postgres's keepAliveInitialDelayMillis).
 * Node 20 then probes every second, ten times (libuv), so a silent server is noticed within this
 * plus 10 s on a connection that waits for the server (a LISTEN connection): half the timeout,
 * at least 1 s.
 */
export function clientKeepAliveDelayMs(linkTimeoutSeconds: number): number {
  return Math.max(1000, Math.round((linkTimeoutSeconds * 1000) / 2));
}

/** `-c name=value` for each setting, after `options` already given (a URL's own, search_path). */
export function startupOptions(settings: Record<string, number | string>, given?: string): string {
  const ours = Object.entries(settings).map(([name, value]) => `-c ${name}=${value}`);
  return [...(given ? [given] : []), ...ours].join(' ');
}

/**
 * A connection URL whose sessions get `settings` at connect, after whatever `options` it has: the
 * URL's own, else the environment's PGOPTIONS. node-postgres reads PGOPTIONS only when the
 * connection names no `options`, so the ones written here would otherwise drop it (an operator's
 * `-c statement_timeout=...`, a test's session tag).
 */
export function withStartupOptions(url: string, settings: Record<string, number | string>, env: NodeJS.ProcessEnv = process.env): string {
  const parsed = new URL(url);
  const given = parsed.searchParams.get('options') ?? env['PGOPTIONS'];
  parsed.searchParams.set('options', startupOptions(settings, given || undefined));
  return parsed.toString();
}

/** A connection URL whose sessions the server ends within the link timeout, with `extra` settings before them. */
export function silentLinkUrl(url: string, linkTimeoutSeconds: number, extra: Record<string, number | string> = {}): string {
  return withStartupOptions(url, { ...extra, ...silentLinkSessionSettings(linkTimeoutSeconds) });
}

/** node-postgres's client keepalive for a connection that waits for the server (LISTEN, a queue pool). */
export function clientKeepAlive(linkTimeoutSeconds: number): { keepAlive: true; keepAliveInitialDelayMillis: number } {
  return { keepAlive: true, keepAliveInitialDelayMillis: clientKeepAliveDelayMs(linkTimeoutSeconds) };
}
