import { context, ROOT_CONTEXT, trace, TraceFlags } from '@opentelemetry/api';
import { afterEach, describe, expect, it } from 'vitest';
import { formatTraceparent, incomingContext, injectTraceHeaders, parseTraceparent } from '../../../src/tracing/trace-context.js';
import { stateName } from '../../../src/tracing/statechart-trace.js';
import { setTracingEnabled } from '../../../src/tracing/tracing-switch.js';

// W3C Trace Context read and written without any SDK registered (src/tracing/trace-context.ts).

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const SPAN = '00f067aa0ba902b7';

afterEach(() => setTracingEnabled(false));

describe('parseTraceparent', () => {
  it('reads a version-00 traceparent with its flags and tracestate', () => {
    const parsed = parseTraceparent(`00-${TRACE}-${SPAN}-01`, 'congo=t61rcWkgMzE, rojo=00f067aa0ba902b7');
    expect(parsed).toMatchObject({ traceId: TRACE, spanId: SPAN, traceFlags: TraceFlags.SAMPLED, isRemote: true });
    expect(parsed?.traceState?.get('rojo')).toBe('00f067aa0ba902b7');
    expect(parseTraceparent(`00-${TRACE}-${SPAN}-00`)?.traceFlags).toBe(TraceFlags.NONE);
  });

  it('accepts a later version with more fields, keeping the four it knows', () => {
    expect(parseTraceparent(`cc-${TRACE}-${SPAN}-01-what-comes-next`)).toMatchObject({ traceId: TRACE, spanId: SPAN });
  });

  it.each([
    ['absent', undefined],
    ['empty', ''],
    ['garbage', 'not a traceparent'],
    ['short trace id', `00-${TRACE.slice(1)}-${SPAN}-01`],
    ['all-zero trace id', `00-${'0'.repeat(32)}-${SPAN}-01`],
    ['all-zero span id', `00-${TRACE}-${'0'.repeat(16)}-01`],
    ['uppercase', `00-${TRACE.toUpperCase()}-${SPAN}-01`],
    ['version ff', `ff-${TRACE}-${SPAN}-01`],
    ['version 00 with a fifth field', `00-${TRACE}-${SPAN}-01-extra`],
  ])('ignores a malformed one (%s): no context, no error', (_name, value) => {
    expect(parseTraceparent(value)).toBeNull();
    expect(trace.getSpanContext(incomingContext(value, 'a=b'))).toBeUndefined();
  });

  it('formats what it parses', () => {
    expect(formatTraceparent(parseTraceparent(`00-${TRACE}-${SPAN}-01`)!)).toBe(`00-${TRACE}-${SPAN}-01`);
  });
});

describe('injectTraceHeaders', () => {
  const parent = trace.setSpanContext(ROOT_CONTEXT, parseTraceparent(`00-${TRACE}-${SPAN}-01`, 'a=b')!);

  it('adds nothing while tracing is off', () => {
    expect(injectTraceHeaders({}, parent)).toEqual({});
  });

  it('adds traceparent and tracestate of the given (or active) context while tracing is on', () => {
    setTracingEnabled(true);
    expect(injectTraceHeaders({ accept: 'x' }, parent)).toEqual({ accept: 'x', traceparent: `00-${TRACE}-${SPAN}-01`, tracestate: 'a=b' });
    // No context manager registered: the active context is the root, which has no span.
    expect(injectTraceHeaders({}, context.active())).toEqual({});
  });
});

describe('stateName', () => {
  it('names nested and parallel states', () => {
    expect(stateName('idle')).toBe('idle');
    expect(stateName({ working: 'drafting' })).toBe('working.drafting');
    expect(stateName({ left: { a: 'b' }, right: 'c' })).toBe('left.a.b,right.c');
  });
});
