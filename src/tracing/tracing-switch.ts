/** Whether an OpenTelemetry SDK was wired at start (src/telemetry/); the hot path skips all tracing work when not. */
let enabled = false;
export function setTracingEnabled(value: boolean): void {
  enabled = value;
}
export function tracingEnabled(): boolean {
  return enabled;
}
