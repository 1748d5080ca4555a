// The event loop's lag, measured by a timer's drift: the answer of /livez. It reads no database and
// no queue, only how late this process's own timer fired.

/** How often the timer fires; its lateness is the lag. */
const TICK_MS = 100;
/** The lag reported is the largest of this many recent ticks (about two seconds). */
const WINDOW_TICKS = 20;

export class EventLoopLag {
  private readonly samples: number[] = [];
  private lastTick = 0;
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly now: () => number = () => performance.now()) {}

  start(): void {
    if (this.timer) return;
    this.lastTick = this.now();
    this.timer = setInterval(() => this.tick(), TICK_MS);
    // The measurement never keeps the process alive on its own.
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /**
   * The event loop's lag now, in ms: the largest lateness of the recent ticks, or of the tick now
   * due if the loop has not let it run yet (a loop blocked right now shows at once).
   */
  lagMs(): number {
    const pending = this.timer ? Math.max(0, this.now() - this.lastTick - TICK_MS) : 0;
    return Math.round(Math.max(pending, ...this.samples));
  }

  private tick(): void {
    const at = this.now();
    this.samples.push(Math.max(0, at - this.lastTick - TICK_MS));
    if (this.samples.length > WINDOW_TICKS) this.samples.shift();
    this.lastTick = at;
  }
}
