import type { KeelConfig } from '../config/load-config.js';

// How this process writes tasks, decided once at start (docs/architecture.md, "The write path").
// The fast path needs a process that both receives tasks and runs them (role `all`); group commit
// needs nothing. `runs.directWrites` turns both off for diagnosis: every creation and completion
// is then a statement (or transaction) of its own and every run takes the queue, the simplest
// write path Keel has, with the same rows.

export type WritePath = {
  /** New tasks' runs start in this process while it has a free slot (decision 0025). */
  fastPath: boolean;
  /** Creations and completions that are ready together are written together (decision 0026). */
  groupCommit: boolean;
};

export function writePathFor(runs: Pick<KeelConfig['runs'], 'fastPath' | 'directWrites'>, role: 'all' | 'api' | 'worker'): WritePath {
  return { fastPath: role === 'all' && runs.fastPath && !runs.directWrites, groupCommit: !runs.directWrites };
}
