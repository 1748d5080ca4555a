/**
 * The guarded fetch against real `node:http` servers on loopback (no mocks): loopback is refused
 * unless listed in allowHosts, and the tests list it to get through to their own servers.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import diagnosticsChannel from 'node:diagnostics_channel';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { createGuardedFetch } from '../../../src/net/guarded-fetch.js';
import type { ClosableGuardedFetch, GuardedFetchResult, GuardPolicy, Resolver } from '../../../src/net/guarded-fetch.js';

type Seen = { method: string; url: string; headers: http.IncomingHttpHeaders; rawHeaders: string[]; body: string; localAddress: string };

type TestServer = {
  port: number;
  seen: Seen[];
  connections: number;
  close(): Promise<void>;
};

/** Routes: /echo (200 + JSON), /redirect (302 to the metadata address), /hang (never answers),
 *  /slow-body (headers, then nothing), /big (2 MiB chunked), /declared-big (Content-Length 5000). */
async function startServer(host: string): Promise<TestServer> {
  const seen: Seen[] = [];
  const sockets = new Set<net.Socket>();
  let connections = 0;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push({
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        body: Buffer.concat(chunks).toString('utf8'),
        localAddress: req.socket.localAddress ?? '',
      });
      const path = (req.url ?? '').split('?')[0];
      switch (path) {
        case '/redirect':
          res.writeHead(302, { Location: 'http://169.254.169.254/latest/meta-data/' });
          res.end();
          return;
        case '/hang':
          return;
        case '/slow-body':
          res.writeHead(200, { 'Content-Type': 'text/plain' });
          res.write('partial');
          return;
        case '/big': {
          res.writeHead(200, { 'Content-Type': 'application/octet-stream' });
          const chunk = Buffer.alloc(64 * 1024, 0x61);
          for (let i = 0; i < 32; i += 1) res.write(chunk);
          res.end();
          return;
        }
        case '/declared-big':
          res.writeHead(200, { 'Content-Length': '5000' });
          res.end(Buffer.alloc(5000, 0x62));
          return;
        default:
          res.writeHead(200, { 'Content-Type': 'application/json', 'X-Reply': 'yes' });
          res.end(JSON.stringify({ ok: true, path }));
      }
    });
  });
  server.on('connection', (socket: net.Socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    seen,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

async function ipv6Available(): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(0, '::1', () => s.close(() => resolve(true)));
  });
}

/** Counts connection attempts at the socket level (node:net) and in undici, for a time window. */
function watchConnects(): { count: () => number; stop: () => void } {
  let n = 0;
  const onNet = (): void => {
    n += 1;
  };
  const onUndici = (): void => {
    n += 1;
  };
  diagnosticsChannel.subscribe('net.client.socket', onNet);
  diagnosticsChannel.subscribe('undici:client:beforeConnect', onUndici);
  return {
    count: () => n,
    stop: () => {
      diagnosticsChannel.unsubscribe('net.client.socket', onNet);
      diagnosticsChannel.unsubscribe('undici:client:beforeConnect', onUndici);
    },
  };
}

function expectOk(r: GuardedFetchResult): Extract<GuardedFetchResult, { ok: true }>['response'] {
  if (!r.ok) throw new Error(`expected a response, got ${JSON.stringify(r)}`);
  return r.response;
}

function countingResolver(answers: string[][]): Resolver & { calls: number } {
  const state = { calls: 0 };
  const fn = (): Promise<string[]> => {
    const a = answers[Math.min(state.calls, answers.length - 1)] as string[];
    state.calls += 1;
    return Promise.resolve(a);
  };
  const counted: Resolver & { calls?: number } = fn;
  Object.defineProperty(counted, 'calls', { get: () => state.calls });
  return counted as Resolver & { calls: number };
}

let v4: TestServer;
let v6: TestServer | undefined;
const fetches: ClosableGuardedFetch[] = [];

function guarded(policy: GuardPolicy, resolver?: Resolver): ClosableGuardedFetch {
  const f = createGuardedFetch(policy, resolver === undefined ? {} : { resolver });
  fetches.push(f);
  return f;
}

beforeAll(async () => {
  v4 = await startServer('127.0.0.1');
  if (await ipv6Available()) v6 = await startServer('::1');
});

afterEach(async () => {
  await Promise.all(fetches.splice(0).map((f) => f.close()));
});

