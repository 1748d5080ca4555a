import { describe, it, expect } from 'vitest';
import { CREDENTIAL_QUERY_KEYS, MASK, REDACTION_RULES, redactText, redactValue } from '../../../src/privacy/redact.js';

// Secret-shaped fixtures are assembled at run time (`cat(...)`) so that this file itself does not
// contain literal key shapes for secret scanners (GitHub push protection) to flag.
const cat = (...parts: string[]): string => parts.join('');
const ALNUM = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
const B64URL = `${ALNUM}-_`;
/** Deterministic filler: `n` characters of `alphabet`, varied by `seed`. */
const fill = (n: number, alphabet = ALNUM, seed = 7): string => {
  let out = '';
  let x = seed;
  for (let i = 0; i < n; i += 1) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out += alphabet[x % alphabet.length];
  }
  return out;
};

type Case = { rule: string; input: string; expected: string };

const jwtHeader = cat('eyJ', 'hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9');
const jwtPayload = cat('eyJ', 'zdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0');
const jwtSig = 'SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c';
const keelToken = cat('keel', '_', fill(43, B64URL, 3));
const slackHookPath = cat('T0', fill(8, ALNUM, 1).toUpperCase(), '/B0', fill(8, ALNUM, 2).toUpperCase(), '/', fill(24, ALNUM, 3));

