import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// Requests refused before any route runs (issue 40): a URL Fastify cannot percent-decode (400), a
// path parameter over the router's length limit (414), headers larger than Node's parser accepts
// (431, refused by the parser itself). Under an A2A agent's endpoint each is answered in the
// binding's own error shape (a JSON-RPC error object for a POST to /a2a/<agent>, the HTTP+JSON error
// elsewhere under it); off it, a plain JSON error. Never HTML, never Fastify's default body. The
// bytes are read off the socket, as a client sees them.

let keel: TestKeel;
beforeAll(async () => {
  keel = await startTestKeel();
});
afterAll(async () => keel?.dispose());

type Wire = { status: number; headers: Record<string, string>; body: string };

/** Sends raw bytes and reads the answer until the server closes or the body is complete. */
function raw(request: string): Promise<Wire> {
  const { hostname, port } = new URL(keel.url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(request));
    const chunks: Buffer[] = [];
    const finish = () => {
      const text = Buffer.concat(chunks).toString('utf8');
      const [head, ...rest] = text.split('\r\n\r\n');
      const [statusLine, ...headerLines] = head!.split('\r\n');
      const headers = Object.fromEntries(headerLines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]));
      const body = rest.join('\r\n\r\n');
      if (headers['content-length'] !== undefined && Buffer.byteLength(body) < Number(headers['content-length'])) return false;
      socket.destroy();
      resolve({ status: Number(statusLine!.split(' ')[1]), headers, body });
      return true;
    };
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      if (Buffer.concat(chunks).includes('\r\n\r\n')) finish();
    });
    socket.on('end', () => finish());
    socket.on('error', (error) => (chunks.length ? finish() : reject(error)));
  });
}

const request = (method: string, target: string, extraHeaders = '') =>
  `${method} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n${extraHeaders}\r\n{}`;
const bigHeader = `X-Padding: ${'a'.repeat(20_000)}\r\n`;
const longSegment = 'a'.repeat(101);

function expectJsonRpcError(wire: Wire, code: number, message: RegExp) {
  expect(wire.status).toBe(200);
  expect(wire.headers['content-type']).toMatch(/^application\/json/);
  const body = JSON.parse(wire.body) as { jsonrpc: string; id: null; error: { code: number; message: string } };
  expect(body.jsonrpc).toBe('2.0');
  expect(body.id).toBeNull();
  expect(body.error.code).toBe(code);
  expect(body.error.message).toMatch(message);
}

function expectRestError(wire: Wire, status: number, message: RegExp) {
  expect(wire.status).toBe(status);
  expect(wire.headers['content-type']).toMatch(/^application\/json/);
  const body = JSON.parse(wire.body) as { error: { code: number; status: string; message: string; details: unknown[] } };
  expect(body.error.code).toBe(status);
  expect(body.error.status).toBe('INVALID_ARGUMENT');
  expect(body.error.message).toMatch(message);
  expect(Array.isArray(body.error.details)).toBe(true);
}

function expectPlainJson(wire: Wire, status: number, message: RegExp) {
  expect(wire.status).toBe(status);
  expect(wire.headers['content-type']).toMatch(/^application\/json/);
  const body = JSON.parse(wire.body) as Record<string, unknown>;
  expect(body).toEqual({ error: expect.stringMatching(message), statusCode: status });
}

describe('bad percent-encoding (400)', () => {
  it('JSON-RPC endpoint: a JSON-RPC error object', async () => {
    expectJsonRpcError(await raw(request('POST', '/a2a/%E0%A4%A')), -32600, /percent-encoded/);
  });
  it('HTTP+JSON endpoint: the binding error with status 400', async () => {
    expectRestError(await raw(request('GET', '/a2a/echo/tasks/%E0%A4%A')), 400, /percent-encoded/);
  });
  it('off A2A: plain JSON', async () => {
    expectPlainJson(await raw(request('GET', '/ui/runs/%E0%A4%A')), 400, /percent-encoded/);
  });
});

describe('a path parameter too long (414)', () => {
  it('JSON-RPC endpoint: a JSON-RPC error object', async () => {
    expectJsonRpcError(await raw(request('POST', `/a2a/${longSegment}`)), -32600, /longer than 100/);
  });
  it('HTTP+JSON endpoint: the binding error with status 414', async () => {
    expectRestError(await raw(request('GET', `/a2a/${longSegment}/tasks/x`)), 414, /longer than 100/);
  });
  it('off A2A: plain JSON', async () => {
    expectPlainJson(await raw(request('GET', `/ui/runs/${longSegment}`)), 414, /longer than 100/);
  });
});

describe('headers too large (431, refused by the HTTP parser)', () => {
  it('JSON-RPC endpoint: a JSON-RPC error object, and the connection closes', async () => {
    const wire = await raw(request('POST', '/a2a/echo', bigHeader));
    expectJsonRpcError(wire, -32600, /headers are larger than/);
    expect(wire.headers.connection).toBe('close');
  });
  it('HTTP+JSON endpoint: the binding error with status 431', async () => {
    expectRestError(await raw(request('GET', '/a2a/echo/tasks/x', bigHeader)), 431, /headers are larger than/);
  });
  it('off A2A: plain JSON', async () => {
    expectPlainJson(await raw(request('GET', '/healthz', bigHeader)), 431, /headers are larger than/);
  });
  it('a request line itself past the limit: still the binding addressed, read from its start', async () => {
    expectRestError(await raw(request('GET', `/a2a/echo/tasks/${'a'.repeat(20_000)}`)), 431, /headers are larger than/);
    expectPlainJson(await raw(request('GET', `/ui/runs/${'a'.repeat(20_000)}`)), 431, /headers are larger than/);
  });
});
