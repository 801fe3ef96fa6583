import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { UnrecoverableError, Worker, type Job } from 'bullmq';
import { loadConfig } from '../domain/config.ts';
import { openCredential } from '../domain/bridge/credentials.ts';
import { credentialDef, providerDef } from '../domain/bridge/catalog.ts';
import { retryDelayMs } from '../queues/names.ts';
import { lockWaits, openQueue, resetDb, startWorker, testDb, testEnv, waitFor, withQueue, type Client, type Proc, type Stack } from './helpers/stack.ts';
import { consent, startOAuthStack, type OAuthServer, type OAuthStack } from './helpers/oauth-server.ts';
import type { FakeProviders } from './helpers/fake-providers.ts';

const B = '/api/bridge/v1';
const avail = `${B}/available-providers/google_mail/available-credentials/oauth_auth_flow`;
const CLIENT_SECRET = `cs-${randomUUID()}`;
const ATTEMPTS = 3;


// The stack the tests of each describe use, and how they act on it.
let stack: Stack;
let c: Client;
let oauth: OAuthServer;
let gmail: FakeProviders;
let all: OAuthStack | undefined;
async function start(env: Record<string, string>, workers: number) {
  await resetDb();
  all = await startOAuthStack(CLIENT_SECRET, { CREDENTIAL_REFRESH_SCAN_MS: '200', CREDENTIAL_REFRESH_ATTEMPTS: String(ATTEMPTS), CREDENTIAL_REFRESH_BACKOFF_MS: '50', ...env }, { workers });
  ({ stack, oauth, providers: gmail } = all);
  c = stack.client;
}

// An instance whose user credential was brokered through the OAuth server (as the OAuth client
// `clientId`), with send_email enabled.
async function brokered(id: string, clientId = 'refresh-test') {
  const cred = await c.post(`${avail}/credential/resource-server`, {
    value: { client_id: clientId, client_secret: CLIENT_SECRET, redirect_uri: `${stack.api.url}${B}/generic-oauth-callback` },
  });
  assert.equal(cred.status, 201, cred.text);
  assert.equal((await c.post(avail, { provider_instance_id: id, display_name: id, resource_server_credential_id: cred.body.id })).status, 201);
  await rebroker(id);
  assert.equal((await c.post(`${B}/provider/${id}/function/google_mail_send_email/enable`, {})).status, 201);
}
async function rebroker(id: string) {
  const state = await c.post(`${avail}/credential/user-credential/broker`, { provider_instance_id: id });
  assert.equal(state.status, 200, state.text);
  const done = await fetch(await consent(state.body.action.Redirect.url), { redirect: 'manual' });
  assert.equal(done.status, 200);
}
const instance = async (id: string) => (await c.get(`${B}/provider/${id}`)).body;
const userCredential = async (id: string) => testDb()('bridge_credentials').where({ id: (await instance(id)).user_credential_id }).first();
// Due now, past the scan's mark too (refresh_queued_until) where a refresh it queued left one.
const makeDue = async (id: string) => testDb()('bridge_credentials').where({ id: (await instance(id)).user_credential_id })
  .update({ next_rotation_time: new Date(Date.now() - 1000), refresh_queued_until: null });
// Brokers `id`, then makes its refresh due with the OAuth server answering in `mode` until the refresh gives up.
async function refreshFailing(id: string, mode: Parameters<OAuthServer['setMode']>[0]) {
  await brokered(id);
  await oauth.inMode(mode, async () => {
    await makeDue(id);
    await waitFor(async () => (await instance(id)).status === 'refresh_failed', 'the instance to be refresh_failed');
  });
}
// A stored user credential's refresh token, decrypted.
const refreshTokenOf = async (row: { kind: 'user'; value: Record<string, unknown>; dek_id: string }) =>
  (await openCredential({ db: testDb(), cfg: loadConfig(stack.env) }, credentialDef(providerDef('google_mail'), 'oauth_auth_flow'), row)).refresh_token;
const send = (id: string) => c.post(`${B}/provider/${id}/function/google_mail_send_email/invoke`, { params: { to: 'a@example.com', subject: 's', body: 'b' } });

