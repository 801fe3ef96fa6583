import { isIPv6 } from 'node:net';

/**
 * The client a request address stands for, in the limits per client address: an IPv6 address's
 * /64 (a host is given a /64 and may take any address in it, so one address each would let it past
 * any limit), an IPv4-mapped one as its IPv4 address; anything else as it is.
 */
export function clientOf(address: string): string {
  const groups = ipv6Groups(address);
  if (!groups) return address;
  if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) {
    return [groups[6] >> 8, groups[6] & 0xff, groups[7] >> 8, groups[7] & 0xff].join('.');
  }
  return `${groups.slice(0, 4).map((g) => g.toString(16)).join(':')}::/64`;
}

// The eight 16-bit groups of an IPv6 address (a zone, `%eth0`, dropped); undefined for anything else.
function ipv6Groups(address: string): number[] | undefined {
  const ip = address.replace(/%.*$/, '');
  if (!isIPv6(ip)) return undefined;
  const half = (text: string) => text.split(':').filter(Boolean).flatMap((part) => {
    if (!part.includes('.')) return [parseInt(part, 16)];
    const [a, b, c, d] = part.split('.').map(Number);
    return [(a << 8) | b, (c << 8) | d];
  });
  const [head, tail] = ip.split('::');
  const front = half(head);
  const back = tail === undefined ? [] : half(tail);
  return [...front, ...Array<number>(8 - front.length - back.length).fill(0), ...back];
}
