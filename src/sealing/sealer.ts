import { openJson, sealJson, type OpenFailure, type SealContext } from './envelope.js';
import type { MasterKeyRing } from './master-key.js';

/**
 * What repositories need from sealing: seal a JSON value for one table/column/row, and open it
 * again. Opening fails closed with a value, never with plaintext from the wrong place.
 */
export type Sealer = {
  readonly activeKeyId: string;
  readonly ring: MasterKeyRing;
  sealJson: (context: SealContext, value: unknown) => Buffer;
  openJson: <T = unknown>(context: SealContext, sealed: Buffer) => OpenJsonResult<T>;
};

export type OpenJsonResult<T> = { ok: true; value: T } | OpenFailure;

export function createSealer(ring: MasterKeyRing): Sealer {
  return {
    activeKeyId: ring.active.id,
    ring,
    sealJson: (context, value) => sealJson(ring, context, value),
    openJson: <T>(context: SealContext, sealed: Buffer) => openJson(ring, context, sealed) as OpenJsonResult<T>,
  };
}
