/**
 * The `metadata` level: a content-free description of a value: counts, lengths, kinds and names,
 * no content (docs/architecture.md, "Privacy").
 *
 * What survives:
 * - kinds (`text`, `number`, `boolean`, `null`, `undefined`, `binary`, `array`, `object`, `other`),
 * - counts (array items, object keys, message parts) and lengths (string length in UTF-16 code units,
 *   binary length in bytes),
 * - names: object property names and tool names, because they describe the schema and the actions
 *   taken, not the data. Names still pass through `redactText` (a map keyed by email addresses or a
 *   key-shaped name must not keep them at a stricter level than `redacted`), and a name longer than
 *   64 characters is masked whole as `***`: that is a sentence used as a key, i.e. content.
 * - A2A part media types, reduced to a well-formed lower-case `type/subtype` (parameters dropped,
 *   anything else dropped), and a fixed set of role names.
 *
 * What never survives: string values, numbers and booleans (an amount or a flag is content), file
 * names, URLs, ids, tool arguments, part metadata.
 *
 * Output is bounded: nesting is described to `maxDepth` levels, at most `maxItems` array items,
 * `maxKeys` property names and `maxParts` parts are described; counts always give the full size.
 * The bound also makes the walk safe on cyclic and very deep values.
 */
import { MASK, redactText } from './redact.js';

export const SUMMARY_LIMITS = {
  maxDepth: 4,
  maxItems: 8,
  maxKeys: 32,
  maxParts: 32,
  maxNameLength: 64,
} as const;

export type ValueSummary =
  | { kind: 'text'; length: number }
  | { kind: 'number' }
  | { kind: 'boolean' }
  | { kind: 'null' }
  | { kind: 'undefined' }
  | { kind: 'binary'; bytes: number }
  /** `items[i]` describes item i; absent beyond `maxDepth`. */
  | { kind: 'array'; count: number; items?: ValueSummary[] }
  /** `values[i]` describes the property named `keys[i]`; `values` is absent beyond `maxDepth`. */
  | { kind: 'object'; count: number; keys: string[]; values?: ValueSummary[] }
  /** Functions and symbols: nothing that JSON would store. */
  | { kind: 'other' };

/** Keeps a property or tool name, masking what in it looks like a secret or like content. */
export function summaryName(name: string): string {
  if (name.length > SUMMARY_LIMITS.maxNameLength) return MASK;
  return redactText(name);
}

function byteLength(value: ArrayBuffer | ArrayBufferView): number {
  return value.byteLength;
}

function isBinary(value: object): value is ArrayBuffer | ArrayBufferView {
  return ArrayBuffer.isView(value) || value instanceof ArrayBuffer;
}

function summarizeAt(input: unknown, depth: number): ValueSummary {
  let value = input;
  // Read objects as JSON.stringify would (Date becomes its ISO text), except binary, described by size.
  if (typeof value === 'object' && value !== null && !isBinary(value)) {
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === 'function') value = (toJSON as () => unknown).call(value);
  }
  switch (typeof value) {
    case 'string':
      return { kind: 'text', length: value.length };
    case 'number':
    case 'bigint':
      return { kind: 'number' };
    case 'boolean':
      return { kind: 'boolean' };
    case 'undefined':
      return { kind: 'undefined' };
    case 'function':
    case 'symbol':
      return { kind: 'other' };
    default:
      break;
  }
  if (value === null) return { kind: 'null' };
  const object = value as object;
  if (isBinary(object)) return { kind: 'binary', bytes: byteLength(object) };
  const describeChildren = depth < SUMMARY_LIMITS.maxDepth;
  if (Array.isArray(object)) {
    const summary: ValueSummary = { kind: 'array', count: object.length };
    if (describeChildren && object.length > 0) {
      summary.items = object.slice(0, SUMMARY_LIMITS.maxItems).map((item: unknown) => summarizeAt(item, depth + 1));
    }
    return summary;
  }
  const allKeys = Object.keys(object);
  const described = allKeys.slice(0, SUMMARY_LIMITS.maxKeys);
  const summary: ValueSummary = { kind: 'object', count: allKeys.length, keys: described.map(summaryName) };
  if (describeChildren && described.length > 0) {
    summary.values = described.map((key) => summarizeAt((object as Record<string, unknown>)[key], depth + 1));
  }
  return summary;
}

/** Describes any value without its content (see the module comment for what is kept). */
export function summarizeValue(value: unknown): ValueSummary {
  return summarizeAt(value, 0);
}

// ---------------------------------------------------------------------------------------------------
// A2A parts and messages, tool calls

export type PartSummary =
  | { kind: 'text'; length: number; mediaType?: string }
  | { kind: 'raw'; bytes: number; mediaType?: string }
  | { kind: 'url'; mediaType?: string }
  | { kind: 'data'; data: ValueSummary; mediaType?: string }
  | { kind: 'unknown' };

export type ToolCallSummary = { kind: 'tool_call'; name: string; argumentsLength: number };

/** Roles are an enumeration, not content; any other role string is dropped. */
export const SUMMARY_ROLES = [
  'ROLE_USER',
  'ROLE_AGENT',
  'ROLE_UNSPECIFIED',
  'user',
  'agent',
  'assistant',
  'system',
  'developer',
  'tool',
] as const;
export type SummaryRole = (typeof SUMMARY_ROLES)[number];

