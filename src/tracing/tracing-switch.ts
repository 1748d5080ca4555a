// Whether Keel makes spans at all: set once at start by the SDK wiring (src/telemetry/) after it
// registered its tracer provider. Off (the default), every instrumented place skips its tracing
// work after reading this one flag: no span, no context read, no traceparent stored or sent
// (docs/decisions/0081-trace-context-stored-only-while-tracing.md).

let enabled = false;
/** Counts the switch's turns, so that what is cached from the registered provider is read again after one. */
let generation = 0;

/** Turns Keel's spans on or off (the SDK wiring calls it with true once its provider is registered). */
export function setTracingEnabled(value: boolean): void {
  enabled = value;
  generation += 1;
}

/** How many times tracing was turned on or off: a tracer got from the provider stays valid while it is unchanged. */
export function tracingGeneration(): number {
  return generation;
}

/** Whether a tracer provider is registered and Keel makes spans. */
export function tracingEnabled(): boolean {
  return enabled;
}
