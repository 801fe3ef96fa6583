// The two connections that only listen: the Postgres listener (key revocations in the API, push
// relays in workers) and the Redis subscriber of the event bus (task notes, cancel notes, keyring
// invalidations). One that goes silent without closing (a NAT gateway or load balancer dropping it
// as idle) is found by its heartbeat and replaced, so notifications arrive again.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { listenPg } from '../db/pg-listener.ts';
import { EventBus } from '../queues/events.ts';
import { behindProxy } from './helpers/black-hole-proxy.ts';
import { requireEnv, testDb, waitFor } from './helpers/stack.ts';

const HEARTBEAT = { heartbeatMs: 200, timeoutMs: 500 };

function capturedLog() {
  const lines: string[] = [];
  return { lines, log: pino({ level: 'warn' }, new Writable({ write(chunk, _enc, done) { lines.push(String(chunk)); done(); } })) };
}

// Sends notes until one is heard: only a new connection can hear those sent after the freeze.
async function heardAgain(send: (payload: string) => Promise<unknown>, heard: string[]): Promise<void> {
  let n = 0;
  await waitFor(async () => {
    await send(`after ${++n}`);
    return heard.some((p) => p.startsWith('after '));
  }, 'a notification after the connection went silent', 15_000, 250);
}

describe('connections that only listen', function () {
  this.timeout(30_000);

  it('Postgres listener: a connection gone silent is found by its heartbeat and replaced', async () => {
    const { proxy, url } = await behindProxy(requireEnv('DATABASE_URL'));
    const { lines, log } = capturedLog();
    const heard: string[] = [];
    const listener = await listenPg(url, { listener_test: (p) => heard.push(p) }, log, HEARTBEAT);
    const notify = (payload: string) => testDb().raw(`select pg_notify('listener_test', ?)`, [payload]);
    try {
      await notify('before');
      await waitFor(async () => heard.includes('before'), 'the first notification');
      proxy.freezeOpen();
      await heardAgain(notify, heard);
      assert.ok(lines.some((l) => l.includes('Postgres listener lost its connection') && l.includes('heartbeat')), lines.join('\n'));
    } finally {
      await listener.close();
      await proxy.close();
    }
  });

  it('Postgres listener: closed while it waits to reconnect, it opens nothing more and hears nothing', async () => {
    const { proxy, url } = await behindProxy(requireEnv('DATABASE_URL'));
    const { lines, log } = capturedLog();
    const heard: string[] = [];
    const listener = await listenPg(url, { listener_close_test: (p) => heard.push(p) }, log, HEARTBEAT);
    const listening = async () => Number((await testDb().raw(`select count(*) as n from pg_stat_activity where query = 'LISTEN "listener_close_test"'`)).rows[0].n);
    try {
      proxy.freezeOpen();
      await waitFor(async () => lines.some((l) => l.includes('Postgres listener lost its connection')), 'the heartbeat to give up', 10_000, 20);
      // Shutdown, within the second before the reconnect.
      await listener.close();
      await sleep(1500);
      await testDb().raw(`select pg_notify('listener_close_test', 'after close')`);
      await sleep(300);
      assert.deepEqual(heard, []);
      assert.equal(await listening(), 0, 'a listening connection was opened after close');
    } finally {
      await proxy.close();
    }
  });

  it('event bus: a Redis subscriber gone silent is found by its ping and reconnected, subscribed again', async () => {
    const { proxy, url } = await behindProxy(requireEnv('REDIS_URL'));
    const { lines, log } = capturedLog();
    const pub = new Redis(requireEnv('REDIS_URL'));
    const sub = new Redis(url, { maxRetriesPerRequest: null });
    const bus = new EventBus(pub, sub, 'idle-test', log, HEARTBEAT);
    const heard: string[] = [];
    try {
      await bus.subscribe('notes', (m) => heard.push(String(m.payload)));
      const send = (payload: string) => bus.publish('notes', { payload });
      await send('before');
      await waitFor(async () => heard.includes('before'), 'the first note');
      proxy.freezeOpen();
      await heardAgain(send, heard);
      assert.ok(lines.some((l) => l.includes('Redis subscriber gave no answer to a ping; reconnecting')), lines.join('\n'));
    } finally {
      sub.disconnect();
      pub.disconnect();
      await proxy.close();
    }
  });

  it('event bus: a subscriber that joins a channel as its last one leaves still hears notes', async () => {
    const pub = new Redis(requireEnv('REDIS_URL'));
    const sub = new Redis(requireEnv('REDIS_URL'));
    const bus = new EventBus(pub, sub, 'join-test', capturedLog().log);
    const heard: unknown[] = [];
    try {
      const leave = await bus.subscribe('notes', () => undefined);
      const joining = bus.subscribe('notes', (m) => heard.push(m));
      // In the same tick: a stream ending while another opens.
      await leave();
      await joining;
      await waitFor(async () => {
        await bus.publish('notes', { n: 1 });
        return heard.length > 0;
      }, 'a note for the subscriber that joined', 3000, 100);
    } finally {
      sub.disconnect();
      pub.disconnect();
    }
  });

  it('event bus: a subscription Redis refused is asked for again by the next subscriber', async () => {
    const admin = new Redis(requireEnv('REDIS_URL'));
    const user = `idle-test-${process.pid}`;
    // A user that may run commands but not yet subscribe to any channel.
    await admin.call('ACL', 'SETUSER', user, 'on', '>pw', '~*', '+@all', 'resetchannels');
    const userUrl = new URL(requireEnv('REDIS_URL'));
    userUrl.username = user;
    userUrl.password = 'pw';
    const sub = new Redis(userUrl.toString(), { maxRetriesPerRequest: null });
    const { log } = capturedLog();
    const bus = new EventBus(admin, sub, 'refused-test', log);
    const heard: string[] = [];
    try {
      await assert.rejects(bus.subscribe('notes', () => undefined), /NOPERM/);
      await admin.call('ACL', 'SETUSER', user, 'allchannels');
      await bus.subscribe('notes', (m) => heard.push(String(m.payload)));
      await waitFor(async () => {
        await bus.publish('notes', { payload: 'hello' });
        return heard.includes('hello');
      }, 'a note once subscribing is allowed', 5000, 100);
    } finally {
      sub.disconnect();
      await admin.call('ACL', 'DELUSER', user);
      admin.disconnect();
    }
  });
});
