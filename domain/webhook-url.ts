// Webhook URL policy for push notifications: http(s) only, no credentials in the URL, and no
// private, loopback or link-local targets unless PUSH_ALLOW_PRIVATE allows them. The same check
// runs at delivery time inside the connection's DNS lookup, so a name that later resolves to an
// internal address (DNS rebinding) is still refused.
import dns from 'node:dns';
import net from 'node:net';
import { echoed, InvalidRequest, Unavailable } from './errors.ts';

const blocked = new net.BlockList();
// IPv4: IANA's special-purpose ranges that are not global (this network, private, shared, loopback,
// link-local, protocol assignments, documentation, 6to4 relay, benchmarking, multicast, reserved).
for (const [net4, prefix] of [
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
  ['192.0.0.0', 24], ['192.0.2.0', 24], ['192.88.99.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15],
  ['198.51.100.0', 24], ['203.0.113.0', 24], ['224.0.0.0', 4], ['240.0.0.0', 4],
] as const) blocked.addSubnet(net4, prefix, 'ipv4');
// IPv6: unspecified, loopback and IPv4-compatible (::/96), discard-only, benchmarking, documentation,
// SRv6 SIDs, unique-local, link- and site-local, multicast, and the ranges that embed IPv4 addresses
// (IPv4-translated, NAT64, Teredo, 6to4).
for (const [net6, prefix] of [
  ['::', 96], ['::ffff:0:0:0', 96], ['100::', 64], ['2001:2::', 48], ['2001:db8::', 32], ['3fff::', 20], ['5f00::', 16], ['fc00::', 7], ['fe80::', 10], ['fec0::', 10], ['ff00::', 8],
  ['64:ff9b::', 96], ['64:ff9b:1::', 48], ['2001::', 32], ['2002::', 16],
] as const) blocked.addSubnet(net6, prefix, 'ipv6');

export function isPrivateAddress(ip: string): boolean {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  if (mapped) return blocked.check(mapped[1], 'ipv4');
  const family = net.isIP(ip);
  if (family === 0) return true;
  return blocked.check(ip, family === 4 ? 'ipv4' : 'ipv6');
}

// What a lookup (getaddrinfo) answers about the name itself, which no retry mends: it does not exist
// (ENOTFOUND, ENODATA), or no resolver takes it (EINVAL: over 255 characters). Anything else (EAI_AGAIN,
// EAI_FAIL from a resolver that refused or failed, EAI_SYSTEM's errno, no code at all) may pass.
const NAME_REFUSED = ['ENOTFOUND', 'ENODATA', 'EINVAL'];

const hostOf = (url: URL) => url.hostname.replace(/^\[(.*)\]$/, '$1');

// The host of `url` when it is an internal IP literal, which connecting never looks up (so
// guardedLookup never sees it): each caller refuses it before connecting.
export function privateLiteralHost(url: URL): string | undefined {
  const host = hostOf(url);
  return net.isIP(host) && isPrivateAddress(host) ? host : undefined;
}

async function resolve(host: string): Promise<string[]> {
  if (net.isIP(host)) return [host];
  const found = await dns.promises.lookup(host, { all: true, verbatim: true });
  return found.map((a) => a.address);
}

// `what` names the URL in errors and `setting` the switch that allows internal targets.
export async function assertOutboundUrl(raw: string, allowPrivate: boolean, what = 'Push notification URL', setting = 'PUSH_ALLOW_PRIVATE'): Promise<URL> {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    // One that parses against a base is relative; one that still does not is malformed (a port
    // past 65535, a space in the host), and calling it not absolute would send the caller astray.
    const relative = URL.canParse(raw, 'http://base.invalid/');
    // Not quoted when it holds an '@': what comes before may be credentials (`http://user:pw@...`),
    // and a URL that does not parse cannot be told apart into its parts.
    const quoted = raw.includes('@') ? '' : ` '${echoed(raw)}'`;
    const unquoted = quoted ? '' : " (not quoted: it holds an '@', which may follow credentials)";
    throw new InvalidRequest(`${what}${quoted} is not ${relative ? 'an absolute' : 'a valid'} URL${unquoted}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new InvalidRequest(`${what} must use http or https, not '${url.protocol.replace(/:$/, '')}'`);
  }
  if (url.username || url.password) {
    throw new InvalidRequest(`${what} must not contain credentials: pass them as the token or authentication instead`);
  }
  // Node's HTTP client takes port 0 for the scheme's default: posts, and a token, would go to port 80 or 443.
  if (url.port === '0') throw new InvalidRequest(`${what} must not name port 0`);
  // Resolved whether or not internal targets are allowed: the switch allows internal hosts, not
  // missing ones, which would only fail every post (or call) later.
  const host = hostOf(url);
  let addresses: string[];
  try {
    addresses = await resolve(host);
  } catch (err) {
    const code = String((err as NodeJS.ErrnoException).code);
    // Refusing a lookup that failed for now as the caller's mistake would fail a good URL, and a
    // remote agent's run, for a DNS blip.
    if (NAME_REFUSED.includes(code)) throw new InvalidRequest(`${what} host '${host}' cannot be resolved (${code})`);
    throw new Unavailable(`${what} host '${host}' could not be looked up just now (${code}); retry shortly`);
  }
  if (allowPrivate) return url;
  const internal = addresses.find(isPrivateAddress);
  if (internal !== undefined) {
    // The address is named only when the caller wrote it: what a name resolves to inside stays inside.
    const shown = net.isIP(host) ? ` (${internal})` : '';
    throw new InvalidRequest(
      `${what} host '${host}' resolves to a private, loopback or link-local address${shown}; such targets need ${setting}=true`,
    );
  }
  return url;
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => void;

// A dns.lookup replacement for http(s).request that refuses internal addresses at connect time.
export function guardedLookup(allowPrivate: boolean) {
  return (hostname: string, options: dns.LookupOptions, callback: LookupCallback): void => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, []);
      const list = addresses as dns.LookupAddress[];
      const bad = allowPrivate ? undefined : list.find((a) => isPrivateAddress(a.address));
      if (bad) {
        // Which internal address is not said: what a name resolves to inside stays inside.
        return callback(Object.assign(new Error(`host '${hostname}' resolves to an internal address`), { code: 'EPRIVATE' }), []);
      }
      if (options.all) return callback(null, list);
      callback(null, list[0].address, list[0].family);
    });
  };
}