describe('credential refresh: OAuth user credentials renewed by workers before they expire', () => {
  // Two workers scan every 200 ms: a due credential must still be refreshed once.
  before(() => start({}, 2));
  after(async () => all?.stop());

  it('refreshes a credential once its next_rotation_time passes: new tokens, a new due time, one refresh for two scanning workers', async () => {
    await brokered('mail-r');
    assert.equal((await send('mail-r')).status, 200);
    const before = await userCredential('mail-r');
    assert.ok(before.next_rotation_time.getTime() > Date.now() + 50 * 60 * 1000, 'not due: no refresh yet');
    await new Promise((r) => setTimeout(r, 600));
    const refreshes = await oauth.refreshes();
    assert.equal(refreshes, 0);

    await makeDue('mail-r');
    const after = await waitFor(async () => {
      const row = await userCredential('mail-r');
      return row.next_rotation_time.getTime() > Date.now() && row;
    }, 'the credential to be refreshed');
    assert.equal(after.id, before.id, 'refreshed in place');
    assert.notEqual(after.value.access_token, before.value.access_token);
    assert.notEqual(after.value.refresh_token, before.value.refresh_token, 'the new refresh token is kept');
    assert.equal(typeof after.value.code, 'string', 'the code is kept (sealed again)');
    assert.ok(after.next_rotation_time.getTime() > Date.now() + 50 * 60 * 1000);
    await new Promise((r) => setTimeout(r, 800));
    assert.equal(await oauth.refreshes(), 1, 'one refresh, though both workers scanned several times');
    assert.equal((await instance('mail-r')).status, 'active');
    assert.equal((await send('mail-r')).status, 200, 'the refreshed token works');
    const token = gmail.seen.at(-1)!.authorization!.replace(/^Bearer /, '');

    // Nothing BullMQ keeps of the refresh (job removed, events stream) holds the token.
    const redis = new Redis(stack.env.REDIS_URL);
    try {
      const keys = await redis.keys(`${stack.env.QUEUE_PREFIX}:credential-refresh:*`);
      assert.ok(keys.length > 0, 'the queue has keys');
      let stored = '';
      for (const k of keys) {
        const type = await redis.type(k);
        if (type === 'hash') stored += JSON.stringify(await redis.hgetall(k));
        else if (type === 'stream') stored += JSON.stringify(await redis.xrange(k, '-', '+'));
        else if (type === 'list') stored += JSON.stringify(await redis.lrange(k, '0', '-1'));
        else if (type === 'zset') stored += JSON.stringify(await redis.zrange(k, '0', '-1'));
        else if (type === 'string') stored += String(await redis.get(k));
      }
      assert.match(stored, new RegExp(before.id), 'the events name the credential');
      assert.ok(!stored.includes(token) && !stored.includes(token.slice(0, 40)), 'no token in Redis');
      assert.equal(await redis.exists(`${stack.env.QUEUE_PREFIX}:credential-refresh:refresh_${before.id}`), 0, 'the job was removed: the id is free for the next due time');
    } finally {
      redis.disconnect();
    }
  });

  it('refreshes again at the next due time (the job id is free once a refresh ended)', async () => {
    const first = await userCredential('mail-r');
    const count = await oauth.refreshes();
    await makeDue('mail-r');
    await waitFor(async () => (await userCredential('mail-r')).next_rotation_time.getTime() > Date.now(), 'the second refresh');
    assert.equal(await oauth.refreshes(), count + 1);
    assert.notEqual((await userCredential('mail-r')).value.access_token, first.value.access_token);
  });

  it('makes the instance refresh_failed when the provider answers invalid_grant; invoking it is 409 until it is brokered again', async () => {
    await refreshFailing('mail-x', 'revoked');
    const refused = await send('mail-x');
    assert.equal(refused.status, 409);
    assert.equal(refused.body.message, "Provider instance 'mail-x' is refresh_failed, not active: its credential refresh gave up; broker its user credential again");
    assert.equal((await c.patch(`${B}/provider/mail-x`, { status: 'active' })).status, 409, 'not revived by PATCH');
    await rebroker('mail-x');
    assert.equal((await instance('mail-x')).status, 'active');
    assert.equal((await send('mail-x')).status, 200);
  });

  it('retries a provider that is down with backoff, then gives up: refresh_failed after the last attempt', async () => {
    const start = await oauth.refreshes();
    await refreshFailing('mail-d', 'down');
    assert.equal(await oauth.refreshes() - start, ATTEMPTS);
    const other = await instance('mail-r');
    assert.equal(other.status, 'active', 'other instances are untouched');
    const metrics = (await c.get('/metrics')).text;
    assert.match(metrics, /taskbridge_provider_instances\{status="refresh_failed"\} 1\n/);
    assert.match(metrics, /taskbridge_provider_instances\{status="active"\} 2\n/);
    // The workers' counts of refreshes (each worker flushes to Redis once a second): every earlier
    // test's refreshes, the failed attempts here and the two that gave up (invalid_grant earlier, and this one).
    let seen = {};
    await waitFor(async () => {
      const text = (await c.get('/metrics')).text;
      const n = (outcome: string) => Number(new RegExp(`taskbridge_credential_refreshes_total\\{outcome="${outcome}"\\} (\\d+)`).exec(text)?.[1] ?? 0);
      seen = { refreshed: n('refreshed'), retrying: n('retrying'), gaveUp: n('refresh_failed') };
      return n('refreshed') >= 2 && n('retrying') === ATTEMPTS - 1 && n('refresh_failed') === 2;
    }, 'the refresh outcomes in /metrics').catch((err) => assert.fail(`${(err as Error).message}: ${JSON.stringify(seen)}`));
  });

  it('masks the refresh token and client secret a token endpoint quotes in its refusal: not in the worker log', async () => {
    await refreshFailing('mail-q', 'echo');
    const logs = () => stack.workers.flatMap((w) => w.logs);
    const gaveUp = await waitFor(async () => logs().find((l) => l.includes('credential refresh gave up') && l.includes('Rejected')), 'the give-up line');
    assert.match(gaveUp, /token endpoint refused the refresh token: Rejected grant_type=refresh_token&refresh_token=\*\*\*&client_id=refresh-test&client_secret=\*\*\*/);
    for (const text of logs()) assert.ok(!text.includes(CLIENT_SECRET) && !/refresh_token=(?!\*\*\*)/.test(text), text.slice(0, 500));
  });

  it("keeps an admin's disable through a failed refresh: brokering again makes the instance disabled, not active", async () => {
    // Disabled before the refresh failed, and (a second instance) disabled while refresh_failed.
    for (const [id, when] of [['mail-off', 'before'], ['mail-off2', 'after']] as const) {
      await brokered(id);
      if (when === 'before') assert.equal((await c.patch(`${B}/provider/${id}`, { status: 'disabled' })).body.status, 'disabled');
      await oauth.inMode('revoked', async () => {
        await makeDue(id);
        await waitFor(async () => (await instance(id)).status === 'refresh_failed', 'the instance to be refresh_failed');
      });
      if (when === 'after') {
        // Taken, though only brokering ends refresh_failed: the status shows that until then.
        const patched = await c.patch(`${B}/provider/${id}`, { status: 'disabled' });
        assert.deepEqual([patched.status, patched.body.status, patched.body.disabled_by_admin], [200, 'refresh_failed', true]);
        const shown = (await c.get(`${B}/provider/${id}`)).body;
        assert.deepEqual([shown.status, shown.disabled_by_admin], ['refresh_failed', true], 'the admin sees their disable kept');
      }
      await rebroker(id);
      assert.equal((await instance(id)).status, 'disabled', id);
      assert.equal((await send(id)).status, 409, `${id}: a disabled instance is not invoked`);
      const activated = (await c.patch(`${B}/provider/${id}`, { status: 'active' })).body;
      assert.deepEqual([activated.status, activated.disabled_by_admin], ['active', false]);
      assert.equal((await send(id)).status, 200);
    }
  });

  it('refreshes a token the provider says expired already (expires_in 0) at once, then not again for a minute however often it says so', async () => {
    await oauth.inMode('expires-in:0', async () => {
      const start = await oauth.refreshes();
      await brokered('mail-0');
      await waitFor(async () => (await oauth.refreshes()) > start, 'the refresh of the expired token');
      // Several scans of both workers, each of which would find it due again were it not bounded.
      await new Promise((r) => setTimeout(r, 1500));
      assert.equal(await oauth.refreshes(), start + 1, 'one refresh, not one each scan');
      const row = await userCredential('mail-0');
      assert.ok(Date.parse(row.value.expiry_time) <= Date.now(), `the refreshed token expired too: ${row.value.expiry_time}`);
      assert.ok(row.next_rotation_time.getTime() > Date.now() + 55_000, `due again in a minute: ${row.next_rotation_time.toISOString()}`);
      assert.equal((await instance('mail-0')).status, 'active');
    });
  });

  it('brokering again without a refresh token keeps the one it had for the same user (the same sub), and refreshes with it; for another user, or none named, the credential has none', async () => {
    await brokered('mail-k');
    await oauth.inMode('no-refresh-as:johndoe', () => rebroker('mail-k'));
    assert.equal(typeof (await userCredential('mail-k')).value.refresh_token, 'string', 'the refresh token the instance had');
    const refreshes = await oauth.refreshes();
    await makeDue('mail-k');
    await waitFor(async () => (await userCredential('mail-k')).next_rotation_time.getTime() > Date.now(), 'the credential to be refreshed');
    assert.equal(await oauth.refreshes(), refreshes + 1);
    assert.equal((await instance('mail-k')).status, 'active');
    assert.equal((await send('mail-k')).status, 200);

    for (const sub of ['janedoe', '']) {
      await rebroker('mail-k');
      assert.equal(typeof (await userCredential('mail-k')).value.refresh_token, 'string');
      await oauth.inMode(`no-refresh-as:${sub}`, () => rebroker('mail-k'));
      assert.equal((await userCredential('mail-k')).value.refresh_token, undefined, `no refresh token of johndoe's for ${sub || 'a user no ID token names'}`);
    }
    await makeDue('mail-k');
    await waitFor(async () => (await instance('mail-k')).status === 'refresh_failed', 'the instance to be refresh_failed');
    assert.equal(await oauth.refreshes(), refreshes + 1, 'nothing to refresh with');
  });

  // The credential holds R1 again after a refresh stored R2, then the job reads R1 and its exchange
  // is held; meanwhile R2 is stored back, as the other run of the job would have (with `underWay`, in a
  // transaction still open when the refused run checks the credential), and the provider refuses the spent R1.
  async function refusedAfterAnotherRunStored(id: string, underWay: boolean) {
    await brokered(id);
    const spent = await userCredential(id);
    await makeDue(id);
    const fresh = await waitFor(async () => {
      const row = await userCredential(id);
      return row.next_rotation_time.getTime() > Date.now() && row;
    }, 'the first refresh');
    await oauth.setMode('hold-next');
    const write = await testDb().transaction();
    try {
      await testDb()('bridge_credentials').where({ id: spent.id }).update({ value: spent.value, next_rotation_time: new Date(Date.now() - 1000) });
      await waitFor(async () => (await oauth.held()) === 1, 'the exchange of the spent refresh token');
      await write('bridge_credentials').where({ id: spent.id }).update({ value: fresh.value, next_rotation_time: fresh.next_rotation_time });
      if (!underWay) await write.commit();
      await oauth.setMode('revoked');
      await oauth.release();
      if (underWay) {
        await waitFor(async () => (await lockWaits('%"unchanged"%for update%')) === 1 || (await instance(id)).status === 'refresh_failed', 'the refused run to check the credential');
        await write.commit();
      }
      await waitFor(async () => (await instance(id)).status === 'refresh_failed'
        || stack.workers.flatMap((w) => w.logs).some((l) => l.includes(spent.id) && l.includes('changed since')), 'the refused refresh to end');
    } finally {
      if (!write.isCompleted()) await write.rollback();
      await oauth.setMode('ok');
    }
    assert.equal((await instance(id)).status, 'active');
    assert.deepEqual((await userCredential(id)).value, fresh.value, 'the tokens the other refresh stored');
    assert.equal((await send(id)).status, 200);
  }

  it('leaves the instance active when the refresh token it exchanged was refused after another refresh stored new tokens (a stalled job run twice)', async () => {
    await refusedAfterAnotherRunStored('mail-twice', false);
  });

  it("leaves the instance active when the refresh token it exchanged was refused while another refresh's write of new tokens is under way: the check waits for it", async () => {
    await refusedAfterAnotherRunStored('mail-under-way', true);
  });

  // `id` brokered and refresh_failed (the provider revoked its refresh token), then `sibling`, a new
  // instance on the same credential, active.
  async function failedWithSibling(id: string, sibling: string): Promise<void> {
    await refreshFailing(id, 'revoked');
    await addSibling(id, sibling);
  }
  // `sibling`, a new instance on the user credential of `id`, active.
  async function addSibling(id: string, sibling: string): Promise<void> {
    const old = await instance(id);
    const created = await c.post(avail, {
      provider_instance_id: sibling, display_name: sibling, resource_server_credential_id: old.resource_server_credential_id, user_credential_id: old.user_credential_id,
    });
    assert.equal(created.status, 201, created.text);
    assert.equal(created.body.status, 'active');
  }

  it('a refresh that stores new tokens leaves refresh_failed an instance that shares the credential and was marked before the refresh read it: only brokering revives that', async () => {
    await failedWithSibling('mail-old', 'mail-sib');
    await makeDue('mail-sib');
    await waitFor(async () => (await userCredential('mail-sib')).next_rotation_time.getTime() > Date.now(), 'the shared credential to be refreshed');
    assert.equal((await instance('mail-sib')).status, 'active');
    assert.equal((await instance('mail-old')).status, 'refresh_failed', 'marked by an earlier refresh, not by a run of this one');
  });

  it('a refresh that gives up ends the scan\'s mark with it: a new instance on the credential, still due, is refreshed at the next scan', async () => {
    await refreshFailing('mail-given-up', 'revoked');
    // Read before an instance the scan takes shares the credential: then the scan marks it again.
    assert.equal((await userCredential('mail-given-up')).refresh_queued_until, null, 'the mark cleared with the give-up');
    await addSibling('mail-given-up', 'mail-given-up-sib');
    // Not made due again: it still is since the refresh that gave up.
    await waitFor(async () => (await userCredential('mail-given-up-sib')).next_rotation_time.getTime() > Date.now(), 'the shared credential to be refreshed');
    assert.equal((await instance('mail-given-up-sib')).status, 'active');
  });

  it('a refresh that stores new tokens leaves refresh_failed an instance marked before the refresh read it and PATCHed since: its rename is not a mark', async () => {
    await failedWithSibling('mail-renamed', 'mail-renamed-sib');
    await oauth.setMode('hold-next');
    try {
      await makeDue('mail-renamed-sib');
      await waitFor(async () => (await oauth.held()) === 1, 'the refresh to read the shared credential and exchange its refresh token');
      const renamed = await c.patch(`${B}/provider/mail-renamed`, { display_name: 'mail-renamed (old)' });
      assert.equal(renamed.status, 200, renamed.text);
    } finally {
      await oauth.release();
      await oauth.setMode('ok');
    }
    await waitFor(async () => (await userCredential('mail-renamed-sib')).next_rotation_time.getTime() > Date.now(), 'the shared credential to be refreshed');
    assert.equal((await instance('mail-renamed-sib')).status, 'active');
    assert.equal((await instance('mail-renamed')).status, 'refresh_failed', 'renamed after the read, marked before it');
  });

  it('gives up on a credential whose instance a brokering holds without deadlocking it: both lock the instance before the credential', async () => {
    // Brokering again locks the instance, then the user credential it replaces (to delete it): the
    // test's transaction does the same around the give-up, which then waits for the instance.
    await brokered('mail-lock');
    const cred = await userCredential('mail-lock');
    const start = await oauth.refreshes();
    await oauth.inMode('revoked', async () => {
      const brokering = await testDb().transaction();
      try {
        await brokering('provider_instances').where({ id: 'mail-lock' }).forUpdate().first();
        await makeDue('mail-lock');
        await waitFor(async () => (await lockWaits('%"provider_instances"%"user_credential_id"%')) === 1, 'the give-up to wait for the instance');
        await brokering('bridge_credentials').where({ id: cred.id }).forUpdate().select('id');
        await brokering.commit();
      } finally {
        if (!brokering.isCompleted()) await brokering.rollback();
      }
      await waitFor(async () => (await instance('mail-lock')).status === 'refresh_failed', 'the instance to be refresh_failed');
    });
    assert.equal(await oauth.refreshes() - start, 1, 'one exchange: the give-up was not aborted (40P01) and retried');
  });

  it('brokering again without a refresh token copies none from a user credential another instance keeps: at a provider that rotates them, each instance\'s refresh spends no token of the other\'s', async () => {
    await brokered('mail-sh1');
    const shared = (await instance('mail-sh1')).user_credential_id;
    await addSibling('mail-sh1', 'mail-sh2');
    assert.equal((await c.post(`${B}/provider/mail-sh2/function/google_mail_send_email/enable`, {})).status, 201);
    await oauth.inMode('no-refresh-as:johndoe', () => rebroker('mail-sh1'));
    const own = (await instance('mail-sh1')).user_credential_id;
    const credential = async (id: string) => (await c.get(`${B}/credential/${id}`)).body;
    assert.notEqual(own, shared);
    assert.deepEqual((await credential(shared)).provider_instance_ids, ['mail-sh2'], 'the shared credential stays with mail-sh2');
    assert.equal(typeof (await credential(shared)).value.refresh_token, 'string');
    assert.ok(!('refresh_token' in (await credential(own)).value), 'no copy of the refresh token mail-sh2 keeps');
    // The brokered instance's refresh first: with a copy, it would spend the token mail-sh2 then exchanges.
    await oauth.inMode('rotating', async () => {
      await makeDue('mail-sh1');
      await waitFor(async () => (await instance('mail-sh1')).status === 'refresh_failed'
        || (await userCredential('mail-sh1')).next_rotation_time.getTime() > Date.now(), 'the refresh of mail-sh1 to end');
      await makeDue('mail-sh2');
      await waitFor(async () => (await instance('mail-sh2')).status === 'refresh_failed'
        || (await userCredential('mail-sh2')).next_rotation_time.getTime() > Date.now(), 'the refresh of mail-sh2 to end');
    });
    assert.equal((await instance('mail-sh2')).status, 'active', 'its refresh token was not spent by mail-sh1');
    assert.equal((await send('mail-sh2')).status, 200);
    assert.equal((await instance('mail-sh1')).status, 'refresh_failed', 'no refresh token: broker it again, as when none comes back');
  });

  it('brokering again without a refresh token keeps the one a refresh stored while the previous credential was decrypted, not the one decrypted', async () => {
    await brokered('mail-mv');
    // Its tokens stand in for those a refresh of mail-mv's credential stores (sealed for the same members).
    await brokered('mail-mv2');
    const before = await userCredential('mail-mv');
    const refreshed = await userCredential('mail-mv2');
    // Compared, not shown: a failure prints no token.
    assert.ok(await refreshTokenOf(refreshed) !== await refreshTokenOf(before));
    let done: Promise<void> | undefined;
    const trx = await testDb().transaction();
    try {
      await trx('bridge_credentials').where({ id: before.id }).forUpdate().first();
      done = oauth.inMode('no-refresh-as:johndoe', () => rebroker('mail-mv'));
      done.catch(() => undefined);
      await waitFor(async () => (await lockWaits('%from "bridge_credentials"%for update%')) === 1, 'the brokering to wait for the credential it decrypted');
      await trx('bridge_credentials').where({ id: before.id }).update({ value: refreshed.value, dek_id: refreshed.dek_id });
    } finally {
      await trx.commit();
    }
    await done;
    const after = await userCredential('mail-mv');
    assert.notEqual(after.id, before.id);
    assert.ok(await refreshTokenOf(after) === await refreshTokenOf(refreshed), 'the refresh token the credential held when brokering stored');
  });

  it('gives up, as on any malformed answer, when the refresh answers a token_type other than bearer: the DPoP token is not stored', async () => {
    await brokered('mail-dpop');
    const before = await userCredential('mail-dpop');
    const start = await oauth.refreshes();
    await oauth.inMode('token-type:"DPoP"', async () => {
      await makeDue('mail-dpop');
      await waitFor(async () => (await instance('mail-dpop')).status === 'refresh_failed', 'the instance to be refresh_failed');
    });
    assert.equal(await oauth.refreshes() - start, ATTEMPTS);
    assert.deepEqual((await userCredential('mail-dpop')).value, before.value);
  });
  it('gives up on a refresh whose job fails for good before its last attempt (its backoff answers -1, as one set from the queue dashboard may): refresh_failed, its mark ended', async () => {
    await brokered('mail-no-retry');
    const cred = await userCredential('mail-no-retry');
    const start = await oauth.refreshes();
    await oauth.inMode('down', async () => {
      // Due, and marked as queued: the scan leaves it to the test's job.
      await testDb()('bridge_credentials').where({ id: cred.id }).update({ next_rotation_time: new Date(Date.now() - 1000), refresh_queued_until: new Date(Date.now() + 600_000) });
      await withQueue(stack.env, 'credential-refresh', (q) => q.add('refresh', { credential_id: cred.id }, {
        jobId: `refresh_${cred.id}`, attempts: ATTEMPTS, backoff: { type: 'fixed', delay: -1 }, removeOnComplete: true, removeOnFail: true,
      }));
      await waitFor(async () => (await instance('mail-no-retry')).status === 'refresh_failed', 'the instance to be refresh_failed');
    });
    assert.equal(await oauth.refreshes() - start, 1, 'one attempt, not retried');
    assert.equal((await userCredential('mail-no-retry')).refresh_queued_until, null, 'the scan\'s mark ended with the refresh');
    assert.equal((await send('mail-no-retry')).status, 409);
  });
});