afterAll(async () => {
  await v4.close();
  await v6?.close();
});

describe('refused without allowHosts', () => {
  it('127.0.0.1, localhost (a name resolving to loopback) and [::1] are refused, nothing arrives', async () => {
    const f = guarded({ allowHosts: [], allowHttp: true });
    const before = v4.seen.length;
    const a = await f({ url: `http://127.0.0.1:${v4.port}/echo`, timeoutMs: 2000 });
    expect(a).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', host: '127.0.0.1', range: '127.0.0.0/8 (loopback)' } });
    // The system resolver answers loopback for localhost.
    const b = await f({ url: `http://localhost:${v4.port}/echo`, timeoutMs: 2000 });
    expect(b).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', host: 'localhost' } });
    const c = await f({ url: `http://[::1]:${v6?.port ?? v4.port}/echo`, timeoutMs: 2000 });
    expect(c).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', host: '[::1]', address: '::1' } });
    const d = await f({ url: `http://[::ffff:127.0.0.1]:${v4.port}/echo`, timeoutMs: 2000 });
    expect(d).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range' } });
    // The same IPv4-mapped address in its hexadecimal spelling.
    const e = await f({ url: `http://[::ffff:7f00:1]:${v4.port}/echo`, timeoutMs: 2000 });
    expect(e).toMatchObject({
      ok: false,
      kind: 'refused',
      refusal: { reason: 'refused_range', address: '::ffff:7f00:1', range: '::ffff:0:0/96 (IPv4-mapped) embedding 127.0.0.1 in 127.0.0.0/8 (loopback)' },
    });
    expect(v4.seen.length).toBe(before);
  });

  it('numeric forms of an allowlisted loopback address are refused and never sent', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const before = v4.seen.length;
    for (const host of ['2130706433', '0x7f000001', '0x7f.0.0.1', '0177.0.0.1', '127.1', '017700000001']) {
      const r = await f({ url: `http://${host}:${v4.port}/echo`, timeoutMs: 2000 });
      expect(r, host).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'numeric_host', host, address: '127.0.0.1' } });
    }
    expect(v4.seen.length).toBe(before);
  });

  it('10.0.0.1 and 169.254.169.254 are refused at once, with no resolution and no connection attempt', async () => {
    let resolverCalls = 0;
    const f = guarded({ allowHosts: [], allowHttp: true }, () => {
      resolverCalls += 1;
      return Promise.resolve(['93.184.216.34']);
    });
    const watch = watchConnects();
    try {
      for (const url of ['http://10.0.0.1/', 'http://169.254.169.254/latest/meta-data/', 'https://169.254.169.254/', 'http://[::ffff:169.254.169.254]/']) {
        const started = performance.now();
        const r = await f({ url, method: 'POST', body: 'x', timeoutMs: 5000 });
        const elapsed = performance.now() - started;
        expect(r, url).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range' } });
        expect(elapsed, url).toBeLessThan(100);
      }
      expect(watch.count()).toBe(0);
      expect(resolverCalls).toBe(0);
    } finally {
      watch.stop();
    }
  });

  it('https only unless allowHttp, even for an allowlisted host', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: false });
    const r = await f({ url: `http://127.0.0.1:${v4.port}/echo`, timeoutMs: 2000 });
    expect(r).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'scheme' } });
  });
});

