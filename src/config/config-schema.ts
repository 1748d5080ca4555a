import { z } from 'zod';

// The public configuration interface (docs/architecture.md, "Configuration"). Every object is
// strict so a misspelt key is reported instead of silently ignored.

const privacyLevel = z.enum(['none', 'metadata', 'redacted', 'full']);

const privacyCeilings = z
  .object({
    auditLevel: privacyLevel.optional(),
    answerLevel: privacyLevel.optional(),
  })
  .strict();

const serverSchema = z
  .object({
    host: z.string().min(1).default('127.0.0.1'),
    port: z.number().int().min(0).max(65535).default(8080),
    publicUrl: z.string().url().optional(),
    bodyLimitBytes: z.number().int().min(1024).max(64 * 1024 * 1024).default(1_048_576),
    /**
     * At a graceful shutdown (SIGTERM, SIGINT), /readyz answers 503 "shutting down" for this long
     * while every other request is still served, so a load balancer stops sending here before the
     * listener closes (docs/deploy.md, "Shutdown timing"). 0: the listener closes at once.
     */
    shutdownReadyDelaySeconds: z
      .number()
      .min(0, 'expected 0 or more seconds')
      .max(300, 'expected at most 300 seconds')
      .default(5),
  })
  .strict();

// The gRPC binding (docs/decisions/0020-grpc-binding.md): off unless a port is set. It serves
// every agent on one port; a call names its agent by the request's `tenant`, which each card's GRPC
// interface declares.
const grpcSchema = z
  .object({
    /** Where the gRPC binding listens; absent: no gRPC binding. 0 picks a free port. */
    port: z.number().int().min(0).max(65535).optional(),
    /** The address it binds; by default server.host. */
    host: z.string().min(1).optional(),
    /** The `host:port` the cards name for it (a gRPC target, no scheme); by default host and port. */
    publicAddress: z
      .string()
      .regex(/^(\[[0-9a-fA-F:.]+\]|[^\s/:[\]]+):\d{1,5}$/, 'expected host:port (a gRPC target, e.g. keel.example.com:9090)')
      .optional(),
  })
  .strict();

