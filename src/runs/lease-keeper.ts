import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { KeelLogger } from '../log/logger.js';
import { renewLease, type Holder } from './run-repository.js';

export type LeaseLoss = 'lease_lost' | 'cancelled';

/**
 * Keeps a claimed run's lease alive: a heartbeat while the run is in flight (a long provider call
 * included) and a renewal at every step boundary. When a renewal updates no row the lease is lost
 * (or the run was cancelled): the keeper aborts the in-flight step and the executor stops without
 * settling. A cancel's NOTIFY makes the executor renew at once (decision 0066), so a cancel is
 * noticed within moments, not at the next heartbeat.
 */
export class LeaseKeeper {
  readonly abort = new AbortController();
  /**
   * Aborted only when the run was cancelled (never for a lost lease or a shutdown's release): a
   * step still running then is no longer waited for, and its late result is discarded
   * (decision 0066). A released run still waits for its step, so it is not run twice at once.
   */
  readonly cancelled = new AbortController();
  private lost: LeaseLoss | null = null;
  private lastRenewal = Date.now();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly pool: DatabasePool,
    private readonly runId: string,
    private readonly holder: Holder,
    private readonly leaseMs: number,
    private readonly heartbeatMs: number,
    private readonly logger: KeelLogger,
  ) {}

  /** Also called at every heartbeat (the audit trail's buffer is written then, bounding what a crash loses). */
  onBeat: () => void = () => undefined;

  start(): void {
    this.timer = setInterval(() => {
      void this.renew();
      this.onBeat();
    }, this.heartbeatMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  get loss(): LeaseLoss | null {
    return this.lost;
  }

  /** Shutdown: the worker gives the run back; the in-flight step is aborted and nothing is settled. */
  release(): void {
    if (this.lost) return;
    this.lost = 'lease_lost';
    this.lostAt = Date.now();
    this.released = true;
    this.abort.abort();
  }

  released = false;

  /** When the loss was noticed (ms since the epoch), or 0. */
  lostAt = 0;

  /** A step boundary: renews unless a renewal (or the claim) just happened. */
  async checkpoint(): Promise<LeaseLoss | null> {
    if (this.lost) return this.lost;
    if (Date.now() - this.lastRenewal < 100) return null;
    return this.renew();
  }

  async renew(): Promise<LeaseLoss | null> {
    if (this.lost) return this.lost;
    try {
      const renewed = await renewLease(this.pool, this.runId, { ...this.holder, leaseMs: this.leaseMs });
      if (renewed) {
        this.lastRenewal = Date.now();
        return null;
      }
    } catch (error) {
      // A failed renewal is not a lost lease: the lease still runs until it expires.
      this.logger.warn({ err: error, runId: this.runId }, 'lease renewal failed; retrying at the next heartbeat');
      return null;
    }
    const status = await this.pool
      .maybeOneFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM runs WHERE id = ${this.runId}`)
      .catch(() => null);
    if (this.lost) return this.lost;
    this.lost = status === 'cancelled' ? 'cancelled' : 'lease_lost';
    this.logger.info({ runId: this.runId, why: this.lost }, 'run no longer owned by this worker; stopping without settling');
    this.lostAt = Date.now();
    this.abort.abort();
    if (this.lost === 'cancelled') this.cancelled.abort();
    return this.lost;
  }
}
