#!/usr/bin/env node
// Keel runs its TypeScript sources through tsx's loader (see docs/decisions/0001-run-typescript-through-tsx.md).
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../src/cli/main.ts');
await main(process.argv);
