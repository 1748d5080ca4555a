/**
 * The `redacted` level: content kept, secrets masked with `***` (docs/architecture.md, "Privacy").
 * What counts as a secret is the table `RULES` below, one named rule per shape.
 *
 * A whole secret becomes `***` (no vendor prefix is kept); where a label carries the meaning (query
 * key, `Bearer`, the AWS label, the Slack hook host) the label is kept and only the value is masked,
 * so a reader still knows what was there.
 *
 * Linear time, because the input is untrusted text of any size: every pattern starts with a literal
 * anchor (`://`, `sk-`, `AKIA`, `@`...) and a one-character lookbehind that refuses to start inside
 * a run of the token's own characters, so each run of input characters is scanned a bounded number
 * of times per pattern; all repetitions are over character classes delimited by characters outside
 * the class, so backtracking is linear too. There is no nested ambiguous quantifier anywhere. The
 * tests run every pattern on adversarial 1 MB inputs.
 *
 * Near misses are deliberate non-matches, so that ordinary prose survives: `sk-` inside a word
 * (`task-list`), short `sk-` words (`sk-learn`), `skeleton`, `user@localhost`, `@handle`, and
 * "the bearer of bad news".
 */

/** The mask that replaces a secret. Stable so that redaction is idempotent and greppable. */
export const MASK = '***';

/** The URL query keys whose values are credentials, matched case-insensitively. */
export const CREDENTIAL_QUERY_KEYS = ['key', 'api_key', 'apikey', 'token', 'secret', 'access_token'] as const;

type Rule = { name: string; pattern: RegExp; replace: string | ((match: string, ...groups: string[]) => string) };

/**
 * A `Bearer` value that is all letters and short is prose ("bearer of", "Bearer token"), not a token.
 * Anything with a digit or a token character, or 16+ characters long, is treated as a token.
 */
function maskBearer(_match: string, label: string, token: string): string {
  if (token.length < 16 && /^[A-Za-z]+$/.test(token)) return label + token;
  return label + MASK;
}

/**
 * `://user:pass@`, `://:pass@` (Redis URLs) and `://user@`; `@` may occur inside userinfo, the last
 * one before the host wins. An empty `://@` carries nothing and is left alone.
 */
function maskUserinfo(match: string, user: string, password: string | undefined): string {
  if (password === undefined) return user === '' ? match : `://${MASK}@`;
  return `://${MASK}:${MASK}@`;
}

const QUERY_KEYS = CREDENTIAL_QUERY_KEYS.join('|');

