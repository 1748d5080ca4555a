import type { Job } from 'bullmq';
import { PUSH_AUTH_SCHEME } from '../src/protocol/wire.js';
import type { GuardedFetch } from '../src/net/guarded-fetch.js';
import { classifyAttempt, type OutcomeClass } from '../src/push/attempt-outcome.js';
import {
  beginAttempt,
  cancelPendingOfConfig,
  headOfConfig,
  loadDelivery,
  recordOutcome,
  type AttemptRecord,
  type ConfigHead,
  type DeliveryRow,
  type OutcomeWrite,
} from '../src/push/delivery-repository.js';
import type { DeliveryOptions } from '../src/push/delivery-options.js';
import { destinationOf, type DestinationGate } from '../src/push/destination-gate.js';
import { pushConfigContext } from '../src/push/push-config-repository.js';
import { deliveryJobId } from '../src/queue/job-ids.js';
import type { KeelContext } from '../src/context/keel-context.js';
import { readJournalEventToSend } from '../src/tasks/journal.js';
import { EVENT_SEQUENCE_HEADER, stampResponse } from '../src/a2a/sequenced-events.js';
import { getRunTrace } from '../src/runs/run-repository.js';
import { inPushDeliverySpan } from '../src/tracing/client-spans.js';
import { runContext } from '../src/tracing/run-trace.js';
import { tracingEnabled } from '../src/tracing/tracing-switch.js';

// The push queue's processor: one attempt of one delivery. Before it: reread the config (deleted
// or stopped: no attempt), keep journal order per config (an earlier delivery not ended: wait)
// and load the credential. Then, in one statement on the database's clock, check the deadline, the
// attempts left and the config's state, and count the attempt. Then one POST of the bare
// StreamResponse through the address guard; its result is classified (src/push/attempt-outcome.ts)
// and the outcome recorded in one transaction. The next delivery of the config is woken when this
// one ends. Between the checks and the count, the destination gate (src/push/destination-gate.ts)
// grants the attempt a slot or defers it without counting it: its job ends and comes back later.

export type AttemptOutcome =
  | { kind: 'delivered' }
  | { kind: 'retry'; afterMs: number }
  | { kind: 'dead' }
  | { kind: 'paused' }
  | { kind: 'stopped' };

/** Whether a stored scheme is the one Keel sends (schemes are case-insensitive, RFC 7235; none stored means Bearer). */
const isPushAuthScheme = (scheme: string | null) => scheme === null || scheme.toLowerCase() === PUSH_AUTH_SCHEME.toLowerCase();

/** Backoff before retry n (1-based): min(base × 2^(n-1), max), with full jitter in its upper half. */
export function retryDelayMs(options: DeliveryOptions, attempt: number, retryAfterMs?: number): number {
  const exponential = Math.min(options.retryMaxMs, options.retryBaseMs * 2 ** Math.max(0, attempt - 1));
  const jittered = exponential / 2 + Math.random() * (exponential / 2);
  return Math.min(options.retryMaxMs, Math.max(jittered, retryAfterMs ?? 0));
}

