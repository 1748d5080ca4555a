/**
 * IP literal parsing and the refused ranges of the address guard (DESIGN.md, "Address guard").
 *
 * Pure: no I/O, no DNS. Input is an IP literal as it comes from a resolver answer or from a URL
 * hostname already normalised by WHATWG URL parsing (IPv6 with or without brackets, an optional
 * `%zone` suffix is ignored). Numeric host *forms* (2130706433, 0x7f.1, ...) are not this module's
 * business: see `host-forms.ts`; here an IPv4 literal must be a strict dotted quad.
 *
 * Fail closed: a string that is not an IP literal is reported as refused (range `not an IP address`),
 * so a broken resolver answer can never be mistaken for a public address.
 */

/** One IPv4 CIDR block with a human name. `base` is the network address as an unsigned 32-bit int. */
type V4Block = { readonly cidr: string; readonly name: string; readonly base: number; readonly prefix: number };

function v4Block(cidr: string, name: string): V4Block {
  const [addr, bits] = cidr.split('/') as [string, string];
  const base = parseIPv4(addr);
  if (base === undefined) throw new Error(`bad IPv4 block ${cidr}`);
  return { cidr, name, base, prefix: Number(bits) };
}

/** The refused IPv4 ranges, in DESIGN.md order. */
export const REFUSED_IPV4_BLOCKS: readonly V4Block[] = [
  v4Block('0.0.0.0/8', 'this network'),
  v4Block('10.0.0.0/8', 'private'),
  v4Block('100.64.0.0/10', 'carrier-grade NAT'),
  v4Block('127.0.0.0/8', 'loopback'),
  v4Block('169.254.0.0/16', 'link-local'),
  v4Block('172.16.0.0/12', 'private'),
  v4Block('192.0.0.0/24', 'IETF protocol assignments'),
  v4Block('192.168.0.0/16', 'private'),
  v4Block('198.18.0.0/15', 'benchmarking'),
  v4Block('224.0.0.0/4', 'multicast'),
  v4Block('240.0.0.0/4', 'reserved and broadcast'),
];

/** One IPv6 block: a 128-bit prefix given as 8 groups and a prefix length. */
type V6Block = { readonly cidr: string; readonly name: string; readonly groups: readonly number[]; readonly prefix: number };

function v6Block(cidr: string, name: string): V6Block {
  const [addr, bits] = cidr.split('/') as [string, string];
  const groups = parseIPv6(addr);
  if (groups === undefined) throw new Error(`bad IPv6 block ${cidr}`);
  return { cidr, name, groups, prefix: Number(bits) };
}

/** The refused IPv6 ranges that are refused whatever follows the prefix. */
export const REFUSED_IPV6_BLOCKS: readonly V6Block[] = [
  v6Block('::/128', 'unspecified'),
  v6Block('::1/128', 'loopback'),
  v6Block('fc00::/7', 'unique local'),
  v6Block('fe80::/10', 'link-local'),
  v6Block('ff00::/8', 'multicast'),
];

/**
 * IPv6 ranges that carry an IPv4 address: refused when the embedded IPv4 address is in a refused
 * IPv4 range (a kernel, a NAT64 gateway or a 6to4 relay would deliver them to that IPv4 address).
 * `offset` is the index of the first of the two 16-bit groups holding the IPv4 address.
 */
type V6Embedding = V6Block & { readonly offset: number };

export const IPV4_EMBEDDING_IPV6_BLOCKS: readonly V6Embedding[] = [
  { ...v6Block('::ffff:0:0/96', 'IPv4-mapped'), offset: 6 },
  { ...v6Block('::/96', 'IPv4-compatible'), offset: 6 },
  { ...v6Block('::ffff:0:0:0/96', 'IPv4-translated'), offset: 6 },
  { ...v6Block('64:ff9b::/96', 'NAT64'), offset: 6 },
  { ...v6Block('2002::/16', '6to4'), offset: 1 },
];

export type RangeCheck = { refused: true; range: string } | { refused: false };

export type ParsedIp = { family: 4; value: number } | { family: 6; groups: number[] };

/**
 * A strict dotted quad: four decimal components 0..255 without leading zeros. Returns the address as
 * an unsigned 32-bit integer, or undefined.
 */
export function parseIPv4(text: string): number | undefined {
  const match = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(text);
  if (match === null) return undefined;
  let value = 0;
  for (let i = 1; i <= 4; i += 1) {
    const part = match[i] as string;
    if (part.length > 1 && part.startsWith('0')) return undefined;
    const n = Number(part);
    if (n > 255) return undefined;
    value = value * 256 + n;
  }
  return value;
}

