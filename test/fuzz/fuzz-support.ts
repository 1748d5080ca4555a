import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import fc from 'fast-check';
import { expect } from 'vitest';
import { pino } from 'pino';
import type { KeelLogger } from '../../src/log/logger.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// What the bad-input suites (test/fuzz/) share: the seed, the Keel they run against, a push
// receiver on loopback, raw HTTP requests with full control of bytes and headers, and a log of
// everything Keel logged at error level (a bad request must never be an error of Keel's).

export const BODY_LIMIT = 65_536;

/**
 * The seed of one fuzz file: KEEL_FUZZ_SEED when set (to replay a failure), otherwise fresh, and
 * printed either way. The seed alone replays the file's whole sequence of requests (the state a
 * failing request met included); fast-check's report adds the `path` of the failing case, which
 * KEEL_FUZZ_PATH with the seed and `-t '<test name>'` replays alone.
 */
export function fuzzSeed(file: string): number {
  const fixed = process.env.KEEL_FUZZ_SEED;
  const seed = fixed !== undefined && fixed !== '' ? Number(fixed) : (Date.now() ^ (Math.random() * 0x7fffffff)) | 0;
  if (!Number.isInteger(seed)) throw new Error(`KEEL_FUZZ_SEED must be an integer, not ${fixed}`);
  console.info(`[fuzz] ${file}: seed ${seed} (replay: KEEL_FUZZ_SEED=${seed} npx vitest run test/fuzz/${file})`);
  return seed;
}

/** The runs of one property, scaled by KEEL_FUZZ_RUNS_FACTOR (e.g. 10 for a long local session). */
export function runs(base: number): number {
  const factor = Number(process.env.KEEL_FUZZ_RUNS_FACTOR ?? '1');
  return Math.max(1, Math.round(base * (Number.isFinite(factor) && factor > 0 ? factor : 1)));
}

/**
 * fc.assert with the file's seed. Failures are not shrunk unless KEEL_FUZZ_SHRINK=1: every run is
 * a few HTTP requests, and shrinking a 60 kB body request by request would outlast the test's
 * timeout; the report's seed and path replay the failing case as generated.
 */
export async function check<T>(seed: number, property: fc.IAsyncProperty<T>, numRuns: number): Promise<void> {
  const path = process.env.KEEL_FUZZ_PATH;
  await fc.assert(property, {
    seed,
    numRuns,
    endOnFailure: process.env.KEEL_FUZZ_SHRINK !== '1',
    ...(path ? { path } : {}),
  });
}

export type ErrorLog = { lines: string[] };

/** A logger that keeps every line at error level or above (pino levels 50, 60). */
function recordingLogger(): { logger: KeelLogger; errors: ErrorLog } {
  const errors: ErrorLog = { lines: [] };
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) if (line) errors.lines.push(line.slice(0, 2000));
      done();
    },
  });
  return { logger: pino<'notice'>({ level: 'error', customLevels: { notice: 35 }, base: { service: 'keel' } }, sink), errors };
}

/** A 200-answering receiver on loopback for the push configs that requests manage to create. */
export async function startSink(): Promise<{ url: string; close: () => Promise<void> }> {
  const server: Server = createServer((request, response) => {
    request.resume();
    request.on('end', () => response.writeHead(200).end());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hook`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export type FuzzKeel = { keel: TestKeel; errors: ErrorLog };

/** A Keel with the echo agent, a 64 KiB body limit, loopback push targets and an error log. */
export async function startFuzzKeel(overrides: Record<string, unknown> = {}): Promise<FuzzKeel> {
  const { logger, errors } = recordingLogger();
  const keel = await startTestKeel({
    logger,
    pushTestTimings: { timeoutSeconds: 1 },
    overrides: {
      KEEL_SERVER_BODY_LIMIT_BYTES: String(BODY_LIMIT),
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
      KEEL_PROVIDERS: { echo: { type: 'echo' } },
      KEEL_AGENTS: [{ id: 'echo', name: 'Echo', provider: 'echo', privacy: { answerLevel: 'full' } }],
      ...overrides,
    },
  });
  return { keel, errors };
}

export type RawRequest = {
  method: string;
  /** Path and query, sent as is (already percent-encoded where it should be). */
  path: string;
  headers: Array<[string, string]>;
  body?: Buffer;
};

export type RawResponse = { status: number; contentType: string; text: string; body: unknown; ms: number };

/** How long one request may take: a blocking SendMessage on the echo agent answers in well under this. */
const REQUEST_TIMEOUT_MS = 20_000;

export async function send(baseUrl: string, request: RawRequest): Promise<RawResponse> {
  const headers = new Headers();
  for (const [name, value] of request.headers) headers.append(name, value);
  const started = Date.now();
  const response = await fetch(`${baseUrl}${request.path}`, {
    method: request.method,
    headers,
    ...(request.body !== undefined ? { body: request.body } : {}),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: response.status, contentType: response.headers.get('content-type') ?? '', text, body, ms: Date.now() - started };
}

/** The process still serves: /readyz answers 200 (database and queue reachable). */
export async function expectReady(baseUrl: string): Promise<void> {
  const response = await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(10_000) });
  expect(response.status, await response.text()).toBe(200);
}

/** Nothing Keel logged at error level (every 500 logs "request failed" there). */
export function expectNoErrorsLogged(errors: ErrorLog): void {
  expect(errors.lines, errors.lines.join('\n')).toEqual([]);
}

/** A one-line description of a request for failure messages. */
export function describeRequest(request: RawRequest): string {
  const body = request.body === undefined ? '' : ` body(${request.body.length} B)=${JSON.stringify(request.body.subarray(0, 300).toString('latin1'))}`;
  return `${request.method} ${request.path.slice(0, 300)} headers=${JSON.stringify(request.headers).slice(0, 400)}${body}`;
}

/** Counts of the answers a run got, printed at the end so a run shows what it reached. */
export class Tally {
  readonly #counts = new Map<string, number>();

  add(key: string): void {
    this.#counts.set(key, (this.#counts.get(key) ?? 0) + 1);
  }

  print(file: string): void {
    const lines = [...this.#counts].sort((a, b) => b[1] - a[1]).map(([key, count]) => `  ${String(count).padStart(5)}  ${key}`);
    console.info(`[fuzz] ${file}: answers\n${lines.join('\n')}`);
  }
}

/** The tally key of an A2A answer: the result, or the error's code and reason (either binding). */
export function answerKey(response: RawResponse): string {
  const body = response.body as { error?: string | { code?: unknown; data?: Array<{ reason?: string }>; details?: Array<{ reason?: string }> }; result?: unknown; code?: string } | undefined;
  if (response.contentType.startsWith('text/event-stream')) return `${response.status} stream`;
  if (typeof body?.error === 'string') return `${response.status} ${body.error}`;
  if (body?.error) return `${response.status} error ${String(body.error.code)} ${(body.error.data ?? body.error.details)?.[0]?.reason ?? ''}`;
  if (body?.code) return `${response.status} ${body.code}`;
  return `${response.status} result`;
}
