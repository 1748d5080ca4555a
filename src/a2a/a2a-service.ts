import { randomUUID } from 'node:crypto';
import type { DatabasePool } from 'slonik';
import type { AgentRegistry, RegisteredAgent } from '../agents/agent-registry.js';
import type { CardSigner } from '../cards/card-signature.js';
import type { KeelConfig } from '../config/load-config.js';
import type { ClientLimits } from '../limits/client-limits.js';
import type { KeelLogger } from '../log/logger.js';
import { checkUrl, describeRefusal, type Resolver } from '../net/guarded-fetch.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { provideRunInput } from '../runs/resume-run.js';
import { cancelRun } from '../runs/run-repository.js';
import { cancelRemoteChildren } from '../remote/cancel-remote-children.js';
import type { TranscriptMessage } from '../providers/provider.js';
import type { RunRequest } from '../runs/run-request.js';
import type { TaskIntake } from '../writes/task-intake.js';
import type { Sealer } from '../sealing/sealer.js';
import { cancelPendingOfConfig } from '../push/delivery-repository.js';
import { createPushConfig, deletePushConfig, getPushConfig, listPushConfigs, maskedPushConfig, pushConfigIdTaken } from '../push/push-config-repository.js';
import { lastMissingSequence } from '../tasks/journal.js';
import { SharedJournalReads } from '../tasks/shared-journal-reads.js';
import { TaskRevisionCache, type SharedTask } from '../tasks/task-revision-cache.js';
import { StreamFlow } from './stream-flow.js';
import { stampResponse, stampTask, unavailableResumePoint } from './sequenced-events.js';
import { JournalWait, wokenOrAfter, type JournalListener } from '../tasks/journal-listener.js';
import type { ProjectionScheduler } from '../tasks/task-projector.js';
import {
  getTaskHead,
  getTaskRow,
  getVersionedTaskRow,
  listTaskRows,
  markTaskWatched,
  openSealed,
  recordClientReply,
  sealTaskHistory,
  taskView,
  type TaskRow,
  type VersionedTaskHead,
  type VersionedTaskRow,
} from '../tasks/task-repository.js';
import { A2AErrors, fail, invalidParams, ok, taskNotFound, type A2AError, type Result } from './a2a-error.js';
import { acceptsMediaType, INPUT_MODES } from './agent-card.js';
import { ServedCards } from './served-cards.js';
import {
  endsStream,
  isoTime,
  isTerminalState,
  messageText,
  type ListTasksParams,
  type Message,
  type SendMessageParams,
  type StreamResponse,
  type Task,
  type WireMessage,
} from '../protocol/wire.js';
import { isUuid } from '../db/uuid.js';
import { newRowId } from '../db/row-id.js';
import { findMessageKey, insertFollowUpKey, MAX_MESSAGE_KEY_LENGTH } from '../tasks/message-keys.js';
import { newRunTrace } from '../tracing/run-trace.js';
import { noteTaskId } from '../tracing/a2a-server-span.js';
import { compareFingerprint, fingerprintInputOf, messageFingerprint, type FingerprintInput } from './message-fingerprint.js';

// The eleven A2A methods, independent of the binding. Every handler returns a value or an A2A
// error; nothing here throws for bad input. Tasks and contexts belong to the calling client:
// another client's task answers TaskNotFoundError, exactly like one that never existed.

/** `sequenced`: the request activated the sequenced-events extension (sequenced-events.ts); its answers carry sequence numbers. */
export type Caller = { clientId: string; agent: RegisteredAgent; sequenced?: boolean };

export type A2AServiceDeps = {
  pool: DatabasePool;
  sealer: Sealer;
  queues: KeelQueues;
  registry: AgentRegistry;
  listener: JournalListener;
  projector: ProjectionScheduler;
  config: KeelConfig;
  logger: KeelLogger;
  /** Tests point the guard at a resolver of their own. */
  resolver?: Resolver;
  /** The key every card is signed with (`security.cardSigning`); none: cards go unsigned. */
  cardSigner?: CardSigner | null;
  /** Where new tasks enter the write path (src/writes/task-intake.ts). */
  intake: TaskIntake;
  /** Per-client limits (src/limits/): a new task is refused past the client's concurrentRuns. None: no limit. */
  limits?: Pick<ClientLimits<A2AError>, 'startRun' | 'runEnded'>;
  /** Task revisions shared by concurrent readers; by default one of a2a.taskCacheBytes. */
  taskCache?: TaskRevisionCache;
  /** Streams' backpressure; by default a2a.streams' limits. */
  streamFlow?: StreamFlow;
  /**
   * Aborted at shutdown once the process's runs are finished or released and projected: open
   * streams send what is committed and end (a client resumes elsewhere with Last-Event-ID), and
   * blocking requests answer with the task as it is.
   */
  shutdown?: AbortSignal;
};

export type SendResult = { task: Task } | { message: Message };

/** What a binding read beside the params: the `Idempotency-Key` header (HTTP) or metadata entry (gRPC). */
export type SendOptions = { idempotencyKey?: string | undefined };

/** A message accepted: its task, where to wait or stream from, and whether it repeated an earlier one (nothing new written or run). */
export type AcceptedMessage = { taskId: string; afterSequence: number; repeat: boolean };

