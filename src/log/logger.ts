import { pino, type Logger, type LoggerOptions } from 'pino';
import pretty, { type PrettyOptions } from 'pino-pretty';

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

// `notice` sits between info and warn: expected but noteworthy events, such as a late settle that
// the guarded write refused.
export function createLogger(options: LoggerOptions<'notice'> = {}, isTTY: boolean | undefined = process.stdout.isTTY): KeelLogger {
  const settings: LoggerOptions<'notice'> = {
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
  return output.format === 'pretty' ? pino<'notice'>(settings, pretty(output.options)) : pino<'notice'>(settings);
}

export function silentLogger(): KeelLogger {
  return createLogger({ level: 'silent' }, false);
}