const databaseSchema = z
  .object({
    url: z.string().regex(/^postgres(ql)?:\/\//, 'expected a postgres:// URL').optional(),
    /** The most connections the server process's own pool opens (the LISTEN connection and the queues' come on top). */
    maxConnections: z.number().int().min(2).max(1000).default(20),
    /**
     * How long a connection to Postgres may stay silent (a partition, a cut link: no packet, no
     * reset) before either end gives it up: the server ends the session, so the locks of its open
     * transaction are released, and Keel's LISTEN and queue connections reconnect (db/silent-link.ts,
     * decision 0092). Keep it well under runs.leaseSeconds.
     */
    linkTimeoutSeconds: z.number().min(2).max(600).default(20),
  })
  .strict();

const queueSchema = z
  .object({
    redisUrl: z.string().regex(/^rediss?:\/\//, 'expected a redis:// or rediss:// URL').optional(),
    prefix: z.string().regex(/^[a-zA-Z0-9_-]{1,32}$/, 'expected 1-32 letters, digits, _ or -').default('keel'),
    /**
     * On BullMQ's Postgres backend: each worker's pool, its LISTEN connection included; the queues
     * (adding and reading jobs) share one pool of one fewer (decision 0040). Unused on Redis. The
     * default is decision 0033's size, DEFAULT_CONNECTIONS_PER_WORKER of queue/keel-queues.ts (not
     * imported here, so that reading the config does not load BullMQ).
     */
    connectionsPerWorker: z.number().int().min(2).max(100).default(6),
  })
  .strict();

const authSchema = z
  .object({
    mode: z.enum(['token', 'none']).default('token'),
  })
  .strict();

const addressGuardSchema = z
  .object({
    allowHosts: z.array(z.string().min(1)).default([]),
    allowHttp: z.boolean().default(false),
  })
  .strict();

// Every card Keel serves is signed with this key when it is set (decision 0021): Ed25519 (JWS alg
// EdDSA) or ES256 (P-256), from a PEM or JWK file or sealed under the master key; exactly one.
const cardSigningSchema = z
  .object({
    alg: z.enum(['Ed25519', 'ES256']),
    keyFile: z.string().min(1).optional(),
    keySealed: z.string().min(1).optional(),
    kid: z.string().min(1),
    jku: z.string().url().optional(),
  })
  .strict();

// Failed operator-UI logins per source address (src/ui/login-throttle.ts): after maxFailures
// within windowSeconds of the first, the address gets 429 until that window ends.
const operatorLoginSchema = z
  .object({
    maxFailures: z.number().int().min(1).max(10_000).default(10),
    windowSeconds: z.number().min(0.1).max(86_400).default(300),
  })
  .strict();

const securitySchema = z
  .object({
    masterKeyFile: z.string().min(1).optional(),
    addressGuard: addressGuardSchema.default({}),
    cardSigning: cardSigningSchema.optional(),
    operatorLogin: operatorLoginSchema.default({}),
  })
  .strict();

const privacySchema = z
  .object({
    level: privacyLevel.default('metadata'),
    retention: z
      .object({ agentRun: z.number().int().min(1).max(36_500).default(30) })
      .strict()
      .default({}),
  })
  .strict();

// Large tasks (docs/reliability.md, "Large tasks"): the size of what one message or artifact may
// carry, the bytes of unsealed and serialized task revisions shared by concurrent readers, and how
// long a stream may hold a full buffer for a client that does not read before it is cut off.
const a2aStreamsSchema = z
  .object({
    /** Bytes one stream may hold that its client has not taken; at the bound the stream waits for the client. */
    maxBufferedBytes: z.number().int().min(16 * 1024).max(64 * 1024 * 1024).default(256 * 1024),
    /** How long a stream may wait for its client to take bytes before it is cut off. */
    stallTimeoutSeconds: z.number().min(0.1).max(3600).default(30),
    /** How often an idle SSE stream sends a comment line, so proxies do not drop it (never inside an event). */
    keepAliveSeconds: z.number().min(0.1).max(3600).default(15),
  })
  .strict();

const a2aSchema = z
  .object({
    blockingCapSeconds: z.number().min(0).max(3600).default(30),
    /** The largest message a client may send (its JSON, in bytes); below server.bodyLimitBytes, which bounds the whole request. */
    maxMessageBytes: z.number().int().min(1024).max(64 * 1024 * 1024).default(1_000_000),
    /** The largest artifact an agent may produce (its JSON, in bytes); a larger one fails the run. */
    maxArtifactBytes: z.number().int().min(1024).max(256 * 1024 * 1024).default(4 * 1024 * 1024),
    /** Bytes of task revisions kept opened and serialized for concurrent readers (0: none kept, only in-flight reads shared). */
    taskCacheBytes: z.number().int().min(0).max(4 * 1024 * 1024 * 1024).default(64 * 1024 * 1024),
    /**
     * Whether a message's messageId is its idempotency key when the client sends no Idempotency-Key
     * (decision 0076). Off only for clients that reuse messageIds for different messages.
     */
    messageIdIsKey: z.boolean().default(true),
    streams: a2aStreamsSchema.default({}),
  })
  .strict();

// The push timeout stays within the 10-30 s the A2A specification gives a sender, and a retried
// delivery gets at most 8 attempts (docs/push.md). Tests that need shorter timings use the
// test-only knobs of src/push/delivery-options.ts, never these keys.
const pushSchema = z
  .object({
    timeoutSeconds: z
      .number()
      .min(10, 'must be between 10 and 30 seconds (the A2A push timeout)')
      .max(30, 'must be between 10 and 30 seconds (the A2A push timeout)')
      .default(15),
    maxAttempts: z.number().int().min(1, 'must be between 1 and 8').max(8, 'must be between 1 and 8').default(8),
    deadlineHours: z.number().positive().max(24 * 30).default(24),
    retryBaseSeconds: z.number().min(0).max(3600).default(2),
    retryMaxSeconds: z.number().min(0).max(86_400).default(300),
    maxPendingPerConfig: z.number().int().min(1).max(1_000_000).default(1000),
    maxPendingTotal: z.number().int().min(1).max(100_000_000).default(100_000),
    concurrency: z.number().int().min(1).max(1000).default(16),
    // Isolation (docs/push.md, "Isolation"): the connection's own deadline within timeoutSeconds,
    // a destination's share of the concurrency slots, and its circuit breaker.
    connectTimeoutSeconds: z.number().min(0.1).max(30).default(5),
    destinationShare: z.number().gt(0).max(1).default(0.25),
    breakerFailures: z.number().int().min(1).max(1000).default(5),
    breakerCooldownSeconds: z.number().min(0.1).max(3600).default(30),
  })
  .strict();

// Per-client limits (docs/reliability.md, "Per-client limits"; decision 0060): a default for every
// client and overrides by client name (`keel clients create NAME`; `anonymous` under auth.mode none).
// Excess is refused with 429 / RESOURCE_EXHAUSTED and a retry delay. The defaults stay out of an
// honest client's way (one client at 1,700 blocking sends/s over 256 connections passes) and still
// bound one that floods.
const clientLimitFields = {
  requestsPerSecond: z.number().positive('must be above 0 (fractions allowed: 0.5 is one request every 2 s)').max(1_000_000),
  burst: z.number().int().min(1, 'must be at least 1').max(10_000_000),
  concurrentRequests: z.number().int().min(1, 'must be at least 1').max(1_000_000),
  openStreams: z.number().int().min(1, 'must be at least 1').max(1_000_000),
  concurrentRuns: z.number().int().min(1, 'must be at least 1').max(10_000_000),
};

const defaultClientLimitsSchema = z
  .object({
    requestsPerSecond: clientLimitFields.requestsPerSecond.default(5000),
    burst: clientLimitFields.burst.default(5000),
    concurrentRequests: clientLimitFields.concurrentRequests.default(256),
    openStreams: clientLimitFields.openStreams.default(200),
    concurrentRuns: clientLimitFields.concurrentRuns.default(5000),
  })
  .strict();

const clientLimitsOverrideSchema = z
  .object({
    requestsPerSecond: clientLimitFields.requestsPerSecond.optional(),
    burst: clientLimitFields.burst.optional(),
    concurrentRequests: clientLimitFields.concurrentRequests.optional(),
    openStreams: clientLimitFields.openStreams.optional(),
    concurrentRuns: clientLimitFields.concurrentRuns.optional(),
  })
  .strict();

const limitsSchema = z
  .object({
    default: defaultClientLimitsSchema.default({}),
    clients: z
      .record(
        z.string().regex(/^[a-zA-Z0-9._-]{1,64}$/, 'a client name is 1 to 64 characters among letters, digits, ".", "_" and "-" (as `keel clients create` takes it)'),
        clientLimitsOverrideSchema,
      )
      .default({}),
  })
  .strict();

const errorClass = z.enum([
  'connection',
  'rate_limit',
  'auth',
  'configuration',
  'client_error',
  'server_error',
  'unknown',
]);

const scriptedToolCall = z
  .object({ name: z.string().min(1), arguments: z.record(z.unknown()).default({}) })
  .strict();

const scriptedStep = z
  .object({
    reply: z.string().optional(),
    toolCalls: z.array(scriptedToolCall).optional(),
    artifact: z
      .object({
        artifactId: z.string().min(1).optional(),
        name: z.string().optional(),
        text: z.string(),
        append: z.boolean().optional(),
        lastChunk: z.boolean().optional(),
      })
      .strict()
      .optional(),
    delayMs: z.number().int().min(0).max(600_000).optional(),
    fail: errorClass.optional(),
    tokens: z.number().int().min(0).optional(),
  })
  .strict();

const providerSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('echo'), privacy: privacyCeilings.optional() }).strict(),
  z
    .object({
      type: z.literal('scripted'),
      steps: z.array(scriptedStep).default([]),
      privacy: privacyCeilings.optional(),
    })
    .strict(),
  z
    .object({
      type: z.literal('openai'),
      baseUrl: z.string().url(),
      model: z.string().min(1),
      apiKeyEnv: z.string().regex(/^[A-Z_][A-Z0-9_]*$/, 'expected an environment variable name').optional(),
      timeoutSeconds: z.number().positive().max(600).default(120),
      privacy: privacyCeilings.optional(),
    })
    .strict(),
  z
    .object({
      type: z.literal('conformance'),
      /** The conformance kit's streaming timeout; the long-running scenario waits twice this long. */
      streamTimeoutSeconds: z.number().positive().max(300).default(5),
      privacy: privacyCeilings.optional(),
    })
    .strict(),
]);