/**
 * The key that names a message for its owner (decision 0064), where the key came from (for the
 * error that names it), and the request's fingerprint.
 */
type MessageKey = { key: string; fromHeader: boolean; input: FingerprintInput; fingerprint: Buffer };

/**
 * One event of a stream: its journal sequence (the SSE id) and the StreamResponse; a snapshot
 * `{ task }` shared with other readers also carries the Task's JSON, encoded once for all of them.
 */
export type StreamItem = { id: number; response: StreamResponse; taskJson?: Buffer };

/**
 * What a stream sends: from the journal's start or after `lastEventId`, with the Task first
 * (`withSnapshot`; on a resume only with `snapshotOnResume`, the sequenced-events extension's
 * resume), as a subscription or as the stream of the SendStreamingMessage that created the task.
 */
export type StreamOptions = {
  lastEventId?: number;
  signal: AbortSignal;
  withSnapshot: boolean;
  snapshotOnResume?: boolean;
  subscription?: boolean;
  fromCreation?: boolean;
};

type PushConfigInput = { id?: string | undefined; url: string; token?: string | undefined; authentication?: { scheme: string; credentials?: string | undefined } | undefined };

const duplicatePushConfigId = (id: string) =>
  `a push notification config with id ${id} exists for this task; configs are not updated: delete it and create a new one with another id`;

const PAGE_TOKEN_VERSION = 1;

function encodePageToken(row: TaskRow): string {
  return Buffer.from(JSON.stringify([PAGE_TOKEN_VERSION, row.status_timestamp, row.id])).toString('base64url');
}

function decodePageToken(token: string): { timestamp: number; id: string } | null {
  try {
    const [version, timestamp, id] = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as [number, number, string];
    if (version !== PAGE_TOKEN_VERSION || typeof timestamp !== 'number' || typeof id !== 'string' || !isUuid(id)) return null;
    // A timestamp no Date can hold (1e999 parses as Infinity) would fail the query, not the token.
    if (Number.isNaN(new Date(timestamp).getTime())) return null;
    return { timestamp, id };
  } catch {
    return null;
  }
}

/** A part as a statechart machine's input sees it: a file's bytes stay out (their name, media type and size stand for them). */
function referencedPart(part: WireMessage['parts'][number]): unknown {
  if ('raw' in part && typeof part.raw === 'string') {
    const { raw, ...rest } = part;
    return { ...rest, file: { bytes: Buffer.byteLength(raw, 'base64') } };
  }
  return part;
}

/** The streams' backpressure of a configuration, reporting the task cache in its metrics. */
export function streamFlowOf(config: KeelConfig, cache: TaskRevisionCache): StreamFlow {
  const { maxBufferedBytes, stallTimeoutSeconds, keepAliveSeconds } = config.a2a.streams;
  return new StreamFlow({ maxBufferedBytes, stallTimeoutMs: stallTimeoutSeconds * 1000, keepAliveMs: keepAliveSeconds * 1000 }, () => cache.stats());
}

export class A2AService {
  /** The public and extended cards, signed when card signing is configured. */
  readonly cards: ServedCards;

  /** Task revisions opened and serialized once for their concurrent readers (GetTask, stream snapshots). */
  readonly taskCache: TaskRevisionCache;
  /** Backpressure of every stream this service sends (SSE and gRPC). */
  readonly streamFlow: StreamFlow;
  readonly #journalReads: SharedJournalReads;

  constructor(private readonly deps: A2AServiceDeps) {
    this.cards = new ServedCards(deps.config, deps.cardSigner ?? null);
    this.taskCache = deps.taskCache ?? new TaskRevisionCache(deps.sealer, deps.config.a2a.taskCacheBytes);
    this.streamFlow = deps.streamFlow ?? streamFlowOf(deps.config, this.taskCache);
    this.#journalReads = new SharedJournalReads(deps.pool, deps.sealer);
  }

  private get blockingCapMs(): number {
    return this.deps.config.a2a.blockingCapSeconds * 1000;
  }

  /** The client's message as stored in history: ids filled in, nothing else added. */
  private storedMessage(message: WireMessage, taskId: string, contextId: string): Message {
    return {
      messageId: message.messageId,
      role: message.role,
      parts: message.parts as Message['parts'],
      contextId,
      taskId,
      ...(message.metadata ? { metadata: message.metadata } : {}),
      ...(message.referenceTaskIds ? { referenceTaskIds: message.referenceTaskIds } : {}),
      ...(message.extensions ? { extensions: message.extensions } : {}),
    };
  }

  /** The error for a message over a2a.maxMessageBytes (its JSON, as stored), or null. */
  private oversizedMessage(message: WireMessage): A2AError | null {
    const limit = this.deps.config.a2a.maxMessageBytes;
    const bytes = Buffer.byteLength(JSON.stringify(message));
    if (bytes <= limit) return null;
    return A2AErrors.messageTooLarge(`the message is ${bytes} bytes; this server takes messages of at most ${limit} bytes (a2a.maxMessageBytes)`, {
      metadata: { limit: 'a2a.maxMessageBytes', maxBytes: String(limit), bytes: String(bytes) },
      fieldViolations: [{ field: 'message', description: `${bytes} bytes, over a2a.maxMessageBytes (${limit})` }],
    });
  }

