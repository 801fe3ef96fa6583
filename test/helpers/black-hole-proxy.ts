// A TCP proxy that can turn into a black hole: while `swallowing`, bytes in either direction are
// dropped, so a peer behind it goes silent without closing anything (a network partition, a frozen
// host). Bytes dropped stay lost after `forward()`: what was in flight then never arrives.
// `freezeOpen()` silences only the connections open now, for good, while new ones pass (a NAT
// gateway or load balancer that dropped idle connections without telling either end).
// `reset()` instead cuts every connection with a TCP reset (a server killed, a proxy dropping it).
import net from 'node:net';
import { requireEnv, startStack, type Stack } from './stack.ts';

export interface BlackHoleProxy { port: number; swallow(): void; forward(): void; freezeOpen(): void; reset(): void; close(): Promise<void> }

export async function startBlackHoleProxy(target: { host: string; port: number }): Promise<BlackHoleProxy> {
  let swallowing = false;
  const sockets = new Set<net.Socket>();
  const connections = new Set<{ frozen: boolean }>();
  const server = net.createServer((client) => {
    const connection = { frozen: false };
    connections.add(connection);
    const upstream = net.connect(target.port, target.host);
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      sockets.add(from);
      from.on('data', (chunk) => { if (!swallowing && !connection.frozen) to.write(chunk); });
      from.on('error', () => to.destroy());
      from.on('close', () => { sockets.delete(from); connections.delete(connection); to.destroy(); });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    swallow() { swallowing = true; },
    forward() { swallowing = false; },
    freezeOpen() {
      for (const c of connections) c.frozen = true;
    },
    reset() {
      for (const s of sockets) s.resetAndDestroy();
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

// The service at `url`, reached through such a proxy instead: the proxy, and the URL that goes through it.
export async function behindProxy(url: string): Promise<{ proxy: BlackHoleProxy; url: string }> {
  const target = new URL(url);
  const proxy = await startBlackHoleProxy({ host: target.hostname, port: Number(target.port) });
  const via = new URL(target);
  via.hostname = '127.0.0.1';
  via.port = String(proxy.port);
  return { proxy, url: via.toString() };
}

// A stack (API only) whose Postgres or Redis connections pass through a proxy that a test may silence or reset.
export function behindServiceProxy(variable: 'DATABASE_URL' | 'REDIS_URL', env: Record<string, string> = {}) {
  const own = { stack: undefined as unknown as Stack, proxy: undefined as unknown as BlackHoleProxy };
  before(async () => {
    const { proxy, url } = await behindProxy(requireEnv(variable));
    own.proxy = proxy;
    own.stack = await startStack({ [variable]: url, ...env }, { workers: 0 });
  });
  after(async () => {
    await own.stack?.stop();
    await own.proxy?.close();
  });
  return own;
}