// Order matters only where shapes nest: userinfo and query values go first, so that an email or key
// inside a URL credential is masked together with it, and the email rule never sees `***@host`.
const RULES: readonly Rule[] = [
  {
    name: 'url-userinfo',
    pattern: /:\/\/([^\s:/?#"'<>]*)(?::([^\s/?#"'<>]*))?@/g,
    replace: maskUserinfo,
  },
  {
    name: 'url-query-credential',
    // `(?<![^...])`: at the start of the text or right after one of the listed delimiters, so a
    // fragment `#access_token=` and a logged `token=...` are caught as well as a query.
    pattern: new RegExp(`(?<![^\\s?&#;'"])((?:${QUERY_KEYS})=)[^\\s&#;'"<>]+`, 'gi'),
    replace: `$1${MASK}`,
  },
  {
    name: 'bearer',
    pattern: /(?<![A-Za-z0-9_])(bearer[ \t]+)([A-Za-z0-9\-._~+/]+=*)/gi,
    replace: maskBearer,
  },
  {
    name: 'jwt',
    pattern: /(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*/g,
    replace: MASK,
  },
  {
    name: 'keel-client-token',
    pattern: /(?<![A-Za-z0-9_-])keel_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])/g,
    replace: MASK,
  },
  {
    name: 'openai',
    pattern: /(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}/g,
    replace: MASK,
  },
  {
    name: 'stripe',
    pattern: /(?<![A-Za-z0-9_])(?:(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{20,})/g,
    replace: MASK,
  },
  {
    name: 'aws-access-key-id',
    pattern: /(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])/g,
    replace: MASK,
  },
  {
    name: 'aws-secret-access-key',
    // The 40-character secret has no prefix of its own; only its label identifies it.
    pattern: /(?<![A-Za-z0-9])((?:aws[_-]?)?secret[_-]?access[_-]?key["']?[ \t]*[:=][ \t]*["']?)[A-Za-z0-9/+=]{16,}/gi,
    replace: `$1${MASK}`,
  },
  {
    name: 'github',
    pattern: /(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})/g,
    replace: MASK,
  },
  {
    name: 'slack-token',
    pattern: /(?<![A-Za-z0-9-])(?:xox[baprs]|xapp)-[A-Za-z0-9-]{10,}/g,
    replace: MASK,
  },
  {
    name: 'slack-webhook',
    // The path is the credential of a Slack webhook; the host stays so the reader knows what it was.
    pattern: /(hooks\.slack\.com\/(?:services|workflows|triggers)\/)[A-Za-z0-9_/+-]+/gi,
    replace: `$1${MASK}`,
  },
  {
    name: 'google-api-key',
    pattern: /(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{30,}/g,
    replace: MASK,
  },
  {
    name: 'email',
    // Labels are separated by dots that the label class excludes, so the domain cannot backtrack
    // exponentially; the lookbehind keeps the local part from starting mid-run.
    pattern: /(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}/g,
    replace: MASK,
  },
];

/** The names of the redaction rules, in the order they are applied (for docs and tests). */
export const REDACTION_RULES: readonly string[] = RULES.map((rule) => rule.name);

/**
 * Masks every secret shape listed above with `***`. Text without any is returned as it is.
 * Idempotent: redacting redacted text changes nothing.
 */
export function redactText(text: string): string {
  let out = text;
  for (const rule of RULES) {
    // `replace` with a global regex resets lastIndex itself, so sharing the RegExp objects is safe.
    const { pattern, replace } = rule;
    out = typeof replace === 'string' ? out.replace(pattern, replace) : out.replace(pattern, replace);
  }
  return out;
}

function isBinary(value: object): boolean {
  return ArrayBuffer.isView(value) || value instanceof ArrayBuffer;
}

function isContainer(value: unknown): value is object {
  return typeof value === 'object' && value !== null && !isBinary(value) && !(value instanceof Date);
}

/** JSON.stringify calls `toJSON` once; redaction sees what storage would see. */
function viaToJson(value: unknown): unknown {
  if (typeof value === 'object' && value !== null && !(value instanceof Date) && !isBinary(value)) {
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === 'function') return (toJSON as () => unknown).call(value);
  }
  return value;
}

/**
 * Deep-walks a JSON-like value: strings are redacted, object keys are kept as they are (they are the
 * schema; masking them could also merge two distinct keys), arrays and objects keep their shape, and
 * numbers, booleans, null, undefined, Dates and binary data are kept. Objects are read as
 * JSON.stringify reads them (`toJSON`, own enumerable string keys). The input is never mutated.
 *
 * Iterative, so a deeply nested body cannot overflow the stack; shared and cyclic references map to
 * one copy each.
 */
export function redactValue(value: unknown): unknown {
  const copies = new Map<object, unknown>();
  const pending: Array<{ source: object; target: unknown[] | Record<string, unknown> }> = [];

  const convert = (input: unknown): unknown => {
    const v = viaToJson(input);
    if (typeof v === 'string') return redactText(v);
    if (!isContainer(v)) return v;
    const existing = copies.get(v);
    if (existing !== undefined) return existing;
    const target: unknown[] | Record<string, unknown> = Array.isArray(v) ? [] : {};
    copies.set(v, target);
    if (input !== v && typeof input === 'object' && input !== null) copies.set(input, target);
    pending.push({ source: v, target });
    return target;
  };

  const result = convert(value);
  while (pending.length > 0) {
    const next = pending.pop();
    if (next === undefined) break;
    const { source, target } = next;
    if (Array.isArray(target)) {
      const items = source as unknown[];
      for (let i = 0; i < items.length; i += 1) target[i] = convert(items[i]);
    } else {
      for (const key of Object.keys(source)) {
        // defineProperty, not assignment: a `__proto__` key from JSON.parse must stay a plain key.
        Object.defineProperty(target, key, {
          value: convert((source as Record<string, unknown>)[key]),
          enumerable: true,
          writable: true,
          configurable: true,
        });
      }
    }
  }
  return result;
}