  private async checkPushTarget(input: PushConfigInput, field: string): Promise<A2AError | null> {
    const check = await checkUrl(input.url, this.deps.config.security.addressGuard, this.deps.resolver);
    if (check.ok) return null;
    const description = describeRefusal(check.refusal);
    return A2AErrors.invalidParams(`push notification url refused: ${description}`, {
      fieldViolations: [{ field: `${field}.url`, description: `refused by the address guard (${check.refusal.reason}): ${description}` }],
      metadata: { reason: check.refusal.reason },
    });
  }

  /**
   * The task's row when it exists, belongs to the calling client and was sent to the calling
   * agent; otherwise TaskNotFoundError, the same for another's task as for one that never existed.
   */
  private async ownedTask(caller: Caller, taskId: string): Promise<Result<VersionedTaskHead>> {
    // The head only: a check never reads (and parses) the task's sealed content.
    const row = await getTaskHead(this.deps.pool, caller.clientId, taskId);
    return row && row.agent === caller.agent.config.id ? ok(row) : fail(taskNotFound(taskId));
  }

  async sendMessage(caller: Caller, params: SendMessageParams, options: SendOptions = {}): Promise<Result<SendResult>> {
    const blocking = !params.configuration?.returnImmediately;
    let wait: JournalWait | null = null;
    try {
      // The wait subscribes before the work is enqueued, so no notice can be missed.
      const started = await this.acceptMessage(caller, params, blocking ? (taskId) => (wait = new JournalWait(this.deps.listener, taskId)) : undefined, options);
      if (!started.ok) return started;
      const { taskId, afterSequence, repeat } = started.value;
      if (wait) {
        const waited = wait as JournalWait;
        const deadline = Date.now() + this.blockingCapMs;
        // A repeat waits as its original does, for the same end, wherever its run is: the task is
        // marked watched so a fast run's end elsewhere is NOTIFYd (decision 0047), then the journal
        // is read first (the end may be committed already).
        if (repeat) await markTaskWatched(this.deps.pool, caller.clientId, taskId);
        // An end this process committed is answered with the task as its transaction wrote it,
        // without reading it again (docs/decisions/0022-completion-writes-the-journal.md).
        if (await waited.until(this.deps.pool, afterSequence, this.blockingCapMs, repeat, this.deps.shutdown)) {
          const committed = await waited.committedTask(Math.max(0, deadline - Date.now()));
          if (committed) return this.endedHere(caller, params, ok(this.sendResultOf(caller, committed, params.configuration?.historyLength)));
        }
      }
      return this.endedHere(caller, params, await this.sendResult(caller, taskId, params.configuration?.historyLength));
    } finally {
      (wait as JournalWait | null)?.close();
    }
  }

  /** A new task's end seen by its own request gives the client's run back at once (src/limits/), not at the next count. */
  private endedHere(caller: Caller, params: SendMessageParams, result: Result<SendResult>): Result<SendResult> {
    if (params.message.taskId === undefined && result.ok && ('message' in result.value || isTerminalState(result.value.task.status.state))) {
      this.deps.limits?.runEnded(caller.clientId);
    }
    return result;
  }

  private async sendResult(caller: Caller, taskId: string, historyLength: number | undefined): Promise<Result<SendResult>> {
    const row = await getTaskRow(this.deps.pool, caller.clientId, taskId);
    if (!row) return fail(taskNotFound(taskId));
    return ok(this.sendResultOf(caller, row, historyLength));
  }

  /** A blocking SendMessage's answer from the task row: the direct Message of a task answered by one, else the Task. */
  private sendResultOf(caller: Caller, row: TaskRow, historyLength: number | undefined): SendResult {
    if (row.direct_message && row.state === 'TASK_STATE_COMPLETED') {
      const message = openSealed<Message | null>(this.deps.sealer, row.id, 'status_message', row.status_message, null);
      if (message) {
        const { taskId: _taskId, ...direct } = message;
        return { message: direct };
      }
    }
    const task = taskView(this.deps.sealer, row, { historyLength });
    return { task: caller.sequenced ? stampTask(task, row.last_sequence) : task };
  }

  /**
   * The message's key and fingerprint: the Idempotency-Key when the client sent one, else the
   * messageId (decision 0064). The fingerprint covers what a repeat must repeat, not how its answer
   * is awaited (blocking, history length).
   */
  private messageKey(caller: Caller, params: SendMessageParams, options: SendOptions): Result<MessageKey> {
    const header = options.idempotencyKey;
    if (header !== undefined && (header.trim() === '' || header.length > MAX_MESSAGE_KEY_LENGTH)) {
      return fail(
        A2AErrors.invalidParams(`the Idempotency-Key must be 1 to ${MAX_MESSAGE_KEY_LENGTH} characters, not blank`, {
          fieldViolations: [{ field: 'Idempotency-Key', description: `1 to ${MAX_MESSAGE_KEY_LENGTH} characters, not blank` }],
        }),
      );
    }
    const input = fingerprintInputOf(caller.agent.config.id, params);
    // With a2a.messageIdIsKey off, a message without an Idempotency-Key gets a key no other
    // message has: it is always new, as before idempotency (decision 0076).
    const key = header ?? (this.deps.config.a2a.messageIdIsKey ? params.message.messageId : `unkeyed:${randomUUID()}`);
    return ok({ key, fromHeader: header !== undefined, input, fingerprint: messageFingerprint(this.deps.sealer.ring, input) });
  }

