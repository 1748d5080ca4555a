import { isAbsolute, resolve } from 'node:path';
import { z } from 'zod';
import { TOOL_EFFECTS, type ToolDefinition } from './tool.js';
import { loadModuleFile } from '../config/import-module-file.js';
import { loadProblem } from '../config/module-load-error.js';

const toolShape = z
  .object({
    name: z.string().regex(/^[a-zA-Z0-9_-]{1,64}$/, 'expected 1-64 letters, digits, _ or -'),
    description: z.string(),
    parameters: z.record(z.unknown()),
    effect: z.enum(TOOL_EFFECTS),
    needsApproval: z.boolean(),
    run: z.function(),
  })
  .passthrough();

export type LoadToolsResult = { ok: true; tools: ToolDefinition[] } | { ok: false; problems: string[] };

/**
 * Loads tools from the modules named in `toolModules`. A module exports `tools` (an array) or a
 * default export that is an array; each tool declares its effect and whether it needs approval.
 */
export async function loadToolModules(paths: readonly string[], baseDir: string): Promise<LoadToolsResult> {
  const problems: string[] = [];
  const tools: ToolDefinition[] = [];
  for (const path of paths) {
    const absolute = isAbsolute(path) ? path : resolve(baseDir, path);
    const loaded = await loadModuleFile(absolute);
    if (!loaded.ok) {
      problems.push(loadProblem(`toolModules: ${path}: cannot be loaded`, loaded.text));
      continue;
    }
    const module = loaded.module;
    const exported = module.tools ?? module.default;
    if (!Array.isArray(exported)) {
      problems.push(`toolModules: ${path}: expected an exported array "tools" (or a default export array)`);
      continue;
    }
    exported.forEach((candidate, index) => {
      const parsed = toolShape.safeParse(candidate);
      if (!parsed.success) {
        for (const issue of parsed.error.issues) problems.push(`toolModules: ${path}: tools[${index}].${issue.path.join('.')}: ${issue.message}`);
        return;
      }
      tools.push(candidate as ToolDefinition);
    });
  }
  return problems.length > 0 ? { ok: false, problems } : { ok: true, tools };
}
