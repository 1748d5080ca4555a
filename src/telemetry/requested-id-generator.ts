import type { IdGenerator } from '@opentelemetry/sdk-trace-base';
import { takeRequestedSpanId } from '../tracing/requested-span-id.js';

const SPAN_ID = /^(?!0{16})[0-9a-f]{16}$/;

/**
 * The SDK's id generator: a span id asked for through src/tracing/requested-span-id.ts (a span
 * whose id was fixed before it started, so that it can be stored and parented across a restart)
 * when it is a valid one, else the SDK's random ids.
 */
export class RequestedIdGenerator implements IdGenerator {
  constructor(private readonly random: IdGenerator) {}

  generateTraceId(): string {
    return this.random.generateTraceId();
  }

  generateSpanId(): string {
    const requested = takeRequestedSpanId();
    return requested !== undefined && SPAN_ID.test(requested) ? requested : this.random.generateSpanId();
  }
}
