import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { testDb, useStack, waitFor, type Client } from './helpers/stack.ts';

const S = '/api/secret/v1';
const E = '/api/encryption/v1';
const SECRETS = 40;

// A rotation's counts while secrets of its alias are written and deleted under it: done + failed never
// exceeds total, and total is the secrets it moved or failed plus those it has still to move.
describe('alias rotation counts: total is the distinct secrets moved or failed plus those left', () => {
  // Batches of 5 with a pause, so clients write between batches of the walk and of the sweep.
  const stack = useStack({ ALIAS_ROTATION_BATCH: '5', ALIAS_ROTATION_PAUSE_MS: '300' });
  let c: Client;
  before(() => { c = stack.client; });

  // An alias of its own with SECRETS secrets: their ids in the order the walk takes them.
  async function aliasWithSecrets(alias: string): Promise<string[]> {
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    const dek = await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {});
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek.body.id, alias })).status, 201);
    const ids: string[] = [];
    for (let i = 0; i < SECRETS; i++) {
      const r = await c.post(S, { key: `${alias}/${i}`, raw_value: randomUUID(), dek_alias: alias });
      assert.equal(r.status, 201, r.text);
      ids.push(r.body.id);
    }
    return ids.sort();
  }

  // Counts found wrong while polling (waitFor would retry past a failed assertion).
  let wrong: string[] = [];
  beforeEach(() => { wrong = []; });
  const note = (what: string) => { if (!wrong.includes(what)) wrong.push(what); };

  const poll = async (id: string) => {
    const r = await c.get(`${E}/job/${id}`);
    assert.equal(r.status, 200, r.text);
    const j = r.body;
    if (j.done + j.failed > j.total) note(`done ${j.done} + failed ${j.failed} > total ${j.total} (${j.status}, ${j.params.phase})`);
    return j;
  };

  // The job row and what its alias has left under another DEK than the new one, read in one snapshot.
  // With no failures, every secret of the alias not yet under the new DEK is one still to move.
  async function countsNow(id: string, alias: string) {
    return testDb().transaction(async (trx) => {
      const row = await trx('key_jobs').where({ id }).first();
      const newDek = row.params.new_dek_id;
      const [{ n }] = await trx('secrets').where({ dek_alias: alias }).whereNot({ dek_id: newDek }).count({ n: '*' });
      return { row, left: Number(n) };
    }, { isolationLevel: 'repeatable read' });
  }

  // Polls the job to its end; from the repoint on (and once ended) its total is exactly done + failed + left.
  async function followToEnd(id: string, alias: string) {
    let sawSweep = false;
    const ended = await waitFor(async () => {
      const j = await poll(id);
      const { row, left } = await countsNow(id, alias);
      if (row.params.phase !== 'walk' || !['queued', 'running'].includes(row.status)) {
        if (row.params.phase === 'sweep' && row.status === 'running') sawSweep = true;
        if (row.total !== row.done + row.failed + left) note(`total ${row.total} for done ${row.done}, failed ${row.failed}, left ${left} (${row.status}, ${row.params.phase})`);
      }
      return !['queued', 'running'].includes(j.status) && j;
    }, 'the rotation to end', 60000, 20);
    return { ended, sawSweep };
  }

  const waitDone = (id: string, n: number) =>
    waitFor(async () => { const j = await poll(id); return j.status === 'running' && j.done >= n && j; }, 'a first batch', 30000, 10);

  it('secrets updated, deleted and created during the walk, before it reaches them, are counted once', async function () {
    this.timeout(120000);
    const alias = 'cnt-walk';
    const ids = await aliasWithSecrets(alias);
    const r = await c.post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(r.status, 202, r.text);
    assert.equal(r.body.total, SECRETS);
    await waitDone(r.body.id, 5);
    // The last ids, which the walk takes last: 3 updated, 3 deleted; and 12 new secrets.
    for (const id of ids.slice(-3)) assert.equal((await c.put(`${S}/${id}`, { raw_value: randomUUID() })).status, 200);
    for (const id of ids.slice(-6, -3)) assert.equal((await c.delete(`${S}/${id}`)).status, 200);
    for (let i = 0; i < 12; i++) assert.equal((await c.post(S, { key: `${alias}/new/${i}`, raw_value: randomUUID(), dek_alias: alias })).status, 201);
    const walking = await poll(r.body.id);
    assert.equal(walking.params.phase, 'walk', 'written during the walk');

    const { ended, sawSweep } = await followToEnd(r.body.id, alias);
    assert.deepEqual(wrong, []);
    assert.ok(sawSweep, 'the job was observed during its sweep');
    const secrets = SECRETS - 3 + 12;
    assert.deepEqual([ended.status, ended.total, ended.done, ended.failed], ['completed', secrets, secrets, 0]);
    assert.equal((await testDb()('secrets').where({ dek_alias: alias }).whereNot({ dek_id: ended.params.new_dek_id })).length, 0);
  });

  it('secrets the walk moved and that are written again before the repoint are moved and counted once', async function () {
    this.timeout(120000);
    const alias = 'cnt-again';
    await aliasWithSecrets(alias);
    const r = await c.post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(r.status, 202, r.text);
    const walking = await waitDone(r.body.id, 10);
    const moved = await testDb()('secrets').where({ dek_alias: alias, dek_id: walking.params.new_dek_id }).orderBy('id').limit(3);
    assert.equal(moved.length, 3);
    const values = new Map<string, string>();
    for (const m of moved) {
      const raw = randomUUID();
      assert.equal((await c.put(`${S}/${m.id}`, { raw_value: raw })).status, 200);
      values.set(m.key, raw);
    }
    assert.equal((await poll(r.body.id)).params.phase, 'walk', 'written again before the repoint');

    const { ended } = await followToEnd(r.body.id, alias);
    assert.deepEqual(wrong, []);
    assert.deepEqual([ended.status, ended.total, ended.done, ended.failed], ['completed', SECRETS, SECRETS, 0]);
    assert.equal((await testDb()('secrets').where({ dek_alias: alias }).whereNot({ dek_id: ended.params.new_dek_id })).length, 0);
    const read = await c.get(`${S}/list-decrypted?page_size=300`);
    assert.equal(read.status, 200, read.text);
    for (const [key, raw] of values) assert.equal(read.body.secrets.find((x: { key: string }) => x.key === key)?.decrypted_value, raw, key);
  });

  it('a rotation canceled mid-walk, after secrets it had not reached were deleted, counts what it moved and what it left', async function () {
    this.timeout(120000);
    const alias = 'cnt-cancel';
    const ids = await aliasWithSecrets(alias);
    const r = await c.post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(r.status, 202, r.text);
    await waitDone(r.body.id, 5);
    for (const id of ids.slice(-4)) assert.equal((await c.delete(`${S}/${id}`)).status, 200);
    for (const id of ids.slice(-7, -4)) assert.equal((await c.put(`${S}/${id}`, { raw_value: randomUUID() })).status, 200);
    const canceled = await c.post(`${E}/job/${r.body.id}/cancel`);
    assert.ok([200, 202].includes(canceled.status), canceled.text);
    const { ended } = await followToEnd(r.body.id, alias);
    assert.deepEqual(wrong, []);
    assert.equal(ended.status, 'canceled');
    assert.equal(ended.params.phase, 'walk', 'canceled before its repoint');
    assert.ok(ended.done > 0 && ended.done < SECRETS - 4, `canceled mid-walk (${ended.done})`);
    // Every secret the alias has now is one the job moved or one it left.
    assert.equal(ended.total, SECRETS - 4);
  });
});
