/**
 * Numeric host forms (docs/architecture.md, "Address guard"): `2130706433`, `0x7f000001`,
 * `0x7f.0.0.1`, `0177.0.0.1`, `127.1`, `%31%32%37.0.0.1`, fullwidth digits... are refused outright,
 * even when the address they stand for is allowlisted, because each is a way to smuggle an address
 * past a filter that compares text.
 *
 * WHATWG URL parsing normalises all of them to a dotted quad (`new URL('http://2130706433/')
 * .hostname === '127.0.0.1'`), so the decision must be taken on the RAW authority text of the URL
 * string. `extractRawHost` reproduces just enough of the WHATWG URL state machine for the special
 * schemes http and https to find that text; `classifyRawHost` runs the WHATWG IPv4 parser on it.
 *
 * Pure: no I/O. `domainToASCII` (node:url) is only used for the UTS #46 mapping of non-ASCII hosts.
 */
import { domainToASCII } from 'node:url';
import { formatIPv4, parseIPv4 } from './address-ranges.js';

export type NumericHostForm =
  | 'decimal integer'
  | 'hexadecimal integer'
  | 'octal integer'
  | 'hexadecimal component'
  | 'octal component'
  | 'short dotted form'
  | 'trailing dot'
  | 'percent-encoded or non-ASCII'
  /** Ends in a number but is no IPv4 address (WHATWG rejects such a URL). */
  | 'invalid numeric form';

export type HostFormClass =
  /** A bracketed IPv6 literal (range-checked elsewhere). */
  | { kind: 'ipv6'; literal: string }
  /** A canonical dotted quad exactly as WHATWG prints it (range-checked elsewhere). */
  | { kind: 'ipv4'; address: string }
  /** Text that WHATWG turns into (or fails to turn into) an IPv4 address from a non-canonical form. */
  | { kind: 'numeric'; form: NumericHostForm; address: string | undefined }
  /** A domain name. */
  | { kind: 'name' };

const SPECIAL_AUTHORITY_SCHEMES = new Set(['http', 'https', 'ws', 'wss', 'ftp']);

/**
 * The raw host text of an absolute URL with a special scheme (http, https, ws, wss, ftp), as written:
 * not lowercased, not percent-decoded, without userinfo and port. IPv6 literals keep their brackets.
 * Returns undefined when the string has no scheme or a scheme without a WHATWG authority rule we
 * reproduce (those URLs are refused by the scheme rule anyway).
 *
 * Mirrors WHATWG: leading/trailing C0 controls and spaces stripped, tab/CR/LF removed anywhere, any
 * run of `/` and `\` after `scheme:` skipped, the authority ends at `/`, `\`, `?` or `#`, the host
 * starts after the last `@`, and (outside brackets) ends at the first `:`.
 */