const POSITIVE: Case[] = [
  // URL userinfo
  { rule: 'url-userinfo', input: 'https://alice:hunter2@example.com/path', expected: 'https://***:***@example.com/path' },
  { rule: 'url-userinfo', input: 'postgres://keel:s3cr3t@db.internal:5432/keel', expected: 'postgres://***:***@db.internal:5432/keel' },
  { rule: 'url-userinfo', input: 'redis://:p4ssw0rd@cache:6379/0', expected: 'redis://***:***@cache:6379/0' },
  { rule: 'url-userinfo', input: 'clone https://TOKEN123@github.com/org/repo.git now', expected: 'clone https://***@github.com/org/repo.git now' },
  { rule: 'url-userinfo', input: 'https://user:p@ss@host.example/', expected: 'https://***:***@host.example/' },
  { rule: 'url-userinfo', input: 'https://user:@host.example', expected: 'https://***:***@host.example' },
  { rule: 'url-userinfo', input: 'ftp://me@corp.example:pw@files.example/x', expected: 'ftp://***:***@files.example/x' },
  { rule: 'url-userinfo', input: '"amqp://guest:guest@rabbit:5672"', expected: '"amqp://***:***@rabbit:5672"' },
  // URL query credentials: every key, case-insensitive, every delimiter
  ...CREDENTIAL_QUERY_KEYS.flatMap((key): Case[] => [
    { rule: 'url-query-credential', input: `https://api.example.com/v1?${key}=abc123&q=1`, expected: `https://api.example.com/v1?${key}=***&q=1` },
    { rule: 'url-query-credential', input: `https://api.example.com/v1?q=1&${key.toUpperCase()}=AbC-123_x`, expected: `https://api.example.com/v1?q=1&${key.toUpperCase()}=***` },
    {
      rule: 'url-query-credential',
      input: `/cb#${key[0].toUpperCase()}${key.slice(1)}=v%2Fx&state=s`,
      expected: `/cb#${key[0].toUpperCase()}${key.slice(1)}=***&state=s`,
    },
  ]),
  { rule: 'url-query-credential', input: 'token=abc', expected: 'token=***' },
  { rule: 'url-query-credential', input: 'log: sent Api_Key=xyz to upstream', expected: 'log: sent Api_Key=*** to upstream' },
  { rule: 'url-query-credential', input: '<a href="/x?a=1&amp;secret=s3">', expected: '<a href="/x?a=1&amp;secret=***">' },
  { rule: 'url-query-credential', input: "curl -d 'apikey=k1' https://x.example", expected: "curl -d 'apikey=***' https://x.example" },
  { rule: 'url-query-credential', input: '?key=1&key=2;token=3', expected: '?key=***&key=***;token=***' },
  // Bearer
  { rule: 'bearer', input: 'Authorization: Bearer abc.def-123', expected: 'Authorization: Bearer ***' },
  { rule: 'bearer', input: 'authorization: bearer 0123456789abcdef', expected: 'authorization: bearer ***' },
  { rule: 'bearer', input: 'BEARER Zm9vYmFy=', expected: 'BEARER ***' },
  { rule: 'bearer', input: 'Bearer abcdefghijklmnopqrstuvwxyz', expected: 'Bearer ***' },
  { rule: 'bearer', input: '{"Authorization":"Bearer tok_123"}', expected: '{"Authorization":"Bearer ***"}' },
  { rule: 'bearer', input: 'Bearer\thunter2 then', expected: 'Bearer\t*** then' },
  // JWT
  { rule: 'jwt', input: `${jwtHeader}.${jwtPayload}.${jwtSig}`, expected: MASK },
  { rule: 'jwt', input: `id_token: ${jwtHeader}.${jwtPayload}.`, expected: `id_token: ${MASK}` },
  { rule: 'jwt', input: `"${jwtHeader}.${jwtPayload}.${jwtSig}", next`, expected: `"${MASK}", next` },
  // Keel client token
  { rule: 'keel-client-token', input: keelToken, expected: MASK },
  { rule: 'keel-client-token', input: `TOKEN=${keelToken}\n`, expected: `TOKEN=${MASK}\n` },
  { rule: 'keel-client-token', input: `client ci: ${cat('keel', '_', '-'.repeat(20), '_'.repeat(23))}.`, expected: `client ci: ${MASK}.` },
  // OpenAI
  { rule: 'openai', input: cat('sk', '-', fill(48)), expected: MASK },
  { rule: 'openai', input: `OPENAI_API_KEY=${cat('sk', '-proj-', fill(120, B64URL, 5))}`, expected: `OPENAI_API_KEY=${MASK}` },
  { rule: 'openai', input: `key: ${cat('sk', '-svcacct-', fill(60, B64URL, 9))} end`, expected: `key: ${MASK} end` },
  { rule: 'openai', input: `(${cat('sk', '-', fill(20))})`, expected: `(${MASK})` },
  // Stripe
  ...['sk_live_', 'sk_test_', 'rk_live_', 'rk_test_', 'pk_live_', 'pk_test_', 'whsec_'].map(
    (prefix, i): Case => ({ rule: 'stripe', input: `stripe ${cat(prefix, fill(24 + i, ALNUM, i))} ok`, expected: `stripe ${MASK} ok` }),
  ),
  // AWS
  { rule: 'aws-access-key-id', input: cat('AK', 'IA', 'IOSFODNN7EXAMPLE'), expected: MASK },
  { rule: 'aws-access-key-id', input: `id=${cat('AS', 'IA', 'Y34FZKBOKMUTVV7A')},`, expected: `id=${MASK},` },
  {
    rule: 'aws-secret-access-key',
    input: `aws_secret_access_key=${cat('wJalrXUtnFEMI', '/K7MDENG/bPxRfiCYEXAMPLEKEY')}`,
    expected: 'aws_secret_access_key=***',
  },
  {
    rule: 'aws-secret-access-key',
    input: `export AWS_SECRET_ACCESS_KEY = "${fill(40, `${ALNUM}/+`, 4)}"`,
    expected: 'export AWS_SECRET_ACCESS_KEY = "***"',
  },
  {
    rule: 'aws-secret-access-key',
    input: `{"SecretAccessKey": "${fill(40, `${ALNUM}/+`, 5)}"}`,
    expected: '{"SecretAccessKey": "***"}',
  },
  { rule: 'aws-secret-access-key', input: `aws-secret-access-key: ${fill(40, ALNUM, 6)}`, expected: 'aws-secret-access-key: ***' },
  // GitHub
  ...['ghp_', 'gho_', 'ghu_', 'ghs_', 'ghr_'].map((prefix, i): Case => ({ rule: 'github', input: `t ${cat(prefix, fill(36, ALNUM, i))}`, expected: `t ${MASK}` })),
  { rule: 'github', input: cat('github', '_pat_', fill(22), '_', fill(59, ALNUM, 2)), expected: MASK },
  // Slack
  ...['xoxb-', 'xoxp-', 'xoxa-', 'xoxr-', 'xoxs-', 'xapp-'].map(
    (prefix, i): Case => ({ rule: 'slack-token', input: `slack ${cat(prefix, '1234567890-', fill(24, ALNUM, i))}`, expected: `slack ${MASK}` }),
  ),
  {
    rule: 'slack-webhook',
    input: `POST https://hooks.slack.com/services/${slackHookPath} done`,
    expected: 'POST https://hooks.slack.com/services/*** done',
  },
  { rule: 'slack-webhook', input: 'https://hooks.slack.com/workflows/T1/A2/33/abc', expected: 'https://hooks.slack.com/workflows/***' },
  { rule: 'slack-webhook', input: 'https://HOOKS.SLACK.COM/triggers/T1/2/x', expected: 'https://HOOKS.SLACK.COM/triggers/***' },
  // Google
  { rule: 'google-api-key', input: cat('AI', 'za', 'SyD-', fill(31, B64URL, 8)), expected: MASK },
  { rule: 'google-api-key', input: `https://maps.example/api?q=x&k=${cat('AI', 'za', fill(35, B64URL, 2))}`, expected: `https://maps.example/api?q=x&k=${MASK}` },
  // Email
  { rule: 'email', input: 'write to alice@example.com today', expected: 'write to *** today' },
  { rule: 'email', input: 'john.doe+tag@mail.example.co.uk.', expected: '***.' },
  { rule: 'email', input: 'From: Bob <BOB_99@Sub-Domain.Example.ORG>', expected: 'From: Bob <***>' },
  { rule: 'email', input: 'mailto:x%y@example.io?subject=hi', expected: 'mailto:***?subject=hi' },
  { rule: 'email', input: 'a@b.cd,c@d.ef', expected: '***,***' },
  { rule: 'email', input: 'https://example.com/u/jane@example.net', expected: 'https://example.com/u/***' },
];

