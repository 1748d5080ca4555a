import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { buildAgentCard, grpcPublicAddress } from '../../../src/a2a/agent-card.js';
import { loadConfig, type KeelConfig } from '../../../src/config/load-config.js';
import { tempDir } from '../../support/test-keel.js';

// The `grpc` section: off by default, on with a port; the address the cards name; and the
// loopback rule of auth.mode none, which holds for the gRPC bind address too.

function load(yaml: string, env: NodeJS.ProcessEnv = {}) {
  const dir = tempDir('keel-config-');
  const path = join(dir, 'keel.config.yaml');
  writeFileSync(path, yaml);
  return loadConfig({ configPath: path, env, cwd: dir });
}

function loaded(yaml: string, env: NodeJS.ProcessEnv = {}): KeelConfig {
  const result = load(yaml, env);
  if (!result.ok) throw new Error(result.problems.join('\n'));
  return result.config;
}

const interfacesOf = (config: KeelConfig) => buildAgentCard(config.agents[0]!, config).supportedInterfaces as Array<Record<string, unknown>>;

describe('grpc', () => {
  it('is off by default: no address, no GRPC interface on the card', () => {
    const config = loaded('');
    expect(config.grpc).toEqual({});
    expect(grpcPublicAddress(config)).toBeNull();
    expect(interfacesOf(config).map((entry) => entry.protocolBinding)).toEqual(['JSONRPC', 'HTTP+JSON']);
  });

  it('with a port the card lists GRPC last, at host:port, with the agent as tenant', () => {
    const config = loaded('grpc: { port: 9090 }\n');
    expect(interfacesOf(config)).toEqual([
      { url: 'http://127.0.0.1:8080/a2a/echo', protocolBinding: 'JSONRPC', protocolVersion: '1.0' },
      { url: 'http://127.0.0.1:8080/a2a/echo', protocolBinding: 'HTTP+JSON', protocolVersion: '1.0' },
      { url: '127.0.0.1:9090', protocolBinding: 'GRPC', protocolVersion: '1.0', tenant: 'echo' },
    ]);
  });

  it('names its own host, a wildcard bind by loopback, IPv6 in brackets, and publicAddress above all', () => {
    expect(grpcPublicAddress(loaded('grpc: { port: 9090, host: 10.1.2.3 }\n'))).toBe('10.1.2.3:9090');
    expect(grpcPublicAddress(loaded('server: { host: 0.0.0.0 }\ngrpc: { port: 9090 }\n'))).toBe('127.0.0.1:9090');
    expect(grpcPublicAddress(loaded("grpc: { port: 9090, host: '::1' }\n"))).toBe('[::1]:9090');
    expect(grpcPublicAddress(loaded('grpc: { port: 9090, host: 0.0.0.0, publicAddress: keel.example.com:443 }\n'))).toBe('keel.example.com:443');
  });

  it('takes its keys from the environment', () => {
    const config = loaded('', { KEEL_GRPC_PORT: '7001', KEEL_GRPC_HOST: '::', KEEL_GRPC_PUBLIC_ADDRESS: '[2001:db8::1]:7001' });
    expect(config.grpc).toEqual({ port: 7001, host: '::', publicAddress: '[2001:db8::1]:7001' });
  });

  it('refuses a public address that is not a gRPC target, a port out of range and an unknown key', () => {
    const result = load('grpc: { port: 70000, publicAddress: "https://keel.example.com/a2a", tls: true }\n');
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^grpc\.port: /),
        'grpc.publicAddress: expected host:port (a gRPC target, e.g. keel.example.com:9090)',
        'grpc.tls: unknown key',
      ]),
    );
  });

  it('holds the gRPC bind address to the loopback rule of auth.mode none', () => {
    expect(load('auth: { mode: none }\ngrpc: { port: 9090 }\n').ok).toBe(true);
    expect(load('auth: { mode: none }\ngrpc: { port: 9090, host: localhost }\n').ok).toBe(true);
    expect(load('auth: { mode: none }\ngrpc: { port: 9090, host: 0.0.0.0 }\n')).toEqual({
      ok: false,
      problems: ['auth.mode: "none" is only allowed when grpc.host is a loopback address, not "0.0.0.0"'],
    });
    // Without a port the binding is off, and its host binds nothing.
    expect(load('auth: { mode: none }\ngrpc: { host: 0.0.0.0 }\n').ok).toBe(true);
  });
});
