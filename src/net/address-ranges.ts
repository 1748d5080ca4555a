/**
 * IP literals and the refused ranges of the address guard (docs/architecture.md, "Address guard").
 *
 * Pure: no I/O, no DNS. Input is an IP literal as it comes from a resolver answer or from a URL
 * hostname already normalised by WHATWG URL parsing (IPv6 with or without brackets, an optional
 * `%zone` suffix is ignored). Numeric host *forms* (2130706433, 0x7f.1, ...) are not this module's
 * business: see `host-forms.ts`; here an IPv4 literal must be a strict dotted quad.
 *
 * Node decides what is an IP literal (`net.isIP`) and prints IPv6 canonically (the WHATWG host
 * parser), `net.BlockList` does the range tests, and ipaddr.js gives the 16-bit groups of an IPv6
 * address, which BlockList does not expose but which name the IPv4 address carried inside one.
 *
 * Fail closed: a string that is not an IP literal is reported as refused (range `not an IP address`),
 * so a broken resolver answer can never be mistaken for a public address.
 */
import { BlockList, isIPv4, isIPv6 } from 'node:net';
import ipaddr from 'ipaddr.js';

/** One refused CIDR block with a human name, as a one-rule BlockList so that a hit can be named. */
type Block = { readonly cidr: string; readonly name: string; readonly list: BlockList };

function block(cidr: string, name: string): Block {
  const [network, bits] = cidr.split('/') as [string, string];
  const list = new BlockList();
  list.addSubnet(network, Number(bits), network.includes(':') ? 'ipv6' : 'ipv4');
  return { cidr, name, list };
}

/** The refused IPv4 ranges, in the order docs/architecture.md lists them. */
export const REFUSED_IPV4_BLOCKS: readonly Block[] = [
  block('0.0.0.0/8', 'this network'),
  block('10.0.0.0/8', 'private'),
  block('100.64.0.0/10', 'carrier-grade NAT'),
  block('127.0.0.0/8', 'loopback'),
  block('169.254.0.0/16', 'link-local'),
  block('172.16.0.0/12', 'private'),
  block('192.0.0.0/24', 'IETF protocol assignments'),
  block('192.168.0.0/16', 'private'),
  block('198.18.0.0/15', 'benchmarking'),
  block('224.0.0.0/4', 'multicast'),
  block('240.0.0.0/4', 'reserved and broadcast'),
];

/** The refused IPv6 ranges that are refused whatever follows the prefix. */
export const REFUSED_IPV6_BLOCKS: readonly Block[] = [
  block('::/128', 'unspecified'),
  block('::1/128', 'loopback'),
  block('fc00::/7', 'unique local'),
  block('fe80::/10', 'link-local'),
  block('ff00::/8', 'multicast'),
];

/**
 * IPv6 ranges that carry an IPv4 address: refused when the embedded IPv4 address is in a refused
 * IPv4 range (a kernel, a NAT64 gateway or a 6to4 relay would deliver them to that IPv4 address).
 * `offset` is the index of the first of the two 16-bit groups holding the IPv4 address.
 */
type Embedding = Block & { readonly offset: number };

export const IPV4_EMBEDDING_IPV6_BLOCKS: readonly Embedding[] = [
  { ...block('::ffff:0:0/96', 'IPv4-mapped'), offset: 6 },
  { ...block('::/96', 'IPv4-compatible'), offset: 6 },
  { ...block('::ffff:0:0:0/96', 'IPv4-translated'), offset: 6 },
  { ...block('64:ff9b::/96', 'NAT64'), offset: 6 },
  { ...block('2002::/16', '6to4'), offset: 1 },
];

export type RangeCheck = { refused: true; range: string } | { refused: false };

/** An IPv6 address is kept in its canonical text (RFC 5952, no zone) and its eight 16-bit groups. */
type ParsedIp = { family: 4; text: string } | { family: 6; text: string; groups: number[] };

function parseIp(input: string): ParsedIp | undefined {
  if (isIPv4(input)) return { family: 4, text: input };
  const literal = input.startsWith('[') && input.endsWith(']') ? input.slice(1, -1) : input;
  // Node's parser is the gate (it also insists on a strict dotted-quad tail).
  if (!isIPv6(literal)) return undefined;
  const zone = literal.indexOf('%');
  let text: string;
  try {
    // The WHATWG host parser prints the canonical text the guard compares URL hosts with.
    text = new URL(`http://[${zone === -1 ? literal : literal.slice(0, zone)}]/`).hostname.slice(1, -1);
  } catch {
    return undefined;
  }
  // ipaddr.js reads the groups from that all-hex text: it would read `::a.b.c.d` itself as the
  // IPv4-mapped `::ffff:a.b.c.d`, which is another address.
  return { family: 6, text, groups: ipaddr.IPv6.parse(text).parts };
}

/** A strict dotted quad (no leading zeros) as an unsigned 32-bit integer, or undefined. */
export function parseIPv4(text: string): number | undefined {
  if (!isIPv4(text)) return undefined;
  return ipaddr.IPv4.parse(text).octets.reduce((value, octet) => value * 256 + octet, 0);
}

/** Formats an unsigned 32-bit integer as a dotted quad. */
export function formatIPv4(value: number): string {
  return [value >>> 24, (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff].join('.');
}

/**
 * An IPv6 literal (brackets and a `%zone` suffix allowed), with an optional trailing dotted quad.
 * Returns the eight 16-bit groups, or undefined.
 */
export function parseIPv6(text: string): number[] | undefined {
  const parsed = parseIp(text);
  return parsed?.family === 6 ? parsed.groups : undefined;
}

/** 4, 6, or 0 when `text` is not an IP literal (same convention as `net.isIP`). */
export function ipFamily(text: string): 0 | 4 | 6 {
  return parseIp(text)?.family ?? 0;
}

/** Canonical text of an IP literal (RFC 5952 for IPv6, no brackets, no zone), or undefined. */
export function canonicalIp(text: string): string | undefined {
  return parseIp(text)?.text;
}

function checkV4(address: string): RangeCheck {
  for (const { cidr, name, list } of REFUSED_IPV4_BLOCKS) {
    if (list.check(address, 'ipv4')) return { refused: true, range: `${cidr} (${name})` };
  }
  return { refused: false };
}

function checkV6(address: string, groups: readonly number[]): RangeCheck {
  for (const { cidr, name, list } of REFUSED_IPV6_BLOCKS) {
    if (list.check(address, 'ipv6')) return { refused: true, range: `${cidr} (${name})` };
  }
  for (const { cidr, name, list, offset } of IPV4_EMBEDDING_IPV6_BLOCKS) {
    if (!list.check(address, 'ipv6')) continue;
    const embedded = formatIPv4((groups[offset] as number) * 0x10000 + (groups[offset + 1] as number));
    const inner = checkV4(embedded);
    if (inner.refused) return { refused: true, range: `${cidr} (${name}) embedding ${embedded} in ${inner.range}` };
  }
  return { refused: false };
}

/**
 * Whether an IP literal lies in a refused range; `range` names the block (for an IPv6 form that
 * embeds an IPv4 address, the IPv6 block and the IPv4 block). Non-IP input is refused.
 */
export function isRefusedAddress(ip: string): RangeCheck {
  const parsed = parseIp(ip);
  if (parsed === undefined) return { refused: true, range: 'not an IP address' };
  return parsed.family === 4 ? checkV4(parsed.text) : checkV6(parsed.text, parsed.groups);
}
