import type { AgentConfig } from '../config/config-schema.js';
import type { KeelConfig } from '../config/load-config.js';
import { publicJwks } from '../cards/card-keys.js';
import { signAgentCard, type CardSigner } from '../cards/card-signature.js';
import { buildAgentCard } from './agent-card.js';

// The cards as Keel serves them, public and extended, each agent's: built from its config and,
// with `security.cardSigning`, signed (decision 0021). A card depends on the config only, so each
// is built and signed once, on first use: with port 0 the public URL is only known once the
// server listens.

export class ServedCards {
  private readonly built = new Map<string, Promise<Record<string, unknown>>>();

  constructor(
    private readonly config: KeelConfig,
    private readonly signer: CardSigner | null,
  ) {}

  /** The public half of the signing key as a JWKS (what `security.cardSigning.jku` may point at); null when cards go unsigned. */
  jwks(): object | null {
    return this.signer ? publicJwks(this.signer) : null;
  }

  card(agent: AgentConfig, options: { extended?: boolean } = {}): Promise<Record<string, unknown>> {
    const key = `${options.extended ? 'extended' : 'public'}:${agent.id}`;
    let card = this.built.get(key);
    if (!card) {
      const unsigned = buildAgentCard(agent, this.config, options);
      card = this.signer ? signAgentCard(unsigned, this.signer) : Promise.resolve(unsigned);
      // A signing that failed is tried again on the next request rather than remembered.
      card.catch(() => this.built.delete(key));
      this.built.set(key, card);
    }
    return card;
  }
}