export function extractRawHost(input: string): string | undefined {
  // eslint-disable-next-line no-control-regex
  const trimmed = input.replace(/^[\u0000-\u0020]+|[\u0000-\u0020]+$/g, '').replace(/[\t\n\r]/g, '');
  const scheme = /^([a-zA-Z][a-zA-Z0-9+\-.]*):/.exec(trimmed);
  if (scheme === null) return undefined;
  if (!SPECIAL_AUTHORITY_SCHEMES.has((scheme[1] as string).toLowerCase())) return undefined;
  let rest = trimmed.slice(scheme[0].length);
  rest = rest.replace(/^[/\\]+/, '');
  const end = rest.search(/[/\\?#]/);
  const authority = end === -1 ? rest : rest.slice(0, end);
  const at = authority.lastIndexOf('@');
  const hostPort = at === -1 ? authority : authority.slice(at + 1);
  if (hostPort.startsWith('[')) {
    const close = hostPort.indexOf(']');
    return close === -1 ? hostPort : hostPort.slice(0, close + 1);
  }
  const colon = hostPort.indexOf(':');
  return colon === -1 ? hostPort : hostPort.slice(0, colon);
}

/** Whether the authority of `input` (raw text) carries a userinfo part (`user:pass@`, `@`). */
export function rawAuthorityHasUserinfo(input: string): boolean {
  // eslint-disable-next-line no-control-regex
  const trimmed = input.replace(/^[\u0000-\u0020]+|[\u0000-\u0020]+$/g, '').replace(/[\t\n\r]/g, '');
  const scheme = /^([a-zA-Z][a-zA-Z0-9+\-.]*):/.exec(trimmed);
  if (scheme === null) return false;
  const rest = trimmed.slice(scheme[0].length).replace(/^[/\\]+/, '');
  const end = rest.search(/[/\\?#]/);
  const authority = end === -1 ? rest : rest.slice(0, end);
  return authority.includes('@');
}

function percentDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    // WHATWG leaves malformed escapes as they are; such a host is not numeric.
    return text;
  }
}

/**
 * The WHATWG "IPv4 number parser": `0x`/`0X` prefix is hexadecimal, a leading `0` (length >= 2) is
 * octal, otherwise decimal. Returns the value and the radix, or undefined on failure.
 */
function parseIPv4Number(part: string): { value: number; radix: 8 | 10 | 16 } | undefined {
  if (part === '') return undefined;
  let radix: 8 | 10 | 16 = 10;
  let digits = part;
  if (digits.length >= 2 && (digits.startsWith('0x') || digits.startsWith('0X'))) {
    radix = 16;
    digits = digits.slice(2);
  } else if (digits.length >= 2 && digits.startsWith('0')) {
    radix = 8;
    digits = digits.slice(1);
  }
  if (digits === '') return { value: 0, radix };
  const valid = radix === 16 ? /^[0-9a-fA-F]+$/ : radix === 10 ? /^[0-9]+$/ : /^[0-7]+$/;
  if (!valid.test(digits)) return undefined;
  // Number() is exact up to 2^53; anything that large is out of range below anyway.
  const value = radix === 10 ? Number(digits) : parseInt(digits, radix);
  return { value, radix };
}

/** The WHATWG "ends in a number" checker: is this host to be parsed as IPv4 at all? */
function endsInNumber(host: string): boolean {
  const parts = host.split('.');
  if (parts[parts.length - 1] === '') {
    if (parts.length === 1) return false;
    parts.pop();
  }
  const last = parts[parts.length - 1] as string;
  if (last !== '' && /^[0-9]+$/.test(last)) return true;
  return parseIPv4Number(last) !== undefined && /^0[xX]/.test(last);
}

/** The WHATWG IPv4 parser; undefined is "failure" (the URL would be invalid). */
function whatwgIPv4(host: string): number | undefined {
  const parts = host.split('.');
  if (parts[parts.length - 1] === '' && parts.length > 1) parts.pop();
  if (parts.length > 4) return undefined;
  const numbers: number[] = [];
  for (const part of parts) {
    const n = parseIPv4Number(part);
    if (n === undefined) return undefined;
    numbers.push(n.value);
  }
  for (let i = 0; i < numbers.length - 1; i += 1) if ((numbers[i] as number) > 255) return undefined;
  const last = numbers[numbers.length - 1] as number;
  if (last >= 256 ** (5 - numbers.length)) return undefined;
  let value = last;
  for (let i = 0; i < numbers.length - 1; i += 1) value += (numbers[i] as number) * 256 ** (3 - i);
  return value;
}

function describeForm(host: string): NumericHostForm {
  const parts = host.split('.');
  if (parts.length > 1 && parts[parts.length - 1] === '') {
    parts.pop();
    if (parts.length === 4 && parts.every((p) => /^(0|[1-9][0-9]{0,2})$/.test(p))) return 'trailing dot';
  }
  if (parts.length === 1) {
    const only = parts[0] as string;
    if (/^0[xX]/.test(only)) return 'hexadecimal integer';
    if (only.length >= 2 && only.startsWith('0')) return 'octal integer';
    return 'decimal integer';
  }
  if (parts.some((p) => /^0[xX]/.test(p))) return 'hexadecimal component';
  if (parts.some((p) => p.length >= 2 && p.startsWith('0'))) return 'octal component';
  return 'short dotted form';
}

/**
 * Classifies the raw host text of a URL (as returned by `extractRawHost`).
 *
 * `numeric` covers every text that WHATWG's host parser would read as an IPv4 address but that is
 * not the canonical dotted quad itself, and text that ends in a number but is no valid IPv4 address
 * (WHATWG rejects the URL; `address` is then undefined).
 */
export function classifyRawHost(rawHost: string): HostFormClass {
  if (rawHost.startsWith('[')) return { kind: 'ipv6', literal: rawHost };
  if (parseIPv4(rawHost) !== undefined) return { kind: 'ipv4', address: rawHost };

  const decoded = percentDecode(rawHost);
  const encoded = decoded !== rawHost || /[^\x20-\x7e]/.test(decoded);
  // UTS #46 mapping as WHATWG does it (fullwidth digits, ideographic full stops, case folding).
  // domainToASCII already applies the IPv4 parser; we still run our own on the mapped ASCII text to
  // name the form, and fall back to the mapped result for anything we cannot name.
  let ascii = decoded.toLowerCase();
  if (/[^\x20-\x7e]/.test(decoded)) {
    ascii = decoded
      .normalize('NFKC')
      .replace(/[\u3002\uff0e\uff61]/g, '.')
      .toLowerCase();
  }
  if (endsInNumber(ascii)) {
    const value = whatwgIPv4(ascii);
    const address = value === undefined ? undefined : formatIPv4(value);
    if (address !== undefined && address === rawHost) return { kind: 'ipv4', address };
    if (address === undefined) return { kind: 'numeric', form: 'invalid numeric form', address };
    return { kind: 'numeric', form: encoded ? 'percent-encoded or non-ASCII' : describeForm(ascii), address };
  }
  // Belt and braces: whatever node's own WHATWG host parser makes of it.
  const mapped = domainToASCII(decoded);
  if (parseIPv4(mapped) !== undefined && mapped !== rawHost) {
    return { kind: 'numeric', form: 'percent-encoded or non-ASCII', address: mapped };
  }
  return { kind: 'name' };
}

export type NumericHostFinding =
  | { numeric: true; rawHost: string; form: NumericHostForm; address: string | undefined }
  | { numeric: false; rawHost: string | undefined };

/** Whether the URL string's raw host is a refused numeric form. */
export function findNumericHostForm(url: string): NumericHostFinding {
  const rawHost = extractRawHost(url);
  if (rawHost === undefined) return { numeric: false, rawHost };
  const cls = classifyRawHost(rawHost);
  if (cls.kind === 'numeric') return { numeric: true, rawHost, form: cls.form, address: cls.address };
  return { numeric: false, rawHost };
}