const skillSchema = z
  .object({
    id: z.string().min(1),
    name: z.string().min(1),
    description: z.string().default(''),
    tags: z.array(z.string()).default([]),
    examples: z.array(z.string()).optional(),
  })
  .strict();

const guardrailStage = z.enum(['input', 'answer']);

const guardrailSchema = z.discriminatedUnion('type', [
  z
    .object({
      type: z.literal('denyPattern'),
      name: z.string().min(1),
      patterns: z.array(z.string().min(1)).min(1),
      ignoreCase: z.boolean().default(true),
      on: z.array(guardrailStage).min(1).default(['input', 'answer']),
      action: z.enum(['deny', 'requireApproval']).default('deny'),
      reason: z.string().min(1).optional(),
    })
    .strict(),
  z
    .object({
      type: z.literal('module'),
      name: z.string().min(1),
      module: z.string().min(1),
      export: z.string().min(1).default('default'),
      on: z.array(guardrailStage).min(1).default(['input', 'answer']),
    })
    .strict(),
]);

/** What an agent id may be: it names the agent's endpoint (and `keel new agent`'s files). */
export const AGENT_ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;

const agentId = z.string().regex(AGENT_ID, 'expected lowercase letters, digits, - or _ (at most 63)');

const agentSchema = z
  .object({
    id: agentId,
    name: z.string().min(1),
    description: z.string().default(''),
    version: z.string().default('1.0.0'),
    /** The model provider of the agent loop; a statechart agent names one only if its machine calls the model. */
    provider: z.string().min(1).optional(),
    /**
     * A statechart agent (docs/statechart-agents.md): a module exporting an XState machine made with
     * setup(), relative to the config file. The machine drives the run instead of the agent loop.
     */
    machine: z.string().min(1).optional(),
    fallbacks: z.array(z.string().min(1)).default([]),
    tools: z.array(z.string().min(1)).default([]),
    limits: z
      .object({
        maxIterations: z.number().int().min(1).max(1000).default(20),
        tokenBudget: z.number().int().min(1).optional(),
      })
      .strict()
      .default({}),
    privacy: privacyCeilings.optional(),
    guardrails: z.array(guardrailSchema).default([]),
    systemPrompt: z.string().optional(),
    /** A2A extensions the agent supports; a required one must be requested by the client (A2A-Extensions). */
    extensions: z
      .array(z.object({ uri: z.string().min(1), description: z.string().default(''), required: z.boolean().default(false) }).strict())
      .default([]),
    skills: z.array(skillSchema).default([]),
  })
  .strict();

