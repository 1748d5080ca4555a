import { generateKeyPairSync } from 'node:crypto';
import { chmodSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCardKeyFiles } from '../../../src/cards/card-trust.js';
import { silentLogger } from '../../../src/log/logger.js';
import { createGuardedFetch } from '../../../src/net/guarded-fetch.js';
import { listRemoteCardStatus, RemoteAgents } from '../../../src/remote/remote-agents.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, tempDir, type TestKeel } from '../../support/test-keel.js';
import { LOOPBACK, REMOTE_TEST_OVERRIDES, artifactText, delegatingOverrides, dependenciesOf, freePort, newToken, sendLocal, waitForLocalTask, type RemoteAgentInput } from './remote-support.js';

// The client role with remoteAgents[].requireSignedCard (decision 0021): Keel A delegates to the
// `worker` agent of Keel B, which signs its cards. A card is used only when a signature on it
// verifies with the key A was given (cardKey) or with the JWKS at an allowed jku (cardJku); an
// unsigned card, one signed by another key, one changed in transit and one naming a jku A does not
// allow are refused before any message goes out, and the refusal reaches the run (the tool's
// error), the operator (remote_cards.error, `keel remote list`) and the logs.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const dir = tempDir('keel-signed-remote-');
const signing = generateKeyPairSync('ed25519');
const stranger = generateKeyPairSync('ed25519');
const writeKey = (name: string, text: string, mode: number) => {
  const path = join(dir, name);
  writeFileSync(path, text);
  chmodSync(path, mode);
  return path;
};
const privatePem = writeKey('b-signing.pem', signing.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), 0o600);
const publicJwk = writeKey('b-signing.jwk', JSON.stringify({ ...signing.publicKey.export({ format: 'jwk' }), kid: 'keel-b-1' }), 0o644);
const strangerPem = writeKey('stranger.pub.pem', stranger.publicKey.export({ type: 'spki', format: 'pem' }).toString(), 0o644);

const WORK_DONE = 'work done by keel-b';

let a: TestKeel;
let b: TestKeel;
let databaseA: TestDatabase;
let databaseB: TestDatabase;
let relay: Server;
let token = '';
let jwksB = '';
let cardB = '';

/** Serves B's worker card as it is, without its signatures, or with its interface moved. */
async function startRelay(): Promise<string> {
  relay = createServer((request, response) => {
    void (async () => {
      const card = (await (await fetch(cardB)).json()) as Json;
      const served = request.url?.startsWith('/unsigned/')
        ? (({ signatures: _signatures, ...rest }) => rest)(card)
        : { ...card, supportedInterfaces: card.supportedInterfaces.map((entry: Json) => ({ ...entry, url: `http://${LOOPBACK}:9/a2a/worker` })) };
      response.writeHead(200, { 'content-type': 'application/json' });
      response.end(JSON.stringify(served));
    })();
  });
  await new Promise<void>((resolve) => relay.listen(0, LOOPBACK, resolve));
  return `http://${LOOPBACK}:${(relay.address() as AddressInfo).port}`;
}

const remotes = (relayUrl: string): RemoteAgentInput[] =>
  [
    { id: 'by-key', cardUrl: cardB, requireSignedCard: true, cardKey: publicJwk },
    { id: 'by-jku', cardUrl: cardB, requireSignedCard: true, cardJku: [jwksB] },
    { id: 'other-key', cardUrl: cardB, requireSignedCard: true, cardKey: strangerPem },
    { id: 'jku-not-allowed', cardUrl: cardB, requireSignedCard: true, cardJku: [`http://${LOOPBACK}:9/.well-known/jwks.json`] },
    { id: 'unsigned', cardUrl: `${relayUrl}/unsigned/.well-known/agent-card.json`, requireSignedCard: true, cardKey: publicJwk },
    { id: 'tampered', cardUrl: `${relayUrl}/tampered/.well-known/agent-card.json`, requireSignedCard: true, cardJku: [jwksB] },
    { id: 'unchecked', cardUrl: `${relayUrl}/unsigned/.well-known/agent-card.json` },
  ].map((remote) => ({ ...remote, credentialEnv: 'KEEL_B_TOKEN' }));

beforeAll(async () => {
  [databaseA, databaseB] = await Promise.all([createTestDatabase(), createTestDatabase()]);
  const portB = await freePort();
  const urlB = `http://${LOOPBACK}:${portB}`;
  jwksB = `${urlB}/.well-known/jwks.json`;
  cardB = `${urlB}/a2a/worker/.well-known/agent-card.json`;
  b = await startTestKeel({
    databaseUrl: databaseB.url,
    overrides: {
      // B pushes to A's inbox on loopback.
      ...REMOTE_TEST_OVERRIDES,
      KEEL_PROVIDERS: { worker: { type: 'scripted', steps: [{ reply: WORK_DONE }] } },
      KEEL_AGENTS: [{ id: 'worker', name: 'Worker of keel-b', provider: 'worker', privacy: { answerLevel: 'full' } }],
      KEEL_SERVER_PORT: String(portB),
      KEEL_SECURITY_CARD_SIGNING_ALG: 'Ed25519',
      KEEL_SECURITY_CARD_SIGNING_KID: 'keel-b-1',
      KEEL_SECURITY_CARD_SIGNING_KEY_FILE: privatePem,
      KEEL_SECURITY_CARD_SIGNING_JKU: jwksB,
    },
  });
  const relayUrl = await startRelay();
  a = await startTestKeel({
    databaseUrl: databaseA.url,
    env: { KEEL_B_TOKEN: await newToken(databaseB.pool, 'keel-a') },
    overrides: delegatingOverrides(remotes(relayUrl)),
  });
  token = await newToken(databaseA.pool, 'tester');
});
afterAll(async () => {
  await Promise.all([a?.dispose(), b?.dispose()]);
  await new Promise<void>((resolve) => (relay ? relay.close(() => resolve()) : resolve()));
  await Promise.all([databaseA?.drop(), databaseB?.drop()]);
});

