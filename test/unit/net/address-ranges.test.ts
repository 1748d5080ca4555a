import { describe, it, expect } from 'vitest';
import { canonicalIp, ipFamily, isRefusedAddress, parseIPv4, parseIPv6 } from '../../../src/net/address-ranges.js';

/** [block, first, last, just below (or null), just above (or null)]; neighbours listed as accepted. */
const V4_BOUNDARIES: Array<[string, string, string, string | null, string | null]> = [
  ['0.0.0.0/8', '0.0.0.0', '0.255.255.255', null, '1.0.0.0'],
  ['10.0.0.0/8', '10.0.0.0', '10.255.255.255', '9.255.255.255', '11.0.0.0'],
  ['100.64.0.0/10', '100.64.0.0', '100.127.255.255', '100.63.255.255', '100.128.0.0'],
  ['127.0.0.0/8', '127.0.0.0', '127.255.255.255', '126.255.255.255', '128.0.0.0'],
  ['169.254.0.0/16', '169.254.0.0', '169.254.255.255', '169.253.255.255', '169.255.0.0'],
  ['172.16.0.0/12', '172.16.0.0', '172.31.255.255', '172.15.255.255', '172.32.0.0'],
  ['192.0.0.0/24', '192.0.0.0', '192.0.0.255', '191.255.255.255', '192.0.1.0'],
  ['192.168.0.0/16', '192.168.0.0', '192.168.255.255', '192.167.255.255', '192.169.0.0'],
  ['198.18.0.0/15', '198.18.0.0', '198.19.255.255', '198.17.255.255', '198.20.0.0'],
  // 224/4 and 240/4 are adjacent: the address above 224/4 is the first of 240/4 (refused, below).
  ['224.0.0.0/4', '224.0.0.0', '239.255.255.255', '223.255.255.255', null],
  ['240.0.0.0/4', '240.0.0.0', '255.255.255.255', null, null],
];

describe('isRefusedAddress: IPv4 boundaries', () => {
  for (const [block, first, last, below, above] of V4_BOUNDARIES) {
    it(`${block}: first ${first} and last ${last} refused`, () => {
      for (const ip of [first, last]) {
        const r = isRefusedAddress(ip);
        expect(r.refused, ip).toBe(true);
        if (r.refused) expect(r.range.startsWith(block)).toBe(true);
      }
    });
    if (below !== null || above !== null) {
      it(`${block}: just outside (${[below, above].filter(Boolean).join(', ')}) accepted`, () => {
        for (const ip of [below, above]) if (ip !== null) expect(isRefusedAddress(ip), ip).toEqual({ refused: false });
      });
    }
  }

  it('the broadcast address 255.255.255.255 is refused as part of 240/4', () => {
    expect(isRefusedAddress('255.255.255.255')).toEqual({ refused: true, range: '240.0.0.0/4 (reserved and broadcast)' });
  });

  it('canonical public addresses are accepted', () => {
    for (const ip of ['93.184.216.34', '8.8.8.8', '1.1.1.1', '192.0.2.1', '223.255.255.255', '100.63.0.1']) {
      expect(isRefusedAddress(ip), ip).toEqual({ refused: false });
    }
  });
});