function retryAfter(header: string | undefined): number | undefined {
  if (!header) return undefined;
  if (/^\d+$/.test(header.trim())) return Number(header.trim()) * 1000;
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** The most bytes of a 2xx answer read: the status is the acknowledgement, the rest is discarded. */
const ANSWER_PREFIX_BYTES = 64 * 1024;

/** How late a deferred delivery's comeback job may be before it counts as lost (and another is added). */
const COMEBACK_GRACE_MS = 5_000;

/**
 * How long one job goes on sending, in the slot its attempt released, the deliveries waiting at
 * the same destination (each only after the one before was delivered): a handoff in memory costs
 * no queue round trip, a job of its own for the next waiting delivery did (about 15 deliveries a
 * second through a destination's 4 slots on the Postgres queue backend). Bounded so that one job
 * never holds its worker slot long, and a graceful stop waits for it no more than this.
 */
const HANDOFF_BUDGET_MS = 2_000;

export function createPushDeliveryProcessor(context: KeelContext, fetch: GuardedFetch, options: DeliveryOptions, gate: DestinationGate) {
  const { pool, sealer, queues, logger } = context;
  /** Each delivery this process deferred: the job that brings it back, and when it is due. */
  const comebacks = new Map<string, { jobId: string; at: number; baseJobId: string }>();

  /**
   * A slot was released and `next` waits longest at its destination (the gate's nextWaiting): it
   * comes back now, by a job of its own (its later comeback then finds it sent, or finds this one
   * newer and ends). Without it a destination's backlog was sent only as fast as comeback jobs came
   * due: a single healthy receiver with hundreds waiting (a backlog after an outage) got about 15
   * deliveries a second through its 4 slots instead of what the receiver could take.
   */
  async function offerReleasedSlot(next: string): Promise<void> {
    const waiting = comebacks.get(next);
    if (waiting === undefined) return;
    const now = Date.now();
    const jobId = `${waiting.baseJobId}-r${now}`;
    comebacks.set(next, { jobId, at: now, baseJobId: waiting.baseJobId });
    await queues.addJob('push', jobId, { deliveryId: next }, { delayMs: 0 });
  }

  /**
   * Wakes the head of the config. After a delivery this job ended, the wake-up gets an id of its
   * own (`-w<sequence>`): under the head's plain id it could be hidden by the head's first job,
   * still 'active' when it is skipping right now (earlier delivery not ended yet) or left 'active'
   * by a worker that died, and the head would wait for the sweeper or stall detection.
   */
  async function wakeNext(delivery: Pick<DeliveryRow, 'task_id' | 'config_id' | 'event_sequence'>, endedHere = false): Promise<void> {
    const head = await headOfConfig(pool, delivery.task_id, delivery.config_id);
    if (head) await wakeHead(delivery, head, endedHere);
  }

  async function wakeHead(delivery: Pick<DeliveryRow, 'event_sequence'>, head: ConfigHead, endedHere: boolean): Promise<void> {
    const jobId = deliveryJobId(head.id, head.attempts);
    const delayMs = head.next_attempt_at - Date.now();
    // The `-w` id is this wake-up's own: adding it twice is a no-op, no need to look first.
    if (endedHere) await queues.addJob('push', `${jobId}-w${delivery.event_sequence}`, { deliveryId: head.id }, { delayMs });
    else await queues.ensureJob('push', jobId, { deliveryId: head.id }, { delayMs });
  }

  /** A deleted or stopped config's pending deliveries are cancelled, never sent. */
  async function cancelIfConfigGone(delivery: DeliveryRow): Promise<boolean> {
    if (delivery.deleted_at === null && delivery.config_state !== 'stopped') return false;
    await cancelPendingOfConfig(pool, delivery.task_id, delivery.config_id, delivery.deleted_at !== null ? 'config deleted' : 'config stopped');
    return true;
  }

  /**
   * Records an outcome in one transaction. A delivery that ended wakes the config's next one (its
   * head as the transaction left it), unless the config was paused: the resume wakes it then.
   */
  async function settle(delivery: DeliveryRow, write: OutcomeWrite): Promise<void> {
    const read = await recordOutcome(pool, { id: delivery.id, taskId: delivery.task_id, configId: delivery.config_id }, write);
    if (write.config?.event === 'AUTH_FAILED') return;
    // Nothing pending as the transaction read it: a delivery committed after that read (and before
    // this commit) was not seen, and its writer, looking after its own commit, found this one still
    // pending and leased, so it woke nothing. Looked for again after the commit, whichever of the
    // two commits last sees the other's row (src/push/wake-deliveries.ts).
    const head = read ?? (await headOfConfig(pool, delivery.task_id, delivery.config_id));
    if (head && head.id !== delivery.id) await wakeHead(delivery, head, true);
  }

  async function attempt(delivery: DeliveryRow, jobId: string | undefined, released: { destination: string | null }): Promise<AttemptOutcome | 'skipped' | 'deferred'> {
    const log = logger.child({ deliveryId: delivery.id, taskId: delivery.task_id, configId: delivery.config_id });
    if (await cancelIfConfigGone(delivery)) return 'skipped';
    if (delivery.config_state === 'paused' || delivery.behind) return 'skipped';
    if (delivery.next_attempt_at > Date.now() + 50) {
      // Woken early (a wake-up raced a retry): a job of its own for the due time.
      await queues.ensureJob('push', `${deliveryJobId(delivery.id, delivery.attempts)}-at${delivery.next_attempt_at}`, { deliveryId: delivery.id }, { delayMs: delivery.next_attempt_at - Date.now() });
      return 'skipped';
    }
    // The deadline of an attempt is not checked here, on this worker's clock: beginAttempt checks it
    // below, in the statement that counts the attempt, on the database's. (Only a deferred one,
    // which sends nothing either way, is expired on this worker's clock.)
    if (delivery.credentials && !isPushAuthScheme(delivery.auth_scheme)) {
      // A config stored before only Bearer was accepted: its credential was meant for another
      // scheme and is never sent, under that scheme or as a Bearer token. Final, like any stop.
      const reason = `authentication scheme ${JSON.stringify(delivery.auth_scheme)} is not supported: only ${PUSH_AUTH_SCHEME} is sent`;
      await settle(delivery, { config: { event: 'STOP', reason }, cancelPending: `config stopped: ${reason}` });
      log.warn({ reason: 'unsupported_auth_scheme' }, 'push config names an unsupported authentication scheme; config stopped');
      return { kind: 'stopped' };
    }
    let credentials: string | null = null;
    if (delivery.credentials) {
      const opened = sealer.openJson<string>(pushConfigContext(delivery.task_id, delivery.config_id, 'credentials'), delivery.credentials);
      if (!opened.ok) {
        await settle(delivery, { delivery: { event: 'GIVE_UP', outcome: 'dead: the credential cannot be opened' } });
        return { kind: 'dead' };
      }
      credentials = opened.value;
    }

    const destination = destinationOf(delivery.url);
    const slot = gate.acquire(destination, delivery.owner, delivery.id);
    if (slot.kind === 'deferred') {
      if (delivery.deadline <= Date.now()) {
        // Waiting for its destination until past its deadline: it expires, never sent.
        gate.forget(destination, delivery.id);
        await settle(delivery, { delivery: { event: 'DEADLINE_PASSED', outcome: 'expired: past its deadline' } });
        return 'skipped';
      }
      // Not counted, no request: the job ends (its slot is free) and a job of its own comes back,
      // unless one already will: a deferred delivery has one comeback, not one per job that found
      // it waiting. Otherwise every extra job of a waiting head (the sweeper wakes each due head it
      // finds no job for under the plain id; a 'gone' job wakes its config's next delivery) started
      // a chain of comebacks of its own, so a head deferred for minutes (behind an open breaker)
      // gained a chain per sweep: hundreds of deferrals per second in bench:push's hung mode, which
      // took the healthy destinations' CPU (issue 40).
      const now = Date.now();
      const pending = comebacks.get(delivery.id);
      if (pending && pending.jobId !== jobId && pending.at > now - COMEBACK_GRACE_MS) return 'deferred';
      const at = now + slot.retryInMs;
      const baseJobId = deliveryJobId(delivery.id, delivery.attempts);
      const comeback = `${baseJobId}-d${at}`;
      await queues.addJob('push', comeback, { deliveryId: delivery.id }, { delayMs: slot.retryInMs });
      comebacks.set(delivery.id, { jobId: comeback, at, baseJobId });
      return 'deferred';
    }
    let breaker: 'success' | 'failure' | 'neutral' = 'neutral';
    try {
      const sent = await send(delivery, credentials, log);
      breaker = sent.breaker;
      return sent.outcome;
    } finally {
      slot.release(breaker);
      released.destination = destination;
    }
  }

  /** Counts the attempt, sends it and records its outcome; says what the answer means for the breaker. */
  async function send(
    delivery: DeliveryRow,
    credentials: string | null,
    log: KeelContext['logger'],
  ): Promise<{ outcome: AttemptOutcome | 'skipped'; breaker: 'success' | 'failure' | 'neutral' }> {
    const neutral = (outcome: AttemptOutcome | 'skipped') => ({ outcome, breaker: 'neutral' as const });
    // The event is read and the attempt counted in one transaction that holds the journal row: a
    // tightened answer ceiling rewrites the row under a row lock (docs/push.md), so an attempt
    // either began before the tightening committed or sends the rewritten row.
    const begun = await pool.transaction(async (transaction) => {
      const event = await readJournalEventToSend(transaction, sealer, delivery.task_id, delivery.event_sequence);
      if (!event) return { kind: 'gone' as const };
      // The lease outlasts the request's own deadline, so only a dead worker lets it expire.
      const counted = await beginAttempt(transaction, delivery.id, { leaseMs: 2 * options.timeoutMs + 1000, maxAttempts: options.maxAttempts });
      return counted.kind === 'begun' ? { ...counted, event } : counted;
    });
    switch (begun.kind) {
      case 'gone':
        await settle(delivery, { delivery: { event: 'GIVE_UP', outcome: 'dead: the event is no longer in the journal' } });
        return neutral({ kind: 'dead' });
      case 'not_due':
        return neutral('skipped');
      case 'config_not_active': {
        // Paused or stopped since this job read the config (another attempt's answer): as if read now.
        const current = await loadDelivery(pool, delivery.id);
        if (current) await cancelIfConfigGone(current);
        return neutral('skipped');
      }
      case 'past_deadline':
        await settle(delivery, { delivery: { event: 'DEADLINE_PASSED', outcome: 'expired: past its deadline' } });
        return neutral('skipped');
      case 'attempts_used':
        // Its last attempt was counted and never answered here (its worker died): no other request.
        await settle(delivery, { delivery: { event: 'GIVE_UP', outcome: `dead: ${begun.attempts} attempts` } });
        return neutral({ kind: 'dead' });
      case 'begun':
        break;
    }
    const { event, attempt: number, startedAt } = begun;
    // Every delivery names its event's sequence (a receiver discards a repeat by it, decision 0069);
    // the body carries it too for a config of the sequenced-events extension.
    const headers: Record<string, string> = { 'content-type': 'application/a2a+json', 'x-keel-delivery-id': delivery.id, [EVENT_SEQUENCE_HEADER]: String(event.sequence) };
    // Only `Authorization: Bearer`, from the config's authentication; the config's `token` is never sent.
    if (credentials !== null) headers.authorization = `${PUSH_AUTH_SCHEME} ${credentials}`;
    const sentAt = Date.now();
    // The address guard checks the target inside the request (resolution, then connection to a
    // vetted address), so a refusal comes after the attempt was counted: it is that attempt's outcome.
    // Separate deadlines: the connection's (a destination that does not accept fails fast) within
    // the whole attempt's. Of a 2xx answer only a bounded prefix is read: any body acknowledges.
    const post = () =>
      fetch({
        url: delivery.url,
        method: 'POST',
        headers,
        body: JSON.stringify(delivery.sequenced ? stampResponse(event.response, event.sequence) : event.response),
        timeoutMs: options.timeoutMs,
        connectTimeoutMs: options.connectTimeoutMs,
        maxResponseBytes: ANSWER_PREFIX_BYTES,
        overLimit: 'truncate',
      });
    // While tracing is on, the attempt is a span under its task's run span, its traceparent sent with the webhook.
    const result = tracingEnabled()
      ? await inPushDeliverySpan(
          runContext((await getRunTrace(pool, delivery.task_id)) ?? {}),
          { url: delivery.url, deliveryId: delivery.id, taskId: delivery.task_id, attempt: number },
          headers,
          post,
          (answered) => {
            const classified = classifyAttempt(answered, number, options.maxAttempts);
            return { outcome: classified.class, status: classified.status };
          },
        )
      : await post();
    const durationMs = Date.now() - sentAt;
    const outcome = classifyAttempt(result, number, options.maxAttempts);
    const record = (name: AttemptOutcome['kind']): AttemptRecord => ({
      attempt: number,
      startedAt,
      durationMs,
      statusCode: outcome.status,
      outcome: name,
      errorClass: 'errorClass' in outcome ? outcome.errorClass : null,
    });
    // For the breaker, a receiver that answered anything is alive; one that did not accept or did
    // not answer in time is not. A refusal by the address guard says nothing about the receiver.
    const breaker = result.ok ? 'success' : result.kind === 'failed' && (result.failure.class === 'timeout' || result.failure.class === 'connection') ? 'failure' : 'neutral';
    return { outcome: await recordClass(delivery, outcome, record, log), breaker };
  }

  /** The writes of one outcome class (docs/push.md, "Outcome classes"), then the wake-ups. */
  async function recordClass(
    delivery: DeliveryRow,
    outcome: OutcomeClass,
    record: (name: AttemptOutcome['kind']) => AttemptRecord,
    log: KeelContext['logger'],
  ): Promise<AttemptOutcome> {
    switch (outcome.class) {
      case 'delivered':
        await settle(delivery, { attempt: record('delivered'), delivery: { event: 'ACKNOWLEDGED', outcome: `delivered: ${outcome.status}` } });
        return { kind: 'delivered' };
      case 'retry': {
        const row = record('retry');
        const attempt = row.attempt;
        const afterMs = retryDelayMs(options, attempt, retryAfter(outcome.retryAfterHeader));
        await settle(delivery, {
          attempt: row,
          delivery: { event: 'RETRY_LATER', outcome: `retry ${attempt + 1} after ${outcome.status ?? outcome.errorClass}`, retryAt: Date.now() + afterMs },
        });
        await queues.ensureJob('push', deliveryJobId(delivery.id, attempt), { deliveryId: delivery.id }, { delayMs: afterMs });
        return { kind: 'retry', afterMs };
      }
      case 'paused': {
        const { attempt } = record('paused');
        // On its last attempt the delivery ends with the pause: a resume never sends it again.
        const write: OutcomeWrite = outcome.lastAttempt
          ? {
              attempt: record('dead'),
              delivery: { event: 'GIVE_UP', outcome: `dead: ${attempt} attempts, the last answered ${outcome.status} (authentication failed)` },
            }
          : {
              attempt: record('paused'),
              delivery: { event: 'RETRY_LATER', outcome: `waiting: receiver answered ${outcome.status} (authentication failed)`, retryAt: Date.now() },
            };
        await settle(delivery, { ...write, config: { event: 'AUTH_FAILED', reason: 'authentication failed' } });
        log.warn({ status: outcome.status }, 'push receiver refused the credential; config paused');
        return { kind: 'paused' };
      }
      case 'stopped':
        await settle(delivery, {
          attempt: record('stopped'),
          config: { event: 'STOP', reason: outcome.reason },
          cancelPending: outcome.status === null ? 'config stopped: address guard refused the target' : `config stopped: ${outcome.reason}`,
        });
        if (outcome.status === null) log.warn({ reason: outcome.errorClass }, 'push target refused at delivery time; config stopped');
        return { kind: 'stopped' };
      case 'dead':
        await settle(delivery, {
          attempt: record('dead'),
          delivery: { event: 'GIVE_UP', outcome: outcome.attemptsUsed ? `dead: ${record('dead').attempt} attempts` : `dead: receiver answered ${outcome.status}` },
        });
        return { kind: 'dead' };
    }
  }

  type Processed = { outcome: AttemptOutcome | 'skipped' | 'deferred' | 'gone'; released: string | null };

  /** One delivery: loaded, attempted or deferred; says which destination's slot its attempt released. */
  async function processDelivery(deliveryId: string, jobId: string | undefined): Promise<Processed> {
    const delivery = await loadDelivery(pool, deliveryId);
    if (!delivery || delivery.state !== 'pending') {
      if (delivery) {
        gate.forget(destinationOf(delivery.url), delivery.id);
        comebacks.delete(delivery.id);
        await wakeNext(delivery);
      }
      return { outcome: 'gone', released: null };
    }
    const released = { destination: null as string | null };
    const outcome = await attempt(delivery, jobId, released);
    // Anything but a deferral (an attempt, a wait for its config, an end) leaves the destination's backlog.
    if (outcome !== 'deferred') {
      gate.forget(destinationOf(delivery.url), delivery.id);
      comebacks.delete(delivery.id);
    }
    if (outcome === 'skipped') {
      // Ended meanwhile by another job (or cancelled with its config): its next one goes.
      const after = await loadDelivery(pool, delivery.id);
      if (after && after.state !== 'pending') await wakeNext(delivery, true);
    }
    return { outcome, released: released.destination };
  }

  return async (job: Job<{ deliveryId: string }>): Promise<AttemptOutcome | 'skipped' | 'deferred' | 'gone'> => {
    const first = await processDelivery(job.data.deliveryId, job.id);
    // The slot the attempt released goes at once to the delivery deferred longest at its
    // destination: sent by this job while each attempt there is delivered and the budget lasts,
    // else brought by a job of its own (its comeback job, still due, then finds it sent and ends).
    let last = first;
    const until = Date.now() + HANDOFF_BUDGET_MS;
    while (last.released !== null) {
      const destination = last.released;
      const next = gate.nextWaiting(destination);
      if (next === null) break;
      if (typeof last.outcome !== 'object' || last.outcome.kind !== 'delivered' || Date.now() >= until) {
        await offerReleasedSlot(next).catch((error: unknown) => logger.warn({ err: error, destination }, 'waking a waiting delivery failed; its comeback job brings it'));
        break;
      }
      try {
        last = await processDelivery(next, job.id);
      } catch (error) {
        // The delivery handed off failed here, not the job's own: its comeback job brings it again.
        logger.warn({ err: error, deliveryId: next }, 'a delivery handed a released slot failed; its comeback job brings it');
        break;
      }
    }
    return first.outcome;
  };
}
