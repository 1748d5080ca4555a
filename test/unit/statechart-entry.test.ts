import { describe, expect, it } from 'vitest';
import * as steps from '../../src/statecharts/steps.js';

// `keel/statechart` (package.json exports) is lib/statechart.js, which names each export of the
// steps module (decision 0077): an export added there and not here would be missing for a team.

describe('keel/statechart', () => {
  it('exports every value the steps module exports, the same ones', async () => {
    // @ts-expect-error lib/statechart.js is plain JavaScript without declarations of its own
    const entry = (await import('../../lib/statechart.js')) as Record<string, unknown>;
    expect(Object.keys(entry).sort()).toEqual(Object.keys(steps).sort());
    for (const name of Object.keys(steps)) expect(entry[name], name).toBe((steps as Record<string, unknown>)[name]);
  });
});
