import type { Job } from 'bullmq';
import { PUSH_AUTH_SCHEME } from '../src/protocol/wire.js';
import type { GuardedFetch } from '../src/net/guarded-fetch.js';
import { describeRefusal } from '../src/net/guarded-fetch.js';
import {
  beginAttempt,
  cancelPendingOfConfig,
  headOfConfig,
  loadDelivery,
  recordAttempt,
  transitionConfig,
  transitionDelivery,
  type DeliveryRow,
} from '../src/push/delivery-repository.js';
import type { DeliveryOptions } from '../src/push/delivery-options.js';
import { pushConfigContext } from '../src/push/push-config-repository.js';
import { deliveryJobId } from '../src/queue/job-ids.js';
import type { KeelContext } from '../src/context/keel-context.js';
import { readJournalEventToSend } from '../src/tasks/journal.js';

// The push queue's processor: one attempt of one delivery. Before it: reread the config (deleted
// or stopped: no attempt), keep journal order per config (an earlier delivery not ended: wait),
// check the deadline, the target (address guard) and load the credential. Then one POST of the bare
// StreamResponse, classified; every attempt is a row. The next delivery of the config is woken
// when this one ends.

export type AttemptOutcome =
  | { kind: 'delivered' }
  | { kind: 'retry'; afterMs: number }
  | { kind: 'dead' }
  | { kind: 'paused' }
  | { kind: 'stopped' };

const RETRY_STATUSES = new Set([429, 502, 503, 504]);

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

