import type { KeelLogger } from '../log/logger.js';
import type { TelemetryIdentity } from './telemetry-sdk.js';
import { resolveTelemetry, type TelemetryConfig } from './telemetry-settings.js';

/** The SDK wired at start, or nothing to stop when tracing is off. */
export type Telemetry = {
  /** Whether an SDK was wired. */
  wired: boolean;
  /** Flushes the spans still buffered and shuts the SDK down within telemetry.shutdownTimeoutMs. */
  shutdown: () => Promise<void>;
};

export type StartTelemetryResult = { ok: true; telemetry: Telemetry } | { ok: false; message: string };

const OFF: Telemetry = { wired: false, shutdown: async () => undefined };

/**
 * Wires the OpenTelemetry SDK when the config or the OTEL_* variables ask for it. With tracing off
 * the SDK's modules are never imported (a dynamic import below), so start-up and the hot path pay
 * nothing for them.
 */
export async function startTelemetry(config: TelemetryConfig, env: NodeJS.ProcessEnv, identity: TelemetryIdentity, logger: KeelLogger): Promise<StartTelemetryResult> {
  const resolved = resolveTelemetry(config, env);
  if (!resolved.ok) return { ok: false, message: resolved.problems.join('\n') };
  const settings = resolved.settings;
  if (settings === null) return { ok: true, telemetry: OFF };
  const { wireTelemetry } = await import('./telemetry-sdk.js');
  const wired = wireTelemetry(settings, identity);
  if (!wired.ok) return { ok: false, message: wired.message };
  logger.info(
    { tracesUrl: settings.tracesUrl, protocol: settings.protocol, serviceName: settings.resourceAttributes['service.name'], sampler: settings.sampler },
    'exporting traces over OTLP/HTTP',
  );
  return {
    ok: true,
    telemetry: {
      wired: true,
      shutdown: async () => {
        const outcome = await wired.shutdown();
        if (outcome !== 'flushed') logger.warn({ outcome, shutdownTimeoutMs: settings.shutdownTimeoutMs }, 'the last spans were not all exported at shutdown');
      },
    },
  };
}
