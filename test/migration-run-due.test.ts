// Migration 0013 on a database that already holds tasks: the tasks owed a run get their run due
// message, by the rule job recovery applied before it, so recovery still finds them.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { migrationConfig } from '../db/knex.ts';
import { scratchDatabase, type ScratchDatabase } from './helpers/scratch-database.ts';

describe('migration 0013 (tasks owed a run)', function () {
  this.timeout(60_000);
  let scratch: ScratchDatabase;
  let db: Knex;

  before(async () => {
    scratch = await scratchDatabase('migration');
    db = scratch.db;
    // Up to the migration before 0013.
    for (;;) {
      const [, pending] = await db.migrate.list(migrationConfig) as [unknown, { file: string }[]];
      if (!pending.length || pending[0].file.startsWith('0013')) break;
      await db.migrate.up(migrationConfig);
    }
  });
  after(async () => {
    await scratch?.drop();
  });

  it('marks submitted tasks opened by a user and waiting tasks answered since, and no others', async () => {
    const t0 = new Date(Date.now() - 60_000);
    const at = (s: number) => new Date(t0.getTime() + s * 1000);
    const ctx = randomUUID();
    await db('contexts').insert({ id: ctx, created_at: t0 });
    const task = async (status: string, messages: { role: string; s: number }[], statusAt: number, statusMessage?: number) => {
      const id = randomUUID();
      const ids = messages.map(() => randomUUID());
      await db('tasks').insert({ id, context_id: ctx, status, status_timestamp: at(statusAt), metadata: {}, created_at: t0, updated_at: t0 });
      for (const [i, m] of messages.entries()) {
        await db('messages').insert({ id: ids[i], task_id: id, role: m.role, parts: JSON.stringify([{ type: 'text-part', text: 'x' }]), reference_task_ids: [], metadata: {}, created_at: at(m.s) });
      }
      if (statusMessage !== undefined) await db('tasks').where({ id }).update({ status_message_id: ids[statusMessage] });
      return { id, ids };
    };
    const userOpened = await task('submitted', [{ role: 'user', s: 0 }], 0);
    const agentOpened = await task('submitted', [{ role: 'agent', s: 0 }, { role: 'user', s: 5 }], 0);
    const answered = await task('input-required', [{ role: 'user', s: 0 }, { role: 'agent', s: 2 }, { role: 'user', s: 5 }, { role: 'user', s: 6 }], 2, 1);
    const unanswered = await task('input-required', [{ role: 'user', s: 0 }, { role: 'agent', s: 2 }], 2, 1);
    const answeredNoStatusMessage = await task('auth-required', [{ role: 'user', s: 0 }, { role: 'user', s: 5 }], 3);
    const completed = await task('completed', [{ role: 'user', s: 0 }, { role: 'agent', s: 1 }], 1, 1);
    const working = await task('working', [{ role: 'user', s: 0 }], 1);

    await db.migrate.up(migrationConfig);
    const due = async (t: { id: string }) => (await db('tasks').where({ id: t.id }).first()).run_due_message_id;
    assert.equal(await due(userOpened), userOpened.ids[0]);
    assert.equal(await due(agentOpened), null);
    assert.equal(await due(answered), answered.ids[2], 'the first answer since the task began to wait');
    assert.equal(await due(unanswered), null);
    assert.equal(await due(answeredNoStatusMessage), answeredNoStatusMessage.ids[1]);
    assert.equal(await due(completed), null);
    assert.equal(await due(working), null);
    const { rows } = await db.raw(`select indexdef from pg_indexes where indexname = 'tasks_run_due'`);
    assert.match(rows[0].indexdef, /WHERE \(run_due_message_id IS NOT NULL\)/);
  });
});
