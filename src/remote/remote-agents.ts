import { AgentCard } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory, type Client } from '@a2a-js/sdk/client';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { verifyCardSignatures } from '../cards/card-signature.js';
import { keyResolver, type RemoteCardTrust } from '../cards/card-trust.js';
import type { RemoteAgentConfig } from '../config/config-schema.js';
import type { KeelLogger } from '../log/logger.js';
import type { GuardedFetch } from '../net/guarded-fetch.js';
import { describeRefusal } from '../net/guarded-fetch.js';
import type { Sealer } from '../sealing/sealer.js';
import { guardedFetchFor } from './guarded-fetch-adapter.js';

// Remote A2A agents this installation calls, by card URL. Cards are fetched through the address
// guard and cached (in memory for calls, in `remote_cards` for operators); the official client
// talks to them with the guarded fetch underneath and the agent's credential on every request.
// With `requireSignedCard`, a card is used only when one of its signatures verifies with a key
// the operator trusts (decision 0021); a refused card is never cached.

export const remoteCredentialContext = (remoteId: string) => ({ table: 'config', column: 'remoteAgents.credentialSealed', rowId: remoteId });

export type RemoteAgent = { config: RemoteAgentConfig; card: Record<string, unknown>; client: Client; pushSupported: boolean };

/** `card_unverified`: the card was fetched but refused, its signature missing or not matching a trusted key. */
export type RemoteLookup = { ok: true; remote: RemoteAgent } | { ok: false; reason: 'unknown' | 'unavailable' | 'card_unverified'; message: string };

const CARD_TTL_MS = 5 * 60_000;

export class RemoteAgents {
  private readonly cache = new Map<string, { remote: RemoteAgent; at: number }>();
  private readonly configs: Map<string, RemoteAgentConfig>;

  constructor(
    configs: readonly RemoteAgentConfig[],
    private readonly deps: {
      fetch: GuardedFetch;
      pool: DatabasePool;
      sealer: Sealer;
      logger: KeelLogger;
      env?: NodeJS.ProcessEnv;
      /** The keys of the remotes with `requireSignedCard` (src/cards/card-trust.ts, read at start). */
      cardTrust?: ReadonlyMap<string, RemoteCardTrust>;
    },
  ) {
    this.configs = new Map(configs.map((config) => [config.id, config]));
  }

  ids(): string[] {
    return [...this.configs.keys()];
  }

  /** The remote agent's credential, from its env var or its sealed value; null when it has none. */
  credentialOf(config: RemoteAgentConfig): { ok: true; value: string | null } | { ok: false; message: string } {
    if (config.credentialEnv) {
      const value = (this.deps.env ?? process.env)[config.credentialEnv];
      if (!value) return { ok: false, message: `the environment variable ${config.credentialEnv} holding remote agent ${config.id}'s credential is not set` };
      return { ok: true, value };
    }
    if (config.credentialSealed) {
      const opened = this.deps.sealer.openJson<string>(remoteCredentialContext(config.id), Buffer.from(config.credentialSealed, 'base64'));
      if (!opened.ok) return { ok: false, message: `remote agent ${config.id}'s sealed credential cannot be opened (${opened.reason})` };
      return { ok: true, value: opened.value };
    }
    return { ok: true, value: null };
  }

  async get(id: string): Promise<RemoteLookup> {
    const config = this.configs.get(id);
    if (!config) return { ok: false, reason: 'unknown', message: `no remote agent ${id} is configured (remoteAgents)` };
    const cached = this.cache.get(id);
    if (cached && Date.now() - cached.at < CARD_TTL_MS) return { ok: true, remote: cached.remote };
    const credential = this.credentialOf(config);
    if (!credential.ok) return { ok: false, reason: 'unavailable', message: credential.message };
    const fetched = await this.deps.fetch({ url: config.cardUrl, method: 'GET', headers: { accept: 'application/json' }, timeoutMs: 15_000, maxResponseBytes: 1024 * 1024 });
    let card: Record<string, unknown> | null = null;
    let error: string | null = null;
    if (!fetched.ok) {
      error = fetched.kind === 'refused' ? `refused by the address guard: ${describeRefusal(fetched.refusal)}` : `card request failed (${fetched.failure.class})`;
    } else if (fetched.response.status !== 200) {
      error = `card request answered ${fetched.response.status}`;
    } else {
      try {
        card = JSON.parse(fetched.response.body.toString('utf8')) as Record<string, unknown>;
      } catch {
        error = 'the card is not JSON';
      }
    }
    let refused = false;
    if (card && config.requireSignedCard) {
      const trust = this.deps.cardTrust?.get(id) ?? { keys: [], jkus: [] };
      const verdict = await verifyCardSignatures(card, keyResolver(trust, this.deps.fetch));
      if (!verdict.ok) {
        refused = true;
        error = `card refused (requireSignedCard): ${verdict.message}`;
        card = null;
        this.deps.logger.warn({ remoteAgent: id, reason: verdict.reason, cardUrl: config.cardUrl }, `remote agent card refused: ${verdict.message}`);
      }
    }
    await this.deps.pool.query(sql.unsafe`
      INSERT INTO remote_cards (remote_agent, card, fetched_at, error, updated_at)
      VALUES (${id}, ${card ? sql.jsonb(card as never) : null}, ${card ? sql.fragment`now()` : null}, ${error}, now())
      ON CONFLICT (remote_agent) DO UPDATE SET card = coalesce(EXCLUDED.card, remote_cards.card),
        fetched_at = coalesce(EXCLUDED.fetched_at, remote_cards.fetched_at), error = EXCLUDED.error, updated_at = now()`);
    if (!card) return { ok: false, reason: refused ? 'card_unverified' : 'unavailable', message: `remote agent ${id}: ${error}` };
    const fetchImpl = guardedFetchFor(this.deps.fetch, credential.value ? { authorization: `Bearer ${credential.value}` } : {}, undefined, id);
    const factory = new ClientFactory(
      ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
        transports: [new JsonRpcTransportFactory({ fetchImpl }), new RestTransportFactory({ fetchImpl })],
      }),
    );
    try {
      const client = await factory.createFromAgentCard(AgentCard.fromJSON(card));
      const capabilities = (card.capabilities ?? {}) as { pushNotifications?: boolean };
      const remote: RemoteAgent = { config, card, client, pushSupported: capabilities.pushNotifications === true };
      this.cache.set(id, { remote, at: Date.now() });
      return { ok: true, remote };
    } catch (cause) {
      return { ok: false, reason: 'unavailable', message: `remote agent ${id}: the card cannot be used (${(cause as Error).message})` };
    }
  }
}

const cardRow = z.object({ remote_agent: z.string(), fetched_at: z.number().nullable(), error: z.string().nullable(), name: z.string().nullable() });

export async function listRemoteCardStatus(pool: DatabasePool): Promise<ReadonlyArray<z.infer<typeof cardRow>>> {
  return pool.any(sql.type(cardRow)`SELECT remote_agent, fetched_at, error, card ->> 'name' AS name FROM remote_cards ORDER BY remote_agent`);
}