describe('credential refresh: two runs of one refresh on two workers', () => {
  before(() => start({ CREDENTIAL_REFRESH_CONCURRENCY: '1' }, 2));
  after(async () => all?.stop());

  it('ends active when a run stores new tokens after another run of the same refresh gave up on the refresh token both exchanged', async () => {
    // A rotating provider: the first run's exchange spends R1 and its write waits on the alias the
    // test holds; a second run (a job of its own id, as a stalled job run again) reads R1 still stored,
    // is refused (invalid_grant) and marks the instance before the first run's tokens land. It runs on
    // the other worker: the first run's, one refresh at a time, is busy (on its own worker it would
    // store the first run's tokens, kept in memory, rather than exchange R1 again).
    await brokered('mail-race');
    const cred = await userCredential('mail-race');
    const start = await oauth.refreshes();
    await oauth.inMode('rotating', async () => {
      const trx = await testDb().transaction();
      try {
        await trx('dek_aliases').where({ alias: cred.dek_alias }).forUpdate().first();
        await makeDue('mail-race');
        await waitFor(async () => (await lockWaits('%from "dek_aliases"%for share%')) === 1, 'the first run to wait to store its tokens');
        assert.equal(await oauth.refreshes() - start, 1);
        await withQueue(stack.env, 'credential-refresh', (q) => q.add('refresh', { credential_id: cred.id }, { jobId: `second-run_${cred.id}` }));
        await waitFor(async () => (await instance('mail-race')).status === 'refresh_failed', 'the second run to give up');
      } finally {
        await trx.commit();
      }
      await waitFor(async () => (await userCredential('mail-race')).next_rotation_time.getTime() > Date.now(), 'the first run to store its tokens');
    });
    assert.equal(await oauth.refreshes() - start, 2);
    assert.notEqual((await userCredential('mail-race')).value.refresh_token, cred.value.refresh_token);
    assert.equal((await instance('mail-race')).status, 'active');
    assert.equal((await send('mail-race')).status, 200);
  });
});

