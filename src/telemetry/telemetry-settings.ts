import type { ParsedConfig } from '../config/config-schema.js';

// What the OpenTelemetry SDK is wired with, from the `telemetry:` section and the standard OTEL_*
// variables (docs/observability.md, "Traces"). Pure: reading the settings loads no SDK module.
// A value the config (or its KEEL_TELEMETRY_* override) sets wins over the OTEL_* variable for the
// same thing; OTEL_SDK_DISABLED=true turns the SDK off whatever the config says.

export type TelemetryConfig = ParsedConfig['telemetry'];

export type TraceProtocol = 'http/protobuf' | 'http/json';

export type SamplerName = 'always_on' | 'always_off' | 'traceidratio' | 'parentbased_always_on' | 'parentbased_always_off' | 'parentbased_traceidratio';

export const SAMPLER_NAMES: readonly SamplerName[] = ['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio'];

export type TelemetrySettings = {
  /** Where spans are POSTed (the full URL, /v1/traces included). */
  tracesUrl: string;
  protocol: TraceProtocol;
  headers: Record<string, string>;
  /** The resource's attributes, service.name included (Keel adds its role and instance id at start). */
  resourceAttributes: Record<string, string>;
  sampler: SamplerName;
  /** The ratio of the *traceidratio samplers (1 for the others). */
  samplerRatio: number;
  exportTimeoutMs: number;
  shutdownTimeoutMs: number;
};

/** Off (null), on with these settings, or the problems of the config and variables. */
export type TelemetryResolution = { ok: true; settings: TelemetrySettings | null } | { ok: false; problems: string[] };

/** The OTLP/HTTP collector's default address (the OpenTelemetry specification's). */
export const DEFAULT_OTLP_ENDPOINT = 'http://localhost:4318';
export const DEFAULT_SERVICE_NAME = 'keel';

const PROTOCOLS: readonly string[] = ['http/protobuf', 'http/json'];

function httpUrlProblem(name: string, value: string): string | null {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return `${name}: expected an http:// or https:// URL, received ${JSON.stringify(value)}`;
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return `${name}: expected an http:// or https:// URL, received ${JSON.stringify(value)}`;
  return null;
}

/** `/v1/traces` under a base endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT is read. */
export function tracesUrlUnder(base: string): string {
  return `${base.replace(/\/+$/, '')}/v1/traces`;
}

/**
 * `key=value,key2=value2` with percent-encoded values (W3C Baggage octets), the format of
 * OTEL_RESOURCE_ATTRIBUTES and OTEL_EXPORTER_OTLP_HEADERS. A malformed list is a problem, not
 * silently dropped.
 */
export function parseKeyValueList(name: string, raw: string): { ok: true; values: Record<string, string> } | { ok: false; problem: string } {
  const values: Record<string, string> = {};
  for (const item of raw.split(',')) {
    if (item.trim() === '') continue;
    const at = item.indexOf('=');
    const key = at < 0 ? '' : item.slice(0, at).trim();
    if (at < 0 || key === '') return { ok: false, problem: `${name}: expected key=value pairs separated by commas, received ${JSON.stringify(item.trim())}` };
    let value: string;
    try {
      value = decodeURIComponent(item.slice(at + 1).trim());
    } catch {
      return { ok: false, problem: `${name}: the value of ${JSON.stringify(key)} is not valid percent-encoding` };
    }
    values[key] = value;
  }
  return { ok: true, values };
}

const nonEmpty = (value: string | undefined): string | undefined => (value === undefined || value.trim() === '' ? undefined : value.trim());

