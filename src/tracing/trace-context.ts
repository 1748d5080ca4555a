import { randomFillSync } from 'node:crypto';
import { context, createTraceState, INVALID_SPANID, INVALID_TRACEID, isValidSpanId, isValidTraceId, ROOT_CONTEXT, trace, TraceFlags, type Context, type SpanContext } from '@opentelemetry/api';
import { tracingEnabled } from './tracing-switch.js';

// W3C Trace Context (traceparent, tracestate) read and written by Keel itself: @opentelemetry/api
// has no propagator of its own, and a context must be read whatever SDK is registered, or none.
// A malformed traceparent is no context (the request goes on as a new trace), never an error.

/** `version-traceid-parentid-flags`, lowercase hex; a later version may append fields after a dash. */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?$/;
/** The longest tracestate kept or sent (W3C: at least 512 characters must be propagated). */
const MAX_TRACESTATE = 512;

/** The span context a traceparent (and tracestate) names, or null for an absent or malformed one. */
export function parseTraceparent(traceparent: string | undefined, tracestate?: string | undefined): SpanContext | null {
  if (traceparent === undefined) return null;
  const match = TRACEPARENT.exec(traceparent.trim());
  if (!match) return null;
  const [, version, traceId, spanId, flags, rest] = match as unknown as [string, string, string, string, string, string | undefined];
  // Version ff is invalid; version 00 has exactly four fields.
  if (version === 'ff' || (version === '00' && rest !== undefined)) return null;
  // The pattern took 32 and 16 lowercase hex digits: all that is left to refuse is all zeros.
  if (traceId === INVALID_TRACEID || spanId === INVALID_SPANID) return null;
  const parsed: SpanContext = { traceId, spanId, traceFlags: Number.parseInt(flags, 16) & TraceFlags.SAMPLED, isRemote: true };
  const state = tracestate?.trim();
  if (state && state.length <= MAX_TRACESTATE) parsed.traceState = createTraceState(state);
  return parsed;
}

/** A span context as a version-00 traceparent. */
export function formatTraceparent(span: Pick<SpanContext, 'traceId' | 'spanId' | 'traceFlags'>): string {
  return `00-${span.traceId}-${span.spanId}-${(span.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED ? '01' : '00'}`;
}

/** The context a request's traceparent/tracestate make the parent of its server span: the root context when there is none or it is malformed. */
export function incomingContext(traceparent: string | undefined, tracestate: string | undefined): Context {
  const parent = parseTraceparent(traceparent, tracestate);
  return parent ? trace.setSpanContext(ROOT_CONTEXT, parent) : ROOT_CONTEXT;
}

/**
 * Random bytes for span ids, drawn from the CSPRNG 256 ids at a time: one randomBytes(8) per id was
 * a getrandom call per task, about 20 µs on a virtual machine and 2-3 % of a traced process's CPU.
 */
const ID_POOL = Buffer.allocUnsafeSlow(8 * 256);
let idPoolOffset = ID_POOL.length;

/** A new span id: 16 lowercase hex digits, never all zeros. */
export function newSpanId(): string {
  for (;;) {
    if (idPoolOffset === ID_POOL.length) {
      randomFillSync(ID_POOL);
      idPoolOffset = 0;
    }
    const id = ID_POOL.toString('hex', idPoolOffset, idPoolOffset + 8);
    idPoolOffset += 8;
    if (id !== INVALID_SPANID) return id;
  }
}

/**
 * The traceparent (and tracestate) of `from` (by default the active context) for an outgoing
 * request, added to `headers`; nothing while tracing is off or without a valid span context.
 */
export function injectTraceHeaders(headers: Record<string, string>, from?: Context): Record<string, string> {
  if (!tracingEnabled()) return headers;
  const span = trace.getSpanContext(from ?? context.active());
  if (!span || !isValidTraceId(span.traceId) || !isValidSpanId(span.spanId)) return headers;
  headers['traceparent'] = formatTraceparent(span);
  const state = span.traceState?.serialize();
  if (state) headers['tracestate'] = state;
  return headers;
}