const NEGATIVE: string[] = [
  '',
  'Hello, world.',
  'skeleton',
  'sk-learn is a library',
  'the task-list-abcdefghijklmnopqrstuvwxyz is long',
  'risk-assessment-framework-document-v2-final',
  'sk-short',
  'sk_live_short',
  'sk_prod_abcdefghijklmnopqrstuvwxyz',
  `${cat('AK', 'IA')}123`,
  `${cat('AK', 'IA', 'IOSFODNN7EXAMPLE')}X`,
  `x${cat('AK', 'IA', 'IOSFODNN7EXAMPLE')}`,
  'aws_secret_access_key',
  'rotate the secret access key monthly',
  'ghp_short',
  'github_pat_x',
  'xoxb-123',
  'see hooks.slack.com/help for setup',
  'AIzaShort',
  `${jwtHeader}`,
  `${jwtHeader}.notjwt.x`,
  'eyJ.eyJ.',
  'the bearer of bad news',
  'Bearer token',
  'bearer bonds',
  cat('keel', '_', fill(42, B64URL)),
  cat('keel', '_', fill(44, B64URL)),
  'keel_config.yaml',
  'user@localhost',
  'user@',
  '@handle',
  'a@b',
  'name at example dot com',
  'user@example.c',
  'user@123.456',
  'foo@bar',
  'https://example.com/path?q=1&page=2#top',
  'https://mastodon.social/@alice',
  'http://localhost:3000/a@b',
  'https://example.com?monkey=1&primary_key=2&tokens=3&keys=4&secretive=5',
  'token=',
  '?key=&q=1',
  'https://@host.example/',
  'const x = a.b?.c ?? d; // 100% ok',
  'Ünïcödé テキスト 🚀 — résumé',
  'line one\nline two\r\n\ttabbed',
];

describe('redactText: positive cases', () => {
  it.each(POSITIVE.map((c) => [c.rule, c.input, c.expected]))('[%s] %j', (_rule, input, expected) => {
    expect(redactText(input)).toBe(expected);
  });

  it('covers every rule with at least one positive case', () => {
    expect(new Set(POSITIVE.map((c) => c.rule))).toEqual(new Set(REDACTION_RULES));
  });

  it('is idempotent on every positive case', () => {
    for (const { input } of POSITIVE) {
      const once = redactText(input);
      expect(redactText(once)).toBe(once);
    }
  });
});

describe('redactText: near misses and clean text are returned unchanged', () => {
  it.each(NEGATIVE)('%j', (input) => {
    expect(redactText(input)).toBe(input);
  });
});