  /**
   * The message the key named before, when this one repeats it: the same task and the place its
   * answer was awaited from; refused when the key came with another request. Null when the key
   * names nothing (its task was purged meanwhile).
   */
  private async repeatOf(caller: Caller, keyed: MessageKey, beforeWork?: (taskId: string) => void): Promise<Result<AcceptedMessage> | null> {
    const earlier = await findMessageKey(this.deps.pool, caller.clientId, keyed.key);
    if (!earlier) return null;
    const compared = compareFingerprint(this.deps.sealer.ring, earlier.fingerprint, keyed.input);
    if (compared === 'different') {
      const name = keyed.fromHeader ? `Idempotency-Key ${keyed.key}` : `message id ${keyed.key}`;
      return fail(
        A2AErrors.messageKeyReused(`${name} was already sent by this client with a different request (task ${earlier.taskId}); a repeat must be the same request, a new message needs a new ${keyed.fromHeader ? 'key' : 'messageId'}`, {
          fieldViolations: [{ field: keyed.fromHeader ? 'Idempotency-Key' : 'message.messageId', description: 'already used with a different request' }],
          metadata: { [keyed.fromHeader ? 'idempotencyKey' : 'messageId']: keyed.key, taskId: earlier.taskId },
        }),
      );
    }
    if (compared === 'unknown') {
      // Made under a master key no longer in the ring (decision 0065): taken as the same request.
      this.deps.logger.info({ taskId: earlier.taskId }, 'a repeated message key was answered with its task; its fingerprint was made under a master key no longer loaded');
    }
    beforeWork?.(earlier.taskId);
    noteTaskId(earlier.taskId);
    return ok({ taskId: earlier.taskId, afterSequence: earlier.afterSequence, repeat: true });
  }

  /**
   * Validates and records the message: a new task (QUEUED run, task row, history, optional push
   * config, all in one transaction; the run's job after the commit), or input to a task that is
   * waiting for it. Returns the task and the journal position to wait from. A message whose key
   * (messageId or Idempotency-Key) its client sent before is a repeat: it returns the earlier
   * message's task and writes and runs nothing (decision 0064).
   */
  async acceptMessage(
    caller: Caller,
    params: SendMessageParams,
    beforeWork?: (taskId: string) => void,
    options: SendOptions = {},
  ): Promise<Result<AcceptedMessage>> {
    const { message } = params;
    const tooLarge = this.oversizedMessage(message);
    if (tooLarge) return fail(tooLarge);
    if (message.role !== 'ROLE_USER') {
      return fail(invalidParams([{ path: ['message', 'role'], message: 'a client sends messages with role ROLE_USER' }]));
    }
    const unsupported = message.parts.find((part) => part.mediaType !== undefined && part.mediaType !== '' && !acceptsMediaType(INPUT_MODES, part.mediaType));
    if (unsupported) {
      return fail(
        A2AErrors.contentTypeNotSupported(`media type ${unsupported.mediaType} is not accepted by agent ${caller.agent.config.id}; it accepts ${INPUT_MODES.join(', ')}`, {
          metadata: { mediaType: unsupported.mediaType!, accepted: INPUT_MODES.join(',') },
        }),
      );
    }
    const pushInput = params.configuration?.taskPushNotificationConfig;
    if (pushInput) {
      const refused = await this.checkPushTarget(pushInput, 'configuration.taskPushNotificationConfig');
      if (refused) return fail(refused);
    }
    const keyed = this.messageKey(caller, params, options);
    if (!keyed.ok) return keyed;
    if (message.taskId !== undefined) return this.continueTask(caller, message, pushInput, keyed.value, beforeWork);

    const primary = caller.agent.chain[0]!;
    if (!answerIsRetainable(primary.ceilings.answerLevel)) {
      return fail(
        A2AErrors.resultNotRetainable(`agent ${caller.agent.config.id} keeps no result under this installation's privacy policy (answer level ${primary.ceilings.answerLevel})`, {
          metadata: { agent: caller.agent.config.id, answerLevel: primary.ceilings.answerLevel },
        }),
      );
    }

    const taskId = newRowId();
    const contextId = message.contextId ?? newRowId();
    const stored = this.storedMessage(message, taskId, contextId);
    const task = {
      id: taskId,
      contextId,
      owner: caller.clientId,
      agent: caller.agent.config.id,
      answerLevel: primary.ceilings.answerLevel,
      history: [stored],
      metadata: params.metadata ?? {},
      messageKey: keyed.value.key,
      messageFingerprint: keyed.value.fingerprint,
    };
    const sealedHistory = sealTaskHistory(this.deps.sealer, task);
    const request = (earlier: TranscriptMessage[]): RunRequest => ({
      messages: [...earlier, { role: 'user' as const, content: messageText(message) }],
      metadata: {
        messageId: message.messageId,
        contextId,
        // A statechart agent's machine gets the message's parts as its input (files as references).
        ...(caller.agent.statechart ? { taskId, parts: message.parts.map(referencedPart) } : {}),
      },
    });
    const intake = {
      // The added field first, the spread last: `{ ...task, sealedHistory }` would make a hidden
      // class per task (docs/decisions/0050-no-leading-spread-on-the-hot-path.md).
      task: { sealedHistory, ...task },
      run: {
        id: taskId,
        agent: caller.agent.config.id,
        auditLevel: primary.ceilings.auditLevel,
        answerLevel: primary.ceilings.answerLevel,
        provider: primary.provider.name,
        taskId,
        // Under the request's server span while tracing is on; null (nothing read) while it is off.
        trace: newRunTrace(),
      },
      request,
      inExistingContext: message.contextId !== undefined,
      pushConfig: pushInput && caller.sequenced ? { ...pushInput, sequenced: true } : pushInput,
    };
    // How the task is written and where its run starts is the write path's (src/writes/task-intake.ts);
    // whether the client may start one more, its concurrentRuns limit's (a repeat, which starts
    // nothing, counts there until the counts are read again, within a second).
    // The task row's INSERT decides whether the key is new; a repeat finds the task it names. A key
    // whose task was purged between the two is tried once more as new.
    for (let attempt = 0; ; attempt += 1) {
      const admitted = this.deps.limits ? await this.deps.limits.startRun(caller.clientId, () => this.deps.intake.accept(intake, beforeWork)) : ok(await this.deps.intake.accept(intake, beforeWork));
      if (!admitted.ok) return admitted;
      const accepted = admitted.value;
      // Built field by field, not spread: the hot path (decision 0050).
      if (accepted.ok) noteTaskId(accepted.task.taskId);
      if (accepted.ok) return ok({ taskId: accepted.task.taskId, afterSequence: accepted.task.afterSequence, repeat: false });
      const repeated = await this.repeatOf(caller, keyed.value, beforeWork);
      if (repeated) return repeated;
      if (attempt === 1) return fail(A2AErrors.internal(`${keyed.value.fromHeader ? 'Idempotency-Key' : 'message id'} ${keyed.value.key} could be neither recorded nor found; send it again`));
    }
  }

