import { isAbsolute, resolve } from 'node:path';
import type { GuardrailConfig } from '../config/config-schema.js';
import type { Guardrail, GuardrailCheck, GuardrailDecision } from './guardrail.js';
import { loadModuleFile } from '../config/import-module-file.js';
import { loadProblem } from '../config/module-load-error.js';

export type LoadGuardrailsResult = { ok: true; guardrails: Guardrail[] } | { ok: false; problems: string[] };

function denyPattern(config: Extract<GuardrailConfig, { type: 'denyPattern' }>, where: string): Guardrail | string {
  const expressions: RegExp[] = [];
  for (const pattern of config.patterns) {
    try {
      expressions.push(new RegExp(pattern, config.ignoreCase ? 'iu' : 'u'));
    } catch (error) {
      return `${where}: pattern ${JSON.stringify(pattern)} is not a valid regular expression (${(error as Error).message})`;
    }
  }
  const reason = config.reason ?? `matched a pattern of ${config.name}`;
  return {
    name: config.name,
    stages: config.on,
    check: async ({ text }): Promise<GuardrailDecision> =>
      expressions.some((expression) => expression.test(text)) ? { verdict: config.action, reason } : { verdict: 'allow' },
  };
}

/** Builds an agent's guardrails; problems name the agent and the guardrail. */
export async function loadGuardrails(configs: readonly GuardrailConfig[], where: string, baseDir: string): Promise<LoadGuardrailsResult> {
  const guardrails: Guardrail[] = [];
  const problems: string[] = [];
  for (const [index, config] of configs.entries()) {
    const at = `${where}: guardrails.${index} (${config.name})`;
    if (config.type === 'denyPattern') {
      const built = denyPattern(config, at);
      if (typeof built === 'string') problems.push(built);
      else guardrails.push(built);
      continue;
    }
    const path = isAbsolute(config.module) ? config.module : resolve(baseDir, config.module);
    const loaded = await loadModuleFile(path);
    if (!loaded.ok) {
      problems.push(loadProblem(`${at}: module ${config.module} cannot be loaded`, loaded.text));
      continue;
    }
    const hook = loaded.module[config.export];
    if (typeof hook !== 'function') {
      problems.push(`${at}: module ${config.module} has no function export "${config.export}"`);
      continue;
    }
    guardrails.push({
      name: config.name,
      stages: config.on,
      check: (input: GuardrailCheck) => Promise.resolve((hook as (input: GuardrailCheck) => GuardrailDecision | Promise<GuardrailDecision>)(input)),
    });
  }
  return problems.length > 0 ? { ok: false, problems } : { ok: true, guardrails };
}
