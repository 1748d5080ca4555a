import type { Tracer, TracerOptions, TracerProvider } from '@opentelemetry/api';
import { PassThroughTracer } from './pass-through-tracer.js';

/** The tracer Keel's own spans come from (src/tracing/). */
export const KEEL_TRACER_NAME = 'keel';

/**
 * The provider registered globally: Keel's tracer from the SDK, a pass-through tracer for every
 * other name (decision 0085: slonik, BullMQ and the like would otherwise add a span per statement
 * to every trace, SQL text included).
 */
export class KeelTracerProvider implements TracerProvider {
  private readonly passThrough = new PassThroughTracer();

  constructor(private readonly sdk: TracerProvider) {}

  getTracer(name: string, version?: string, options?: TracerOptions): Tracer {
    return name === KEEL_TRACER_NAME ? this.sdk.getTracer(name, version, options) : this.passThrough;
  }
}