  private async continueTask(
    caller: Caller,
    message: WireMessage,
    pushInput: PushConfigInput | undefined,
    keyed: MessageKey,
    beforeWork?: (taskId: string) => void,
  ): Promise<Result<AcceptedMessage>> {
    const taskId = message.taskId!;
    const owned = await this.ownedTask(caller, taskId);
    if (!owned.ok) return owned;
    const row = owned.value;
    if (message.contextId !== undefined && message.contextId !== row.context_id) {
      return fail(invalidParams([{ path: ['message', 'contextId'], message: `task ${taskId} belongs to another context` }]));
    }
    // A repeated follow-up provides nothing again: it is answered with its task, whatever the
    // task's state now. A concurrent repeat not committed yet is caught by the key's insert below.
    const repeated = await this.repeatOf(caller, keyed, beforeWork);
    if (repeated) return repeated;
    if (isTerminalState(row.state)) {
      return fail(A2AErrors.unsupportedOperation(`task ${taskId} is ${row.state} and takes no more messages; send a new message in its context instead`, { metadata: { taskId, state: row.state } }));
    }
    if (row.state !== 'TASK_STATE_INPUT_REQUIRED') {
      return fail(A2AErrors.unsupportedOperation(`task ${taskId} is ${row.state}, not waiting for input`, { metadata: { taskId, state: row.state } }));
    }
    // A config id the task has is refused before the input is handed over (configs are not updated).
    if (pushInput?.id !== undefined && (await pushConfigIdTaken(this.deps.pool, taskId, pushInput.id))) {
      return fail(invalidParams([{ path: ['configuration', 'taskPushNotificationConfig', 'id'], message: duplicatePushConfigId(pushInput.id) }]));
    }
    const data = message.parts.find((part) => part.data !== undefined)?.data;
    const value = data !== undefined ? data : messageText(message);
    const stored = this.storedMessage(message, taskId, row.context_id);
    beforeWork?.(taskId);
    // The reply joins the history, the prompt is cleared and the push config is created in the
    // transaction that hands the run over: all before any worker can take the run, so nothing of
    // the follow-up lands after (and over) what the worker then writes. The follow-up's key goes
    // in first: a concurrent repeat's insert waits for this transaction, and one that finds the
    // key declines its own hand-off (the input is provided once).
    let keyUsed = false;
    const provided = await provideRunInput(this.deps, row.run_id, value, { messageId: message.messageId }, async (transaction, claimed) => {
      const followUpKey = { owner: caller.clientId, key: keyed.key, taskId, fingerprint: keyed.fingerprint, afterSequence: row.last_sequence };
      if (!(await insertFollowUpKey(transaction, followUpKey))) {
        keyUsed = true;
        return false;
      }
      await recordClientReply(transaction, this.deps.sealer, taskId, claimed.answer_level, stored);
      if (!pushInput) return true;
      // An id taken since the check above (a concurrent CreateTaskPushNotificationConfig) declines the hand-off.
      return (await createPushConfig(transaction, this.deps.sealer, { ...pushInput, taskId, owner: caller.clientId, sequenced: caller.sequenced })).ok;
    });
    if (!provided.ok && (keyUsed || provided.reason === 'not_waiting' || provided.reason === 'already_decided')) {
      // Lost to a concurrent send of the same key: answered as its repeat (the wait on this task is subscribed already).
      const repeat = await this.repeatOf(caller, keyed);
      if (repeat) return repeat;
    }
    if (!provided.ok) {
      switch (provided.reason) {
        case 'invalid_input':
          return fail(invalidParams([{ path: ['message', 'parts'], message: `the input does not match what the task asked for: ${provided.errors}` }]));
        case 'not_found':
          return fail(taskNotFound(taskId));
        case 'not_waiting':
        case 'already_decided':
          return fail(A2AErrors.unsupportedOperation(`task ${taskId} is no longer waiting for input`, { metadata: { taskId } }));
        case 'declined':
          return fail(invalidParams([{ path: ['configuration', 'taskPushNotificationConfig', 'id'], message: duplicatePushConfigId(pushInput?.id ?? '') }]));
        case 'unreadable':
          return fail(A2AErrors.internal('the waiting task could not be read'));
      }
    }
    this.deps.projector.wake(row.run_id);
    noteTaskId(taskId);
    return ok({ taskId, afterSequence: row.last_sequence, repeat: false });
  }

