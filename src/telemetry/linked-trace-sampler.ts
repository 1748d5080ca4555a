import { isSpanContextValid, TraceFlags, trace, type Attributes, type Context, type Link, type SpanKind } from '@opentelemetry/api';
import { SamplingDecision, type Sampler, type SamplingResult } from '@opentelemetry/sdk-trace-base';

/**
 * The configured sampler, with one rule before it: a span that starts a trace of its own (no
 * parent) but links to a sampled trace is recorded. Keel's group-commit batch is such a span: one
 * root carrying the writes of a dozen tasks, linked to each. Under a ratio sampler its own trace
 * id would decide alone, and a task whose trace was kept would mostly lose the batch that wrote
 * it; with this rule a kept task's trace is whole, and a batch no kept task rode in stays
 * unrecorded as the sampler would have it.
 */
export class LinkedTraceSampler implements Sampler {
  constructor(private readonly configured: Sampler) {}

  shouldSample(context: Context, traceId: string, spanName: string, spanKind: SpanKind, attributes: Attributes, links: Link[]): SamplingResult {
    const parent = trace.getSpanContext(context);
    if ((!parent || !isSpanContextValid(parent)) && links.some(linksSampledTrace)) return { decision: SamplingDecision.RECORD_AND_SAMPLED };
    return this.configured.shouldSample(context, traceId, spanName, spanKind, attributes, links);
  }

  toString(): string {
    return `LinkedTraceSampler{${this.configured.toString()}}`;
  }
}

function linksSampledTrace(link: Link): boolean {
  return isSpanContextValid(link.context) && (link.context.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED;
}
