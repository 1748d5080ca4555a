import { describe, it, expect } from 'vitest';
import { canonicalIp } from '../../../src/net/address-ranges.js';
import { checkUrl, describeRefusal } from '../../../src/net/guarded-fetch.js';
import type { GuardPolicy, GuardRefusal, Resolver } from '../../../src/net/guarded-fetch.js';

const STRICT: GuardPolicy = { allowHosts: [], allowHttp: false };
const HTTP: GuardPolicy = { allowHosts: [], allowHttp: true };

/** A resolver that must not be called (IP literals and early refusals never resolve). */
const noResolver: Resolver = () => Promise.reject(new Error('the resolver must not be called'));

function scripted(answers: Record<string, string[]>): Resolver & { calls: string[] } {
  const calls: string[] = [];
  const fn = (host: string): Promise<string[]> => {
    calls.push(host);
    const a = answers[host];
    if (a === undefined) return Promise.reject(Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' }));
    return Promise.resolve(a);
  };
  return Object.assign(fn, { calls });
}

async function refusalOf(url: string, policy: GuardPolicy = HTTP, resolver: Resolver = noResolver): Promise<GuardRefusal> {
  const r = await checkUrl(url, policy, resolver);
  if (r.ok) throw new Error(`expected a refusal for ${url}, got ${JSON.stringify(r)}`);
  return r.refusal;
}

describe('checkUrl: schemes', () => {
  for (const url of ['ftp://example.com/file', 'file:///etc/passwd', 'data:text/plain,hello', 'javascript:alert(1)', 'ws://example.com/', 'gopher://example.com/']) {
    it(`refuses ${url.split(':')[0]}:`, async () => {
      expect((await refusalOf(url)).reason).toBe('scheme');
    });
  }

  it('refuses plain http without allowHttp, accepts https', async () => {
    const r = await refusalOf('http://93.184.216.34/', STRICT);
    expect(r).toMatchObject({ reason: 'scheme', host: '93.184.216.34' });
    expect(await checkUrl('https://93.184.216.34/', STRICT, noResolver)).toEqual({ ok: true, host: '93.184.216.34', addresses: ['93.184.216.34'] });
    expect(await checkUrl('http://93.184.216.34/', HTTP, noResolver)).toEqual({ ok: true, host: '93.184.216.34', addresses: ['93.184.216.34'] });
  });

  it('invalid URLs are a typed refusal', async () => {
    for (const url of ['', 'not a url', 'http://', 'http://exa mple.com/', 'http://[::1/']) {
      expect((await refusalOf(url)).reason, url).toBe('invalid_url');
    }
    // Numeric text that is no valid address at all is still reported as a numeric form.
    for (const url of ['http://1.2.3.4.5/', 'http://0x100000000/', 'http://09.0.0.1/', 'http://256.0.0.1/']) {
      expect((await refusalOf(url)).reason, url).toBe('numeric_host');
    }
  });
});

describe('checkUrl: credentials', () => {
  it('refuses userinfo and never echoes it', async () => {
    for (const url of ['https://user:hunter2@example.com/', 'https://user@example.com/', 'https://:hunter2@example.com/', 'https://@example.com/']) {
      const r = await refusalOf(url, STRICT);
      expect(r.reason, url).toBe('credentials_in_url');
      expect(JSON.stringify(r)).not.toContain('hunter2');
      expect(describeRefusal(r)).not.toContain('hunter2');
    }
  });
});

describe('checkUrl: numeric host forms', () => {
  const forms = ['2130706433', '0x7f000001', '0x7f.0.0.1', '0177.0.0.1', '127.1', '10.1', '017700000001', '0x7F.1', '%31%32%37.0.0.1', '１２７.０.０.１', '127.0.0.1.', '3232235777', '0xa9fea9fe'];
  for (const form of forms) {
    it(`refuses ${form} outright, even when the address is allowlisted`, async () => {
      const policy: GuardPolicy = { allowHosts: ['127.0.0.1', '10.0.0.1', '192.168.1.1', '169.254.169.254', form], allowHttp: true };
      const r = await refusalOf(`http://${form}:8080/x`, policy);
      expect(r.reason).toBe('numeric_host');
      expect(r.host).toBe(form);
      expect(r.address).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    });
  }

  it('refuses numeric forms of public addresses too (a numeric form is never needed)', async () => {
    expect((await refusalOf('https://1572395042/', STRICT)).reason).toBe('numeric_host'); // 93.184.216.34
    expect((await refusalOf('https://0x5db8d822/', STRICT)).reason).toBe('numeric_host');
  });

  it('refuses numeric forms in the slash-less and backslash spellings WHATWG accepts', async () => {
    expect((await refusalOf('http:2130706433/')).reason).toBe('numeric_host');
    expect((await refusalOf('http:\\\\0x7f.1\\')).reason).toBe('numeric_host');
  });

  it('a canonical dotted quad is not a numeric form, but is range-checked', async () => {
    const r = await refusalOf('http://127.0.0.1:8080/');
    expect(r).toMatchObject({ reason: 'refused_range', host: '127.0.0.1', address: '127.0.0.1', range: '127.0.0.0/8 (loopback)' });
    expect(await checkUrl('https://93.184.216.34/', STRICT, noResolver)).toMatchObject({ ok: true });
  });
});

describe('checkUrl: ranges of IP literals', () => {
  const refused: Array<[string, string]> = [
    ['http://127.0.0.1/', '127.0.0.0/8'],
    ['http://10.0.0.1/', '10.0.0.0/8'],
    ['http://169.254.169.254/latest/meta-data/', '169.254.0.0/16'],
    ['http://0.0.0.0/', '0.0.0.0/8'],
    ['http://255.255.255.255/', '240.0.0.0/4'],
    ['http://[::1]/', '::1/128'],
    ['http://[::]/', '::/128'],
    ['http://[::ffff:127.0.0.1]/', '::ffff:0:0/96'],
    ['http://[::ffff:7f00:1]/', '::ffff:0:0/96'],
    ['http://[::ffff:a9fe:a9fe]/', '::ffff:0:0/96'],
    ['http://[fd00::1]/', 'fc00::/7'],
    ['http://[fe80::1]/', 'fe80::/10'],
    ['http://[64:ff9b::a9fe:a9fe]/', '64:ff9b::/96'],
  ];
  for (const [url, range] of refused) {
    it(`refuses ${url} (${range}) without resolving`, async () => {
      const r = await refusalOf(url);
      expect(r.reason).toBe('refused_range');
      expect(r.range?.startsWith(range)).toBe(true);
    });
  }

  it('accepts public literals, IPv6 without brackets in addresses', async () => {
    expect(await checkUrl('https://[2606:4700::1]/', STRICT, noResolver)).toEqual({ ok: true, host: '[2606:4700::1]', addresses: ['2606:4700::1'] });
    expect(await checkUrl('https://[2606:4700:0:0::1]:8443/', STRICT, noResolver)).toEqual({ ok: true, host: '[2606:4700::1]', addresses: ['2606:4700::1'] });
  });
});

describe('checkUrl: allowHosts', () => {
  it('an exact literal entry lifts the range block for that host only', async () => {
    const policy: GuardPolicy = { allowHosts: ['127.0.0.1'], allowHttp: true };
    expect(await checkUrl('http://127.0.0.1:9/', policy, noResolver)).toEqual({ ok: true, host: '127.0.0.1', addresses: ['127.0.0.1'] });
    expect((await refusalOf('http://127.0.0.2/', policy)).reason).toBe('refused_range');
    expect((await refusalOf('http://[::ffff:127.0.0.1]/', policy)).reason).toBe('refused_range');
    const resolver = scripted({ localhost: ['127.0.0.1'] });
    expect((await refusalOf('http://localhost/', policy, resolver)).reason).toBe('refused_range');
  });

  it('IPv6 entries match with or without brackets, in any spelling', async () => {
    for (const entry of ['::1', '[::1]', '0:0:0:0:0:0:0:1', '[0::1]']) {
      const policy: GuardPolicy = { allowHosts: [entry], allowHttp: true };
      expect(await checkUrl('http://[::1]:8080/', policy, noResolver), entry).toEqual({ ok: true, host: '[::1]', addresses: ['::1'] });
      expect(await checkUrl('http://[0:0::1]:8080/', policy, noResolver), entry).toMatchObject({ ok: true });
    }
  });

  it('a host name entry lifts the block for that name (case-insensitive), not for its addresses', async () => {
    const resolver = scripted({ localhost: ['127.0.0.1', '::1'] });
    const policy: GuardPolicy = { allowHosts: ['LocalHost'], allowHttp: true };
    expect(await checkUrl('http://localhost:1/', policy, resolver)).toEqual({ ok: true, host: 'localhost', addresses: ['127.0.0.1', '::1'] });
    expect((await refusalOf('http://127.0.0.1:1/', policy)).reason).toBe('refused_range');
    expect((await refusalOf('http://sub.localhost:1/', policy, scripted({ 'sub.localhost': ['127.0.0.1'] }))).reason).toBe('refused_range');
  });

  it('allowHosts never lifts the scheme or credential rules', async () => {
    const policy: GuardPolicy = { allowHosts: ['127.0.0.1'], allowHttp: false };
    expect((await refusalOf('http://127.0.0.1/', policy)).reason).toBe('scheme');
    expect((await refusalOf('https://a:b@127.0.0.1/', policy)).reason).toBe('credentials_in_url');
  });
});

describe('checkUrl: resolution', () => {
  it('resolves a name once and checks every answer', async () => {
    const resolver = scripted({ 'public.test': ['93.184.216.34', '2606:4700::1', '93.184.216.34'] });
    expect(await checkUrl('https://public.test/', STRICT, resolver)).toEqual({ ok: true, host: 'public.test', addresses: ['93.184.216.34', '2606:4700::1'] });
    expect(resolver.calls).toEqual(['public.test']);
  });

  it('any refused answer refuses the request', async () => {
    for (const answers of [['93.184.216.34', '10.0.0.1'], ['10.0.0.1', '93.184.216.34'], ['2606:4700::1', '::ffff:127.0.0.1'], ['169.254.169.254']]) {
      const resolver = scripted({ 'mixed.test': answers });
      const r = await refusalOf('https://mixed.test/', STRICT, resolver);
      expect(r.reason, answers.join()).toBe('refused_range');
      expect(r.host).toBe('mixed.test');
      // Addresses are reported canonical (RFC 5952, as WHATWG prints them).
      expect(answers.map((a) => canonicalIp(a))).toContain(r.address);
      expect(resolver.calls).toEqual(['mixed.test']);
    }
  });

  it('a failing, empty or garbled resolution is resolution_failed', async () => {
    expect(await refusalOf('https://missing.test/', STRICT, scripted({}))).toMatchObject({ reason: 'resolution_failed', host: 'missing.test', detail: expect.stringContaining('ENOTFOUND') });
    expect((await refusalOf('https://empty.test/', STRICT, scripted({ 'empty.test': [] }))).reason).toBe('resolution_failed');
    expect((await refusalOf('https://odd.test/', STRICT, scripted({ 'odd.test': ['93.184.216.34', 'not-an-ip'] }))).reason).toBe('resolution_failed');
  });
});

describe('describeRefusal', () => {
  it('is one sentence naming the reason', async () => {
    const refusals = [
      await refusalOf('ftp://example.com/'),
      await refusalOf('http://example.com/', STRICT),
      await refusalOf('https://u:p@example.com/'),
      await refusalOf('http://2130706433/'),
      await refusalOf('http://10.0.0.1/'),
      await refusalOf('https://missing.test/', STRICT, scripted({})),
      await refusalOf('not a url'),
    ];
    const expected = ['scheme', 'http', 'credentials', 'numeric', '10.0.0.0/8', 'resolved', 'not a valid URL'];
    refusals.forEach((r, i) => {
      const sentence = describeRefusal(r);
      expect(sentence).toMatch(/^The address guard refused [^\n]+\.$/);
      expect(sentence).toContain(expected[i]);
    });
  });
});
