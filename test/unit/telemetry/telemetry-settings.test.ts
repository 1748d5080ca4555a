import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { configSchema } from '../../../src/config/config-schema.js';
import { loadConfig } from '../../../src/config/load-config.js';
import { parseKeyValueList, resolveTelemetry, telemetryWanted } from '../../../src/telemetry/telemetry-settings.js';
import { tempDir } from '../../support/test-keel.js';

// The `telemetry:` section and the standard OTEL_* variables: when the SDK is wired, where it
// sends, and the clear message for each value it cannot use.

const section = (telemetry: Record<string, unknown> = {}) => configSchema.parse({ telemetry }).telemetry;

function settings(telemetry: Record<string, unknown>, env: NodeJS.ProcessEnv = {}) {
  const resolved = resolveTelemetry(section(telemetry), env);
  if (!resolved.ok) throw new Error(resolved.problems.join('\n'));
  return resolved.settings;
}

function problems(telemetry: Record<string, unknown>, env: NodeJS.ProcessEnv = {}): string[] {
  const resolved = resolveTelemetry(section(telemetry), env);
  return resolved.ok ? [] : resolved.problems;
}

describe('when the SDK is wired', () => {
  it('is off with no section and no endpoint variable', () => {
    expect(settings({})).toBeNull();
    expect(settings({}, { OTEL_SERVICE_NAME: 'keel-eu', OTEL_TRACES_SAMPLER: 'always_on' })).toBeNull();
    expect(telemetryWanted(section(), {})).toBe(false);
  });

  it('is on with an endpoint in the config or in the variables', () => {
    expect(settings({ endpoint: 'http://collector:4318/' })?.tracesUrl).toBe('http://collector:4318/v1/traces');
    expect(settings({ tracesEndpoint: 'https://collector/custom/path' })?.tracesUrl).toBe('https://collector/custom/path');
    expect(settings({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318' })?.tracesUrl).toBe('http://otel:4318/v1/traces');
    expect(settings({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318', OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://traces:4318/x' })?.tracesUrl).toBe('http://traces:4318/x');
    // The config wins over the variables.
    expect(settings({ endpoint: 'http://config:4318' }, { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://env:4318/v1/traces' })?.tracesUrl).toBe('http://config:4318/v1/traces');
    expect(telemetryWanted(section(), { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318' })).toBe(true);
  });

  it('is on with enabled: true and the default collector address', () => {
    expect(settings({ enabled: true })).toMatchObject({ tracesUrl: 'http://localhost:4318/v1/traces', protocol: 'http/protobuf', sampler: 'parentbased_always_on', samplerRatio: 1 });
  });

  it('is off with enabled: false, OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none, endpoint or not', () => {
    expect(settings({ enabled: false, endpoint: 'http://collector:4318' })).toBeNull();
    expect(settings({ enabled: true }, { OTEL_SDK_DISABLED: 'TRUE' })).toBeNull();
    expect(settings({}, { OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318' })).toBeNull();
    expect(settings({ enabled: true }, { OTEL_TRACES_EXPORTER: 'none' })).toBeNull();
    expect(settings({ enabled: true }, { OTEL_SDK_DISABLED: 'false' })).not.toBeNull();
  });
});

describe('what it is wired with', () => {
  it('takes the protocol, headers, resource and sampler from the variables when the config leaves them out', () => {
    const resolved = settings(
      { enabled: true },
      {
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/json',
        OTEL_EXPORTER_OTLP_HEADERS: 'api-key=secret,x-tenant=a%2Cb',
        OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'api-key=traces-secret',
        OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=prod, team = agents',
        OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
        OTEL_TRACES_SAMPLER_ARG: '0.25',
      },
    );
    expect(resolved).toMatchObject({
      protocol: 'http/json',
      headers: { 'api-key': 'traces-secret', 'x-tenant': 'a,b' },
      resourceAttributes: { 'deployment.environment.name': 'prod', team: 'agents', 'service.name': 'keel' },
      sampler: 'parentbased_traceidratio',
      samplerRatio: 0.25,
      exportTimeoutMs: 10_000,
      shutdownTimeoutMs: 5_000,
    });
  });

  it('names the service from the config, then OTEL_SERVICE_NAME, then OTEL_RESOURCE_ATTRIBUTES, then keel', () => {
    const env = { OTEL_SERVICE_NAME: 'from-name', OTEL_RESOURCE_ATTRIBUTES: 'service.name=from-attributes' };
    expect(settings({ enabled: true, serviceName: 'from-config' }, env)?.resourceAttributes['service.name']).toBe('from-config');
    expect(settings({ enabled: true }, env)?.resourceAttributes['service.name']).toBe('from-name');
    expect(settings({ enabled: true }, { OTEL_RESOURCE_ATTRIBUTES: 'service.name=from-attributes' })?.resourceAttributes['service.name']).toBe('from-attributes');
    expect(settings({ enabled: true })?.resourceAttributes['service.name']).toBe('keel');
  });

  it('lets the config\'s sampler and resource attributes win over the variables', () => {
    const resolved = settings(
      { enabled: true, sampler: 'traceidratio', samplerRatio: 0.5, resourceAttributes: { team: 'platform' } },
      { OTEL_TRACES_SAMPLER: 'always_off', OTEL_TRACES_SAMPLER_ARG: '0.1', OTEL_RESOURCE_ATTRIBUTES: 'team=agents,region=eu' },
    );
    expect(resolved).toMatchObject({ sampler: 'traceidratio', samplerRatio: 0.5, resourceAttributes: { team: 'platform', region: 'eu' } });
  });
});

describe('clear errors', () => {
  it('reports each variable it cannot use, by name', () => {
    expect(problems({ enabled: true }, { OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'grpc' })).toEqual([
      'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: Keel exports OTLP over HTTP: expected http/protobuf or http/json, received "grpc"',
    ]);
    expect(problems({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' })).toEqual(['OTEL_EXPORTER_OTLP_ENDPOINT: expected an http:// or https:// URL, received "collector:4318"']);
    expect(problems({}, { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'ftp://collector/v1/traces' })[0]).toMatch(/^OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: expected an http/);
    expect(problems({ enabled: true }, { OTEL_TRACES_SAMPLER: 'jaeger_remote' })[0]).toMatch(/^OTEL_TRACES_SAMPLER: expected one of always_on, .*received "jaeger_remote"$/);
    expect(problems({ enabled: true }, { OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '1.5' })).toEqual(['OTEL_TRACES_SAMPLER_ARG: expected a ratio from 0 to 1, received "1.5"']);
    expect(problems({ enabled: true }, { OTEL_RESOURCE_ATTRIBUTES: 'team' })).toEqual(['OTEL_RESOURCE_ATTRIBUTES: expected key=value pairs separated by commas, received "team"']);
    expect(problems({ enabled: true }, { OTEL_EXPORTER_OTLP_HEADERS: 'api-key=%E0%A4%A' })).toEqual(['OTEL_EXPORTER_OTLP_HEADERS: the value of "api-key" is not valid percent-encoding']);
    expect(problems({}, { OTEL_SDK_DISABLED: 'yes please' })).toEqual(['OTEL_SDK_DISABLED: expected true or false, received "yes please"']);
    expect(problems({}, { OTEL_TRACES_EXPORTER: 'zipkin' })[0]).toMatch(/^OTEL_TRACES_EXPORTER: Keel exports traces over OTLP only/);
  });

  it('reports the telemetry section\'s mistakes as config errors', () => {
    const dir = tempDir('keel-config-');
    const path = join(dir, 'keel.config.yaml');
    writeFileSync(path, ['telemetry:', '  endpoint: collector:4318', '  protocol: grpc', '  samplerRatio: 2', '  exporter: zipkin'].join('\n'));
    const loaded = loadConfig({ configPath: path, env: {}, cwd: dir });
    expect(loaded.ok).toBe(false);
    const text = loaded.ok ? '' : loaded.problems.join('\n');
    expect(text).toContain('telemetry.endpoint: expected an http:// or https:// URL');
    expect(text).toContain('telemetry.protocol: expected one of "http/protobuf", "http/json", received "grpc"');
    expect(text).toContain('telemetry.samplerRatio:');
    expect(text).toContain('telemetry.exporter: unknown key');
    // And a KEEL_TELEMETRY_* variable overrides the section, as for every key.
    writeFileSync(path, 'telemetry:\n  endpoint: http://config:4318\n');
    const overridden = loadConfig({ configPath: path, env: { KEEL_TELEMETRY_ENDPOINT: 'http://override:4318' }, cwd: dir });
    expect(overridden.ok && overridden.config.telemetry.endpoint).toBe('http://override:4318');
  });

  it('parses key=value lists with percent-encoded values', () => {
    expect(parseKeyValueList('X', 'a=1, b = two%20words ,,c=')).toEqual({ ok: true, values: { a: '1', b: 'two words', c: '' } });
    expect(parseKeyValueList('X', '=1')).toMatchObject({ ok: false });
  });
});

describe('loading', () => {
  const ROOT = join(dirname(new URL(import.meta.url).pathname), '..', '..', '..');
  const files = (dir: string): string[] =>
    readdirSync(join(ROOT, dir)).flatMap((entry) => (statSync(join(ROOT, dir, entry)).isDirectory() ? files(join(dir, entry)) : entry.endsWith('.ts') ? [join(dir, entry)] : []));

  it('imports the SDK packages only in the module loaded by a dynamic import when tracing is on', () => {
    const sdkImports = /from\s+['"]@opentelemetry\/(?!api['"])[^'"]+['"]/;
    const sdkModules = ['src/telemetry/telemetry-sdk.ts', 'src/telemetry/requested-id-generator.ts', 'src/telemetry/linked-trace-sampler.ts'];
    const sources = [...files('src'), ...files('workers'), ...files('machines')];
    const importing = sources.filter((file) => sdkImports.test(readFileSync(join(ROOT, file), 'utf8').replace(/import type [^;]+;/g, '')));
    expect(importing.sort()).toEqual(['src/telemetry/linked-trace-sampler.ts', 'src/telemetry/telemetry-sdk.ts']);
    // The SDK modules are imported statically by nothing but each other.
    for (const file of sources.filter((name) => !sdkModules.includes(name))) {
      expect(readFileSync(join(ROOT, file), 'utf8').replace(/import type [^;]+;/g, ''), file).not.toMatch(/from\s+['"][^'"]*\/(telemetry-sdk|requested-id-generator|linked-trace-sampler)\.js['"]/);
    }
  });
});