describe('allowed with allowHosts', () => {
  it('delivers method, headers and body exactly as given, adding only what HTTP/1.1 needs', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const body = JSON.stringify({ hello: 'world' });
    const r = await f({
      url: `http://127.0.0.1:${v4.port}/echo?x=1#frag`,
      method: 'POST',
      headers: { 'Content-Type': 'application/a2a+json', Authorization: 'Bearer abc', 'X-Keel-Delivery-Id': 'dlv-1', Host: 'evil.example' },
      body,
      timeoutMs: 2000,
    });
    const res = expectOk(r);
    expect(res.status).toBe(200);
    expect(res.address).toBe('127.0.0.1');
    expect(res.headers['x-reply']).toBe('yes');
    expect(res.headers['content-type']).toBe('application/json');
    expect(JSON.parse(res.body.toString('utf8'))).toEqual({ ok: true, path: '/echo' });
    expect(res.durationMs).toBeGreaterThanOrEqual(0);

    const got = v4.seen.at(-1) as Seen;
    expect(got.method).toBe('POST');
    expect(got.url).toBe('/echo?x=1');
    expect(got.body).toBe(body);
    expect(got.headers).toEqual({
      host: `127.0.0.1:${v4.port}`,
      connection: 'keep-alive',
      'content-type': 'application/a2a+json',
      authorization: 'Bearer abc',
      'x-keel-delivery-id': 'dlv-1',
      'content-length': String(Buffer.byteLength(body)),
    });
  });

  it('supports every method, Uint8Array bodies and HEAD', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    for (const method of ['GET', 'PUT', 'DELETE', 'PATCH', 'HEAD'] as const) {
      const r = await f({ url: `http://127.0.0.1:${v4.port}/m`, method, timeoutMs: 2000 });
      expect(expectOk(r).status, method).toBe(200);
      expect((v4.seen.at(-1) as Seen).method).toBe(method);
    }
    const bytes = new Uint8Array([1, 2, 3, 250]);
    expectOk(await f({ url: `http://127.0.0.1:${v4.port}/bytes`, method: 'PUT', body: bytes, timeoutMs: 2000 }));
    expect(Buffer.from((v4.seen.at(-1) as Seen).body, 'utf8').length).toBeGreaterThan(0);
    expect((v4.seen.at(-1) as Seen).headers['content-length']).toBe('4');
  });

  it("allowHosts: ['localhost'] allows http://localhost only, not http://127.0.0.1", async () => {
    const f = guarded({ allowHosts: ['localhost'], allowHttp: true });
    const ok = await f({ url: `http://localhost:${v4.port}/echo`, timeoutMs: 2000 });
    const res = expectOk(ok);
    expect(res.status).toBe(200);
    expect((v4.seen.at(-1) as Seen).headers.host).toBe(`localhost:${v4.port}`);
    const refused = await f({ url: `http://127.0.0.1:${v4.port}/echo`, timeoutMs: 2000 });
    expect(refused).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', host: '127.0.0.1' } });
  });

  it("allowHosts: ['127.0.0.1'] does not allow http://localhost", async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const r = await f({ url: `http://localhost:${v4.port}/echo`, timeoutMs: 2000 });
    expect(r).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', host: 'localhost' } });
  });

  it('[::1] is reachable when listed as ::1 or [::1]', async (ctx) => {
    if (v6 === undefined) ctx.skip();
    const server = v6 as TestServer;
    for (const entry of ['::1', '[::1]']) {
      const f = guarded({ allowHosts: [entry], allowHttp: true });
      const res = expectOk(await f({ url: `http://[::1]:${server.port}/echo`, timeoutMs: 2000 }));
      expect(res.address).toBe('::1');
      expect((server.seen.at(-1) as Seen).headers.host).toBe(`[::1]:${server.port}`);
    }
  });

  it('keeps connections alive between requests to the same origin', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const before = v4.connections;
    for (let i = 0; i < 6; i += 1) expectOk(await f({ url: `http://127.0.0.1:${v4.port}/ka${i}`, timeoutMs: 2000 }));
    // undici may open a second socket when the next request is dispatched a tick before the first
    // socket is marked idle; after that, the sockets are reused.
    expect(v4.connections - before).toBeGreaterThanOrEqual(1);
    expect(v4.connections - before).toBeLessThanOrEqual(2);
  });
});

describe('redirects', () => {
  it('a 302 to 169.254.169.254 is returned as a response and not followed', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const before = v4.seen.length;
    const watch = watchConnects();
    try {
      const res = expectOk(await f({ url: `http://127.0.0.1:${v4.port}/redirect`, method: 'POST', body: '{}', timeoutMs: 2000 }));
      expect(res.status).toBe(302);
      expect(res.headers.location).toBe('http://169.254.169.254/latest/meta-data/');
      expect(v4.seen.length - before).toBe(1);
      // At most the one connection to our server (zero if an idle keep-alive socket was reused).
      expect(watch.count()).toBeLessThanOrEqual(2);
    } finally {
      watch.stop();
    }
  });
});