describe('redactText: in context', () => {
  it('masks several secrets of different kinds in one text and keeps the rest byte for byte', () => {
    const openai = cat('sk', '-proj-', fill(60, B64URL, 1));
    const gh = cat('gh', 'p_', fill(36, ALNUM, 2));
    const text = [
      `Deploy log 2024-05-01: used ${openai} for the model,`,
      `pushed with https://deploy:${gh}@github.com/acme/app.git,`,
      `notified ops@acme.example and https://hooks.slack.com/services/${slackHookPath}.`,
      `callback /cb?code=1&access_token=${fill(30)}&state=ok`,
    ].join('\n');
    const out = redactText(text);
    expect(out).toBe(
      [
        'Deploy log 2024-05-01: used *** for the model,',
        'pushed with https://***:***@github.com/acme/app.git,',
        'notified *** and https://hooks.slack.com/services/***.',
        'callback /cb?code=1&access_token=***&state=ok',
      ].join('\n'),
    );
    for (const secret of [openai, gh, 'ops@acme.example', slackHookPath]) expect(out).not.toContain(secret);
  });

  it('masks secrets inside JSON text without breaking the JSON', () => {
    const json = JSON.stringify({ auth: `Bearer ${keelToken}`, to: 'x@example.com', n: 1 });
    const out = redactText(json);
    expect(JSON.parse(out)).toEqual({ auth: 'Bearer ***', to: '***', n: 1 });
  });

  it('is idempotent on every negative case too', () => {
    for (const input of NEGATIVE) expect(redactText(redactText(input))).toBe(redactText(input));
  });
});

describe('redactText: linear time on 1 MB inputs', () => {
  const MB = 1 << 20;
  const repeatTo = (unit: string): string => unit.repeat(Math.ceil(MB / unit.length)).slice(0, MB);
  // Each input is built to make a backtracking pattern rescan the rest of the text from every start.
  const ADVERSARIAL: Array<[string, string]> = [
    ['letters', repeatTo('a')],
    ['dotted labels', repeatTo('a.')],
    ['dashed labels then an email', `${repeatTo('a-')}@b.com`],
    ['local part without @', `${repeatTo('x')}@`],
    ['@ runs', repeatTo('@')],
    ['a@ runs', repeatTo('a@')],
    ['a@b. runs', repeatTo('a@b.')],
    ['domain labels with a bad tld', `x@${repeatTo('b.')}1`],
    ['eyJ runs', repeatTo('eyJ')],
    ['eyJ segments', repeatTo('eyJa.')],
    ['sk- runs', repeatTo('sk-')],
    ['sk_live_ runs', repeatTo('sk_live_')],
    [':// runs', repeatTo('://')],
    ['://a: runs', repeatTo('://a:')],
    ['userinfo without @', `://${repeatTo('u')}`],
    ['bearer runs', repeatTo('bearer ')],
    ['AKIA runs', repeatTo('AKIA')],
    ['token= runs', repeatTo('token=')],
    ['?token=a runs', repeatTo('?token=a')],
    ['slack hook runs', repeatTo('hooks.slack.com/services/')],
    ['aws label runs', repeatTo('aws_secret_access_key=')],
    ['ghp_ runs', repeatTo('ghp_')],
    ['xoxb- runs', repeatTo('xoxb-')],
    ['AIza runs', repeatTo('AIza')],
    ['keel_ runs', repeatTo('keel_')],
    ['whitespace', repeatTo(' \t\n')],
  ];

  it.each(ADVERSARIAL)('%s', (_name, input) => {
    const started = performance.now();
    redactText(input);
    // A quadratic pattern needs minutes on 1 MB; linear ones take milliseconds. The bound is loose
    // so that a busy CI machine does not flake.
    expect(performance.now() - started).toBeLessThan(1500);
  });

  it('masks every secret in a realistic 1 MB text quickly', () => {
    const secrets = [
      cat('sk', '-', fill(48, ALNUM, 11)),
      cat('gh', 'o_', fill(36, ALNUM, 12)),
      'someone@example.org',
      keelToken,
      `${jwtHeader}.${jwtPayload}.${jwtSig}`,
    ];
    const chunks: string[] = [];
    let size = 0;
    for (let i = 0; size < MB; i += 1) {
      const chunk = `Paragraph ${i}: the quick brown fox jumps over the lazy dog; see https://example.com/p/${i}?q=${i}. ${secrets[i % secrets.length]}\n`;
      chunks.push(chunk);
      size += chunk.length;
    }
    const text = chunks.join('');
    const started = performance.now();
    const out = redactText(text);
    expect(performance.now() - started).toBeLessThan(3000);
    for (const secret of secrets) expect(out).not.toContain(secret);
    expect(out).toContain('the quick brown fox');
  });
});