  async getTask(caller: Caller, id: string, historyLength?: number): Promise<Result<Task>> {
    const shared = await this.getSharedTask(caller, id, historyLength);
    return shared.ok ? ok(shared.value.task) : shared;
  }

  /**
   * GetTask as its concurrent readers share it: the task's head is read and its owner and agent
   * checked for each request; the revision it names is opened and serialized once (the Task and
   * its JSON are shared: a binding sends the JSON as it is and changes neither).
   */
  async getSharedTask(caller: Caller, id: string, historyLength?: number): Promise<Result<SharedTask>> {
    const head = await getTaskHead(this.deps.pool, caller.clientId, id);
    if (!head || head.agent !== caller.agent.config.id) return fail(taskNotFound(id));
    const shared = await this.taskCache.view(head, { historyLength }, () => getVersionedTaskRow(this.deps.pool, id));
    if (!shared) return fail(taskNotFound(id));
    if (!caller.sequenced) return ok(shared);
    // The head's last sequence: the view is of its version or a newer one, so the number never
    // claims an event the Task does not reflect (a resume from it may repeat one, never skip one).
    const task = stampTask(shared.task, head.last_sequence);
    return ok({ task, json: Buffer.from(JSON.stringify(task)) });
  }

  async listTasks(caller: Caller, params: ListTasksParams): Promise<Result<{ tasks: Task[]; nextPageToken: string; pageSize: number; totalSize: number }>> {
    const pageSize = params.pageSize ?? 50;
    let after: { timestamp: number; id: string } | undefined;
    if (params.pageToken) {
      const decoded = decodePageToken(params.pageToken);
      if (!decoded) return fail(invalidParams([{ path: ['pageToken'], message: 'not a page token returned by ListTasks' }]));
      after = decoded;
    }
    const { rows, total } = await listTaskRows(this.deps.pool, {
      owner: caller.clientId,
      agent: caller.agent.config.id,
      contextId: params.contextId || undefined,
      state: params.status,
      statusAfter: params.statusTimestampAfter ? Date.parse(params.statusTimestampAfter) : undefined,
      pageSize,
      after,
    });
    const page = rows.slice(0, pageSize);
    const tasks = page.map((row) => taskView(this.deps.sealer, row, { historyLength: params.historyLength ?? 0, includeArtifacts: params.includeArtifacts ?? false }));
    return ok({ tasks, nextPageToken: rows.length > pageSize ? encodePageToken(page[page.length - 1]!) : '', pageSize, totalSize: total });
  }

  async cancelTask(caller: Caller, id: string): Promise<Result<Task>> {
    const owned = await this.ownedTask(caller, id);
    if (!owned.ok) return owned;
    const row = owned.value;
    if (isTerminalState(row.state)) {
      return fail(A2AErrors.taskNotCancelable(`task ${id} is ${row.state} and cannot be cancelled`, { metadata: { taskId: id, state: row.state } }));
    }
    const result = await cancelRun(this.deps.pool, this.deps.logger, row.run_id);
    if (!result.settled) {
      return fail(A2AErrors.taskNotCancelable(`task ${id} ended before it could be cancelled`, { metadata: { taskId: id } }));
    }
    this.deps.projector.wake(row.run_id);
    // A run waiting on a remote agent cancels that task too (a running one: its worker does, once its work stopped).
    if ('from' in result && result.from !== 'running') await cancelRemoteChildren(this.deps, row.run_id);
    return this.getTask(caller, id);
  }

