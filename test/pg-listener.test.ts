// The Postgres listener behind key revocations (API) and push relays (workers): a connection that
// goes silent without closing (a NAT gateway or load balancer dropping it as idle) is found by the
// heartbeat and replaced, so notifications arrive again.
import assert from 'node:assert/strict';
import net from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { listenPg } from '../db/pg-listener.ts';
import { requireEnv, testDb, waitFor } from './helpers/stack.ts';

// A proxy whose connections can be cut off silently, one by one: bytes of a frozen connection are
// dropped in both directions for good, while new connections pass.
async function freezingProxy(target: URL) {
  const live = new Set<{ frozen: boolean }>();
  const server = net.createServer((client) => {
    const state = { frozen: false };
    live.add(state);
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      from.on('data', (chunk) => { if (!state.frozen) to.write(chunk); });
      from.on('error', () => to.destroy());
      from.on('close', () => to.destroy());
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    freezeAll() { for (const s of live) s.frozen = true; },
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

describe('Postgres listener', function () {
  this.timeout(30_000);

  it('replaces a connection that went silent, found by its heartbeat, and hears notifications again', async () => {
    const target = new URL(requireEnv('DATABASE_URL'));
    const proxy = await freezingProxy(target);
    const viaProxy = new URL(target);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String(proxy.port);
    const warnings: string[] = [];
    const log = pino({ level: 'warn' }, new Writable({ write(chunk, _enc, done) { warnings.push(String(chunk)); done(); } }));
    const heard: string[] = [];
    const listener = await listenPg(viaProxy.toString(), { listener_test: (p) => heard.push(p) }, log, { heartbeatMs: 200, timeoutMs: 500 });
    const notify = (payload: string) => testDb().raw(`select pg_notify('listener_test', ?)`, [payload]);
    try {
      await notify('before');
      await waitFor(async () => heard.includes('before'), 'the first notification');

      proxy.freezeAll();
      // Sent again and again: only a new connection can hear these.
      let n = 0;
      await waitFor(async () => {
        await notify(`after ${++n}`);
        return heard.some((p) => p.startsWith('after '));
      }, 'a notification after the connection went silent', 15_000, 250);
      assert.ok(warnings.some((l) => l.includes('Postgres listener lost its connection') && l.includes('heartbeat')), warnings.join('\n'));
    } finally {
      await listener.close();
      await proxy.close();
    }
  });
});
