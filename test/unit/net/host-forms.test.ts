import { describe, it, expect } from 'vitest';
import { classifyRawHost, extractRawHost, findNumericHostForm, rawAuthorityHasUserinfo } from '../../../src/net/host-forms.js';

describe('extractRawHost', () => {
  const cases: Array<[string, string | undefined]> = [
    ['http://2130706433/', '2130706433'],
    ['http://0x7f.0.0.1:8080/path', '0x7f.0.0.1'],
    ['HTTPS://Example.COM/', 'Example.COM'],
    ['http://user:pa@ss@0177.0.0.1/', '0177.0.0.1'],
    ['http://[::ffff:127.0.0.1]:80/', '[::ffff:127.0.0.1]'],
    ['http:2130706433', '2130706433'],
    ['http:\\\\2130706433\\x', '2130706433'],
    ['http:///127.1?x#y', '127.1'],
    ['  http://12\t7.1/ ', '127.1'],
    ['http://127.0.0.1#frag', '127.0.0.1'],
    ['ftp://10.1/', '10.1'],
    ['javascript:alert(1)', undefined],
    ['no scheme', undefined],
  ];
  for (const [input, expected] of cases) {
    it(`${JSON.stringify(input)} -> ${String(expected)}`, () => expect(extractRawHost(input)).toBe(expected));
  }

  it('detects userinfo in the raw authority, even an empty one', () => {
    expect(rawAuthorityHasUserinfo('http://u:p@host/')).toBe(true);
    expect(rawAuthorityHasUserinfo('http://@host/')).toBe(true);
    expect(rawAuthorityHasUserinfo('http://host/a@b')).toBe(false);
    expect(rawAuthorityHasUserinfo('http://host/?q=a@b')).toBe(false);
  });
});

describe('classifyRawHost', () => {
  const numeric: Array<[string, string, string | undefined]> = [
    ['2130706433', 'decimal integer', '127.0.0.1'],
    ['0x7f000001', 'hexadecimal integer', '127.0.0.1'],
    ['0X7F000001', 'hexadecimal integer', '127.0.0.1'],
    ['017700000001', 'octal integer', '127.0.0.1'],
    ['0x7f.0.0.1', 'hexadecimal component', '127.0.0.1'],
    ['0177.0.0.1', 'octal component', '127.0.0.1'],
    ['127.000.0.1', 'octal component', '127.0.0.1'],
    ['127.1', 'short dotted form', '127.0.0.1'],
    ['10.1', 'short dotted form', '10.0.0.1'],
    ['10.1.1', 'short dotted form', '10.1.0.1'],
    ['169.254.43518', 'short dotted form', '169.254.169.254'],
    ['127.0.0.1.', 'trailing dot', '127.0.0.1'],
    ['0x', 'hexadecimal integer', '0.0.0.0'],
    ['0', 'decimal integer', '0.0.0.0'],
    ['%31%32%37.0.0.1', 'percent-encoded or non-ASCII', '127.0.0.1'],
    ['１２７。０。０。１', 'percent-encoded or non-ASCII', '127.0.0.1'],
    ['１２７.０.０.１', 'percent-encoded or non-ASCII', '127.0.0.1'],
    // Ends in a number but is no IPv4 address: WHATWG rejects the URL; still numeric here.
    ['1.2.3.4.5', 'invalid numeric form', undefined],
    ['4294967296', 'invalid numeric form', undefined],
    ['foo.0x10', 'invalid numeric form', undefined],
    ['09.0.0.1', 'invalid numeric form', undefined],
  ];
  for (const [raw, form, address] of numeric) {
    it(`${raw} is a numeric form (${form})`, () => {
      expect(classifyRawHost(raw)).toEqual({ kind: 'numeric', form, address });
    });
  }

  it('canonical dotted quads, IPv6 literals and names are not numeric forms', () => {
    expect(classifyRawHost('127.0.0.1')).toEqual({ kind: 'ipv4', address: '127.0.0.1' });
    expect(classifyRawHost('93.184.216.34')).toEqual({ kind: 'ipv4', address: '93.184.216.34' });
    expect(classifyRawHost('[::1]')).toEqual({ kind: 'ipv6', literal: '[::1]' });
    for (const name of ['example.com', 'localhost', '127.0.0.1.nip.io', '0x7f.example', 'a1.b2', 'xn--nxasmq6b.com', '1e3.example', 'rebind.test']) {
      expect(classifyRawHost(name), name).toEqual({ kind: 'name' });
    }
  });

  it('agrees with WHATWG: every raw host that WHATWG turns into a different dotted quad is numeric', () => {
    const hosts = [
      '2130706433', '0x7f000001', '0x7f.1', '0x7F.0x0.0x0.0x1', '0177.1', '00000177.0.0.1', '127.0.1', '127.1.',
      '0.0.0.0', '0', '1.1', '255.255.255.255', '0xffffffff', '037777777777', '%30x7f.1', '１２７.1', '127。0。0。1',
      '8.8.8.8', '08.8.8.8', '0x08.8.8.8', 'example.com', '1.2.3.4x', '0x7f.0.0.1.',
    ];
    for (const raw of hosts) {
      let hostname: string | undefined;
      try {
        hostname = new URL(`http://${raw}/`).hostname;
      } catch {
        hostname = undefined;
      }
      const cls = classifyRawHost(raw);
      if (hostname === undefined) {
        // WHATWG rejects it: if it ends in a number we call it numeric, otherwise a name the URL
        // parser refuses anyway.
        expect(cls.kind === 'numeric' || cls.kind === 'name', raw).toBe(true);
        continue;
      }
      const isQuad = /^\d+\.\d+\.\d+\.\d+$/.test(hostname);
      if (isQuad && hostname !== raw) expect(cls, raw).toMatchObject({ kind: 'numeric', address: hostname });
      else if (isQuad) expect(cls, raw).toEqual({ kind: 'ipv4', address: hostname });
      else expect(cls.kind, raw).toBe('name');
    }
  });
});

describe('findNumericHostForm', () => {
  it('reads the raw URL, not the WHATWG-normalised hostname', () => {
    expect(new URL('http://2130706433/').hostname).toBe('127.0.0.1');
    expect(findNumericHostForm('http://2130706433/')).toEqual({ numeric: true, rawHost: '2130706433', form: 'decimal integer', address: '127.0.0.1' });
    expect(findNumericHostForm('https://0x7f.0.0.1:443/x')).toMatchObject({ numeric: true, address: '127.0.0.1' });
    expect(findNumericHostForm('http://u@10.1/')).toMatchObject({ numeric: true, rawHost: '10.1', address: '10.0.0.1' });
  });

  it('a canonical dotted quad or a name is not numeric', () => {
    expect(findNumericHostForm('http://127.0.0.1:8080/')).toEqual({ numeric: false, rawHost: '127.0.0.1' });
    expect(findNumericHostForm('https://example.com/')).toEqual({ numeric: false, rawHost: 'example.com' });
    expect(findNumericHostForm('http://[::ffff:127.0.0.1]/')).toEqual({ numeric: false, rawHost: '[::ffff:127.0.0.1]' });
  });
});