describe('isRefusedAddress: IPv6', () => {
  const refused: Array<[string, string]> = [
    ['::', '::/128'],
    ['::1', '::1/128'],
    ['[::1]', '::1/128'],
    ['0:0:0:0:0:0:0:1', '::1/128'],
    ['fc00::', 'fc00::/7'],
    ['fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'fc00::/7'],
    ['fe80::', 'fe80::/10'],
    ['fe80::1%eth0', 'fe80::/10'],
    ['febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'fe80::/10'],
    ['ff00::', 'ff00::/8'],
    ['ff02::1', 'ff00::/8'],
    ['ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'ff00::/8'],
  ];
  for (const [ip, block] of refused) {
    it(`${ip} refused in ${block}`, () => {
      const r = isRefusedAddress(ip);
      expect(r.refused).toBe(true);
      if (r.refused) expect(r.range.startsWith(block)).toBe(true);
    });
  }

  it('just outside the IPv6 blocks is accepted', () => {
    for (const ip of [
      'fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', // below fc00::/7
      'fe00::', // above fc00::/7, below fe80::/10
      'fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff', // below fe80::/10
      'fec0::', // above fe80::/10
      'feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', // below ff00::/8
      '2606:4700::1',
      '2001:4860:4860::8888',
      '[2606:4700::1]',
    ]) {
      expect(isRefusedAddress(ip), ip).toEqual({ refused: false });
    }
  });

  it('IPv4-mapped forms of refused IPv4 ranges are refused (dotted and hex spellings)', () => {
    for (const ip of ['::ffff:127.0.0.1', '::ffff:7f00:1', '[::ffff:127.0.0.1]', '[::ffff:7f00:1]', '::ffff:10.0.0.1', '::ffff:a9fe:a9fe', '::ffff:0.0.0.0', '::ffff:255.255.255.255', '0:0:0:0:0:ffff:c0a8:101']) {
      const r = isRefusedAddress(ip);
      expect(r.refused, ip).toBe(true);
      if (r.refused) expect(r.range).toContain('::ffff:0:0/96 (IPv4-mapped)');
    }
    expect(isRefusedAddress('::ffff:7f00:1')).toEqual({
      refused: true,
      range: '::ffff:0:0/96 (IPv4-mapped) embedding 127.0.0.1 in 127.0.0.0/8 (loopback)',
    });
  });

  it('IPv4-mapped forms of public addresses are accepted', () => {
    for (const ip of ['::ffff:8.8.8.8', '::ffff:5db8:d822', '::ffff:100.63.255.255']) expect(isRefusedAddress(ip), ip).toEqual({ refused: false });
  });

  it('IPv4-compatible, IPv4-translated, NAT64 and 6to4 forms of refused IPv4 ranges are refused', () => {
    const cases: Array<[string, string]> = [
      ['::127.0.0.1', '::/96 (IPv4-compatible)'],
      ['::7f00:1', '::/96 (IPv4-compatible)'],
      ['::a00:1', '::/96 (IPv4-compatible)'],
      ['::ffff:0:127.0.0.1', '::ffff:0:0:0/96 (IPv4-translated)'],
      ['64:ff9b::127.0.0.1', '64:ff9b::/96 (NAT64)'],
      ['64:ff9b::a9fe:a9fe', '64:ff9b::/96 (NAT64)'],
      ['2002:7f00:1::', '2002::/16 (6to4)'],
      ['2002:c0a8:101::1', '2002::/16 (6to4)'],
    ];
    for (const [ip, range] of cases) {
      const r = isRefusedAddress(ip);
      expect(r.refused, ip).toBe(true);
      if (r.refused) expect(r.range.startsWith(range), `${ip}: ${r.range}`).toBe(true);
    }
    for (const ip of ['64:ff9b::808:808', '64:ff9b::8.8.8.8', '2002:808:808::1', '::808:808']) expect(isRefusedAddress(ip), ip).toEqual({ refused: false });
  });

  it('anything that is not an IP literal is refused (fail closed)', () => {
    for (const text of ['', 'example.com', '1.2.3', '1.2.3.4.5', '0177.0.0.1', '127.1', '256.0.0.1', '::1::2', '1:2:3:4:5:6:7:8:9', '1:2:3:4:5:6:7::8:9', 'gggg::', '[::1', '2130706433']) {
      expect(isRefusedAddress(text), text).toEqual({ refused: true, range: 'not an IP address' });
    }
  });
});

describe('IP literal parsing', () => {
  it('parses strict dotted quads only', () => {
    expect(parseIPv4('127.0.0.1')).toBe(0x7f000001);
    expect(parseIPv4('255.255.255.255')).toBe(0xffffffff);
    expect(parseIPv4('01.2.3.4')).toBeUndefined();
    expect(parseIPv4('1.2.3.256')).toBeUndefined();
    expect(parseIPv4(' 1.2.3.4')).toBeUndefined();
  });

  it('parses IPv6 with compression, a dotted tail, brackets and a zone', () => {
    expect(parseIPv6('::')).toEqual([0, 0, 0, 0, 0, 0, 0, 0]);
    expect(parseIPv6('[::ffff:127.0.0.1]')).toEqual([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1]);
    expect(parseIPv6('fe80::1%lo0')).toEqual([0xfe80, 0, 0, 0, 0, 0, 0, 1]);
    expect(parseIPv6('1:2:3:4:5:6:7:8')).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(parseIPv6('1:2:3:4:5:6:7::8')).toBeUndefined();
    expect(parseIPv6('::1.2.3.4:5')).toBeUndefined();
  });

  it('ipFamily follows net.isIP conventions', () => {
    expect(ipFamily('1.2.3.4')).toBe(4);
    expect(ipFamily('::1')).toBe(6);
    expect(ipFamily('localhost')).toBe(0);
  });

  it('canonicalIp prints IPv6 exactly as WHATWG URL does', () => {
    let seed = 12345;
    const rand = (): number => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed;
    };
    for (let n = 0; n < 500; n += 1) {
      // Mostly zero groups, so that compression runs of every length and position occur.
      const groups = Array.from({ length: 8 }, () => (rand() % 3 === 0 ? rand() % 0x10000 : 0));
      const text = groups.map((g) => g.toString(16)).join(':');
      const whatwg = new URL(`http://[${text}]/`).hostname.slice(1, -1);
      expect(canonicalIp(text), text).toBe(whatwg);
    }
    expect(canonicalIp('::ffff:127.0.0.1')).toBe('::ffff:7f00:1');
    expect(canonicalIp('[0:0:0:0:0:0:0:1]')).toBe('::1');
    expect(canonicalIp('2001:db8:0:0:1:0:0:1')).toBe('2001:db8::1:0:0:1');
    // The deprecated IPv4-compatible spelling is its own address, not the IPv4-mapped one.
    expect(canonicalIp('::127.0.0.1')).toBe('::7f00:1');
    expect(parseIPv6('::127.0.0.1')).toEqual([0, 0, 0, 0, 0, 0, 0x7f00, 1]);
    expect(canonicalIp('fe80::1%eth0')).toBe('fe80::1');
  });
});