  /**
   * A stream from the journal only: the Task first (unless resuming after `lastEventId`), then the
   * journal's events in order; it ends after an event that ends a stream (terminal or interrupted).
   * A subscription (`subscription: true`) to a task that is interrupted right now stays open: the
   * stream closes when the task next *reaches* a terminal or interrupted state (specification
   * 3.1.6: SubscribeToTask "can be used with any task that is not in a terminal state").
   * The stream of the SendStreamingMessage that created the task (`fromCreation: true`) starts from
   * the task as it was created (SUBMITTED) and replays the whole journal, however fast the run was,
   * so every such stream shows the same lifecycle; a direct Message answer that is already there is
   * sent alone.
   * A caller that activated the sequenced-events extension (`caller.sequenced`) gets every item
   * stamped with its sequence (sequenced-events.ts), and a resume (`snapshotOnResume`) starts with
   * the Task as it is now, whose SSE id is the resume point, then the events after that point:
   * a replayed interrupted state does not end a subscription, as the current one does not.
   */
  stream(caller: Caller, taskId: string, options: StreamOptions): AsyncGenerator<StreamItem> {
    // A plain caller gets the journal's items as they are (shared objects, encoded once).
    return caller.sequenced ? this.sequencedStream(caller, taskId, options) : this.journalStream(caller, taskId, options);
  }

  /** The stream with every item stamped with its sequence (a Task with the last one it reflects), on copies. */
  private async *sequencedStream(caller: Caller, taskId: string, options: StreamOptions): AsyncGenerator<StreamItem> {
    for await (const item of this.journalStream(caller, taskId, options)) {
      yield { id: item.id, response: stampResponse(item.response, item.sequence ?? item.id) };
    }
  }

  private async *journalStream(caller: Caller, taskId: string, options: StreamOptions): AsyncGenerator<StreamItem & { sequence?: number }> {
    const { pool, sealer, listener } = this.deps;
    let wake: () => void = () => undefined;
    // When this stream last learnt of new events: a shared journal read it joins began after that.
    let wokenAt = performance.now();
    const unsubscribe = listener.subscribe(taskId, () => {
      wokenAt = performance.now();
      wake();
    });
    const onAbort = () => wake();
    options.signal.addEventListener('abort', onAbort, { once: true });
    this.deps.shutdown?.addEventListener('abort', onAbort, { once: true });
    try {
      // Before anything is read: a fast run's end committed after this is NOTIFYd to this stream
      // wherever it runs (decision 0047).
      await markTaskWatched(pool, caller.clientId, taskId);
      wokenAt = performance.now();
      let cursor = options.lastEventId ?? 0;
      const resuming = options.lastEventId !== undefined;
      // Events up to this one were committed before the stream began: a subscription's replay of them ends nothing.
      let replayedUpTo = 0;
      if (options.withSnapshot && resuming && options.snapshotOnResume) {
        const snapshot = await this.snapshotOf(caller, taskId);
        if (!snapshot) return;
        const { row, task } = snapshot;
        // The Task as it is now (it reflects the journal up to its last sequence), under the resume
        // point's id: a client that loses this stream too resumes from the same point.
        yield { id: cursor, sequence: row.last_sequence, response: { task } };
        if (cursor >= row.last_sequence && (isTerminalState(task.status.state) || (endsStream(task.status.state) && !options.subscription))) return;
        if (options.subscription) replayedUpTo = row.last_sequence;
      } else if (options.withSnapshot && !resuming) {
        const snapshot = await this.snapshotOf(caller, taskId);
        if (!snapshot) return;
        const { row, task, consistent, shared } = snapshot;
        cursor = row.last_sequence;
        if (row.direct_message && row.state === 'TASK_STATE_COMPLETED' && consistent) {
          const message = openSealed<Message | null>(sealer, row.id, 'status_message', row.status_message, null);
          if (message) {
            const { taskId: _taskId, ...direct } = message;
            yield { id: cursor, response: { message: direct } };
            return;
          }
        }
        if (options.fromCreation) {
          const created: Task = {
            id: task.id,
            contextId: task.contextId,
            status: { state: 'TASK_STATE_SUBMITTED', timestamp: isoTime(row.created_at) },
            ...(task.history?.length ? { history: task.history.slice(0, 1) } : {}),
            ...(task.metadata ? { metadata: task.metadata } : {}),
          };
          yield { id: 0, response: { task: created } };
          cursor = 0;
        } else {
          yield consistent ? { id: cursor, response: { task }, taskJson: shared.json } : { id: cursor, response: { task } };
          if (isTerminalState(task.status.state) || (endsStream(task.status.state) && !options.subscription)) return;
        }
      }
      while (!options.signal.aborted) {
        const woken = new Promise<void>((resolve) => (wake = resolve));
        const events = await this.#journalReads.read(taskId, cursor, wokenAt);
        for (const event of events) {
          cursor = event.sequence;
          yield { id: event.sequence, response: event.response };
          if (event.kind === 'message' || (event.state !== null && (isTerminalState(event.state) || (endsStream(event.state) && event.sequence > replayedUpTo)))) return;
        }
        if (events.length > 0) continue;
        // At shutdown a stream ends once it has sent everything committed (the runs this process
        // could finish are finished and projected by then); the client resumes elsewhere.
        if (this.deps.shutdown?.aborted) return;
        await wokenOrAfter(woken, listener.listening ? 15_000 : 500);
      }
    } finally {
      options.signal.removeEventListener('abort', onAbort);
      this.deps.shutdown?.removeEventListener('abort', onAbort);
      unsubscribe();
    }
  }

