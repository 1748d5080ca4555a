import { generateMasterKey, MasterKeyRing } from '../../src/sealing/master-key.js';
import { createSealer, type Sealer } from '../../src/sealing/sealer.js';

export function testSealer(): Sealer {
  return createSealer(new MasterKeyRing([generateMasterKey()]));
}