const tasksOnB = () => databaseB.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_tasks`);

/** Delegates through A's `to-<remote>` agent; the local task's answer and its run's dependencies. */
async function delegate(remote: string) {
  const { taskId, runId } = await sendLocal(a, token, `to-${remote}`, `delegate to ${remote}`);
  const task = await waitForLocalTask(a, token, `to-${remote}`, taskId);
  expect(task.status?.state, `the local task of ${remote} ended COMPLETED`).toBe(3);
  return { answer: artifactText(task), dependencies: await dependenciesOf(a.context.pool, runId) };
}

describe('a remote agent with requireSignedCard', () => {
  it('is called when its card verifies with cardKey, or with the JWKS at an allowed jku', async () => {
    for (const remote of ['by-key', 'by-jku']) {
      const { answer, dependencies } = await delegate(remote);
      expect(answer).toBe(`remote said: ${JSON.stringify({ state: 'completed', result: WORK_DONE })}`);
      expect(dependencies).toHaveLength(1);
      expect(dependencies[0]).toMatchObject({ remote_agent: remote, state: 'resolved', outcome: 'completed' });
    }
  });

  it.each([
    ['unsigned', 'the card carries no signatures (unsigned)'],
    ['other-key', `no signature matches: the card was changed after it was signed, or another key signed it (signature 1: does not verify with ${strangerPem})`],
    ['tampered', 'no signature matches: the card was changed after it was signed, or another key signed it (signature 1: does not verify with JWKS <jwks> (kid keel-b-1))'],
    ['jku-not-allowed', 'no key to check the signature with (signature 1: its jku <jwks> is not one of the allowed JWKS URLs (http://127.0.0.1:9/.well-known/jwks.json))'],
  ])('refuses a card that is %s before any message goes out, and the run and the operator see why', async (remote, why) => {
    const before = await tasksOnB();
    const message = `remote agent ${remote}: card refused (requireSignedCard): ${why.replaceAll('<jwks>', jwksB)}`;
    const { answer, dependencies } = await delegate(remote);
    // The tool's error is the run's answer here (the scripted agent repeats its tool result).
    expect(answer).toBe(`remote said: error: ${message}`);
    expect(dependencies).toEqual([]);
    expect(await tasksOnB()).toBe(before);
    // The operator's view (`keel remote list`): the error, and no card accepted.
    const status = (await listRemoteCardStatus(a.context.pool)).find((row) => row.remote_agent === remote);
    expect(status).toMatchObject({ error: `card refused (requireSignedCard): ${why.replaceAll('<jwks>', jwksB)}`, fetched_at: null, name: null });
  });

  it('answers a typed refusal to the client role (card_unverified), apart from an unreachable card', async () => {
    const keys = loadCardKeyFiles(a.config);
    if (!keys.ok) throw new Error(keys.problems.join('\n'));
    const fetch = createGuardedFetch(a.config.security.addressGuard);
    try {
      const lookups = new RemoteAgents(
        [...a.config.remoteAgents, { id: 'down', cardUrl: `http://${LOOPBACK}:9/.well-known/agent-card.json`, registration: 'embedded', requireSignedCard: false }],
        { fetch, pool: a.context.pool, sealer: a.context.sealer, logger: silentLogger(), env: { KEEL_B_TOKEN: 'x' }, cardTrust: keys.remoteTrust },
      );
      expect(await lookups.get('other-key')).toMatchObject({ ok: false, reason: 'card_unverified' });
      expect(await lookups.get('unsigned')).toMatchObject({ ok: false, reason: 'card_unverified' });
      expect(await lookups.get('down')).toMatchObject({ ok: false, reason: 'unavailable' });
      expect(await lookups.get('by-key')).toMatchObject({ ok: true, remote: { card: { name: 'Worker of keel-b' } } });
    } finally {
      await fetch.close();
    }
  });

  it('leaves a remote without requireSignedCard as it was: its unsigned card is used', async () => {
    const { answer, dependencies } = await delegate('unchecked');
    expect(answer).toBe(`remote said: ${JSON.stringify({ state: 'completed', result: WORK_DONE })}`);
    expect(dependencies[0]).toMatchObject({ remote_agent: 'unchecked', state: 'resolved' });
  });

  it('stops start-up when a cardKey file is missing', async () => {
    await expect(
      startTestKeel({ overrides: delegatingOverrides([{ id: 'peer', cardUrl: cardB, requireSignedCard: true, cardKey: join(dir, 'absent.pem') }]) }),
    ).rejects.toThrow(`keel did not start (card signing): remoteAgents.0 (peer).cardKey: ${join(dir, 'absent.pem')}: not found`);
  });
});