describe('redactValue', () => {
  it('redacts strings at every depth and keeps keys, shapes and non-string scalars', () => {
    const input = {
      user: 'alice@example.com',
      count: 3,
      ok: true,
      nothing: null,
      missing: undefined,
      nested: {
        headers: { authorization: `Bearer ${keelToken}` },
        urls: ['https://a:b@x.example', 'https://clean.example/?page=2'],
        deeper: [[{ note: 'plain text' }, 42, false]],
      },
    };
    expect(redactValue(input)).toEqual({
      user: '***',
      count: 3,
      ok: true,
      nothing: null,
      missing: undefined,
      nested: {
        headers: { authorization: 'Bearer ***' },
        urls: ['https://***:***@x.example', 'https://clean.example/?page=2'],
        deeper: [[{ note: 'plain text' }, 42, false]],
      },
    });
  });

  it('keeps object keys as they are, even secret-shaped ones', () => {
    expect(redactValue({ 'alice@example.com': 'bob@example.com' })).toEqual({ 'alice@example.com': '***' });
  });

  it('does not mutate its input', () => {
    const input = { a: ['x@example.com'], b: { c: 'token=1 ?token=2' } };
    const before = structuredClone(input);
    const out = redactValue(input);
    expect(input).toEqual(before);
    expect(out).not.toBe(input);
  });

  it.each([
    ['a string', 'mail x@example.com', 'mail ***'],
    ['a clean string', 'nothing here', 'nothing here'],
    ['a number', 12.5, 12.5],
    ['a boolean', false, false],
    ['null', null, null],
    ['undefined', undefined, undefined],
    ['an empty array', [], []],
    ['an empty object', {}, {}],
  ])('handles %s at the top level', (_name, input, expected) => {
    expect(redactValue(input)).toEqual(expected);
  });

  it('keeps a __proto__ key from JSON.parse as a plain key, without touching prototypes', () => {
    const input = JSON.parse('{"__proto__": {"polluted": "x@example.com"}, "a": 1}') as unknown;
    const out = redactValue(input) as Record<string, unknown>;
    expect(Object.getPrototypeOf(out)).toBe(Object.prototype);
    expect(Object.keys(out)).toEqual(['__proto__', 'a']);
    expect(JSON.stringify(out)).toBe('{"__proto__":{"polluted":"***"},"a":1}');
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('reads objects as JSON.stringify does (toJSON), and keeps Dates and binary data', () => {
    const date = new Date('2024-01-02T03:04:05.000Z');
    const bytes = new Uint8Array([1, 2, 3]);
    const custom = { toJSON: () => ({ email: 'c@example.com' }) };
    const out = redactValue({ date, bytes, custom }) as Record<string, unknown>;
    expect(out.date).toBe(date);
    expect(out.bytes).toBe(bytes);
    expect(out.custom).toEqual({ email: '***' });
  });

  it('copies shared and cyclic references once, keeping the cycle', () => {
    const shared = { s: 'x@example.com' };
    const cyclic: Record<string, unknown> = { name: 'root', shared, again: shared };
    cyclic.self = cyclic;
    const out = redactValue(cyclic) as Record<string, unknown>;
    expect(out.self).toBe(out);
    expect(out.shared).toBe(out.again);
    expect(out.shared).toEqual({ s: '***' });
  });

  it('walks very deep nesting without overflowing the stack', () => {
    let deep: unknown = 'bottom x@example.com';
    for (let i = 0; i < 200_000; i += 1) deep = i % 2 === 0 ? [deep] : { d: deep };
    let out = redactValue(deep);
    for (let i = 199_999; i >= 0; i -= 1) out = i % 2 === 0 ? (out as unknown[])[0] : (out as { d: unknown }).d;
    expect(out).toBe('bottom ***');
  });

  it('keeps sparse array length and order', () => {
    const sparse: string[] = ['a@example.com'];
    sparse[2] = 'b';
    const out = redactValue(sparse) as unknown[];
    expect(out).toHaveLength(3);
    expect(out).toEqual(['***', undefined, 'b']);
  });
});
