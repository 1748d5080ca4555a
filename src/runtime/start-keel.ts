import { hostname } from 'node:os';
import type { A2AError } from '../a2a/a2a-error.js';
import { limitExceeded } from '../a2a/client-limit-error.js';
import { randomBytes } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import type { FastifyInstance } from 'fastify';
import type { KeelConfig } from '../config/load-config.js';
import { migrate } from '../db/migrate.js';
import { probeDatabase } from '../db/pool.js';
import { DatabaseReturn } from '../db/database-return.js';
import { buildHttpServer } from '../http/http-server.js';
import type { KeelLogger } from '../log/logger.js';
import { KeelQueues } from '../queue/keel-queues.js';
import { queueBackendFor } from '../queue/queue-backend-for.js';
import { onceDatabaseAnswers } from '../queue/once-database-answers.js';
import { prepareSealing } from '../sealing/master-key-store.js';
import { ensureLocalClient } from '../auth/local-client.js';
import { createMaintenanceProcessor, scheduleMaintenance } from '../../workers/maintenance.js';
import { createRunExecutor } from '../../workers/run-executor.js';
import { createProjectorProcessor } from '../../workers/projection-processor.js';
import { createPushDeliveryProcessor } from '../../workers/push-delivery.js';
import { wakeHeadsOfNewDeliveries } from '../push/wake-deliveries.js';
import { inboxJobId } from '../queue/job-ids.js';
import { createInboxReconcileProcessor } from '../../workers/inbox-reconcile.js';
import { registerInboxRoutes } from '../remote/inbox-routes.js';
import { createRemoteAgentTool, type RemoteToolDeps } from '../remote/remote-agent-tool.js';
import { RemoteAgents } from '../remote/remote-agents.js';
import { cardSignerFor, loadCardKeyFiles } from '../cards/card-trust.js';
import { registerOperatorSurfaces } from '../ui/operator-surfaces.js';
import { A2AService, streamFlowOf } from '../a2a/a2a-service.js';
import { TaskRevisionCache } from '../tasks/task-revision-cache.js';
import { refusedRequestAnswer, registerA2ARoutes } from '../a2a/a2a-routes.js';
import { hostPort } from '../a2a/agent-card.js';
import type { GrpcServer } from '../a2a/grpc-binding.js';
import { ClientAuthenticator } from '../auth/client-authenticator.js';
import { JournalListener } from '../tasks/journal-listener.js';
import { RUN_CANCEL_CHANNEL } from '../runs/run-repository.js';
import { ProjectionScheduler } from '../tasks/task-projector.js';
import { TaskCreations } from '../writes/task-creation.js';
import { CompletionBatch } from '../writes/completion-batch.js';
import { TaskWriteBatch } from '../writes/task-write-batch.js';
import { TaskIntake } from '../writes/task-intake.js';
import { writePathFor } from '../writes/write-path.js';
import { HotPathMetrics } from '../metrics/hot-path-metrics.js';
import { ClientLimitMetrics } from '../metrics/client-limit-metrics.js';
import { ClientLimits } from '../limits/client-limits.js';
import { ActiveRunCounts } from '../limits/active-run-counts.js';
import { countActiveTasksByOwner } from '../tasks/task-counts.js';
import { problemList } from '../config/module-load-error.js';
import { buildAgentRegistry, unretainableAgents, type AgentRegistry } from '../agents/agent-registry.js';
import { createGuardedFetch, type ClosableGuardedFetch } from '../net/guarded-fetch.js';
import { deliveryOptionsFor, type PushTestTimings } from '../push/delivery-options.js';
import { DestinationGate, type PushDestinations } from '../push/destination-gate.js';
import { pushDestinationMetrics } from '../metrics/push-destination-metrics.js';
import { runSlotMetrics } from '../metrics/run-slot-metrics.js';
import type { KeelContext } from '../context/keel-context.js';
import { recordMachineDefinitions } from '../statecharts/definition-repository.js';
import { openDatabase, type DatabaseHandle } from './open-database.js';
import { EventLoopLag } from '../health/event-loop-lag.js';
import { startTelemetry } from '../telemetry/start-telemetry.js';

