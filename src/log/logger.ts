import { pino, type Logger, type LoggerOptions } from 'pino';

export type KeelLogger = Logger<'notice'>;

// `notice` sits between info and warn: expected but noteworthy events, such as a late settle that
// the guarded write refused.
export function createLogger(options: LoggerOptions<'notice'> = {}): KeelLogger {
  return pino<'notice'>({
    level: process.env.KEEL_LOG_LEVEL ?? 'info',
    customLevels: { notice: 35 },
    base: { service: 'keel' },
    redact: {
      paths: ['*.authorization', '*.Authorization', '*.token', '*.credentials', '*.password', 'headers.authorization'],
      censor: '***',
    },
    ...options,
  });
}

export function silentLogger(): KeelLogger {
  return createLogger({ level: 'silent' });
}