/** The endpoint the config or the variables name, or null when neither does. */
function namedTracesUrl(config: TelemetryConfig, env: NodeJS.ProcessEnv, problems: string[]): string | null {
  const candidates: Array<[string, string | undefined, boolean]> = [
    ['telemetry.tracesEndpoint', config.tracesEndpoint, false],
    ['telemetry.endpoint', config.endpoint, true],
    ['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), false],
    ['OTEL_EXPORTER_OTLP_ENDPOINT', nonEmpty(env.OTEL_EXPORTER_OTLP_ENDPOINT), true],
  ];
  for (const [name, value, base] of candidates) {
    if (value === undefined) continue;
    const problem = httpUrlProblem(name, value);
    if (problem) {
      problems.push(problem);
      return null;
    }
    return base ? tracesUrlUnder(value) : value;
  }
  return null;
}

/** Whether the variables or the config turn the SDK on, and where it sends spans. */
export function resolveTelemetry(config: TelemetryConfig, env: NodeJS.ProcessEnv): TelemetryResolution {
  const problems: string[] = [];
  const disabled = nonEmpty(env.OTEL_SDK_DISABLED);
  if (disabled !== undefined && !/^(true|false)$/i.test(disabled)) problems.push(`OTEL_SDK_DISABLED: expected true or false, received ${JSON.stringify(disabled)}`);
  const exporter = nonEmpty(env.OTEL_TRACES_EXPORTER);
  if (exporter !== undefined && exporter !== 'otlp' && exporter !== 'none') {
    problems.push(`OTEL_TRACES_EXPORTER: Keel exports traces over OTLP only: expected otlp or none, received ${JSON.stringify(exporter)}`);
  }
  const tracesUrl = namedTracesUrl(config, env, problems);
  if (problems.length > 0) return { ok: false, problems };
  if (disabled?.toLowerCase() === 'true' || exporter === 'none' || config.enabled === false) return { ok: true, settings: null };
  if (config.enabled !== true && tracesUrl === null) return { ok: true, settings: null };

  const protocolName = config.protocol ? 'telemetry.protocol' : nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) ? 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL' : 'OTEL_EXPORTER_OTLP_PROTOCOL';
  const protocol = config.protocol ?? nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) ?? nonEmpty(env.OTEL_EXPORTER_OTLP_PROTOCOL) ?? 'http/protobuf';
  if (!PROTOCOLS.includes(protocol)) {
    problems.push(`${protocolName}: Keel exports OTLP over HTTP: expected http/protobuf or http/json, received ${JSON.stringify(protocol)}`);
  }

  const headers: Record<string, string> = {};
  for (const name of ['OTEL_EXPORTER_OTLP_HEADERS', 'OTEL_EXPORTER_OTLP_TRACES_HEADERS']) {
    const raw = nonEmpty(env[name]);
    if (raw === undefined) continue;
    const parsed = parseKeyValueList(name, raw);
    if (parsed.ok) Object.assign(headers, parsed.values);
    else problems.push(parsed.problem);
  }

  const resourceAttributes: Record<string, string> = {};
  const rawAttributes = nonEmpty(env.OTEL_RESOURCE_ATTRIBUTES);
  if (rawAttributes !== undefined) {
    const parsed = parseKeyValueList('OTEL_RESOURCE_ATTRIBUTES', rawAttributes);
    if (parsed.ok) Object.assign(resourceAttributes, parsed.values);
    else problems.push(parsed.problem);
  }
  Object.assign(resourceAttributes, config.resourceAttributes ?? {});
  resourceAttributes['service.name'] = config.serviceName ?? nonEmpty(env.OTEL_SERVICE_NAME) ?? resourceAttributes['service.name'] ?? DEFAULT_SERVICE_NAME;

  const samplerText = config.sampler ?? nonEmpty(env.OTEL_TRACES_SAMPLER) ?? 'parentbased_always_on';
  const sampler = SAMPLER_NAMES.find((name) => name === samplerText);
  if (!sampler) problems.push(`OTEL_TRACES_SAMPLER: expected one of ${SAMPLER_NAMES.join(', ')}, received ${JSON.stringify(samplerText)}`);
  let samplerRatio = 1;
  if (sampler?.endsWith('traceidratio')) {
    const rawRatio = config.samplerRatio ?? nonEmpty(env.OTEL_TRACES_SAMPLER_ARG);
    const ratio = rawRatio === undefined ? 1 : Number(rawRatio);
    if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1) problems.push(`OTEL_TRACES_SAMPLER_ARG: expected a ratio from 0 to 1, received ${JSON.stringify(rawRatio)}`);
    else samplerRatio = ratio;
  }
  if (problems.length > 0) return { ok: false, problems };
  return {
    ok: true,
    settings: {
      tracesUrl: tracesUrl ?? tracesUrlUnder(DEFAULT_OTLP_ENDPOINT),
      protocol: protocol as TraceProtocol,
      headers,
      resourceAttributes,
      sampler: sampler!,
      samplerRatio,
      exportTimeoutMs: config.exportTimeoutMs,
      shutdownTimeoutMs: config.shutdownTimeoutMs,
    },
  };
}

/** Whether the SDK will be wired at start (the logger then writes trace_id and span_id). */
export function telemetryWanted(config: TelemetryConfig, env: NodeJS.ProcessEnv): boolean {
  const resolved = resolveTelemetry(config, env);
  return resolved.ok && resolved.settings !== null;
}
