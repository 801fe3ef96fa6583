import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import type { Queue } from 'bullmq';
import { assertError, cancelWhileRowHeld, lockWaits, startWorker, testDb, useStack, waitFor, withQueue, type Client, type Proc } from './helpers/stack.ts';

const S = '/api/secret/v1';
const E = '/api/encryption/v1';
const ALIAS = 'rot';
const READ_KEYS = 240; // secrets only read during the rotation
const WRITE_KEYS = 20; // secrets updated during the rotation

describe('alias rotation: new DEK, secrets re-encrypted, alias repointed, readers unaffected', () => {
  // Small batches with a pause, so the rotation spans many transactions while clients work.
  const stack = useStack({ ALIAS_ROTATION_BATCH: '20', ALIAS_ROTATION_PAUSE_MS: '40' }, { workers: 0 });
  let c: Client;
  const allProcs: Proc[] = []; // killed workers too, for the log check
  const expected = new Map<string, string>(); // key -> current raw value
  const everValue = new Set<string>(); // every raw value ever sent
  const ids = new Map<string, string>(); // key -> id
  const value = () => {
    const v = `rv-${randomUUID()}`;
    everValue.add(v);
    return v;
  };
  const job = async (id: string) => (await c.get(`${E}/job/${id}`)).body;
  // The log lines in which workers say a rotation ended: 'finished' with its status, or 'failed'.
  const endLines = (id: string) => [...new Set([...allProcs, ...stack.workers])].flatMap((w) => w.logs)
    .filter((l) => l.includes(id) && /"msg":"alias rotation (finished|failed)"/.test(l));
  // The one end line the worker logs for a job it ended canceled.
  const loggedCanceled = async (id: string) => {
    await waitFor(async () => endLines(id).length > 0, 'the worker to log the end', 10000, 20);
    await sleep(200);
    assert.equal(endLines(id).length, 1, endLines(id).join('\n'));
    const line = JSON.parse(endLines(id)[0]);
    assert.deepEqual([line.msg, line.status], ['alias rotation finished', 'canceled']);
  };
  const waitJob = (id: string, what = 'the rotation job to complete') =>
    waitFor(async () => { const j = await job(id); return ['completed', 'failed'].includes(j.status) && j; }, what, 60000, 100);
  const aliasDek = async (alias: string) => (await testDb()('dek_aliases').where({ alias }).first()).dek_id as string;
  // A rotation of ALIAS requested with the key-jobs queue paused, left paused: its job id.
  const queuedRotation = (keyJobs: Queue) => keyJobs.pause().then(async () => {
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202, r.text);
    return r.body.id as string;
  });

  async function createSecret(key: string, alias: string) {
    const raw = value();
    const r = await c.post(S, { key, raw_value: raw, dek_alias: alias });
    assert.equal(r.status, 201);
    expected.set(key, raw);
    ids.set(key, r.body.id);
  }

  // Deleting an envelope key makes every process drop the keys it read, as a restart would.
  const dropCaches = async () => {
    const name = `drop-${randomUUID()}.key`;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: name })).status, 201);
    assert.equal((await c.delete(`${E}/envelope/${name}`)).status, 200);
  };

  async function decryptedAll(): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    let token: string | undefined;
    do {
      const r = await c.get(`${S}/list-decrypted?page_size=100${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(r.status, 200);
      for (const s of r.body.secrets) out.set(s.key, s.decrypted_value);
      token = r.body.next_page_token;
    } while (token);
    return out;
  }

  before(async () => {
    c = stack.client;
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    const dek = await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {});
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek.body.id, alias: ALIAS })).status, 201);
    const keys = [...Array.from({ length: READ_KEYS }, (_, i) => `r/${i}`), ...Array.from({ length: WRITE_KEYS }, (_, i) => `w/${i}`)];
    for (let i = 0; i < keys.length; i += 20) await Promise.all(keys.slice(i, i + 20).map((k) => createSecret(k, ALIAS)));
    for (let i = 0; i < 5; i++) await createSecret(`default/${i}`, 'default');
  });

  it('answers 404/400/401/403 for bad rotation requests', async () => {
    assert.equal((await c.post(`${E}/dek/alias/no-such-alias/rotate`)).status, 404);
    assert.equal((await c.post(`${E}/dek/alias/bad%20alias/rotate`)).status, 400);
    assert.equal((await c.as('').post(`${E}/dek/alias/${ALIAS}/rotate`)).status, 401);
    const key = (await c.post('/api/auth/v1/api-key', { name: 'secrets only', scopes: ['secret:write', 'encryption:read'] })).body.key;
    assert.equal((await c.as(key).post(`${E}/dek/alias/${ALIAS}/rotate`)).status, 403);
    // It takes no input: a body with members is refused, naming the member, and so is one that is not JSON.
    const withInput = await c.post(`${E}/dek/alias/${ALIAS}/rotate`, { new_dek_id: 'mine' });
    assert.equal(withInput.status, 400, withInput.text);
    assert.ok(withInput.body.data.errors.some((e: { path: string }) => e.path.includes('new_dek_id')), withInput.text);
    const text = await c.request('POST', `${E}/dek/alias/${ALIAS}/rotate`, undefined, { headers: { 'content-type': 'text/plain' }, raw: 'garbage' });
    assert.equal(text.status, 415);
    assert.equal(Number((await testDb()('key_jobs').count({ n: '*' }))[0].n), 0);
  });

  let jobId: string;
  it('answers 202 with a queued job, and 200 with the same job while it is queued', async () => {
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    assert.equal(r.body.kind, 'rotate-alias');
    assert.equal(r.body.status, 'queued');
    assert.deepEqual(r.body.params, { alias: ALIAS });
    jobId = r.body.id;
    // No worker runs yet: the total is already the alias's secrets, not 0 (nothing to do).
    assert.deepEqual([r.body.total, r.body.done, r.body.failed], [READ_KEYS + WRITE_KEYS, 0, 0]);
    const polled = await job(jobId);
    assert.deepEqual([polled.status, polled.total, polled.done], ['queued', READ_KEYS + WRITE_KEYS, 0]);
    const again = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(again.status, 200);
    assert.equal(again.body.id, jobId);
    assert.equal(again.body.total, READ_KEYS + WRITE_KEYS);
  });

  it('re-encrypts every secret of the alias while reads and writes go on, then repoints the alias', async () => {
    const oldDek = await aliasDek(ALIAS);
    const defaultRows = await testDb()('secrets').where({ dek_alias: 'default' }).orderBy('id');
    const failures: string[] = [];
    let reads = 0;
    let stop = false;
    const readKeys = [...expected.keys()].filter((k) => k.startsWith('r/'));
    const reader = async () => {
      while (!stop) {
        const k = readKeys[reads % readKeys.length];
        const [one, list] = await Promise.all([c.get(`${S}/key/${encodeURIComponent(k)}`), c.get(`${S}/list-decrypted?page_size=300`)]);
        reads++;
        if (one.status !== 200) failures.push(`GET key ${k}: ${one.status}`);
        if (list.status !== 200) { failures.push(`list-decrypted: ${list.status} ${list.text}`); continue; }
        for (const s of list.body.secrets) {
          if (s.key.startsWith('r/') && s.decrypted_value !== expected.get(s.key)) failures.push(`${s.key} decrypted to a wrong value`);
          if (!everValue.has(s.decrypted_value)) failures.push(`${s.key} decrypted to an unknown value`);
        }
      }
    };
    let writes = 0;
    const writer = async () => {
      while (!stop) {
        const k = `w/${writes % WRITE_KEYS}`;
        const raw = value();
        const r = await c.put(`${S}/${ids.get(k)}`, { raw_value: raw });
        if (r.status !== 200) failures.push(`PUT ${k}: ${r.status}`);
        else expected.set(k, raw);
        if (writes % 10 === 0) await createSecret(`n/${writes}`, ALIAS);
        writes++;
      }
    };
    const loops = [reader(), reader(), writer()];
    const worker = await startWorker(stack.env);
    stack.workers.push(worker);
    allProcs.push(worker);
    let sawRunning = false;
    const done = await waitFor(async () => {
      const j = await job(jobId);
      if (j.status === 'running' && j.done < j.total) sawRunning = true;
      return ['completed', 'failed'].includes(j.status) && j;
    }, 'the rotation job to complete', 60000, 50);
    stop = true;
    await Promise.all(loops);

    assert.deepEqual(failures, []);
    assert.ok(reads > 0 && writes > 0);
    assert.ok(sawRunning, 'the job was observed mid-way');
    assert.equal(done.status, 'completed');
    assert.equal(done.failed, 0);
    assert.deepEqual(done.errors, []);
    assert.ok(done.done >= READ_KEYS + WRITE_KEYS);
    assert.ok(done.started_at && done.finished_at);
    const newDek = done.params.new_dek_id;
    assert.equal(done.params.from_dek_id, oldDek);
    assert.notEqual(newDek, oldDek);

    // The alias names the new DEK, under the same envelope key; the old DEK still exists.
    const aliasNow = (await c.get(`${E}/dek/alias/${ALIAS}`)).body;
    assert.equal(aliasNow.id, newDek);
    const deks = await testDb()('deks').whereIn('id', [oldDek, newDek]);
    assert.equal(deks.length, 2);
    assert.equal(deks[0].envelope_key_id, deks[1].envelope_key_id);
    // Every secret of the alias (including those written during the rotation) uses the new DEK.
    const rows = await testDb()('secrets').where({ dek_alias: ALIAS });
    assert.equal(rows.length, READ_KEYS + WRITE_KEYS + Math.ceil(writes / 10));
    assert.deepEqual(rows.filter((r) => r.dek_id !== newDek).map((r) => r.key), []);
    // Secrets of other aliases are untouched.
    assert.deepEqual(await testDb()('secrets').where({ dek_alias: 'default' }).orderBy('id'), defaultRows);
    // Every secret decrypts to its latest value.
    const all = await decryptedAll();
    assert.equal(all.size, expected.size);
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);
  });

  it('finishes after the worker is killed mid-rotation, with one new DEK', async () => {
    const deksBefore = Number((await testDb()('deks').count({ n: '*' }))[0].n);
    const oldDek = await aliasDek(ALIAS);
    // The previous job is finished, so this is a new one.
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    assert.notEqual(r.body.id, jobId);
    await waitFor(async () => { const j = await job(r.body.id); return j.status === 'running' && j.done >= 40; }, 'the rotation to get going');
    await stack.workers[0].kill('SIGKILL');
    const mid = await job(r.body.id);
    assert.equal(mid.status, 'running');
    assert.ok(mid.done < mid.total, `killed after ${mid.done} of ${mid.total}`);
    assert.equal(await aliasDek(ALIAS), oldDek, 'not yet repointed');

    const worker = await startWorker(stack.env);
    stack.workers[0] = worker;
    allProcs.push(worker);
    const done = await waitJob(r.body.id, 'the resumed rotation to complete');
    assert.equal(done.status, 'completed');
    assert.equal(done.failed, 0);
    assert.equal(done.done, done.total);
    assert.equal(done.total, expected.size - 5);
    assert.equal(Number((await testDb()('deks').count({ n: '*' }))[0].n), deksBefore + 1);
    assert.equal(await aliasDek(ALIAS), done.params.new_dek_id);
    assert.deepEqual((await testDb()('secrets').where({ dek_alias: ALIAS }).whereNot({ dek_id: done.params.new_dek_id })).length, 0);
    const all = await decryptedAll();
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);
  });

  it('fails the job and leaves the alias alone when the alias is moved during the rotation', async () => {
    const envelope = (await c.get(`${E}/dek/alias/${ALIAS}`)).body.envelope_encryption_key_id.id;
    const elsewhere = (await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {})).body.id;
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    await waitFor(async () => { const j = await job(r.body.id); return j.status === 'running' && j.done >= 20; }, 'the rotation to get going');
    assert.equal((await c.put(`${E}/dek/alias/${ALIAS}`, { new_dek_id: elsewhere })).status, 200);
    const done = await waitJob(r.body.id, 'the rotation to fail');
    assert.equal(done.status, 'failed');
    assert.match(done.errors.at(-1).message, /was pointed at DEK .* during the rotation/);
    assert.equal(await aliasDek(ALIAS), elsewhere);
    // Secrets re-encrypted before the failure and those not reached both still read.
    const all = await decryptedAll();
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);
  });

  it('is canceled mid-walk: stops after the batch in flight, the alias left where it was and every secret still reading', async () => {
    const oldDek = await aliasDek(ALIAS);
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    await waitFor(async () => { const j = await job(r.body.id); return j.status === 'running' && j.done >= 20; }, 'the rotation to get going');
    // 200 canceled, or 202 while a batch holds the job: canceled once that batch ends.
    const canceled = await c.post(`${E}/job/${r.body.id}/cancel`);
    assert.ok([200, 202].includes(canceled.status), canceled.text);
    assert.equal(canceled.body.status, canceled.status === 200 ? 'canceled' : 'running');
    assert.ok(canceled.body.done < canceled.body.total, `canceled mid-walk (${canceled.body.done} of ${canceled.body.total})`);
    await waitFor(async () => allProcs.concat(stack.workers).some((w) => w.logs.some((l) => l.includes(r.body.id) && l.includes('alias rotation finished') && l.includes('"status":"canceled"'))), 'the worker to stop', 30000, 20);
    const stopped = await testDb()('key_jobs').where({ id: r.body.id }).first();
    assert.equal(stopped.status, 'canceled');
    assert.equal(stopped.params.phase, 'walk', 'stopped before its repoint');
    assert.equal(await aliasDek(ALIAS), oldDek, 'the alias was not repointed');
    const moved = await testDb()('secrets').where({ dek_alias: ALIAS, dek_id: stopped.params.new_dek_id });
    assert.equal(moved.length, stopped.done, 'the secrets moved are those the job counted');
    const all = await decryptedAll();
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);
    // A new rotation takes the alias's secrets from wherever they are, the canceled one's moves included.
    const next = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(next.status, 202, next.text);
    const done = await waitJob(next.body.id);
    assert.deepEqual([done.status, done.failed], ['completed', 0]);
    assert.equal(await aliasDek(ALIAS), done.params.new_dek_id);
    assert.equal((await testDb()('secrets').where({ dek_alias: ALIAS }).whereNot({ dek_id: done.params.new_dek_id })).length, 0);
  });

  // A rotation of ALIAS canceled while it makes its new DEK: requested with the workers held off, then
  // the alias held, so the rotation's first step (which holds the job) waits for it, its DEK not yet
  // made, and the cancel is 202. Resolves to the job once it has ended.
  async function canceledWhileMakingDek() {
    const jobHeld = async (id: string) => {
      try {
        await testDb().transaction((t) => t.raw('select 1 from key_jobs where id = ? for update nowait', [id]));
        return false;
      } catch (err) {
        if ((err as { code?: string }).code === '55P03') return true;
        throw err;
      }
    };
    const id = await withQueue(stack.env, 'key-jobs', queuedRotation);
    const held = await testDb().transaction();
    try {
      await held('dek_aliases').where({ alias: ALIAS }).forUpdate().first();
      await withQueue(stack.env, 'key-jobs', (keyJobs) => keyJobs.resume());
      await waitFor(() => jobHeld(id), 'the rotation to take its job', 20000, 20);
      const canceled = await c.post(`${E}/job/${id}/cancel`);
      assert.equal(canceled.status, 202, canceled.text);
      assert.equal(canceled.body.status, 'queued');
    } finally {
      await held.rollback();
    }
    const ended = await waitFor(async () => { const j = await job(id); return j.status !== 'queued' && j.status !== 'running' && j; }, 'the rotation to end');
    assert.equal(ended.status, 'canceled', JSON.stringify(ended));
    assert.ok(ended.params.prepared_dek_id, 'its new DEK had been made');
    return ended;
  }

  it('a cancel while the rotation makes its new DEK is 202 and ends the job before its walk, deleting that DEK', async () => {
    const deks = async () => Number((await testDb()('deks').count({ n: '*' }))[0].n);
    const before = await deks();
    const oldDek = await aliasDek(ALIAS);
    const ended = await canceledWhileMakingDek();
    await loggedCanceled(ended.id);
    assert.equal(ended.params.new_dek_id, undefined, 'its walk never began');
    assert.equal(await testDb()('deks').where({ id: ended.params.prepared_dek_id }).first(), undefined, 'the DEK made for it is deleted');
    assert.equal(await deks(), before);
    assert.equal(await aliasDek(ALIAS), oldDek);
    const all = await decryptedAll();
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);

    // A rotation whose worker died between making its DEK and starting its walk (its job holds the
    // DEK's id and is queued again): the cancel, applied at once (200), deletes that DEK too.
    const envelope = (await c.get(`${E}/dek/alias/${ALIAS}`)).body.envelope_encryption_key_id.id;
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      try {
        const queued = await queuedRotation(keyJobs);
        const made = (await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {})).body.id;
        await testDb()('key_jobs').where({ id: queued }).update({ params: JSON.stringify({ alias: ALIAS, prepared_dek_id: made, prepared_from_dek_id: oldDek }) });
        const canceled = await c.post(`${E}/job/${queued}/cancel`);
        assert.deepEqual([canceled.status, canceled.body.status], [200, 'canceled'], canceled.text);
        assert.equal(await testDb()('deks').where({ id: made }).first(), undefined, 'the DEK made for it is deleted');
      } finally {
        await keyJobs.resume();
      }
    });
    assert.equal(await deks(), before);
  });

  it('a cancel recorded (202) while the job waits in the queue is applied by the worker\'s start, which logs that end', async () => {
    let id!: string;
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      try {
        id = await queuedRotation(keyJobs);
        // Its row held, as a batch of an earlier worker would hold it.
        await cancelWhileRowHeld(c, id);
      } finally {
        await keyJobs.resume();
      }
    });
    await loggedCanceled(id);
    const ended = await job(id);
    assert.deepEqual([ended.status, ended.params.prepared_dek_id], ['canceled', undefined], JSON.stringify(ended));
  });

  it('cancels sent at once to a queued job no batch holds are each answered 200 with it canceled, and leave no cancel request behind', async () => {
    for (let round = 0; round < 3; round++) {
      let id!: string;
      const answers = await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
        try {
          id = await queuedRotation(keyJobs);
          return await Promise.all(Array.from({ length: 20 }, () => c.post(`${E}/job/${id}/cancel`)));
        } finally {
          await keyJobs.resume();
        }
      });
      // As one after the other: the first cancels it at once, the rest find it canceled already.
      assert.deepEqual(answers.map((a) => [a.status, a.body.status]), answers.map(() => [200, 'canceled']), answers.map((a) => a.text).join('\n'));
      assert.equal(await testDb()('key_job_cancels').where({ job_id: id }).first(), undefined, 'no cancel request is left for the ended job');
    }
  });

  it('never gives the id of a DEK a canceled rotation deleted to another DEK: creating or importing one under it is 409 naming why, storing nothing', async () => {
    const envelope = (await c.get(`${E}/dek/alias/${ALIAS}`)).body.envelope_encryption_key_id.id;
    const under = `${E}/envelope/${encodeURIComponent(envelope)}`;
    // Key material that unwraps under that envelope key, so that only the id can be refused.
    const wrapped = (await c.get(`${E}/dek/alias/${ALIAS}`)).body.encrypted_data_encryption_key;
    // A process that missed the note to drop the deleted DEK from its cache would seal values under
    // the id with the old key: a new DEK there would have them unreadable.
    const refused = async (id: string) => {
      // And with material that does not unwrap: the id is refused before the key is tried.
      const foreign = randomBytes(60).toString('base64');
      for (const [path, body] of [['dek', { id }], ['dek/import', { id, encrypted_data_encryption_key: wrapped }], ['dek/import', { id, encrypted_data_encryption_key: foreign }]] as const) {
        const r = await c.post(`${under}/${path}`, body);
        assertError(r, 409, 'conflict');
        assert.match(r.body.message, new RegExp(`^DEK id '${id}' was used by a DEK deleted at \\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z; the id of a deleted DEK is never used again: choose another$`), r.text);
        assert.deepEqual([r.body.data.resource, r.body.data.id, typeof r.body.data.deleted_at], ['dek', id, 'string'], r.text);
      }
      assert.equal(await testDb()('deks').where({ id }).first(), undefined, 'no DEK is stored under it');
    };

    // A DEK a client created under an id of its choosing, then made a queued rotation's new DEK (as a
    // worker that died after making it leaves it), deleted by the API as it applies the cancel at once.
    const chosen = `chosen-${randomUUID()}`;
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      try {
        const queued = await queuedRotation(keyJobs);
        assert.equal((await c.post(`${under}/dek`, { id: chosen })).status, 201);
        await testDb()('key_jobs').where({ id: queued }).update({ params: JSON.stringify({ alias: ALIAS, prepared_dek_id: chosen, prepared_from_dek_id: await aliasDek(ALIAS) }) });
        const canceled = await c.post(`${E}/job/${queued}/cancel`);
        assert.deepEqual([canceled.status, canceled.body.status], [200, 'canceled'], canceled.text);
      } finally {
        await keyJobs.resume();
      }
    });
    assert.equal(await testDb()('deks').where({ id: chosen }).first(), undefined, 'the cancel deleted it');
    await refused(chosen);

    // Deleted by the worker itself, whose step applied the cancel.
    await refused((await canceledWhileMakingDek()).params.prepared_dek_id);
  });

  it('a cancel that ends a rotation which moved nothing yet (202 while it starts its walk) deletes its new DEK, which nothing refers to', async () => {
    const deks = async () => Number((await testDb()('deks').count({ n: '*' }))[0].n);
    const before = await deks();
    const oldDek = await aliasDek(ALIAS);
    const id = await withQueue(stack.env, 'key-jobs', queuedRotation);
    // A write under way holds the alias shared: the rotation makes its DEK, then its start (which
    // holds the job) waits for the write. The cancel then is recorded, and applied by the first batch.
    const write = await testDb().transaction();
    try {
      await write('dek_aliases').where({ alias: ALIAS }).forShare().first();
      await withQueue(stack.env, 'key-jobs', (keyJobs) => keyJobs.resume());
      await waitFor(async () => (await testDb()('key_jobs').where({ id }).first()).params.prepared_dek_id, 'the rotation to make its DEK', 20000, 20);
      await waitFor(async () => (await testDb().raw('select 1 from pg_locks where not granted')).rows.length > 0, 'the start to wait for the write', 20000, 20);
      const canceled = await c.post(`${E}/job/${id}/cancel`);
      assert.deepEqual([canceled.status, canceled.body.status], [202, 'queued'], canceled.text);
    } finally {
      await write.rollback();
    }
    const ended = await waitFor(async () => { const j = await job(id); return !['queued', 'running'].includes(j.status) && j; }, 'the rotation to end');
    assert.deepEqual([ended.status, ended.done, ended.params.phase], ['canceled', 0, 'walk'], JSON.stringify(ended));
    assert.ok(ended.params.new_dek_id, 'its walk had begun');
    assert.equal(await aliasDek(ALIAS), oldDek);
    assert.equal(await testDb()('deks').where({ id: ended.params.new_dek_id }).first(), undefined, 'the DEK made for it is deleted');
    assert.equal(await deks(), before);
    const all = await decryptedAll();
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);
  });

  it('fails the job, pulling nothing back, when the alias is moved after its repoint (the sweep)', async () => {
    const envelope = (await c.get(`${E}/dek/alias/${ALIAS}`)).body.envelope_encryption_key_id.id;
    const elsewhere = (await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {})).body.id;
    const jobRow = async (id: string) => testDb()('key_jobs').where({ id }).first();
    // Started, then stopped mid-walk: secrets written now are the sweep's (after the start, old DEK).
    await stack.workers[0]?.kill('SIGKILL');
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    const first = await startWorker(stack.env);
    allProcs.push(first);
    await waitFor(async () => (await jobRow(r.body.id)).status === 'running', 'the rotation to start', 20000, 20);
    await first.kill('SIGKILL');
    assert.equal((await jobRow(r.body.id)).params.phase, 'walk', 'stopped before its repoint');
    for (let i = 0; i < 10; i++) await createSecret(`sweep/${i}`, ALIAS);
    // One of them held, so the sweep's batch waits on it (holding the alias) while the alias is moved.
    const held = await testDb().transaction();
    try {
      await held('secrets').where({ id: ids.get('sweep/0') }).forUpdate().first();
      const worker = await startWorker(stack.env);
      stack.workers[0] = worker;
      allProcs.push(worker);
      await waitFor(async () => (await jobRow(r.body.id)).params.phase === 'sweep', 'the sweep', 30000, 20);
      await waitFor(async () => (await lockWaits('update secrets %')) === 1, 'the sweep to wait on the held secret', 30000, 20);
      const moved = c.put(`${E}/dek/alias/${ALIAS}`, { new_dek_id: elsewhere });
      await waitFor(async () => (await lockWaits('%dek_aliases%')) === 1, 'the move to wait on the alias the sweep holds', 30000, 20);
      await held.rollback();
      assert.equal((await moved).status, 200);
    } finally {
      if (!held.isCompleted()) await held.rollback();
    }
    for (let i = 0; i < 5; i++) await createSecret(`after-move/${i}`, ALIAS);
    const done = await waitJob(r.body.id, 'the rotation to fail');
    assert.equal(done.status, 'failed', JSON.stringify(done));
    assert.match(done.errors.at(-1).message, /was pointed at DEK .* during the rotation; it was left there/);
    assert.equal(await aliasDek(ALIAS), elsewhere);
    const rows = await testDb()('secrets').where('key', 'like', 'after-move/%');
    assert.deepEqual(rows.map((row) => row.dek_id), Array(5).fill(elsewhere), 'written under the alias\'s new target, and left there');
    const all = await decryptedAll();
    for (const [k, v] of expected) assert.equal(all.get(k), v, k);
  });

  it('makes its new DEK while writes hold the alias, then starts the walk only once they have committed (it waits for them)', async () => {
    const jobRow = async (id: string) => testDb()('key_jobs').where({ id }).first();
    // Requested with no worker running (the request itself takes the alias FOR UPDATE, briefly).
    await stack.workers[0]?.kill('SIGTERM');
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    const id: string = r.body.id;
    const deks = async () => Number((await testDb()('deks').count({ n: '*' }))[0].n);
    const deksBefore = await deks();
    // Held shared, as a write under the alias holds it from reading its DEK until it commits.
    const held = await testDb().transaction();
    try {
      await held('dek_aliases').where({ alias: ALIAS }).forShare().first();
      const worker = await startWorker(stack.env);
      // The stack's own: stopped with it, also when this test fails.
      stack.workers[0] = worker;
      allProcs.push(worker);
      await waitFor(async () => (await deks()) > deksBefore, 'the new DEK to be made', 30000, 20);
      await waitFor(async () => (await lockWaits('%dek_aliases%')) > 0, 'the start to wait on the alias', 30000, 20);
      const waiting = await jobRow(id);
      assert.deepEqual([waiting.status, waiting.started_at], ['queued', null]);
    } finally {
      await held.rollback();
    }
    const done = await waitJob(id);
    assert.equal(done.status, 'completed', JSON.stringify(done));
    assert.equal(done.params.new_dek_id, done.params.prepared_dek_id);
    assert.equal(await aliasDek(ALIAS), done.params.new_dek_id);
  });

  it('fails the job, leaving the alias there, when it is moved after the new DEK was made and before the start', async () => {
    const envelope = (await c.get(`${E}/dek/alias/${ALIAS}`)).body.envelope_encryption_key_id.id;
    const elsewhere = (await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {})).body.id;
    await stack.workers[0]?.kill('SIGTERM');
    const r = await c.post(`${E}/dek/alias/${ALIAS}/rotate`);
    assert.equal(r.status, 202);
    const waitingOn = (query: string, n = 1) => async () => (await lockWaits(`%${query}%`)) >= n;
    // The envelope key held: the job's new DEK (its insert checks the key) waits, with the alias held shared.
    const held = await testDb().transaction();
    // The alias held shared too, until the start waits on it behind the move: once the DEK is made, the
    // move (woken) and the start (new) would both ask for the alias, and on a slow machine the start
    // could take it first, then walk, and fail only at its repoint.
    const shared = await testDb().transaction();
    let moved: Promise<{ status: number }> | undefined;
    try {
      await shared('dek_aliases').where({ alias: ALIAS }).forShare().first();
      await held('envelope_keys').where({ id: envelope }).forUpdate().first();
      const worker = await startWorker(stack.env);
      // The stack's own: stopped with it, also when this test fails.
      stack.workers[0] = worker;
      allProcs.push(worker);
      await waitFor(waitingOn('insert into deks'), 'the new DEK to wait on its envelope key', 30000, 20);
      moved = c.put(`${E}/dek/alias/${ALIAS}`, { new_dek_id: elsewhere });
      await waitFor(waitingOn('dek_aliases'), 'the move to wait on the alias', 30000, 20);
      await held.rollback();
      await waitFor(waitingOn('dek_aliases', 2), 'the start to wait on the alias behind the move', 30000, 20);
    } finally {
      if (!held.isCompleted()) await held.rollback();
      await shared.rollback();
    }
    assert.equal((await moved!).status, 200);
    const done = await waitJob(r.body.id, 'the rotation to fail');
    assert.equal(done.status, 'failed', JSON.stringify(done));
    assert.equal(done.params.new_dek_id, undefined, 'failed at its start, before its walk');
    assert.match(done.errors.at(-1).message, new RegExp(`was pointed at DEK '${elsewhere}' during the rotation; it was left there`));
    assert.equal(await aliasDek(ALIAS), elsewhere);
    // The DEK it made before its walk was to begin is deleted with it: nothing refers to it.
    assert.ok(done.params.prepared_dek_id, 'it had made its DEK');
    assert.equal(await testDb()('deks').where({ id: done.params.prepared_dek_id }).first(), undefined);
  });

  it('an alias deleted while a rotation of it is requested: the rotation 202 and the delete 409, or the rotation 404 and the delete 200', async () => {
    const dek = (await c.get(`${E}/dek/alias/default`)).body.id;
    // Paused, so no rotation ends before its delete is looked at.
    await withQueue(stack.env, 'key-jobs', async (queue) => {
      await queue.pause();
      try {
        for (let i = 0; i < 20; i++) {
          const alias = `rot-del-${i}`;
          assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek, alias })).status, 201);
          const [rotated, deleted] = await Promise.all([c.post(`${E}/dek/alias/${alias}/rotate`), c.delete(`${E}/dek/alias/${alias}`)]);
          if (rotated.status === 202) {
            assert.equal(deleted.status, 409, `round ${i}: ${deleted.text}`);
            assert.match(deleted.body.message, /is being rotated/);
            assert.ok(await testDb()('dek_aliases').where({ alias }).first(), 'the alias stays for its rotation');
          } else {
            assert.equal(rotated.status, 404, `round ${i}: ${rotated.text}`);
            assert.equal(deleted.status, 200, deleted.text);
            assert.equal(await testDb()('key_jobs').whereRaw(`params->>'alias' = ?`, [alias]).first(), undefined);
          }
        }
      } finally {
        await queue.resume();
      }
    });
  });

  it('re-encrypts what it can read and lists, as not moved, the secrets under an older DEK whose envelope key file is lost', async () => {
    const alias = 'rot-lost';
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'rot-lost.key' })).status, 201);
    assert.equal((await c.post(`${E}/envelope/rot-lost.key/dek`, { id: 'rot-lost-old' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'rot-lost-old', alias })).status, 201);
    const oldKeys = [0, 1, 2].map((i) => `lost/old/${i}`);
    for (const k of oldKeys) await createSecret(k, alias);
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    const current = (await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {})).body.id;
    assert.equal((await c.put(`${E}/dek/alias/${alias}`, { new_dek_id: current })).status, 200);
    const newKeys = [0, 1, 2, 3, 4].map((i) => `lost/new/${i}`);
    for (const k of newKeys) await createSecret(k, alias);
    const file = path.join(stack.env.DATA_DIR, 'keys', 'rot-lost.key');
    const original = fs.readFileSync(file);
    fs.rmSync(file);
    try {
      await dropCaches();
      const r = await c.post(`${E}/dek/alias/${alias}/rotate`);
      assert.equal(r.status, 202);
      const done = await waitJob(r.body.id);
      assert.equal(done.status, 'completed', JSON.stringify(done));
      assert.deepEqual([done.total, done.done, done.failed], [8, 5, 3]);
      assert.deepEqual(done.errors.map((e: any) => e.id).sort(), oldKeys.map((k) => ids.get(k)).sort());
      for (const e of done.errors) assert.match(e.message, /^secret does not decrypt with DEK 'rot-lost-old': local envelope key 'rot-lost\.key' cannot be read \(ENOENT\)$/);
      assert.equal(await aliasDek(alias), done.params.new_dek_id);
      const rows = await testDb()('secrets').where({ dek_alias: alias });
      assert.deepEqual(Object.fromEntries(rows.map((row) => [row.key, row.dek_id])), Object.fromEntries([...oldKeys.map((k) => [k, 'rot-lost-old']), ...newKeys.map((k) => [k, done.params.new_dek_id])]));
    } finally {
      fs.writeFileSync(file, original, { mode: 0o600 });
    }
    // With the file back, those left under the old DEK read as they were.
    const all = await decryptedAll();
    for (const k of [...oldKeys, ...newKeys]) assert.equal(all.get(k), expected.get(k), k);
  });

  it('fails, the alias left where it was, when the envelope key its new DEK is under is lost mid-job (not every secret listed as not moved)', async () => {
    const alias = 'rot-gone';
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'rot-gone.key' })).status, 201);
    assert.equal((await c.post(`${E}/envelope/rot-gone.key/dek`, { id: 'rot-gone-old' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'rot-gone-old', alias })).status, 201);
    const keys = Array.from({ length: 300 }, (_, i) => `gone/${i}`);
    for (let i = 0; i < keys.length; i += 20) await Promise.all(keys.slice(i, i + 20).map((k) => createSecret(k, alias)));
    const file = path.join(stack.env.DATA_DIR, 'keys', 'rot-gone.key');
    const original = fs.readFileSync(file);
    const r = await c.post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(r.status, 202);
    try {
      // Batches of 20, 40 ms apart: the file goes while most are still to come.
      await waitFor(async () => (await job(r.body.id)).done >= 20, 'a first batch', 30000, 10);
      // Caches left as they are: the worker holds both DEKs, and must still see the file gone.
      fs.rmSync(file);
      const done = await waitJob(r.body.id);
      assert.equal(done.status, 'failed', JSON.stringify({ ...done, errors: done.errors.slice(0, 3) }));
      assert.ok(done.done < keys.length && done.failed === 0, JSON.stringify([done.done, done.failed]));
      assert.match(JSON.stringify(done.errors), /local envelope key 'rot-gone\.key' cannot be read \(ENOENT\)/);
      assert.equal(await aliasDek(alias), 'rot-gone-old');
    } finally {
      fs.writeFileSync(file, original, { mode: 0o600 });
    }
    await dropCaches();
    const all = await decryptedAll();
    for (const k of keys) assert.equal(all.get(k), expected.get(k), k);
  });

  it('keeps every secret value out of logs and out of the BullMQ job hashes', async () => {
    const redis = new Redis(stack.env.REDIS_URL);
    try {
      const keys: string[] = [];
      let cursor = '0';
      do {
        const [next, batch] = await redis.scan(cursor, 'MATCH', `${stack.env.QUEUE_PREFIX}:*`, 'COUNT', 1000);
        keys.push(...batch);
        cursor = next;
      } while (cursor !== '0');
      const jobHashes: string[] = [];
      for (const k of keys) if ((await redis.type(k)) === 'hash' && k.includes(':key-jobs:')) jobHashes.push(k);
      assert.ok(jobHashes.some((k) => /:key-jobs:[0-9a-f-]{36}$/.test(k)), `rotation job hashes exist: ${jobHashes.join(', ')}`);
      const stored = (await Promise.all(jobHashes.map((k) => redis.hgetall(k)))).map((h) => JSON.stringify(h)).join('\n');
      assert.match(stored, /job_id/);
      for (const v of everValue) assert.ok(!stored.includes(v), 'a secret value is stored in a job hash');
    } finally {
      redis.disconnect();
    }
    const logs = [stack.api, ...allProcs].map((p) => p.logs.join('\n')).join('\n');
    assert.match(logs, /alias rotation finished/);
    for (const v of everValue) assert.ok(!logs.includes(v), 'a secret value appears in a log');
  });
});
