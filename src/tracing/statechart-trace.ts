import { context, trace, type Span } from '@opentelemetry/api';
import { inSpan, keelTracer } from './keel-tracer.js';

// A statechart agent's run in its stretch's trace: one span per state the machine stood in
// (`keel.statechart.state <state>`, from the commit that entered it to the next one) and one per
// step it invoked (`keel.statechart.step <step>`, a child of the state it ran in). Names only:
// never a step's input or output.

/** A machine's state value as one name: `a.b` for nested states, parallel regions joined by `,`. */
export function stateName(value: unknown): string {
  if (typeof value === 'string') return value;
  if (typeof value !== 'object' || value === null) return String(value);
  return Object.entries(value as Record<string, unknown>)
    .map(([key, inner]) => (inner === undefined || (typeof inner === 'object' && inner !== null && Object.keys(inner).length === 0) ? key : `${key}.${stateName(inner)}`))
    .join(',');
}

export class StatechartTrace {
  private state: Span | null = null;
  private stateName: string | null = null;

  constructor(private readonly runId: string) {}

  /** The machine committed a transition into `value`: a new state span when the state changed. */
  entered(value: unknown): void {
    const name = stateName(value);
    if (name === this.stateName) return;
    this.state?.end();
    this.stateName = name;
    this.state = keelTracer().startSpan(`keel.statechart.state ${name}`, { attributes: { 'keel.statechart.state': name, 'keel.run.id': this.runId } });
  }

  /** A step's work inside its span, a child of the state it runs in. */
  step<T>(step: { src: string; key: string }, work: () => Promise<T>): Promise<T> {
    const parent = this.state ? trace.setSpan(context.active(), this.state) : undefined;
    return inSpan(`keel.statechart.step ${step.src}`, { attributes: { 'keel.statechart.step': step.src, 'keel.statechart.step.key': step.key, 'keel.run.id': this.runId } }, parent, () => work());
  }

  /** The stretch left the machine (settled, suspended or stopped): the open state span ends. */
  left(): void {
    this.state?.end();
    this.state = null;
    this.stateName = null;
  }
}