describe('failures', () => {
  it('a server that never answers: failed/timeout within about timeoutMs', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const started = performance.now();
    const r = await f({ url: `http://127.0.0.1:${v4.port}/hang`, timeoutMs: 300 });
    const elapsed = performance.now() - started;
    expect(r).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'timeout' } });
    if (!r.ok && r.kind === 'failed') expect(r.failure.durationMs).toBeGreaterThanOrEqual(280);
    expect(elapsed).toBeGreaterThanOrEqual(280);
    expect(elapsed).toBeLessThan(1500);
  });

  it('the timeout also covers the body: headers then silence is failed/timeout', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const started = performance.now();
    const r = await f({ url: `http://127.0.0.1:${v4.port}/slow-body`, timeoutMs: 300 });
    expect(r).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'timeout' } });
    expect(performance.now() - started).toBeLessThan(1500);
  });

  it('a resolver that never answers is bounded by the timeout too', async () => {
    const f = guarded({ allowHosts: [], allowHttp: true }, () => new Promise<string[]>(() => undefined));
    const started = performance.now();
    const r = await f({ url: 'https://slow-dns.test/', timeoutMs: 300 });
    expect(r).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'timeout' } });
    expect(performance.now() - started).toBeLessThan(1500);
  });

  it('a body over maxResponseBytes is too_large (streamed and declared)', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const streamed = await f({ url: `http://127.0.0.1:${v4.port}/big`, timeoutMs: 5000, maxResponseBytes: 100_000 });
    expect(streamed).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'too_large' } });
    const declared = await f({ url: `http://127.0.0.1:${v4.port}/declared-big`, timeoutMs: 5000, maxResponseBytes: 4999 });
    expect(declared).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'too_large' } });
    const exact = expectOk(await f({ url: `http://127.0.0.1:${v4.port}/declared-big`, timeoutMs: 5000, maxResponseBytes: 5000 }));
    expect(exact.body.length).toBe(5000);
    const whole = expectOk(await f({ url: `http://127.0.0.1:${v4.port}/big`, timeoutMs: 5000 }));
    expect(whole.body.length).toBe(2 * 1024 * 1024);
    // HEAD: the declared length of the absent body does not count.
    const head = expectOk(await f({ url: `http://127.0.0.1:${v4.port}/declared-big`, method: 'HEAD', timeoutMs: 5000, maxResponseBytes: 10 }));
    expect(head.status).toBe(200);
    expect(head.body.length).toBe(0);
  });

  it('overLimit truncate: a body over maxResponseBytes is an answer with its first bytes (streamed and declared)', async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const streamed = expectOk(await f({ url: `http://127.0.0.1:${v4.port}/big`, timeoutMs: 5000, maxResponseBytes: 100_000, overLimit: 'truncate' }));
    expect(streamed.status).toBe(200);
    expect(streamed.body.length).toBe(100_000);
    const declared = expectOk(await f({ url: `http://127.0.0.1:${v4.port}/declared-big`, timeoutMs: 5000, maxResponseBytes: 4999, overLimit: 'truncate' }));
    expect(declared.body.length).toBe(4999);
  });

  it('connection refused is failed/connection', async () => {
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', () => resolve()));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const r = await f({ url: `http://127.0.0.1:${port}/`, timeoutMs: 2000 });
    expect(r).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'connection' } });
    if (!r.ok && r.kind === 'failed') expect(r.failure.message).toContain('ECONNREFUSED');
  });

  it("the caller's signal is failed/aborted", async () => {
    const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 50);
    const r = await f({ url: `http://127.0.0.1:${v4.port}/hang`, timeoutMs: 5000, signal: controller.signal });
    expect(r).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'aborted' } });
    const pre = await f({ url: `http://127.0.0.1:${v4.port}/echo`, timeoutMs: 5000, signal: AbortSignal.abort() });
    expect(pre).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'aborted' } });
  });

  it('a server that closes the connection mid-response is failed/connection', async () => {
    const rude = net.createServer((socket) => {
      socket.once('data', () => {
        socket.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort');
        socket.destroy();
      });
    });
    await new Promise<void>((resolve) => rude.listen(0, '127.0.0.1', () => resolve()));
    try {
      const f = guarded({ allowHosts: ['127.0.0.1'], allowHttp: true });
      const r = await f({ url: `http://127.0.0.1:${(rude.address() as AddressInfo).port}/`, timeoutMs: 2000 });
      expect(r).toMatchObject({ ok: false, kind: 'failed' });
      if (!r.ok && r.kind === 'failed') expect(['connection', 'protocol']).toContain(r.failure.class);
    } finally {
      await new Promise<void>((resolve) => rude.close(() => resolve()));
    }
  });
});

