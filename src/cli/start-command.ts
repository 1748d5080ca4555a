import type { Command } from 'commander';
import { createLogger } from '../log/logger.js';
import { startKeel } from '../runtime/start-keel.js';
import { telemetryWanted } from '../telemetry/telemetry-settings.js';
import { CliExit, EXIT, loadConfigOrExit, type GlobalOptions, type HarnessStartOptions } from './cli-support.js';

const STAGE_EXIT: Record<string, number> = { agents: EXIT.config, telemetry: EXIT.config, 'card signing': EXIT.config, database: EXIT.database, migrate: EXIT.database, 'master key': EXIT.masterKey, queue: EXIT.queue };

export function registerStartCommand(program: Command, globals: () => GlobalOptions, harness: HarnessStartOptions = {}): void {
  program
    .command('start')
    .description('start Keel: migrate, then serve HTTP and run the workers (embedded Postgres without database.url)')
    .option('--role <role>', 'all (default), api (HTTP and streams only) or worker (queues only)', 'all')
    .action(async (options: { role: string }) => {
      if (!['all', 'api', 'worker'].includes(options.role)) throw new CliExit(EXIT.usage, '--role must be all, api or worker');
      const config = loadConfigOrExit(globals());
      // Log lines carry trace_id and span_id when traces are exported (nothing is added otherwise).
      const logger = createLogger({}, process.stdout.isTTY, { traceContext: telemetryWanted(config.telemetry, process.env) });
      const startedAt = Date.now();
      const result = await startKeel(config, logger, { role: options.role as 'all' | 'api' | 'worker', ...harness });
      if (!result.ok) throw new CliExit(STAGE_EXIT[result.stage] ?? EXIT.failure, `start failed (${result.stage}): ${result.message}`);
      const { keel } = result;
      logger.info(
        {
          url: keel.url,
          ...(keel.grpcAddress ? { grpc: keel.grpcAddress } : {}),
          database: config.database.url ? 'external' : 'embedded',
          queue: keel.context.queues.backend.kind,
          role: keel.role,
          config: config.source ?? '(defaults)',
          readyMs: Date.now() - startedAt,
        },
        'keel is ready',
      );

      await new Promise<void>((resolve) => {
        let signals = 0;
        const onSignal = (signal: NodeJS.Signals) => {
          signals += 1;
          if (signals > 1) {
            logger.warn({ signal }, 'second signal: exiting now');
            process.exit(130);
          }
          logger.info({ signal }, 'shutting down');
          keel.stop().then(resolve, (error: Error) => {
            logger.error({ err: error }, 'shutdown failed');
            resolve();
          });
        };
        process.on('SIGINT', onSignal);
        process.on('SIGTERM', onSignal);
      });
      logger.info('keel stopped');
    });
}
