// ProtoJSON parsing accepts a field by its lowerCamelCase JSON name and by its original proto field
// name (https://protobuf.dev/programming-guides/json/: "Parsers accept both the lowerCamelCase name
// (or the one specified by the json_name option) and the original proto field name"). Keel always
// writes camelCase (specification 5.5); on input it maps proto names (`task_id`, `history_length`)
// to their JSON names before validation, so clients that build params from the proto names (the
// conformance kit's JSON-RPC client does) are understood instead of having fields silently dropped.

/** Free-form values (google.protobuf.Struct / Value): their keys are data, never field names. */
const FREE_FORM = new Set(['metadata', 'data']);

const camel = (name: string) => name.replace(/_([a-z0-9])/g, (_match, letter: string) => letter.toUpperCase());

/**
 * A copy of `value` with every snake_case field name of the protocol's messages turned into its
 * camelCase JSON name; the contents of `metadata` and `data` are left as they are. When both names
 * of one field are present the JSON name wins.
 */
export function withJsonNames(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withJsonNames);
  if (typeof value !== 'object' || value === null) return value;
  const out: Record<string, unknown> = {};
  const entries = Object.entries(value as Record<string, unknown>);
  for (const [key, item] of entries) {
    if (!key.includes('_')) out[key] = FREE_FORM.has(key) ? item : withJsonNames(item);
  }
  for (const [key, item] of entries) {
    if (!key.includes('_')) continue;
    const name = camel(key);
    if (name in out) continue;
    out[name] = FREE_FORM.has(name) ? item : withJsonNames(item);
  }
  return out;
}