export function createPushDeliveryProcessor(context: KeelContext, fetch: GuardedFetch, options: DeliveryOptions) {
  const { pool, sealer, queues, logger } = context;

  /**
   * Wakes the head of the config. After a delivery this job ended, the wake-up gets an id of its
   * own (`-w<sequence>`): under the head's plain id it could be hidden by the head's first job,
   * still 'active' when it is skipping right now (earlier delivery not ended yet) or left 'active'
   * by a worker that died, and the head would wait for the sweeper or stall detection.
   */
  async function wakeNext(delivery: Pick<DeliveryRow, 'task_id' | 'config_id' | 'event_sequence'>, endedHere = false): Promise<void> {
    const head = await headOfConfig(pool, delivery.task_id, delivery.config_id);
    if (!head) return;
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

  async function attempt(delivery: DeliveryRow): Promise<AttemptOutcome | 'skipped'> {
    const log = logger.child({ deliveryId: delivery.id, taskId: delivery.task_id, configId: delivery.config_id });
    if (await cancelIfConfigGone(delivery)) return 'skipped';
    if (delivery.config_state === 'paused' || delivery.behind) return 'skipped';
    if (delivery.next_attempt_at > Date.now() + 50) {
      // Woken early (a wake-up raced a retry): a job of its own for the due time.
      await queues.ensureJob('push', `${deliveryJobId(delivery.id, delivery.attempts)}-at${delivery.next_attempt_at}`, { deliveryId: delivery.id }, { delayMs: delivery.next_attempt_at - Date.now() });
      return 'skipped';
    }
    if (delivery.deadline < Date.now()) {
      await transitionDelivery(pool, delivery.id, 'DEADLINE_PASSED', 'expired: past its deadline');
      return 'skipped';
    }
    if (delivery.credentials && !isPushAuthScheme(delivery.auth_scheme)) {
      // A config stored before only Bearer was accepted: its credential was meant for another
      // scheme and is never sent, under that scheme or as a Bearer token. Final, like any stop.
      const reason = `authentication scheme ${JSON.stringify(delivery.auth_scheme)} is not supported: only ${PUSH_AUTH_SCHEME} is sent`;
      await transitionConfig(pool, delivery.task_id, delivery.config_id, 'STOP', reason);
      await cancelPendingOfConfig(pool, delivery.task_id, delivery.config_id, `config stopped: ${reason}`);
      log.warn({ reason: 'unsupported_auth_scheme' }, 'push config names an unsupported authentication scheme; config stopped');
      return { kind: 'stopped' };
    }
    let credentials: string | null = null;
    if (delivery.credentials) {
      const opened = sealer.openJson<string>(pushConfigContext(delivery.task_id, delivery.config_id, 'credentials'), delivery.credentials);
      if (!opened.ok) {
        await transitionDelivery(pool, delivery.id, 'GIVE_UP', 'dead: the credential cannot be opened');
        return { kind: 'dead' };
      }
      credentials = opened.value;
    }

    // The event is read and the attempt counted in one transaction that holds the journal row: a
    // tightened answer ceiling rewrites the row under a row lock (docs/push.md), so an attempt
    // either began before the tightening committed or sends the rewritten row.
    const begun = await pool.transaction(async (transaction) => {
      const event = await readJournalEventToSend(transaction, sealer, delivery.task_id, delivery.event_sequence);
      if (!event) return 'gone' as const;
      // The lease outlasts the request's own deadline, so only a dead worker lets it expire.
      const counted = await beginAttempt(transaction, delivery.id, 2 * options.timeoutMs + 1000);
      return counted.kind === 'begun' ? { event, ...counted } : counted.kind;
    });
    if (begun === 'gone') {
      await transitionDelivery(pool, delivery.id, 'GIVE_UP', 'dead: the event is no longer in the journal');
      return { kind: 'dead' };
    }
    if (begun === 'not_due') return 'skipped';
    if (begun === 'config_not_active') {
      // Paused or stopped since this job read the config (another attempt's answer): as if read now.
      const current = await loadDelivery(pool, delivery.id);
      if (current) await cancelIfConfigGone(current);
      return 'skipped';
    }
    if (begun === 'past_deadline') {
      // The deadline passed between the check above (this worker's clock) and the attempt's own.
      await transitionDelivery(pool, delivery.id, 'DEADLINE_PASSED', 'expired: past its deadline');
      return 'skipped';
    }
    const { event, attempt: number, startedAt } = begun;
    const headers: Record<string, string> = { 'content-type': 'application/a2a+json', 'x-keel-delivery-id': delivery.id };
    // Only `Authorization: Bearer`, from the config's authentication; the config's `token` is never sent.
    if (credentials !== null) headers.authorization = `${PUSH_AUTH_SCHEME} ${credentials}`;
    const sentAt = Date.now();
    const result = await fetch({ url: delivery.url, method: 'POST', headers, body: JSON.stringify(event.response), timeoutMs: options.timeoutMs, maxResponseBytes: 64 * 1024 });
    const durationMs = Date.now() - sentAt;
    const record = (outcome: string, statusCode: number | null, errorClass: string | null) =>
      recordAttempt(pool, delivery.id, { attempt: number, startedAt, durationMs, statusCode, outcome, errorClass });

    if (!result.ok && result.kind === 'refused') {
      // The target became unacceptable (DNS now points somewhere refused): stop the config.
      await record('stopped', null, `refused:${result.refusal.reason}`);
      await transitionConfig(pool, delivery.task_id, delivery.config_id, 'STOP', `address guard: ${describeRefusal(result.refusal)}`);
      await cancelPendingOfConfig(pool, delivery.task_id, delivery.config_id, 'config stopped: address guard refused the target');
      log.warn({ reason: result.refusal.reason }, 'push target refused at delivery time; config stopped');
      return { kind: 'stopped' };
    }
    const status = result.ok ? result.response.status : null;
    const errorClass = result.ok ? null : result.failure.class;
    const retryable = !result.ok || RETRY_STATUSES.has(status!) || (status! >= 300 && status! < 400);
    if (result.ok && status! >= 200 && status! < 300) {
      await record('delivered', status, null);
      await transitionDelivery(pool, delivery.id, 'ACKNOWLEDGED', `delivered: ${status}`);
      return { kind: 'delivered' };
    }
    if (status === 401 || status === 403) {
      await record('paused', status, null);
      await transitionConfig(pool, delivery.task_id, delivery.config_id, 'AUTH_FAILED', 'authentication failed');
      await transitionDelivery(pool, delivery.id, 'RETRY_LATER', `waiting: receiver answered ${status} (authentication failed)`, { retryAt: Date.now() });
      log.warn({ status }, 'push receiver refused the credential; config paused');
      return { kind: 'paused' };
    }
    if (status === 404 || status === 410) {
      await record('stopped', status, null);
      await transitionConfig(pool, delivery.task_id, delivery.config_id, 'STOP', `receiver answered ${status}`);
      await cancelPendingOfConfig(pool, delivery.task_id, delivery.config_id, `config stopped: receiver answered ${status}`);
      return { kind: 'stopped' };
    }
    if (retryable && number < options.maxAttempts) {
      const afterMs = retryDelayMs(options, number, status === 429 || status === 503 ? retryAfter(result.ok ? result.response.headers['retry-after'] : undefined) : undefined);
      await record('retry', status, errorClass);
      await transitionDelivery(pool, delivery.id, 'RETRY_LATER', `retry ${number + 1} after ${status ?? errorClass}`, { retryAt: Date.now() + afterMs });
      await queues.ensureJob('push', deliveryJobId(delivery.id, number), { deliveryId: delivery.id }, { delayMs: afterMs });
      return { kind: 'retry', afterMs };
    }
    await record('dead', status, errorClass);
    await transitionDelivery(pool, delivery.id, 'GIVE_UP', retryable ? `dead: ${number} attempts` : `dead: receiver answered ${status}`);
    return { kind: 'dead' };
  }

  return async (job: Job<{ deliveryId: string }>): Promise<AttemptOutcome | 'skipped' | 'gone'> => {
    const delivery = await loadDelivery(pool, job.data.deliveryId);
    if (!delivery || delivery.state !== 'pending') {
      if (delivery) await wakeNext(delivery);
      return 'gone';
    }
    const outcome = await attempt(delivery);
    if (outcome !== 'skipped' && outcome.kind !== 'retry' && outcome.kind !== 'paused') await wakeNext(delivery, true);
    else if (outcome === 'skipped') {
      const after = await loadDelivery(pool, delivery.id);
      if (after && after.state !== 'pending') await wakeNext(delivery, true);
    }
    return outcome;
  };
}