describe('credential refresh: new tokens whose write fails for a while are kept, not exchanged again', () => {
  // Statements time out after 1 s, so a write held up longer fails as it would behind a long lock.
  before(() => start({ DB_QUERY_TIMEOUT_MS: '1000', CREDENTIAL_REFRESH_STORE_RETRY_MS: '8000' }, 1));
  after(async () => all?.stop());

  const workerLogs = () => stack.workers.flatMap((w) => w.logs);
  // Makes the refresh of `id` due at a provider that rotates refresh tokens while its writes are held
  // up until `until` resolves, then waits for the refresh to end. The alias the write holds is locked,
  // as unlike the credential row it can be locked before the refresh is made due: it is sure to meet it.
  async function refreshHeldUp(id: string, until: () => Promise<unknown>) {
    const cred = await userCredential(id);
    await oauth.inMode('rotating', async () => {
      const trx = await testDb().transaction();
      try {
        await trx('dek_aliases').where({ alias: cred.dek_alias }).forUpdate().first();
        await makeDue(id);
        await until();
      } finally {
        await trx.commit();
      }
      await waitFor(async () => (await userCredential(id)).next_rotation_time.getTime() > Date.now() || (await instance(id)).status === 'refresh_failed', 'the refresh to end');
    });
    return cred;
  }
  // No log line quotes a token: the access tokens are JWTs, refresh tokens appear in forms only.
  const assertNoTokenLogged = (token?: string) => {
    for (const text of workerLogs()) assert.ok(!/eyJ[\w-]+\.eyJ/.test(text) && !(token && text.includes(token)) && !/refresh_token=(?!\*\*\*)/.test(text), text.slice(0, 500));
  };

  it('retries the write of tokens a rotating provider issued until it goes through: the instance stays active with them, after one exchange', async () => {
    await brokered('mail-w');
    const start = await oauth.refreshes();
    const before = await refreshHeldUp('mail-w', async () => {
      await waitFor(async () => (await oauth.refreshes()) > start, 'the refresh exchange');
      // Past several statement timeouts of the write (and the job's backoff, were the job retried).
      await new Promise((r) => setTimeout(r, 3000));
    });
    assert.equal((await instance('mail-w')).status, 'active');
    assert.equal(await oauth.refreshes() - start, 1, 'the refresh token was exchanged once');
    assert.notEqual((await userCredential('mail-w')).value.refresh_token, before.value.refresh_token);
    assert.equal((await send('mail-w')).status, 200, 'the new access token works');
    assert.ok(workerLogs().some((l) => l.includes('"level":40') && l.includes('could not store the refreshed tokens; retrying for up to 8 s') && l.includes(before.id)), 'the failed write is logged');
    assertNoTokenLogged(gmail.seen.at(-1)!.authorization!.replace(/^Bearer /, ''));
  });

  it('keeps tokens it could not store in time for the job\'s next attempt, which stores them instead of exchanging the spent refresh token: active after one exchange', async () => {
    await brokered('mail-lost');
    const start = await oauth.refreshes();
    const kept = (id: string) => workerLogs().find((l) => l.includes('"level":50') && l.includes(id));
    const cred = await refreshHeldUp('mail-lost', async () => waitFor(async () => kept((await userCredential('mail-lost')).id), 'the error line', 30000));
    assert.equal((await instance('mail-lost')).status, 'active');
    assert.equal(await oauth.refreshes() - start, 1, 'the spent refresh token was not exchanged again');
    assert.notEqual((await userCredential('mail-lost')).value.refresh_token, cred.value.refresh_token, 'the new refresh token is stored');
    assert.equal((await send('mail-lost')).status, 200, 'the new access token works');
    assert.match(kept(cred.id)!, /the refreshed tokens could not be stored within 8 s: kept for the job's next attempt on this worker/);
    assertNoTokenLogged();
  });
  it('a second run of the refresh on the worker that holds the tokens it has not stored yet stores those instead of exchanging the spent refresh token', async () => {
    await brokered('mail-again');
    const start = await oauth.refreshes();
    const before = await refreshHeldUp('mail-again', async () => {
      await waitFor(async () => (await oauth.refreshes()) > start, 'the refresh exchange');
      const credentialId = (await userCredential('mail-again')).id;
      await withQueue(stack.env, 'credential-refresh', (q) => q.add('refresh', { credential_id: credentialId }, { jobId: `second-run_${credentialId}` }));
      await waitFor(async () => (await lockWaits('%from "dek_aliases"%for share%')) === 2, 'both runs to wait to store the tokens');
    });
    assert.equal(await oauth.refreshes() - start, 1, 'the refresh token was exchanged once');
    assert.equal((await instance('mail-again')).status, 'active');
    assert.notEqual((await userCredential('mail-again')).value.refresh_token, before.value.refresh_token);
    assert.equal((await send('mail-again')).status, 200);
  });
});

describe('credential refresh: tokens a worker could not store, after another worker refreshed the credential', () => {
  // Statements time out after 1 s and a write is retried for 2 s: a write the test holds up fails the
  // attempt soon; its retry waits 5 s, while the test freezes the worker whose attempt failed.
  before(() => start({ DB_QUERY_TIMEOUT_MS: '1000', CREDENTIAL_REFRESH_STORE_RETRY_MS: '2000', CREDENTIAL_REFRESH_BACKOFF_MS: '5000', CREDENTIAL_REFRESH_CONCURRENCY: '1' }, 2));
  after(async () => all?.stop());

  const refreshed = (id: string) => waitFor(async () => {
    const row = await userCredential(id);
    return row.next_rotation_time.getTime() > Date.now() && row;
  }, 'the credential to be refreshed');
  // Frozen (SIGSTOP), a worker takes no job until `use` ends.
  async function frozen<T>(worker: Proc, use: () => Promise<T>): Promise<T> {
    worker.child.kill('SIGSTOP');
    try {
      return await use();
    } finally {
      worker.child.kill('SIGCONT');
    }
  }

  it('does not store the tokens a worker kept once the credential holds others, at a provider that sends no new refresh token: it exchanges again, and the newest tokens stay', async () => {
    // Worker A exchanges the refresh token, and its write is held past its retries: A keeps the
    // tokens. Frozen, A leaves the job's next run to B, which exchanges and stores; then the
    // credential is due again and runs on A (B frozen). The refresh token is the same throughout.
    await brokered('mail-stale');
    const cred = await userCredential('mail-stale');
    const start = await oauth.refreshes();
    let byB: any;
    await oauth.inMode('no-refresh-as:johndoe', async () => {
      const kept = (w: Proc) => w.logs.some((l) => l.includes('"level":50') && l.includes(cred.id));
      const trx = await testDb().transaction();
      let a: Proc;
      try {
        await trx('dek_aliases').where({ alias: cred.dek_alias }).forUpdate().first();
        await makeDue('mail-stale');
        a = await waitFor(async () => stack.workers.find(kept), 'a worker to keep the tokens it could not store');
      } finally {
        await trx.commit();
      }
      const b = stack.workers.find((w) => w !== a)!;
      byB = await frozen(a, () => refreshed('mail-stale'));
      assert.equal(await oauth.refreshes() - start, 2, 'B exchanged the refresh token again');
      assert.ok(!kept(b));
      await frozen(b, async () => {
        await makeDue('mail-stale');
        await refreshed('mail-stale');
      });
    });
    const after = await userCredential('mail-stale');
    assert.equal(await oauth.refreshes() - start, 3, 'A exchanged, not stored the tokens it kept');
    assert.ok(Date.parse(after.value.expiry_time) > Date.parse(byB.value.expiry_time), `newer than B's tokens: ${after.value.expiry_time} after ${byB.value.expiry_time}`);
    assert.ok(after.next_rotation_time.getTime() > byB.next_rotation_time.getTime(), 'the due time did not go back');
    assert.equal((await instance('mail-stale')).status, 'active');
    assert.equal((await send('mail-stale')).status, 200);
  });

  it('says, when the tokens it could not store go with the job\'s last attempt, that they are dropped and the refresh gives up, not that they are kept', async () => {
    await brokered('mail-last');
    const cred = await userCredential('mail-last');
    const trx = await testDb().transaction();
    try {
      await trx('dek_aliases').where({ alias: cred.dek_alias }).forUpdate().first();
      // Due, and marked as queued: the scan leaves it to the test's job, of one attempt.
      await testDb()('bridge_credentials').where({ id: cred.id }).update({ next_rotation_time: new Date(Date.now() - 1000), refresh_queued_until: new Date(Date.now() + 600_000) });
      await withQueue(stack.env, 'credential-refresh', (q) => q.add('refresh', { credential_id: cred.id }, { jobId: `refresh_${cred.id}`, attempts: 1, removeOnComplete: true, removeOnFail: true }));
      await waitFor(async () => (await instance('mail-last')).status === 'refresh_failed', 'the last attempt to give up');
    } finally {
      await trx.commit();
    }
    const lines = stack.workers.flatMap((w) => w.logs).filter((l) => l.includes('"level":50') && l.includes(cred.id));
    assert.equal(lines.length, 1, lines.join('\n'));
    assert.match(lines[0], /the refreshed tokens could not be stored within 2 s, and this was the job's last attempt: they are dropped and the refresh gives up/);
    assert.doesNotMatch(lines[0], /kept for the job's next attempt/);
  });
});

describe('credential refresh: a refresh job that stalled too often', () => {
  before(() => start({}, 1));
  after(async () => all?.stop());

  it('is not given up on, as a stall says nothing of the credential: the instance stays active, and the next scan queues the refresh again, which stores new tokens', async () => {
    await brokered('mail-stalled');
    const cred = await userCredential('mail-stalled');
    const jobId = `refresh_${cred.id}`;
    const [first] = stack.workers;
    const handle = openQueue(stack.env, 'credential-refresh');
    // A stalled-job check that allows no stall (maxStalledCount 0): BullMQ's check on the worker's
    // sixth death during the job, in one. It takes no jobs (autorun off).
    const checker = new Worker('credential-refresh', undefined, { ...handle.queue.opts, autorun: false, stalledInterval: 300, maxStalledCount: 0 });
    try {
      await oauth.setMode('hold-next');
      await makeDue('mail-stalled');
      await waitFor(async () => (await oauth.held()) === 1, 'the refresh to be under way');
      await first.kill('SIGKILL');
      await checker.startStalledCheckTimer();
      await waitFor(async () => (await handle.queue.getJob(jobId))?.deferredFailure, 'the job to be marked as stalled too often');
    } finally {
      await checker.close();
      await handle.close();
      await oauth.release();
      await oauth.setMode('ok');
    }
    // The worker that takes the job next fails it for good.
    const second = await startWorker(stack.env);
    stack.workers.push(second);
    const after = await waitFor(async () => {
      const row = await userCredential('mail-stalled');
      return (row.next_rotation_time.getTime() > Date.now() || (await instance('mail-stalled')).status === 'refresh_failed') && row;
    }, 'the refresh to end');
    assert.equal((await instance('mail-stalled')).status, 'active');
    assert.ok(after.next_rotation_time.getTime() > cred.next_rotation_time.getTime(), 'refreshed: due later than before');
    assert.ok(second.logs.some((l) => l.includes('"level":40') && l.includes(cred.id) && l.includes('stalled more than allowable limit')), 'the stall is logged');
    assert.equal((await send('mail-stalled')).status, 200);
  });
});

describe('credential refresh: the scan takes each due credential once', () => {
  // A held token request is not given up on while the test holds it.
  before(() => start({ BRIDGE_TIMEOUT_MS: '120000' }, 1));
  after(async () => all?.stop());

  it('takes each due credential once: a credential 500 instances share, its refresh under way, does not keep another from being refreshed', async () => {
    // One credential with 500 instances (as rows: no API shares one) filled a scan that joined on
    // instances and took 500 rows, and while its refresh is held it stays due.
    await brokered('mail-s');
    await brokered('mail-later');
    const shared = await testDb()('provider_instances').where({ id: 'mail-s' }).first();
    await testDb()('provider_instances').insert(Array.from({ length: 499 }, (_, i) => ({ ...shared, id: `mail-s-${i}`, display_name: `mail-s-${i}` })));
    await oauth.setMode('hold-next');
    try {
      await makeDue('mail-s');
      await waitFor(async () => (await oauth.held()) === 1, 'the refresh of the shared credential');
      await testDb()('bridge_credentials').where({ id: (await instance('mail-later')).user_credential_id }).update({ next_rotation_time: new Date(Date.now() - 500) });
      await waitFor(async () => (await userCredential('mail-later')).next_rotation_time.getTime() > Date.now(), 'the other credential to be refreshed');
    } finally {
      await oauth.release();
    }
    await waitFor(async () => (await userCredential('mail-s')).next_rotation_time.getTime() > Date.now(), 'the shared credential to be refreshed');
    assert.equal((await instance('mail-later')).status, 'active');
  });
});

describe('credential refresh: credentials whose refresh is queued do not hold up the others', () => {
  // A scan takes 2 credentials; a refresh at a provider that is down retries for about 100 s, longer than the test.
  before(() => start({ CREDENTIAL_REFRESH_SCAN_LIMIT: '2', CREDENTIAL_REFRESH_ATTEMPTS: '100', RETRY_BACKOFF_MAX_MS: '1000' }, 1));
  after(async () => all?.stop());

  it('refreshes a credential of a working provider that falls due while more credentials than a scan takes wait out the outage of theirs', async () => {
    const failing = ['mail-down-1', 'mail-down-2', 'mail-down-3'];
    for (const id of failing) await brokered(id, 'client-down');
    await brokered('mail-up');
    const queued = (id: string) => withQueue(stack.env, 'credential-refresh', async (q) => Boolean(await q.getJob(`refresh_${(await instance(id)).user_credential_id}`)));
    await oauth.inMode('down-for:client-down', async () => {
      const start = await oauth.refreshes();
      for (const id of failing) await makeDue(id);
      await waitFor(async () => (await oauth.refreshes()) - start > failing.length, 'the failing refreshes to be retried');
      await testDb()('bridge_credentials').where({ id: (await instance('mail-up')).user_credential_id }).update({ next_rotation_time: new Date(Date.now() - 500) });
      await waitFor(async () => (await userCredential('mail-up')).next_rotation_time.getTime() > Date.now(), 'the working provider\'s credential to be refreshed');
      for (const id of failing) {
        assert.equal((await instance(id)).status, 'active', `${id}: its refresh still retrying`);
        assert.ok(await queued(id), `${id}: its refresh still queued`);
        assert.ok((await userCredential(id)).next_rotation_time.getTime() <= Date.now(), `${id}: still due`);
      }
    });
    assert.equal((await instance('mail-up')).status, 'active');
    assert.equal((await send('mail-up')).status, 200);
  });
});

describe('credential refresh: a queued refresh is marked one attempt at a time', () => {
  // A held token request is not given up on while the test holds it; the first retry waits 10 min.
  const BACKOFF_MS = 600_000;
  before(() => start({ BRIDGE_TIMEOUT_MS: '120000', CREDENTIAL_REFRESH_BACKOFF_MS: String(BACKOFF_MS) }, 1));
  after(async () => all?.stop());

  // BRIDGE_TIMEOUT_MS + CREDENTIAL_REFRESH_STORE_RETRY_MS + WORKER_LOCK_MS + WORKER_STALLED_CHECK_MS.
  const attemptMs = () => 120_000 + 30_000 + Number(stack.env.WORKER_LOCK_MS) + Number(stack.env.WORKER_STALLED_CHECK_MS);
  // How long the scan skips the credential from now on, by the database's clock.
  const markLeftMs = async (credentialId: string) => Number((await testDb().raw(
    `select extract(epoch from refresh_queued_until - now()) * 1000 as left from bridge_credentials where id = ?`, [credentialId])).rows[0].left);

  it('marks a queued refresh for one attempt, and a failed attempt for its backoff and the next attempt: a job lost with Redis is queued again before the tokens expire', async () => {
    await brokered('mail-mark');
    const cred = await userCredential('mail-mark');
    const job = () => withQueue(stack.env, 'credential-refresh', async (q) => (await q.getJob(`refresh_${cred.id}`))?.getState());
    await oauth.setMode('hold-next');
    try {
      await makeDue('mail-mark');
      await waitFor(async () => (await oauth.held()) === 1, 'the first attempt');
      const first = await markLeftMs(cred.id);
      assert.ok(first > 0 && first <= attemptMs(), `marked for one attempt (${attemptMs()} ms), not all: ${first} ms`);
      await oauth.setMode('down');
      await oauth.release();
      await waitFor(async () => (await job()) === 'delayed', 'the first attempt to fail and the job to wait for its retry');
      const retrying = await markLeftMs(cred.id);
      assert.ok(retrying > BACKOFF_MS && retrying <= BACKOFF_MS + attemptMs(), `marked for the backoff (${BACKOFF_MS} ms) and one attempt: ${retrying} ms`);
    } finally {
      await oauth.setMode('ok');
    }
  });
});

// The processor marks a failed attempt for its backoff only when retryDelayMs says BullMQ retries it
// (workers/refresh-credential.ts): a mark for a retry that never comes made the scan wait for nothing.
describe('credential refresh: a failed attempt BullMQ does not retry is not marked for a retry', () => {
  const job = (backoff: { type: string; delay: number }) => ({ attemptsMade: 0, opts: { attempts: ATTEMPTS, backoff } }) as unknown as Job;
  const capped = { type: 'capped-exponential', delay: 50 };

  it('has no retry delay for an UnrecoverableError (also known by its name alone) or a backoff answering -1; an ordinary failure waits its backoff', async () => {
    const cfg = loadConfig(testEnv({ LOG_LEVEL: 'silent' }));
    assert.equal(await retryDelayMs(cfg, job(capped), new Error('provider down')), 50);
    assert.equal(await retryDelayMs(cfg, job(capped), new UnrecoverableError('no retry mends it')), undefined);
    assert.equal(await retryDelayMs(cfg, job(capped), Object.assign(new Error('no retry mends it'), { name: 'UnrecoverableError' })), undefined);
    assert.equal(await retryDelayMs(cfg, job({ type: 'fixed', delay: -1 }), new Error('provider down')), undefined);
    assert.equal(await retryDelayMs(cfg, { ...job(capped), attemptsMade: ATTEMPTS - 1 } as Job, new Error('provider down')), undefined, 'after the last attempt');
  });
});