const runsSchema = z
  .object({
    /**
     * Runs one worker process drives at once (docs/decisions/0028-run-slots-for-waiting-runs.md):
     * a run mostly waits on a model or a remote agent, so a slot costs little while it waits.
     */
    concurrency: z.number().int().min(1).max(1000).default(64),
    /**
     * A process that runs workers runs the new tasks it receives itself while it has a free run
     * slot, without the queue (docs/decisions/0025-fast-path.md). Off: every run takes the queue.
     */
    fastPath: z.boolean().default(true),
    /**
     * Diagnosis: every task's creation and completion written by a statement or transaction of its
     * own, and every run through the queue (the fast path and group commit off). Same rows, slower.
     */
    directWrites: z.boolean().default(false),
    leaseSeconds: z.number().positive().max(3600).default(60),
    heartbeatSeconds: z.number().positive().max(600).default(20),
    maxRequeues: z.number().int().min(0).max(100).default(3),
    requeueBaseSeconds: z.number().min(0).max(3600).default(30),
    requeueMaxSeconds: z.number().min(0).max(86_400).default(600),
    providerAttempts: z.number().int().min(1).max(10).default(2),
    providerBackoffMs: z.number().int().min(0).max(60_000).default(500),
    shutdownGraceSeconds: z.number().min(0).max(3600).default(10),
    /** A run waiting this long for an approval nobody gave ends FAILED (`approval_denied`); fractions allowed. */
    approvalTimeoutHours: z.number().positive().max(24 * 365).default(72),
  })
  .strict();

const inboxSchema = z
  .object({
    maxPendingPerRegistration: z.number().int().min(1).max(100_000).default(100),
    maxPendingTotal: z.number().int().min(1).max(10_000_000).default(10_000),
    /** How long a delegation whose message was never acknowledged (its sender died mid-send) waits before it fails. */
    unacknowledgedGiveUpSeconds: z.number().positive().max(86_400).default(600),
  })
  .strict();

const metricsSchema = z
  .object({
    /** When set, GET /metrics needs `Authorization: Bearer <token>`; without it /metrics is open. */
    token: z.string().min(16, 'a metrics token has at least 16 characters').optional(),
  })
  .strict();

