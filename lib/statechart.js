// `keel/statechart`, the steps a statechart agent's machine invokes (docs/statechart-agents.md),
// from the Keel this file belongs to. A packed Keel has no sources and exports its build, dist/;
// a checkout exports its TypeScript source, which whatever loads a team's TypeScript machine there
// (Keel's loader, vitest) compiles (docs/decisions/0077-a-packed-keel-runs-its-build.md).
// The declarations are dist/src/statecharts/steps.d.ts (package.json `exports`).
import { existsSync } from 'node:fs';

const source = new URL('../src/statecharts/steps.ts', import.meta.url);
const steps = await import(existsSync(source) ? source.href : new URL('../dist/src/statecharts/steps.js', import.meta.url).href);

export const { KEEL_STEP, askApproval, askInput, callModel, callRemoteAgent, callTool, defineStep, stepMarkerOf } = steps;