export type MessageSummary = {
  kind: 'message';
  role?: SummaryRole;
  partCount: number;
  parts: PartSummary[];
  toolCalls?: ToolCallSummary[];
};

// type/subtype per RFC 6838 restricted-name characters, each at most 127 characters.
const MEDIA_TYPE = /^([A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126})\/([A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126})[ \t]*(?:;[^\r\n]*)?$/;

/**
 * A media type reduced to lower-case `type/subtype`; parameters are dropped because they can carry
 * names (`; name="q3-layoffs.pdf"`). Anything that is not a media type is dropped entirely.
 */
export function summaryMediaType(mediaType: unknown): string | undefined {
  if (typeof mediaType !== 'string' || mediaType.length > 1024) return undefined;
  const match = MEDIA_TYPE.exec(mediaType.trim());
  if (match === null) return undefined;
  return `${match[1]}/${match[2]}`.toLowerCase();
}

/** Decoded size of base64 or base64url text without decoding it (whitespace and padding ignored). */
export function base64ByteLength(text: string): number {
  let chars = 0;
  for (let i = 0; i < text.length; i += 1) {
    const c = text.charCodeAt(i);
    // Count only alphabet characters: skips '=', whitespace and line breaks of MIME-wrapped base64.
    const isAlphabet =
      (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c === 43 || c === 47 || c === 45 || c === 95;
    if (isAlphabet) chars += 1;
  }
  return Math.floor((chars * 3) / 4);
}

function withMediaType<T extends PartSummary>(summary: T, mediaType: unknown): T {
  const kept = summaryMediaType(mediaType);
  if (kept !== undefined) (summary as { mediaType?: string }).mediaType = kept;
  return summary;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Describes one A2A 1.0 part. The key present (`text`, `raw`, `url`, `data`) is the discriminator;
 * `filename`, the URL itself and part `metadata` are dropped.
 */
export function summarizePart(part: unknown): PartSummary {
  if (!isRecord(part)) return { kind: 'unknown' };
  const { mediaType } = part;
  if (typeof part.text === 'string') return withMediaType({ kind: 'text', length: part.text.length }, mediaType);
  if (part.raw !== undefined) {
    const { raw } = part;
    let bytes = 0;
    if (typeof raw === 'string') bytes = base64ByteLength(raw);
    else if (typeof raw === 'object' && raw !== null && isBinary(raw)) bytes = byteLength(raw);
    return withMediaType({ kind: 'raw', bytes }, mediaType);
  }
  if (part.url !== undefined) return withMediaType({ kind: 'url' }, mediaType);
  if ('data' in part) return withMediaType({ kind: 'data', data: summarizeValue(part.data) }, mediaType);
  return { kind: 'unknown' };
}

/** Describes at most `maxParts` parts (the count is given by the caller, see `summarizeMessage`). */
export function summarizeParts(parts: readonly unknown[]): PartSummary[] {
  return parts.slice(0, SUMMARY_LIMITS.maxParts).map(summarizePart);
}

function argumentsLength(args: unknown): number {
  if (args === undefined || args === null) return 0;
  if (typeof args === 'string') return args.length;
  try {
    return JSON.stringify(args)?.length ?? 0;
  } catch {
    // A cycle or a BigInt: the length is unknown; the arguments themselves are never kept anyway.
    return 0;
  }
}

/**
 * Describes a tool call: its name and the length of its arguments (JSON text length when they are
 * not already text); never the arguments. Accepts `{ name, arguments }` and the OpenAI shape
 * `{ function: { name, arguments } }`.
 */
export function summarizeToolCall(call: unknown): ToolCallSummary {
  const source = isRecord(call) && isRecord(call.function) ? call.function : call;
  if (!isRecord(source)) return { kind: 'tool_call', name: MASK, argumentsLength: 0 };
  const name = typeof source.name === 'string' ? summaryName(source.name) : MASK;
  const args = 'arguments' in source ? source.arguments : source.args;
  return { kind: 'tool_call', name, argumentsLength: argumentsLength(args) };
}

export function summarizeToolCalls(calls: readonly unknown[]): ToolCallSummary[] {
  return calls.slice(0, SUMMARY_LIMITS.maxParts).map(summarizeToolCall);
}

/**
 * Describes a message: an A2A message (`role`, `parts`) or a chat message (`role`, `content` as text
 * or as parts, `toolCalls`/`tool_calls`). Ids, context and task ids, metadata and extensions are
 * dropped.
 */
export function summarizeMessage(message: unknown): MessageSummary {
  if (!isRecord(message)) return { kind: 'message', partCount: 0, parts: [] };
  const summary: MessageSummary = { kind: 'message', partCount: 0, parts: [] };
  const { role } = message;
  if (typeof role === 'string' && (SUMMARY_ROLES as readonly string[]).includes(role)) summary.role = role as SummaryRole;
  let parts: readonly unknown[] = [];
  if (Array.isArray(message.parts)) parts = message.parts;
  else if (typeof message.content === 'string') parts = [{ text: message.content }];
  else if (Array.isArray(message.content)) parts = message.content;
  summary.partCount = parts.length;
  summary.parts = summarizeParts(parts);
  const calls = Array.isArray(message.toolCalls) ? message.toolCalls : Array.isArray(message.tool_calls) ? message.tool_calls : undefined;
  if (calls !== undefined) summary.toolCalls = summarizeToolCalls(calls);
  return summary;
}
