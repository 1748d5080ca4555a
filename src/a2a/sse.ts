import type { FastifyReply, FastifyRequest } from 'fastify';
import type { KeelLogger } from '../log/logger.js';
import { drainedWithin, WRITE_SLICE_BYTES, type CutOffReason, type StreamFlow } from './stream-flow.js';

// Server-Sent Events on a hijacked reply: every event carries `id: <journal sequence>` so a client
// can resume with Last-Event-ID. A comment line (every a2a.streams.keepAliveSeconds, between
// events only) keeps idle connections from timing out.
//
// Backpressure (stream-flow.ts): an event is written in slices while the reply holds less than
// a2a.streams.maxBufferedBytes the client has not taken; at the bound the writer waits for the
// client, and one that takes nothing for a2a.streams.stallTimeoutSeconds is cut off (the
// connection reset, so neither side holds it any longer). A stream that ended gives its client
// the same time to take its last bytes; its connection then stays open for another request for
// 5 s only.

/** How long a stream's connection is kept for another request after the stream ended. */
const ENDED_STREAM_KEEP_ALIVE_MS = 5_000;

/** A piece of an event's data line: small framing text, or a payload buffer shared by every stream. */
export type SsePiece = string | Buffer;

export type SseWriter = {
  /** Writes one event; false when the stream is gone or was cut off (nothing more should be sent). */
  send: (id: number, pieces: readonly SsePiece[]) => Promise<boolean>;
  close: () => void;
  signal: AbortSignal;
};

export type SseFlow = { flow: StreamFlow; logger: KeelLogger; context: Record<string, unknown> };

export function openSse(request: FastifyRequest, reply: FastifyReply, headers: Record<string, string>, flowOf: SseFlow): SseWriter {
  const { flow, logger, context } = flowOf;
  const { maxBufferedBytes, stallTimeoutMs, keepAliveMs } = flow.limits;
  reply.hijack();
  const raw = reply.raw;
  raw.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
    ...headers,
  });
  raw.flushHeaders?.();
  const connection = raw.socket;
  const abort = new AbortController();
  // A keep-alive line only goes out between events (an event is written in slices, with waits
  // between them: a comment line there would split its data line and corrupt it) and to a client
  // that is taking what it is sent.
  let inEvent = false;
  const keepAlive = setInterval(() => !inEvent && raw.writableLength < maxBufferedBytes && raw.write(': keep-alive\n\n'), keepAliveMs);
  keepAlive.unref();
  const done = () => {
    clearInterval(keepAlive);
    abort.abort();
  };
  request.raw.on('close', done);
  raw.on('close', done);
  let cut = false;
  const cutOff = (reason: CutOffReason) => {
    if (cut || raw.destroyed) return;
    cut = true;
    flow.cutOff('sse', reason, logger, { ...context, bufferedBytes: raw.writableLength });
    done();
    // A reset, not a FIN: a FIN waits behind the bytes the client does not take, so the
    // connection would stay open on both sides.
    const socket = raw.socket;
    if (socket && typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
    else raw.destroy();
  };
  /** Waits while the reply holds the bound; false when the client took nothing within the stall time. */
  const room = async (): Promise<boolean> => {
    while (raw.writableLength >= maxBufferedBytes) {
      if (abort.signal.aborted) return false;
      if (!(await drainedWithin(raw, stallTimeoutMs, abort.signal))) {
        if (!abort.signal.aborted) cutOff('stalled');
        return false;
      }
    }
    return !abort.signal.aborted;
  };
  const write = async (piece: SsePiece): Promise<boolean> => {
    if (typeof piece === 'string') {
      if (!(await room())) return false;
      raw.write(piece);
      return true;
    }
    // Slices of the shared buffer: no copy per stream, and paced with every other stream's
    // (StreamFlow.pace) so the event loop takes its other work between them.
    for (let start = 0; start < piece.length; start += WRITE_SLICE_BYTES) {
      const slice = piece.subarray(start, start + WRITE_SLICE_BYTES);
      await flow.pace(slice.length);
      if (!(await room())) return false;
      raw.write(slice);
    }
    return true;
  };
  return {
    signal: abort.signal,
    send: async (id, pieces) => {
      inEvent = true;
      try {
        if (!(await write(`id: ${id}\ndata: `))) return false;
        for (const piece of pieces) if (!(await write(piece))) return false;
        return await write('\n\n');
      } finally {
        inEvent = false;
      }
    },
    close: () => {
      done();
      if (cut || raw.destroyed) return;
      raw.end();
      // Once the last bytes are with the kernel the connection is kept for a reuse for a short
      // while only, then closed if no request came on it: a client that never reads (the issue's
      // 300 subscribers) would otherwise hold it until the server's keep-alive timeout, and no
      // client can use a stream's connection again before the stream has ended. Longer than the
      // idle time of undici's pool (4 s), which closes such a connection first.
      // (The socket as it was at the start: a response detaches from it once it finished.)
      // "No request came" is no byte received since the stream ended, not "no request in progress
      // when the time is up": a client sending request after request on the connection is between
      // two of them now and then, and one just sent would be cut off with the connection
      // (ECONNRESET; bench:a2a's streaming mode). Its next idle time is the server keep-alive's.
      const closeConnection = () => {
        const bytesReadAtEnd = connection?.bytesRead ?? 0;
        const timer = setTimeout(() => {
          if (!connection || connection.destroyed || connection.bytesRead !== bytesReadAtEnd) return;
          if (!(connection as { _httpMessage?: unknown })._httpMessage) connection.destroy();
        }, ENDED_STREAM_KEEP_ALIVE_MS);
        timer.unref();
      };
      if (raw.writableFinished) return closeConnection();
      // The stream ended: its last bytes get the stall time to be taken, then the connection goes.
      const timer = setTimeout(() => cutOff('unflushed_end'), stallTimeoutMs);
      timer.unref();
      raw.once('finish', () => {
        clearTimeout(timer);
        closeConnection();
      });
      raw.once('close', () => clearTimeout(timer));
    },
  };
}

export function lastEventId(request: FastifyRequest): number | undefined {
  const header = request.headers['last-event-id'];
  const value = Array.isArray(header) ? header[0] : header;
  if (value === undefined || !/^\d{1,9}$/.test(value.trim())) return undefined;
  return Number(value.trim());
}