/** How long the projection of a claim waits for the run's next commit (a fast run's settle). */
const CLAIM_COALESCE_MS = 40;
/** At most this many new tasks in one creation statement (group commit, docs/decisions/0026-group-commit.md). */
const CREATION_BATCH = 64;
/** At most this many completions in one transaction (it holds their run and task locks until it commits). */
const COMPLETION_BATCH = 32;
/** Batches of each kind in flight at once: one is written while the other waits for its WAL flush. */
const BATCH_LANES = 2;
/** At most this many creations and held completions in one statement, when a process writes both (decision 0048). */
const TOGETHER_BATCH = 64;
/** /readyz answers within this bound (both probes run at once) even when a dependency hangs. */
const READINESS_TIMEOUT_MS = 2000;
/** /livez answers 503 when the event loop lags more than this (a process this stuck is restarted). */
const LIVENESS_MAX_LAG_MS = 10_000;
/** At shutdown, gRPC calls still open this long after the streams were told to end are cut. */
const GRPC_CLOSE_GRACE_MS = 10_000;

export type KeelInstance = {
  role: 'all' | 'api' | 'worker';
  context: KeelContext;
  projector: ProjectionScheduler;
  listener: JournalListener;
  registry: AgentRegistry;
  fetch: ClosableGuardedFetch;
  http: FastifyInstance;
  /** The address the HTTP server listens on. */
  url: string;
  /** The `host:port` the gRPC binding listens on, or null when it is off (or this process serves no API). */
  grpcAddress: string | null;
  stop: () => Promise<void>;
};

export type StartOptions = {
  env?: NodeJS.ProcessEnv;
  sweepEveryMs?: number;
  /** Which roles this process runs (`keel start --role`). */
  role?: 'all' | 'api' | 'worker';
  /** Where one-time notices go (the local client's token); stderr by default. */
  notice?: (text: string) => void;
  /** Skip the HTTP listener (workers only). */
  listen?: boolean;
  /**
   * Push timings beyond the configuration's bounds, for Keel's own test suites only: passed by the
   * test harness's starters, never read from a file, the environment or `keel start`'s arguments
   * (docs/decisions/0052-push-attempts-capped-and-test-timings-by-the-harness.md).
   */
  pushTestTimings?: PushTestTimings;
};

export type StartResult = { ok: true; keel: KeelInstance } | { ok: false; stage: string; message: string };

/**
 * Boots one Keel process holding every role: database (embedded or external), migrations, sealing,
 * queues and their workers, and the HTTP server. Each stage that fails stops start-up with a
 * message naming it, after releasing what the earlier stages took.
 */