// OpenTelemetry traces (docs/observability.md, "Traces"; decision 0084): the SDK is wired at start
// when this section or the OTEL_* variables name a collector, and not even loaded otherwise. The
// OTEL_* variables fill what this section leaves out; OTEL_SDK_DISABLED=true turns it off.
const otlpUrl = z
  .string()
  .url('expected an http:// or https:// URL')
  .regex(/^https?:\/\//i, 'expected an http:// or https:// URL');
const telemetrySchema = z
  .object({
    /** true: on (the default collector http://localhost:4318 when no endpoint is named); false: off; absent: on when an endpoint is named here or in OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT. */
    enabled: z.boolean().optional(),
    /** The collector's OTLP/HTTP base URL; spans go to <endpoint>/v1/traces (as OTEL_EXPORTER_OTLP_ENDPOINT). */
    endpoint: otlpUrl.optional(),
    /** The exact URL spans are POSTed to (as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); wins over endpoint. */
    tracesEndpoint: otlpUrl.optional(),
    /** http/protobuf (the default) or http/json. */
    protocol: z.enum(['http/protobuf', 'http/json']).optional(),
    /** The resource's service.name; by default OTEL_SERVICE_NAME, else `keel`. */
    serviceName: z.string().min(1).max(256).optional(),
    /** More resource attributes (added to OTEL_RESOURCE_ATTRIBUTES, winning over it). */
    resourceAttributes: z.record(z.string().min(1), z.string()).optional(),
    /** As OTEL_TRACES_SAMPLER; by default parentbased_always_on. */
    sampler: z.enum(['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio']).optional(),
    /** The ratio of the traceidratio samplers, 0 to 1 (as OTEL_TRACES_SAMPLER_ARG). */
    samplerRatio: z.number().min(0).max(1).optional(),
    /** How long one export request may take. */
    exportTimeoutMs: z.number().int().min(100).max(120_000).default(10_000),
    /** At Keel's graceful shutdown, spans still buffered are flushed within this bound, then dropped. */
    shutdownTimeoutMs: z.number().int().min(0).max(60_000).default(5_000),
  })
  .strict();

const maintenanceSchema = z
  .object({
    sweepSeconds: z.number().positive().max(3600).default(15),
  })
  .strict();

const remoteAgentSchema = z
  .object({
    id: agentId,
    cardUrl: z.string().url(),
    credentialEnv: z.string().regex(/^[A-Z_][A-Z0-9_]*$/, 'expected an environment variable name').optional(),
    credentialSealed: z.string().min(1).optional(),
    /** How callbacks are registered with a remote that takes push: in the message, or as a separate config. */
    registration: z.enum(['embedded', 'separate']).default('embedded'),
    /** Refuse the remote's card unless one of its signatures verifies with cardKey or a JWKS of cardJku. */
    requireSignedCard: z.boolean().default(false),
    /** A public key file (PEM, JWK or JWKS) the remote's card must be signed with. */
    cardKey: z.string().min(1).optional(),
    /** JWKS URLs a signature may name as its jku (exact match), fetched through the address guard. */
    cardJku: z.array(z.string().url()).optional(),
  })
  .strict();

const DEFAULT_AGENTS = [
  {
    id: 'echo',
    name: 'Echo',
    description: 'Answers with what it was sent',
    provider: 'echo',
    privacy: { answerLevel: 'full' as const },
    skills: [{ id: 'echo', name: 'Echo', description: 'Echoes the input', tags: ['demo'] }],
  },
];

export const configSchema = z
  .object({
    server: serverSchema.default({}),
    grpc: grpcSchema.default({}),
    database: databaseSchema.default({}),
    queue: queueSchema.default({}),
    dataDir: z.string().min(1).default('.keel'),
    auth: authSchema.default({}),
    security: securitySchema.default({}),
    privacy: privacySchema.default({}),
    a2a: a2aSchema.default({}),
    push: pushSchema.default({}),
    limits: limitsSchema.default({}),
    providers: z.record(z.string().regex(/^[a-z0-9][a-z0-9_-]*$/), providerSchema).default({ echo: { type: 'echo' } }),
    toolModules: z.array(z.string().min(1)).default([]),
    agents: z.array(agentSchema).default(DEFAULT_AGENTS),
    runs: runsSchema.default({}),
    maintenance: maintenanceSchema.default({}),
    inbox: inboxSchema.default({}),
    metrics: metricsSchema.default({}),
    telemetry: telemetrySchema.default({}),
    remoteAgents: z.array(remoteAgentSchema).default([]),
  })
  .strict();

export type KeelConfigInput = z.input<typeof configSchema>;
export type ParsedConfig = z.output<typeof configSchema>;
export type PrivacyLevelName = z.infer<typeof privacyLevel>;
export type ProviderConfig = z.output<typeof providerSchema>;
export type AgentConfig = z.output<typeof agentSchema>;
export type RemoteAgentConfig = z.output<typeof remoteAgentSchema>;
export type ClientLimitsConfig = z.output<typeof limitsSchema>;
export type ClientLimitValues = z.output<typeof defaultClientLimitsSchema>;
export type CardSigningConfig = z.output<typeof cardSigningSchema>;
export type ScriptedStep = z.output<typeof scriptedStep>;
export type GuardrailConfig = z.output<typeof guardrailSchema>;
export type GuardrailStage = z.infer<typeof guardrailStage>;
export type ProviderErrorClass = z.infer<typeof errorClass>;