/** Formats an unsigned 32-bit integer as a dotted quad. */
export function formatIPv4(value: number): string {
  return [value >>> 24, (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff].join('.');
}

/**
 * An IPv6 literal (brackets and a `%zone` suffix allowed), with an optional trailing dotted quad.
 * Returns the eight 16-bit groups, or undefined.
 */
export function parseIPv6(input: string): number[] | undefined {
  let text = input;
  if (text.startsWith('[') && text.endsWith(']')) text = text.slice(1, -1);
  const zone = text.indexOf('%');
  if (zone !== -1) text = text.slice(0, zone);
  if (text === '' || !/^[0-9a-fA-F:.]+$/.test(text)) return undefined;

  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const parseHalf = (half: string, allowV4Tail: boolean): number[] | undefined => {
    if (half === '') return [];
    const out: number[] = [];
    const pieces = half.split(':');
    for (let i = 0; i < pieces.length; i += 1) {
      const piece = pieces[i] as string;
      if (piece.includes('.')) {
        if (!allowV4Tail || i !== pieces.length - 1) return undefined;
        const v4 = parseIPv4(piece);
        if (v4 === undefined) return undefined;
        out.push(v4 >>> 16, v4 & 0xffff);
      } else {
        if (!/^[0-9a-fA-F]{1,4}$/.test(piece)) return undefined;
        out.push(parseInt(piece, 16));
      }
    }
    return out;
  };

  if (halves.length === 1) {
    const groups = parseHalf(halves[0] as string, true);
    return groups !== undefined && groups.length === 8 ? groups : undefined;
  }
  const head = parseHalf(halves[0] as string, false);
  const tail = parseHalf(halves[1] as string, true);
  if (head === undefined || tail === undefined) return undefined;
  const missing = 8 - head.length - tail.length;
  // `::` stands for at least one group of zeros.
  if (missing < 1) return undefined;
  return [...head, ...new Array<number>(missing).fill(0), ...tail];
}

/** Parses an IPv4 (strict dotted quad) or IPv6 literal. */
export function parseIp(text: string): ParsedIp | undefined {
  const v4 = parseIPv4(text);
  if (v4 !== undefined) return { family: 4, value: v4 };
  const v6 = parseIPv6(text);
  if (v6 !== undefined) return { family: 6, groups: v6 };
  return undefined;
}

/** 4, 6, or 0 when `text` is not an IP literal (same convention as `net.isIP`). */
export function ipFamily(text: string): 0 | 4 | 6 {
  return parseIp(text)?.family ?? 0;
}

/** Canonical text of an IP literal (RFC 5952 for IPv6, no brackets), or undefined. */
export function canonicalIp(text: string): string | undefined {
  const parsed = parseIp(text);
  if (parsed === undefined) return undefined;
  if (parsed.family === 4) return formatIPv4(parsed.value);
  return formatIPv6(parsed.groups);
}

/** RFC 5952 text of eight groups: lowercase, the longest run (>= 2) of zero groups as `::`. */
export function formatIPv6(groups: readonly number[]): string {
  let bestStart = -1;
  let bestLength = 0;
  for (let i = 0; i < groups.length; ) {
    if (groups[i] !== 0) {
      i += 1;
      continue;
    }
    let j = i;
    while (j < groups.length && groups[j] === 0) j += 1;
    if (j - i > bestLength) {
      bestStart = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (bestLength < 2) return hex.join(':');
  const head = hex.slice(0, bestStart).join(':');
  const tail = hex.slice(bestStart + bestLength).join(':');
  return `${head}::${tail}`;
}

function inV4Block(value: number, block: V4Block): boolean {
  if (block.prefix === 0) return true;
  const shift = 32 - block.prefix;
  return value >>> shift === block.base >>> shift;
}

function inV6Block(groups: readonly number[], block: V6Block): boolean {
  let bits = block.prefix;
  for (let i = 0; i < 8 && bits > 0; i += 1) {
    const take = Math.min(16, bits);
    const mask = (0xffff << (16 - take)) & 0xffff;
    if (((groups[i] as number) & mask) !== ((block.groups[i] as number) & mask)) return false;
    bits -= take;
  }
  return true;
}

function checkV4(value: number): RangeCheck {
  for (const block of REFUSED_IPV4_BLOCKS) {
    if (inV4Block(value, block)) return { refused: true, range: `${block.cidr} (${block.name})` };
  }
  return { refused: false };
}

function checkV6(groups: readonly number[]): RangeCheck {
  for (const block of REFUSED_IPV6_BLOCKS) {
    if (inV6Block(groups, block)) return { refused: true, range: `${block.cidr} (${block.name})` };
  }
  for (const block of IPV4_EMBEDDING_IPV6_BLOCKS) {
    if (!inV6Block(groups, block)) continue;
    const embedded = (groups[block.offset] as number) * 0x10000 + (groups[block.offset + 1] as number);
    const inner = checkV4(embedded);
    if (inner.refused) {
      return { refused: true, range: `${block.cidr} (${block.name}) embedding ${formatIPv4(embedded)} in ${inner.range}` };
    }
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
  return parsed.family === 4 ? checkV4(parsed.value) : checkV6(parsed.groups);
}