export async function startKeel(config: KeelConfig, logger: KeelLogger, options: StartOptions = {}): Promise<StartResult> {
  const env = options.env ?? process.env;
  const role = options.role ?? 'all';
  // Agents first: a config whose tools, guardrails or providers cannot be built stops start-up
  // before anything else is touched.
  const fetch = createGuardedFetch(config.security.addressGuard);
  let remoteToolDeps: RemoteToolDeps | null = null;
  const remoteTool = createRemoteAgentTool(config, () => remoteToolDeps);
  const built = await buildAgentRegistry(config, { fetch, env, extraTools: [remoteTool] });
  if (!built.ok) {
    await fetch.close();
    return { ok: false, stage: 'agents', message: `${built.problems.length} problem(s):\n${problemList(built.problems)}` };
  }
  const registry = built.registry;
  // Card signing and remote card keys read from files: a missing or wrong file stops start-up here too.
  const cardKeys = loadCardKeyFiles(config);
  if (!cardKeys.ok) {
    await fetch.close();
    return { ok: false, stage: 'card signing', message: cardKeys.problems.join('\n') };
  }
  // Traces (docs/observability.md, "Traces"): the SDK is wired now, when configured, so that every
  // span of this process goes to the collector; it is the last thing stopped.
  const instanceId = `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  const telemetry = await startTelemetry(config.telemetry, env, { role, instanceId }, logger);
  if (!telemetry.ok) {
    await fetch.close();
    return { ok: false, stage: 'telemetry', message: telemetry.message };
  }
  const tracing = telemetry.telemetry;
  for (const name of unretainableAgents(registry)) {
    logger.warn({ agent: name }, 'agent keeps no result under the privacy policy (answer level metadata or none): A2A requests to it are refused with RESULT_NOT_RETAINABLE');
  }
  const opened = await openDatabase(config, logger, 'server', { applicationName: 'keel', maximumPoolSize: config.database.maxConnections });
  if (!opened.ok) {
    await fetch.close();
    await tracing.shutdown();
    return { ok: false, stage: 'database', message: opened.message };
  }
  const database: DatabaseHandle = opened.database;
  const cleanup: Array<() => Promise<void>> = [() => tracing.shutdown(), () => fetch.close(), () => database.close()];
  const fail = async (stage: string, message: string): Promise<StartResult> => {
    for (const step of cleanup.reverse()) await step().catch(() => undefined);
    return { ok: false, stage, message };
  };

  const migrated = await migrate(database.url).catch((error: Error) => ({ ok: false as const, message: error.message }));
  if (!migrated.ok) return fail('migrate', migrated.message);
  if (migrated.applied.length > 0) logger.info({ applied: migrated.applied }, 'migrations applied');
  // Every definition a run may have started with stays comparable (`keel machines diff`).
  const recorded = await recordMachineDefinitions(database.pool, registry).then(() => null, (error: Error) => error);
  if (recorded) return fail('database', `cannot record the statechart agents' machine definitions: ${recorded.message}`);

  const sealing = await prepareSealing(database.pool, config.security.masterKeyFile, env);
  if (!sealing.ok) return fail('master key', sealing.message);
  if (sealing.created) logger.info({ file: config.security.masterKeyFile, keyId: sealing.sealer.activeKeyId }, 'created a new master key file');
  const cardSigning = cardSignerFor(config, cardKeys.fileSigner, sealing.sealer);
  if (cardSigning && !cardSigning.ok) return fail('card signing', cardSigning.message);
  const localClient = await ensureLocalClient(database.pool, config, logger, options.notice ? { write: options.notice } : {});
  if (localClient.action === 'failed') return fail('clients', localClient.message);

  const queues = new KeelQueues(queueBackendFor(config, database.url), logger, { lockDurationMs: Math.min(30_000, config.runs.leaseSeconds * 1000) });
  cleanup.push(() => queues.close());
  const queueReady = await queues.waitUntilReady().then(() => null, (error: Error) => error);
  if (queueReady) return fail('queue', `queue backend (${queues.backend.kind}) is not reachable: ${queueReady.message}`);

  const context: KeelContext = {
    config,
    pool: database.pool,
    queues,
    sealer: sealing.sealer,
    logger,
    workerId: instanceId,
  };

  const remotes = new RemoteAgents(config.remoteAgents, { fetch, pool: database.pool, sealer: sealing.sealer, logger, env, cardTrust: cardKeys.remoteTrust });
  remoteToolDeps = { pool: database.pool, sealer: sealing.sealer, remotes, config };

  // Committed run revisions are projected into the journal right away in this process; the
  // projector queue and the sweeper repair whatever a crash leaves behind.
  const projectionOptions = {
    push: { deadlineHours: config.push.deadlineHours, maxPendingPerConfig: config.push.maxPendingPerConfig, maxPendingTotal: config.push.maxPendingTotal },
  };
  // A wake-up for the head of each config that got deliveries (the rest follow in order).
  const enqueueDeliveries = (result: { deliveryIds: string[] }) => wakeHeadsOfNewDeliveries({ pool: database.pool, queues }, result.deliveryIds);
  const projector = new ProjectionScheduler(database.pool, sealing.sealer, logger, projectionOptions, enqueueDeliveries);
  const listener = new JournalListener(database.url, logger, config.database.linkTimeoutSeconds);
  const listening = await listener.start().then(() => null, (error: Error) => error);
  if (listening) return fail('database', `cannot LISTEN for journal notifications: ${listening.message}`);
  cleanup.push(() => listener.stop());

  const shutdown = new AbortController();
  // Every open stream listens to this one signal (and removes its listener when it ends), so
  // hundreds at once are normal, not a leak: no MaxListenersExceededWarning for them.
  setMaxListeners(0, shutdown.signal);
  const hotPath = new HotPathMetrics();
  const limitMetrics = new ClientLimitMetrics();
  // This process's push destinations (none unless it runs the push worker), for /metrics and /ui/push.
  const pushDestinations: PushDestinations = { gate: null };
  let pushGate: DestinationGate | null = null;
  // A process that receives tasks and runs them fast writes their creations and their held
  // completions together (docs/decisions/0048-creations-and-completions-in-one-statement.md).
  const writePath = writePathFor(config.runs, role);
  if (config.runs.directWrites) logger.warn('runs.directWrites is on: no fast path and no group commit (every creation and completion written alone); for diagnosis only');
  const taskWrites =
    writePath.fastPath && writePath.groupCommit
      ? new TaskWriteBatch(database.pool, sealing.sealer, {
          maxBatch: TOGETHER_BATCH,
          lanes: BATCH_LANES,
          // One statement at a time gathers both kinds: the creations that arrived while it ran and
          // the completions its own creations' runs submitted. The second lane is for a backlog.
          spareLaneBacklog: TOGETHER_BATCH / 2,
          onBatch: ({ creations, completions }) => {
            if (creations > 0) hotPath.batch('creation', creations);
            if (completions > 0) hotPath.batch('completion', completions);
          },
          onWritten: (kind, waitedMs, writeMs) => hotPath.batchWritten(kind, waitedMs, writeMs),
        })
      : null;
  let executor: ReturnType<typeof createRunExecutor> | null = null;
  let runsWorker: { close: () => Promise<void>; concurrency: number } | null = null;
  if (role !== 'api') {
    executor = createRunExecutor(
      context,
      registry,
      fetch,
      {
        leaseMs: config.runs.leaseSeconds * 1000,
        heartbeatMs: config.runs.heartbeatSeconds * 1000,
        providerAttempts: config.runs.providerAttempts,
        providerBackoffMs: config.runs.providerBackoffMs,
        maxBackoffMs: 60_000,
        projection: projectionOptions,
        // Fast and queued runs share runs.concurrency: the queue's worker takes what fast runs leave
        // (at least one, so follow-ups and requeued runs never wait for a stream of new tasks).
        fastSlots: writePath.fastPath ? Math.max(0, config.runs.concurrency - 1) : 0,
        concurrency: config.runs.concurrency,
        completions: new CompletionBatch(database.pool, sealing.sealer, logger, {
          maxBatch: COMPLETION_BATCH,
          lanes: BATCH_LANES,
          direct: !writePath.groupCommit,
          onBatch: (size) => hotPath.batch('completion', size),
          onWritten: (waitedMs, writeMs) => hotPath.batchWritten('completion', waitedMs, writeMs),
        }, taskWrites ?? undefined),
        onRunStarted: (path) => hotPath.runStarted(path),
        // A cancel reaches the run's work in whichever process drives it (decision 0066).
        cancelNotices: (onCancel) => listener.listenTo(RUN_CANCEL_CHANNEL, onCancel),
        onQueueShare: (slots) => {
          if (runsWorker) runsWorker.concurrency = slots;
        },
      },
      (runId, settleSoon) => projector.wake(runId, settleSoon ? CLAIM_COALESCE_MS : 0),
      // A run now waiting on a remote task: reconcile once at once (the remote may be done already).
      (dependencyId) => void queues.ensureJob('inbox', inboxJobId(dependencyId), { dependencyId }).catch(() => undefined),
      // A run's end journaled by its own transaction (decision 0022): blocking requests in this
      // process are answered with the task it wrote, and no projection is owed for it.
      {
        begin: (runId, taskId) => {
          projector.settling(runId);
          return listener.beginLocalCommit(taskId);
        },
        journaled: async (_runId, end) => enqueueDeliveries(end.write),
      },
    );
    // A job that loses its database connection is processed again once the database answers
    // (src/queue/once-database-answers.ts); the runs queue's processor does so itself.
    const again = onceDatabaseAnswers(new DatabaseReturn(database.pool), logger, shutdown.signal);
    queues.createWorker('inbox', again('inbox', createInboxReconcileProcessor(context, remotes)), { concurrency: 4, returnLostJobs: true });
    const runs = queues.createWorker('runs', executor.processor, { concurrency: config.runs.concurrency });
    const runExecutor = executor;
    runs.on('drained', () => runExecutor.queueDrained());
    runsWorker = runs;
    queues.createWorker('projector', again('projector', createProjectorProcessor(context, projectionOptions, enqueueDeliveries)), { concurrency: 4, returnLostJobs: true });
    const delivery = deliveryOptionsFor(config.push, options.pushTestTimings);
    for (const warning of delivery.warnings) logger.warn(warning);
    pushGate = new DestinationGate({
      slots: config.push.concurrency,
      destinationSlots: delivery.options.destinationSlots,
      breakerFailures: delivery.options.breakerFailures,
      breakerCooldownMs: delivery.options.breakerCooldownMs,
      attemptTimeoutMs: delivery.options.timeoutMs,
    });
    pushDestinations.gate = pushGate;
    // push.concurrency requests at most (the gate's slots); as many jobs again may run beside them,
    // each only checked and deferred by the gate, so a deferral never waits for a held slot.
    queues.createWorker('push', again('push', createPushDeliveryProcessor(context, fetch, delivery.options, pushGate)), { concurrency: 2 * config.push.concurrency, returnLostJobs: true });
    // Two at once: the reaper beside a long sweep (workers/maintenance.ts, decision 0093).
    queues.createWorker('maintenance', again('maintenance', createMaintenanceProcessor(context)), { concurrency: 2, returnLostJobs: true });
    await scheduleMaintenance(context, options.sweepEveryMs ?? config.maintenance.sweepSeconds * 1000);
  }

  const loopLag = new EventLoopLag();
  loopLag.start();
  cleanup.push(async () => loopLag.stop());
  // Set when a graceful shutdown begins: /readyz fails first, before the listener closes.
  let shuttingDown = false;
  const http = buildHttpServer({
    logger,
    bodyLimitBytes: config.server.bodyLimitBytes,
    refusedRequestAnswer,
    liveness: { lagMs: () => loopLag.lagMs(), maxLagMs: LIVENESS_MAX_LAG_MS },
    shuttingDown: () => shuttingDown,
    readiness: async () => {
      const [databaseProbe, queueProbe] = await Promise.all([probeDatabase(database.pool, READINESS_TIMEOUT_MS), queues.probe(READINESS_TIMEOUT_MS)]);
      return { database: databaseProbe, queue: queueProbe };
    },
  });
  cleanup.push(() => http.close());
  // Large tasks (docs/reliability.md): revisions shared by their readers, streams' backpressure.
  const taskCache = new TaskRevisionCache(sealing.sealer, config.a2a.taskCacheBytes);
  const streamFlow = streamFlowOf(config, taskCache);
  registerOperatorSurfaces(http, {
    pool: database.pool,
    sealer: sealing.sealer,
    queues,
    config,
    logger,
    registry,
    ui: role !== 'worker',
    inProcessMetrics: [hotPath.registry, pushDestinationMetrics(pushDestinations), runSlotMetrics(() => executor?.keptFreeSlots() ?? 0), limitMetrics.registry, streamFlow.registry],
    pushDestinations,
  });
  let grpc: GrpcServer | null = null;
  let clientLimits: ClientLimits<A2AError> | null = null;
  if (role !== 'worker') {
    // Per-client limits, in this process's memory; the run counts read from the task counts (decision 0060).
    const runCounts = new ActiveRunCounts(
      () => countActiveTasksByOwner(database.pool),
      Date.now,
      (error) => logger.warn({ err: error }, 'cannot read the clients\' active task counts; the last ones stand'),
    );
    const limits = new ClientLimits<A2AError>(config.limits, { refuse: limitExceeded, runs: runCounts, onRefused: (kind) => limitMetrics.refused(kind) });
    limits.start();
    clientLimits = limits;
    cleanup.push(async () => limits.stop());
    const service = new A2AService({
      pool: database.pool,
      sealer: sealing.sealer,
      queues,
      registry,
      listener,
      projector,
      config,
      logger,
      shutdown: shutdown.signal,
      taskCache,
      streamFlow,
      cardSigner: cardSigning?.ok ? cardSigning.signer : null,
      limits,
      intake: new TaskIntake({
        pool: database.pool,
        sealer: sealing.sealer,
        queues,
        logger,
        creations:
          taskWrites ??
          new TaskCreations(database.pool, sealing.sealer, {
            maxBatch: CREATION_BATCH,
            lanes: BATCH_LANES,
            direct: !writePath.groupCommit,
            onBatch: (size) => hotPath.batch('creation', size),
            onWritten: (waitedMs, writeMs) => hotPath.batchWritten('creation', waitedMs, writeMs),
          }),
        // Decided once, above: this process's slots when the fast path is on here, else none.
        fastRuns: writePath.fastPath ? (executor?.fastRuns ?? null) : null,
        projectionOptions,
        onDeliveries: (deliveryIds) => enqueueDeliveries({ deliveryIds }),
      }),
    });
    const authenticator = new ClientAuthenticator(database.pool, { mode: config.auth.mode });
    registerA2ARoutes(http, { service, registry, authenticator, config, logger, limits });
    // The gRPC binding's modules (grpc-js, the SDK's service definitions: about a tenth of a start's
    // CPU) are loaded only where it is configured.
    if (config.grpc.port !== undefined) {
      const { GrpcServer } = await import('../a2a/grpc-binding.js');
      grpc = new GrpcServer({ service, registry, authenticator, logger, limits }, { maxMessageBytes: config.server.bodyLimitBytes });
    }
    registerInboxRoutes(http, { pool: database.pool, sealer: sealing.sealer, queues, config, logger });
  }
  let grpcAddress: string | null = null;
  // gRPC first: by the time the HTTP server hands out a card, the gRPC address it names is bound.
  if (grpc && options.listen !== false) {
    const host = config.grpc.host ?? config.server.host;
    try {
      const port = await grpc.listen(host, config.grpc.port!);
      grpcAddress = hostPort(host, port);
      cleanup.push(async () => grpc!.forceClose());
      // As for the HTTP port: with port 0 and no publicAddress, cards name the port really bound.
      if (config.grpc.port === 0 && !config.grpc.publicAddress) config.grpc.publicAddress = hostPort(host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host, port);
    } catch (error) {
      return fail('grpc', `cannot listen for gRPC on ${hostPort(host, config.grpc.port!)}: ${(error as Error).message}`);
    }
  }
  let url = '';
  if (options.listen !== false) {
    try {
      url = await http.listen({ host: config.server.host, port: config.server.port });
      // Port 0 picks a free port: without an explicit publicUrl, cards name the real one.
      if (config.server.port === 0 && config.server.publicUrl.endsWith(':0')) config.server.publicUrl = url;
    } catch (error) {
      return fail('http', `cannot listen on ${config.server.host}:${config.server.port}: ${(error as Error).message}`);
    }
  } else {
    await http.ready();
  }

  let stopping: Promise<void> | null = null;
  const stop = () => {
    // Order matters: stop taking requests, let workers finish, then close queues, pool, database.
    stopping ??= (async () => {
      // Readiness first (docs/decisions/0089-readiness-fails-first-at-shutdown.md): /readyz says
      // "shutting down" while the listener still serves every request, so a load balancer or an
      // orchestrator takes this process out of rotation before its connections are refused. A
      // worker-only process has no clients to drain and goes on at once.
      shuttingDown = true;
      const readyDelayMs = url && role !== 'worker' ? config.server.shutdownReadyDelaySeconds * 1000 : 0;
      if (readyDelayMs > 0) {
        logger.info({ delaySeconds: config.server.shutdownReadyDelaySeconds }, '/readyz answers 503 (shutting down) before the listener closes');
        await new Promise((resolve) => setTimeout(resolve, readyDelayMs));
      }
      // Stop taking work: no new connections (a request on an open one gets 503), no new jobs.
      // Requests in flight (streams, blocking sends) go on for now; close() resolves when they end.
      const closing = http.close().catch(() => undefined);
      const grpcClosing = grpcAddress ? grpc!.close() : Promise.resolve();
      // Runs in flight may finish within the grace period; the rest go back to the queue.
      if (executor) {
        // This worker takes no new run (those in flight go on): a released run's wake-up goes to
        // another process instead of being taken here and skipped. queues.close() awaits it.
        void runsWorker?.close().catch(() => undefined);
        const drained = await executor.drain(config.runs.shutdownGraceSeconds * 1000);
        if (drained.released > 0) logger.info(drained, 'released runs still in flight at shutdown');
      }
      // The journal now holds everything this process's runs committed (the finished ones and the
      // released ones): streams send it, ending with the final event where one is due, and end;
      // blocking requests answer with their task as it is.
      await projector.idle().catch(() => undefined);
      shutdown.abort();
      // A connection that went idle after close() began (its stream just ended) would otherwise
      // hold the close until its keep-alive timeout.
      const closeIdle = setInterval(() => http.server.closeIdleConnections(), 50);
      await closing;
      clearInterval(closeIdle);
      // gRPC streams ended with the same signal; a call still open after the grace is cut.
      let graceTimer: NodeJS.Timeout | undefined;
      const grace = new Promise<'late'>((resolve) => (graceTimer = setTimeout(resolve, GRPC_CLOSE_GRACE_MS, 'late')));
      if ((await Promise.race([grpcClosing, grace])) === 'late') {
        logger.warn('gRPC calls still open after the shutdown grace were cut');
        grpc?.forceClose();
      }
      clearTimeout(graceTimer);
      clientLimits?.stop();
      await listener.stop().catch(() => undefined);
      await queues.close().catch((error: Error) => logger.warn({ err: error }, 'queues did not close cleanly'));
      await projector.idle().catch(() => undefined);
      await fetch.close().catch(() => undefined);
      loopLag.stop();
      try {
        await database.close();
      } finally {
        // The spans of everything above, flushed within telemetry.shutdownTimeoutMs.
        await tracing.shutdown();
      }
    })();
    return stopping;
  };
  return { ok: true, keel: { context, registry, fetch, http, url, grpcAddress, stop, projector, listener, role } };
}