describe('DNS pinning', () => {
  // Tests only ever connect to loopback: the "rebind" answer is another loopback address.
  it('connects to the vetted address only, resolving once per request; a rebound answer never reuses the pinned socket', async () => {
    const resolver = countingResolver([['127.0.0.1'], ['127.0.0.2'], ['127.0.0.1']]);
    const f = guarded({ allowHosts: ['rebind.test'], allowHttp: true }, resolver);
    const before = v4.seen.length;
    expectOk(await f({ url: `http://rebind.test:${v4.port}/a`, timeoutMs: 2000 }));
    const second = await f({ url: `http://rebind.test:${v4.port}/b`, timeoutMs: 300 });
    expect(second.ok).toBe(false);
    const third = expectOk(await f({ url: `http://rebind.test:${v4.port}/c`, timeoutMs: 2000 }));
    expect(third.address).toBe('127.0.0.1');
    expect(resolver.calls).toBe(3);
    expect(v4.seen.slice(before).map((s) => s.url)).toEqual(['/a', '/c']);
  });

  it('a resolver answering [public, private] refuses without connecting', async () => {
    const resolver = countingResolver([['93.184.216.34', '10.0.0.1']]);
    const f = guarded({ allowHosts: [], allowHttp: true }, resolver);
    const watch = watchConnects();
    try {
      const r = await f({ url: 'https://mixed.test/', timeoutMs: 2000 });
      expect(r).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', host: 'mixed.test', address: '10.0.0.1', range: '10.0.0.0/8 (private)' } });
      expect(resolver.calls).toBe(1);
      expect(watch.count()).toBe(0);
    } finally {
      watch.stop();
    }
  });

  it('a host resolving to a private address is refused', async () => {
    const resolver = countingResolver([['192.168.1.10']]);
    const f = guarded({ allowHosts: [], allowHttp: true }, resolver);
    const r = await f({ url: 'http://internal.test/', timeoutMs: 2000 });
    expect(r).toMatchObject({ ok: false, kind: 'refused', refusal: { reason: 'refused_range', address: '192.168.1.10' } });
  });

  it('falls back to the next vetted address when the first refuses the connection', async () => {
    // 127.0.0.2 has nothing listening on this port (ECONNREFUSED on Linux); the second answer is ours.
    const resolver = countingResolver([['127.0.0.2', '127.0.0.1']]);
    const f = guarded({ allowHosts: ['fallback.test'], allowHttp: true }, resolver);
    const r = await f({ url: `http://fallback.test:${v4.port}/fb`, timeoutMs: 2000 });
    // On platforms where 127.0.0.2 is not routed the first attempt may hang instead; accept a timeout there.
    if (r.ok) expect(r.response.address).toBe('127.0.0.1');
    else expect(r).toMatchObject({ kind: 'failed', failure: { class: 'timeout' } });
    expect(resolver.calls).toBe(1);
  });

  it('TLS SNI and Host stay the host name while the socket goes to the vetted address', async () => {
    // A raw TCP listener stands in for a TLS server: it reads the ClientHello and hangs up.
    let hello: Buffer = Buffer.alloc(0);
    const tlsProbe = net.createServer((socket) => {
      socket.once('data', (chunk: Buffer) => {
        hello = chunk;
        socket.destroy();
      });
    });
    await new Promise<void>((resolve) => tlsProbe.listen(0, '127.0.0.1', () => resolve()));
    try {
      const resolver = countingResolver([['127.0.0.1']]);
      const f = guarded({ allowHosts: ['sni-check.test'], allowHttp: false }, resolver);
      const r = await f({ url: `https://sni-check.test:${(tlsProbe.address() as AddressInfo).port}/`, timeoutMs: 2000 });
      expect(r).toMatchObject({ ok: false, kind: 'failed', failure: { class: 'connection' } });
      expect(hello.length).toBeGreaterThan(0);
      expect(hello[0]).toBe(0x16); // TLS handshake record
      expect(hello.includes(Buffer.from('sni-check.test'))).toBe(true);
      expect(resolver.calls).toBe(1);
    } finally {
      await new Promise<void>((resolve) => tlsProbe.close(() => resolve()));
    }
  });
});
