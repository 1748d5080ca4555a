import { createRequire } from 'node:module';
import { isSpanContextValid, trace } from '@opentelemetry/api';
import { pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino';
import type { default as prettyFactory, PrettyOptions } from 'pino-pretty';
import { tracingEnabled } from '../tracing/tracing-switch.js';

export type KeelLogger = Logger<'notice'>;

/**
 * How log lines are written to stdout: pino-pretty's one-line summaries for a person at a terminal,
 * JSON lines for everything else (a pipe, a file, a log collector, the tests and the fault suite,
 * which parse the JSON of child processes).
 */
export type LogOutput = { format: 'json' } | { format: 'pretty'; options: PrettyOptions };

export function logOutputFor(isTTY: boolean | undefined): LogOutput {
  if (isTTY !== true) return { format: 'json' };
  return {
    format: 'pretty',
    options: {
      // A stream built in this process does not learn pino's custom levels by itself.
      customLevels: { notice: 35 },
      useOnlyCustomProps: false,
      translateTime: 'SYS:HH:MM:ss.l',
      ignore: 'pid,hostname,service',
      // Synchronous like pino's own stdout destination: the last lines before an exit are written.
      sync: true,
    },
  };
}

/**
 * The active span's ids, for a log line written inside it (`trace_id`, `span_id`, as the
 * OpenTelemetry log data model names them); nothing outside a span or when no SDK is wired.
 */
export function traceLogFields(): Record<string, string> {
  if (!tracingEnabled()) return {};
  const span = trace.getActiveSpan();
  if (span === undefined) return {};
  const ids = span.spanContext();
  return isSpanContextValid(ids) ? { trace_id: ids.traceId, span_id: ids.spanId } : {};
}

export type LoggerExtras = {
  /** Add the active span's trace_id and span_id to each line (only a process that exports traces asks: the others pay nothing). */
  traceContext?: boolean;
  /** Where JSON lines go instead of stdout (a test reading them). */
  destination?: DestinationStream;
};

// `notice` sits between info and warn: expected but noteworthy events, such as a late settle that
// the guarded write refused.
export function createLogger(options: LoggerOptions<'notice'> = {}, isTTY: boolean | undefined = process.stdout.isTTY, extras: LoggerExtras = {}): KeelLogger {
  const settings: LoggerOptions<'notice'> = {
    ...(extras.traceContext === true ? { mixin: traceLogFields } : {}),
    level: process.env.KEEL_LOG_LEVEL ?? 'info',
    customLevels: { notice: 35 },
    base: { service: 'keel' },
    redact: {
      paths: ['*.authorization', '*.Authorization', '*.token', '*.credentials', '*.password', 'headers.authorization'],
      censor: '***',
    },
    ...options,
  };
  const output = logOutputFor(isTTY);
  if (extras.destination) return pino<'notice'>(settings, extras.destination);
  return output.format === 'pretty' ? pino<'notice'>(settings, prettyStream(output.options)) : pino<'notice'>(settings);
}

/**
 * pino-pretty's stream, its module loaded only for a person at a terminal: a process that writes
 * JSON lines (every server behind a supervisor, the tests' and the fault suite's children) does
 * not pay for importing it at each start.
 */
function prettyStream(options: PrettyOptions): DestinationStream {
  const build = createRequire(import.meta.url)('pino-pretty') as typeof prettyFactory;
  return build(options);
}

export function silentLogger(): KeelLogger {
  return createLogger({ level: 'silent' }, false);
}
