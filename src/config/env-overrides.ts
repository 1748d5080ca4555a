import { z } from 'zod';

// Every config key can be overridden by an environment variable named by its path:
// server.port -> KEEL_SERVER_PORT, queue.redisUrl -> KEEL_QUEUE_REDIS_URL. The leaves are found by
// walking the zod schema, so a key added to the schema gets its variable without a second list.

export type EnvLeaf = { path: string[]; envName: string; kind: 'string' | 'number' | 'boolean' | 'list' | 'json' };

function unwrap(schema: z.ZodTypeAny): z.ZodTypeAny {
  let current = schema;
  for (;;) {
    if (current instanceof z.ZodDefault) current = current._def.innerType;
    else if (current instanceof z.ZodOptional || current instanceof z.ZodNullable) current = current.unwrap();
    else if (current instanceof z.ZodEffects) current = current.innerType();
    else return current;
  }
}

export function envNameForPath(path: readonly string[]): string {
  return (
    'KEEL_' +
    path
      .map((segment) => segment.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase())
      .join('_')
  );
}

export function listEnvLeaves(schema: z.ZodTypeAny, prefix: string[] = []): EnvLeaf[] {
  const inner = unwrap(schema);
  if (inner instanceof z.ZodObject) {
    const shape = inner.shape as Record<string, z.ZodTypeAny>;
    return Object.entries(shape).flatMap(([key, child]) => listEnvLeaves(child, [...prefix, key]));
  }
  const envName = envNameForPath(prefix);
  if (inner instanceof z.ZodNumber) return [{ path: prefix, envName, kind: 'number' }];
  if (inner instanceof z.ZodBoolean) return [{ path: prefix, envName, kind: 'boolean' }];
  if (inner instanceof z.ZodArray && unwrap(inner.element) instanceof z.ZodString) {
    return [{ path: prefix, envName, kind: 'list' }];
  }
  if (inner instanceof z.ZodArray || inner instanceof z.ZodRecord || inner instanceof z.ZodDiscriminatedUnion) {
    return [{ path: prefix, envName, kind: 'json' }];
  }
  return [{ path: prefix, envName, kind: 'string' }];
}

export type EnvValue = { ok: true; value: unknown } | { ok: false; error: string };

export function parseEnvValue(leaf: EnvLeaf, raw: string): EnvValue {
  const text = raw.trim();
  switch (leaf.kind) {
    case 'string':
      return { ok: true, value: raw };
    case 'number': {
      const value = Number(text);
      if (text === '' || !Number.isFinite(value)) return { ok: false, error: `expected a number, got "${raw}"` };
      return { ok: true, value };
    }
    case 'boolean':
      if (/^(true|1|yes|on)$/i.test(text)) return { ok: true, value: true };
      if (/^(false|0|no|off)$/i.test(text)) return { ok: true, value: false };
      return { ok: false, error: `expected true or false, got "${raw}"` };
    case 'list':
      if (text.startsWith('[')) return parseJson(text);
      return { ok: true, value: text === '' ? [] : text.split(',').map((item) => item.trim()).filter(Boolean) };
    case 'json':
      return parseJson(text);
  }
}

function parseJson(text: string): EnvValue {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (error) {
    return { ok: false, error: `expected JSON (${(error as Error).message})` };
  }
}

export function setAtPath(target: Record<string, unknown>, path: readonly string[], value: unknown): void {
  let node = target;
  path.slice(0, -1).forEach((segment) => {
    const next = node[segment];
    if (typeof next !== 'object' || next === null || Array.isArray(next)) node[segment] = {};
    node = node[segment] as Record<string, unknown>;
  });
  node[path[path.length - 1]!] = value;
}
