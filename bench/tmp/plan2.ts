import fs from 'node:fs'; import os from 'node:os'; import path from 'node:path'; import { randomUUID } from 'node:crypto';
import { startPostgres } from '../../scripts/local-services.ts';
import { createDb, migrateLatest } from '../../db/knex.ts';
import { insertTaskBundles, applyStatusChanges, beginRuns } from '../../db/tasks.ts';
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'exp-')); fs.chmodSync(dataDir, 0o755);
const pg = await startPostgres({ dataDir, log: () => {}, ephemeral: true });
const db = createDb(pg.url, { min: 1, max: 1 });
await migrateLatest(db);
const mk = () => { const id = randomUUID(); const at = new Date(); return { task: { id, context_id: randomUUID(), status: 'submitted', status_timestamp: at, status_message_id: null, metadata: {}, created_at: at, updated_at: at }, message: { id: randomUUID(), task_id: id, role: 'user', parts: [{ type: 'text-part', text: 'x' }], reference_task_ids: [], metadata: {}, created_at: at.toISOString() }, timeline: [{ id: randomUUID(), task_id: id, created_at: at.toISOString(), event_payload: { type: 'x' } }] } as any; };
const N = Number(process.argv[2] ?? 20000);
const all: any[] = [];
for (let k = 0; k < N / 500; k++) { const b = Array.from({ length: 500 }, mk); all.push(...b); await insertTaskBundles(db, b); }
if (process.argv[3] === 'custom') await db.raw('set plan_cache_mode = force_custom_plan');
// time batches of 10 begin-runs + status changes on fresh tasks
let i = 0;
const t0 = performance.now();
for (let k = 0; k < 200; k++) {
  const batch = all.slice(i, i + 10); i += 10;
  await beginRuns(db, batch.map((b: any) => ({ taskId: b.task.id, messageId: b.message.id, historyLimit: 200, at: new Date(), from: ['submitted'], timelineItem: { id: randomUUID(), task_id: b.task.id, created_at: new Date().toISOString(), event_payload: { type: 'task-status-update', status: 'working' } } })) as any);
  await applyStatusChanges(db, batch.map((b: any) => ({ taskId: b.task.id, to: 'completed', from: ['working'], at: new Date(), timeline: [] })) as any);
}
console.log(process.argv.slice(2).join(' '), 'ms per batch pair', ((performance.now() - t0) / 200).toFixed(3));
const { rows } = await db.raw(`select relname, seq_scan, seq_tup_read, idx_scan from pg_stat_user_tables where relname='tasks'`); console.log(rows[0]);
await db.destroy(); await pg.stop(); fs.rmSync(dataDir, { recursive: true, force: true });
