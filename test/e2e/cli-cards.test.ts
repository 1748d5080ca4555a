import { spawn } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { chmodSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeMasterKey, generateMasterKey } from '../../src/sealing/master-key.js';
import { freePort, LOOPBACK } from '../integration/remote/remote-support.js';
import { cleanEnv, KEEL_BIN, runKeel } from '../support/keel-process.js';
import { cliEnvFor, startTestKeel, tempDir, type TestKeel } from '../support/test-keel.js';

// `keel cards` as an operator runs it (decision 0021): `verify` against a running Keel that signs
// its cards and one that does not, with the signer's key, with the key its jku names, with the
// wrong key, and against a copy of a signed card changed in transit; `seal-key` and `jwks` for a
// signing installation; `doctor` naming the signing key.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const dir = tempDir('keel-cli-cards-');
const signing = generateKeyPairSync('ed25519');
const stranger = generateKeyPairSync('ed25519');

function writeKey(name: string, text: string, mode = 0o600): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  chmodSync(path, mode);
  return path;
}

const privatePem = writeKey('signing.pem', signing.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
const publicPem = writeKey('signing.pub.pem', signing.publicKey.export({ type: 'spki', format: 'pem' }).toString(), 0o644);
const strangerPem = writeKey('stranger.pub.pem', stranger.publicKey.export({ type: 'spki', format: 'pem' }).toString(), 0o644);

let signed: TestKeel;
let unsigned: TestKeel;
let tamperer: Server;
let tamperedUrl = '';
const SIGNING_ENV = { KEEL_SECURITY_CARD_SIGNING_ALG: 'Ed25519', KEEL_SECURITY_CARD_SIGNING_KID: 'keel-cli' };
/** The CLI may reach loopback over plain HTTP, as an operator would allow for a local peer. */
const GUARD_ENV = { KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: LOOPBACK, KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true' };
const cli = (args: string[], env: Record<string, string> = GUARD_ENV) => runKeel(args, { cwd: dir, env: cleanEnv({ KEEL_LOG_LEVEL: 'warn', ...env }) });

/** `keel` with text on stdin. */
function cliWithInput(args: string[], input: string, env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [KEEL_BIN, ...args], { cwd: dir, env: cleanEnv({ KEEL_LOG_LEVEL: 'warn', ...env }), stdio: ['pipe', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  child.stdin.end(input);
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, stdout, stderr })));
}

beforeAll(async () => {
  const port = await freePort();
  const jku = `http://${LOOPBACK}:${port}/.well-known/jwks.json`;
  [signed, unsigned] = await Promise.all([
    startTestKeel({ overrides: { ...SIGNING_ENV, KEEL_SECURITY_CARD_SIGNING_KEY_FILE: privatePem, KEEL_SECURITY_CARD_SIGNING_JKU: jku, KEEL_SERVER_PORT: String(port) } }),
    startTestKeel(),
  ]);
  // A man in the middle: serves the signed card with its interface moved to another server.
  const original = (await (await fetch(`${signed.url}/.well-known/agent-card.json`)).json()) as Json;
  const changed = { ...original, supportedInterfaces: original.supportedInterfaces.map((entry: Json) => ({ ...entry, url: 'http://127.0.0.1:9/a2a/echo' })) };
  tamperer = createServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'application/json' });
    response.end(JSON.stringify(changed));
  });
  await new Promise<void>((resolve) => tamperer.listen(0, LOOPBACK, resolve));
  tamperedUrl = `http://${LOOPBACK}:${(tamperer.address() as AddressInfo).port}/.well-known/agent-card.json`;
});
afterAll(async () => {
  await Promise.all([signed?.dispose(), unsigned?.dispose()]);
  await new Promise<void>((resolve) => (tamperer ? tamperer.close(() => resolve()) : resolve()));
});

