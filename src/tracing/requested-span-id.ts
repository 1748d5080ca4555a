/** A span id a caller asks the next started span to take; Keel's own SDK wiring (src/telemetry/) honours it, another SDK ignores it. */
let requested: string | undefined;
/** Starts a span through `start` asking the SDK to give it `spanId` (16 lowercase hex digits). */
export function startSpanWithId<T>(spanId: string, start: () => T): T {
  requested = spanId;
  try {
    return start();
  } finally {
    requested = undefined;
  }
}
/** The span id asked for by startSpanWithId, once. */
export function takeRequestedSpanId(): string | undefined {
  const id = requested;
  requested = undefined;
  return id;
}