  /**
   * The task as a stream's first event shows it: the revision's Task, shared with the other
   * readers of that revision (opened and serialized once), and its announced state while the
   * journal has not caught up with the task row (artifacts then left out).
   */
  private async snapshotOf(caller: Caller, taskId: string): Promise<{ row: VersionedTaskRow; task: Task; consistent: boolean; shared: SharedTask } | null> {
    const { pool } = this.deps;
    const head = await getTaskHead(pool, caller.clientId, taskId);
    if (!head) return null;
    const revision = await this.taskCache.revision(head, () => getVersionedTaskRow(pool, taskId));
    if (!revision) return null;
    const { row } = revision;
    const consistent = row.projected_state === row.state;
    const shared = this.taskCache.viewOf(revision, { includeArtifacts: consistent });
    const view = shared.task;
    const task: Task = consistent ? view : { ...view, status: { state: row.projected_state as Task['status']['state'], timestamp: view.status.timestamp } };
    return { row, task, consistent, shared };
  }

  /**
   * SubscribeToTask's checks, before any event is sent (errors are then plain responses). A resume
   * of the sequenced-events extension (`afterSequence` from a caller that activated it) must name a
   * point whose events after it are all in the journal, and may resume a task that has ended since
   * (the events it missed are still to be sent).
   */
  async checkSubscribable(caller: Caller, id: string, afterSequence?: number): Promise<Result<VersionedTaskHead>> {
    const owned = await this.ownedTask(caller, id);
    if (!owned.ok) return owned;
    const row = owned.value;
    if (caller.sequenced && afterSequence !== undefined) {
      const beyond = afterSequence > row.last_sequence;
      const lastMissing = await lastMissingSequence(this.deps.pool, id, beyond ? 0 : afterSequence, row.last_sequence);
      const unavailable = unavailableResumePoint(id, afterSequence, { lastSequence: row.last_sequence, lastMissing });
      return unavailable ? fail(unavailable) : ok(row);
    }
    if (isTerminalState(row.state) && isTerminalState(row.projected_state)) {
      return fail(A2AErrors.unsupportedOperation(`task ${id} is ${row.state}; a terminal task has no more events to subscribe to`, { metadata: { taskId: id, state: row.state } }));
    }
    return ok(row);
  }

  async createPushConfig(caller: Caller, input: PushConfigInput & { taskId: string }): Promise<Result<Record<string, unknown>>> {
    const owned = await this.ownedTask(caller, input.taskId);
    if (!owned.ok) return owned;
    const refused = await this.checkPushTarget(input, 'config');
    if (refused) return fail(refused);
    const created = await createPushConfig(this.deps.pool, this.deps.sealer, { ...input, owner: caller.clientId, sequenced: caller.sequenced });
    if (!created.ok) {
      return fail(invalidParams([{ path: ['id'], message: duplicatePushConfigId(input.id ?? '') }]));
    }
    return ok(maskedPushConfig(created.row));
  }

  async getPushConfig(caller: Caller, taskId: string, id: string): Promise<Result<Record<string, unknown>>> {
    const owned = await this.ownedTask(caller, taskId);
    if (!owned.ok) return owned;
    const config = await getPushConfig(this.deps.pool, taskId, id);
    if (!config) return fail(A2AErrors.invalidParams(`no push notification config ${id} for task ${taskId}`, { fieldViolations: [{ field: 'id', description: 'unknown push notification config' }] }));
    return ok(maskedPushConfig(config));
  }

  async listPushConfigs(caller: Caller, taskId: string, pageSize = 100, pageToken?: string): Promise<Result<{ configs: Record<string, unknown>[]; nextPageToken: string }>> {
    const owned = await this.ownedTask(caller, taskId);
    if (!owned.ok) return owned;
    let after: string | undefined;
    if (pageToken) {
      try {
        after = Buffer.from(pageToken, 'base64url').toString('utf8');
        // Only what this method issued: the base64url of a config id (never a NUL, which no query takes).
        if (after.includes('\u0000') || Buffer.from(after).toString('base64url') !== pageToken) throw new Error('not a page token');
      } catch {
        return fail(invalidParams([{ path: ['pageToken'], message: 'not a page token returned by this method' }]));
      }
    }
    const rows = await listPushConfigs(this.deps.pool, taskId, pageSize + 1, after);
    const page = rows.slice(0, pageSize);
    return ok({
      configs: page.map(maskedPushConfig),
      nextPageToken: rows.length > pageSize ? Buffer.from(page[page.length - 1]!.id).toString('base64url') : '',
    });
  }

  async deletePushConfig(caller: Caller, taskId: string, id: string): Promise<Result<Record<string, never>>> {
    const owned = await this.ownedTask(caller, taskId);
    if (!owned.ok) return owned;
    // Idempotent; after it no new attempt starts (a request already in flight may still arrive).
    await this.deps.pool.transaction(async (transaction) => {
      await deletePushConfig(transaction, taskId, id);
      await cancelPendingOfConfig(transaction, taskId, id, 'config deleted');
    });
    return ok({});
  }

  async extendedCard(caller: Caller): Promise<Result<Record<string, unknown>>> {
    return ok(await this.cards.card(caller.agent.config, { extended: true }));
  }
}

export { isoTime };
