import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

// The fault suite's peers on 127.0.0.1, living in the test process (faults never touch them):
// a fake OpenAI-compatible model that echoes the last user message after a short delay, so every
// task has a result of its own to check, and a push receiver that records every request and may
// be told to fail.

type Closable = { close: () => Promise<void> };

/** Listens on `host` (127.0.0.1, or the test's own address on a test network). */
async function listen(server: Server, sockets: Set<Socket>, host = '127.0.0.1'): Promise<{ port: number; close: () => Promise<void> }> {
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function readBody(request: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    request.on('error', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
}

export type FakeModel = Closable & { baseUrl: string; calls: () => number };

/**
 * POST /v1/chat/completions → "echo: <last user message>" after minDelayMs..maxDelayMs, and not
 * before `answerAfter` settles when given (a test that measures while its tasks wait ends the wait
 * when it is done, instead of sleeping through a fixed delay).
 */
export async function startFakeModel(options: { minDelayMs: number; maxDelayMs: number; host?: string; answerAfter?: Promise<unknown> }): Promise<FakeModel> {
  let calls = 0;
  const server = createServer((request, response) => {
    void (async () => {
      const raw = await readBody(request);
      calls += 1;
      let text = '';
      try {
        const body = JSON.parse(raw) as { messages?: Array<{ role: string; content: string | null }> };
        text = [...(body.messages ?? [])].reverse().find((message) => message.role === 'user')?.content ?? '';
      } catch {
        response.writeHead(400).end();
        return;
      }
      const delay = options.minDelayMs + Math.random() * (options.maxDelayMs - options.minDelayMs);
      await new Promise((resolve) => setTimeout(resolve, delay));
      await options.answerAfter;
      if (response.destroyed) return;
      response.writeHead(200, { 'content-type': 'application/json' });
      response.end(
        JSON.stringify({
          id: `fake-${calls}`,
          object: 'chat.completion',
          choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: `echo: ${text}` } }],
          usage: { prompt_tokens: 1, completion_tokens: 1 },
        }),
      );
    })();
  });
  const sockets = new Set<Socket>();
  const host = options.host ?? '127.0.0.1';
  const { port, close } = await listen(server, sockets, host);
  return { baseUrl: `http://${host}:${port}/v1`, calls: () => calls, close };
}

/** What the receiver does with one request. */
export type ReceiverAction = { kind: 'ok'; delayMs?: number } | { kind: 'status'; status: number; delayMs?: number } | { kind: 'reset' };

export type Receipt = {
  deliveryId: string;
  /** The X-A2A-Event-Sequence header: the journal sequence of the event delivered. */
  sequence: string;
  /** When the body had arrived. */
  at: number;
  /** When a 2xx answer was written completely (the sender may count it as delivered), else null. */
  ackedAt: number | null;
  action: ReceiverAction['kind'];
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  body: any;
};

export type PushReceiver = Closable & {
  url: string;
  receipts: Receipt[];
  inFlight: () => number;
  setPolicy: (policy: () => ReceiverAction) => void;
};

export async function startPushReceiver(policy: () => ReceiverAction = () => ({ kind: 'ok' }), host = '127.0.0.1'): Promise<PushReceiver> {
  let current = policy;
  const receipts: Receipt[] = [];
  let inFlight = 0;
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    inFlight += 1;
    let counted = true;
    const done = () => {
      if (counted) inFlight -= 1;
      counted = false;
    };
    response.on('close', done);
    void (async () => {
      const raw = await readBody(request);
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch {
        body = undefined;
      }
      const action = current();
      const receipt: Receipt = {
        deliveryId: String(request.headers['x-keel-delivery-id'] ?? ''),
        sequence: String(request.headers['x-a2a-event-sequence'] ?? ''),
        at: Date.now(),
        ackedAt: null,
        action: action.kind,
        body,
      };
      receipts.push(receipt);
      if (action.kind === 'reset') {
        request.socket.destroy();
        done();
        return;
      }
      if (action.delayMs) await new Promise((resolve) => setTimeout(resolve, action.delayMs));
      if (response.destroyed || request.socket.destroyed) return done();
      const status = action.kind === 'ok' ? 200 : action.status;
      response.writeHead(status, { 'content-type': 'text/plain' });
      response.end('', () => {
        if (status >= 200 && status < 300) receipt.ackedAt = Date.now();
        done();
      });
    })();
  });
  const sockets = new Set<Socket>();
  const { port, close } = await listen(server, sockets, host);
  return {
    url: `http://${host}:${port}/hook`,
    receipts,
    inFlight: () => inFlight,
    setPolicy: (next) => {
      current = next;
    },
    close,
  };
}