describe('keel cards verify', () => {
  it("exits 0 for a signed Keel's card checked with the signer's public key", async () => {
    const result = await cli(['cards', 'verify', `${signed.url}/.well-known/agent-card.json`, '--key', publicPem]);
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    const lines = result.stdout.trimEnd().split('\n');
    expect(lines[0]).toBe(`card  ${signed.url}/.well-known/agent-card.json  "Echo"`);
    expect(lines[1]).toBe(`signature 1  kid keel-cli  alg EdDSA  jku ${signed.url}/.well-known/jwks.json  VERIFIED: verified with ${publicPem}`);
    expect(lines[2]).toBe("verified: signature 1 (kid keel-cli) covers the card's canonical form");
  });

  it("exits 0 with the key the signature's jku names, given an agent's base URL, and says where the key came from", async () => {
    const result = await cli(['cards', 'verify', `${signed.url}/a2a/echo`]);
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    expect(result.stdout).toContain(`card  ${signed.url}/a2a/echo/.well-known/agent-card.json  "Echo"`);
    expect(result.stdout).toContain(`VERIFIED: verified with JWKS ${signed.url}/.well-known/jwks.json (kid keel-cli)`);
    expect(result.stdout).toContain(`key: from the signature's jku, on the card's own origin ${signed.url}; pin the key with --key to check a known signer`);
  });

  it('exits 1 for an unsigned card', async () => {
    const result = await cli(['cards', 'verify', `${unsigned.url}/.well-known/agent-card.json`, '--key', publicPem]);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe(`card  ${unsigned.url}/.well-known/agent-card.json  "Echo"\n`);
    expect(result.stderr).toBe('keel: card NOT verified: the card carries no signatures (unsigned)\n');
  });

  it('exits 1 for a card signed by another key than the one given', async () => {
    const result = await cli(['cards', 'verify', `${signed.url}/.well-known/agent-card.json`, '--key', strangerPem]);
    expect(result.code).toBe(1);
    expect(result.stdout).toContain(`MISMATCH: does not verify with ${strangerPem}`);
    expect(result.stderr).toBe(
      `keel: card NOT verified: no signature matches: the card was changed after it was signed, or another key signed it (signature 1: does not verify with ${strangerPem})\n`,
    );
  });

  it('exits 1 for a signed card changed in transit, with the right key and with its jku', async () => {
    for (const args of [['--key', publicPem], []]) {
      const result = await cli(['cards', 'verify', tamperedUrl, ...args]);
      expect(result.code).toBe(1);
      expect(result.stdout).toContain('MISMATCH');
      expect(result.stderr).toContain('keel: card NOT verified: no signature matches: the card was changed after it was signed, or another key signed it');
    }
  });

  it('fetches through the address guard: a loopback card is refused without allowHosts', async () => {
    const result = await cli(['cards', 'verify', `${signed.url}/.well-known/agent-card.json`, '--key', publicPem], {});
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/^keel: card http:\/\/127\.0\.0\.1:\d+\/\.well-known\/agent-card\.json: refused by the address guard: .*\(security\.addressGuard\.allowHosts \/ allowHttp\)\n$/);
  });

  it('exits 64 for a key file it cannot read and for something that is no URL', async () => {
    const missing = await cli(['cards', 'verify', `${signed.url}/.well-known/agent-card.json`, '--key', join(dir, 'absent.pem')]);
    expect(missing.code).toBe(64);
    expect(missing.stderr).toBe(`keel: --key: ${join(dir, 'absent.pem')}: not found\n`);
    const notUrl = await cli(['cards', 'verify', 'nonsense']);
    expect(notUrl.code).toBe(64);
    expect(notUrl.stderr).toBe('keel: "nonsense" is not a URL\n');
  });

  it('a Keel without card signing publishes no key set', async () => {
    expect((await fetch(`${unsigned.url}/.well-known/jwks.json`)).status).toBe(404);
  });
});

describe('keel cards seal-key and jwks', () => {
  it('seals a key whose public key set jwks then prints, opened with the same master key only', async () => {
    const master = encodeMasterKey(generateMasterKey());
    const ecKey = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const sealed = await cliWithInput(['cards', 'seal-key'], ecKey.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), { KEEL_MASTER_KEY: master });
    expect(sealed.code).toBe(0);
    expect(sealed.stderr).toBe('an ES256 key: set security.cardSigning.alg: ES256 and keySealed to the line above\n');
    const value = sealed.stdout.trim();
    expect(value).toMatch(/^[A-Za-z0-9+/]+=*$/);
    expect(value).not.toContain('PRIVATE');

    const signingEnv = { KEEL_MASTER_KEY: master, KEEL_SECURITY_CARD_SIGNING_ALG: 'ES256', KEEL_SECURITY_CARD_SIGNING_KID: 'sealed-1', KEEL_SECURITY_CARD_SIGNING_KEY_SEALED: value };
    const jwks = await cli(['cards', 'jwks'], signingEnv);
    expect(jwks.stderr).toBe('');
    expect(jwks.code).toBe(0);
    expect(JSON.parse(jwks.stdout)).toEqual({ keys: [{ ...ecKey.publicKey.export({ format: 'jwk' }), kid: 'sealed-1', alg: 'ES256', use: 'sig' }] });

    // Another master key cannot open it; nothing but a private key is sealed.
    const wrongMaster = await cli(['cards', 'jwks'], { ...signingEnv, KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()) });
    expect(wrongMaster.code).toBe(2);
    expect(wrongMaster.stderr).toMatch(/^keel: security\.cardSigning\.keySealed: sealed under master key [0-9a-f]{16}, which is not available\n$/);
    const publicOnStdin = await cliWithInput(['cards', 'seal-key'], ecKey.publicKey.export({ type: 'spki', format: 'pem' }).toString(), { KEEL_MASTER_KEY: master });
    expect(publicOnStdin.code).toBe(64);
    expect(publicOnStdin.stderr).toBe('keel: the key on stdin: a public key or certificate; card signing needs the private key\n');
  });

  it('jwks prints the key set of a key file, and says when nothing is configured', async () => {
    const jwks = await cli(['cards', 'jwks'], { ...SIGNING_ENV, KEEL_SECURITY_CARD_SIGNING_KEY_FILE: privatePem });
    expect(jwks.code).toBe(0);
    expect(JSON.parse(jwks.stdout)).toEqual({ keys: [{ ...signing.publicKey.export({ format: 'jwk' }), kid: 'keel-cli', alg: 'EdDSA', use: 'sig' }] });
    const none = await cli(['cards', 'jwks'], {});
    expect(none.code).toBe(2);
    expect(none.stderr).toBe('keel: security.cardSigning is not configured\n');
  });
});

describe('keel doctor', () => {
  it('names the card signing key, and fails the config check for one it cannot read', async () => {
    const env = { ...cliEnvFor(signed), ...SIGNING_ENV, KEEL_SECURITY_CARD_SIGNING_KEY_FILE: privatePem };
    const ok = await cli(['doctor'], env);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toMatch(new RegExp(`^ok {4}card key {3}cards signed with EdDSA, kid keel-cli \\(${privatePem.replace(/[.]/g, '\\.')}\\)$`, 'm'));
    const broken = await cli(['doctor'], { ...env, KEEL_SECURITY_CARD_SIGNING_KEY_FILE: publicPem });
    expect(broken.code).toBe(2);
    expect(broken.stdout).toContain(`FAIL  config     security.cardSigning.keyFile ${publicPem}: a public key or certificate; card signing needs the private key`);
  });
});
