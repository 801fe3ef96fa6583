// The floor of bench/a2a-intake.ts: the least any service of our shape can do for a durable A2A task,
// on the same Postgres and Redis. FLOOR_ROLE=api: a bare Koa server that answers every POST (a
// non-blocking message/send) by inserting one row into floor_tasks (primary key only) and adding one
// BullMQ job (in bulk, after the answer's row committed); no key check, no validation, no context, message or timeline rows. FLOOR_ROLE=worker:
// a BullMQ worker of the agent queue's concurrency that completes each task with the echo in one
// update. Both coalesce concurrent statements as ours do (db/statement-batcher.ts), so the floor has
// the one technique that most lowers Postgres's cost a task. Between it and the reference lies what durability through Postgres and a queue costs;
// between ours and it, what our service does beyond that. The bench creates floor_tasks.
import { randomUUID } from 'node:crypto';
import Koa from 'koa';
import pg from 'pg';
import { Queue, Worker } from 'bullmq';
import { createRedis } from '../queues/connection.ts';
import { StatementBatcher } from '../db/statement-batcher.ts';

const FLOOR_QUEUE = 'floor-tasks'; // the bench checks its workers by this name

const prefix = process.env.QUEUE_PREFIX;
const redisUrl = process.env.REDIS_URL!;
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 20 });

if (process.env.FLOOR_ROLE === 'api') {
  const queue = new Queue(FLOOR_QUEUE, { prefix, connection: createRedis(redisUrl, 'producer') });
  // As ours do (queues/outbox-relay.ts): a statement's jobs go in one addBulk once it has committed,
  // which the answers do not wait for.
  const inserts = new StatementBatcher(async (rows: { id: string; context_id: string; message: unknown }[]) => {
    await pool.query(`insert into floor_tasks (id, context_id, status, message)
      select id, context_id, 'submitted', message from jsonb_to_recordset($1::jsonb) as x(id uuid, context_id uuid, message jsonb)`, [JSON.stringify(rows)]);
    queue.addBulk(rows.map((r) => ({ name: 'run', data: { id: r.id }, opts: { jobId: r.id, removeOnComplete: { count: 1000, age: 3600 } } })))
      .catch((err) => console.error(err));
    return rows.map(() => undefined);
  });
  const app = new Koa();
  app.use(async (ctx) => {
    if (ctx.method !== 'POST') {
      ctx.body = 'ready';
      return;
    }
    const chunks: Buffer[] = [];
    for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
    const request = JSON.parse(Buffer.concat(chunks).toString());
    const message = request.params.message;
    const task = { kind: 'task', id: randomUUID(), contextId: randomUUID(), status: { state: 'submitted', timestamp: new Date().toISOString() }, history: [message] };
    await inserts.execute({ id: task.id, context_id: task.contextId, message });
    ctx.body = { jsonrpc: '2.0', id: request.id, result: task };
  });
  await queue.waitUntilReady();
  app.listen(Number(process.env.PORT), '127.0.0.1');
} else {
  const concurrency = Number(process.env.AGENT_CONCURRENCY ?? 200);
  // The echo is built from the stored message.
  const completions = new StatementBatcher(async (runs: { id: string; started_at: Date; message_id: string }[]) => {
    await pool.query(`update floor_tasks t set status = 'completed', started_at = x.started_at, done_at = now(),
        reply = jsonb_build_object('kind', 'message', 'role', 'agent', 'messageId', x.message_id,
          'parts', jsonb_build_array(jsonb_build_object('kind', 'text', 'text', 'Echo: ' || coalesce(t.message->'parts'->0->>'text', ''))))
      from jsonb_to_recordset($1::jsonb) as x(id uuid, started_at timestamptz, message_id text) where t.id = x.id`, [JSON.stringify(runs)]);
    return runs.map(() => undefined);
  });
  const worker = new Worker(FLOOR_QUEUE, async (job) => {
    await completions.execute({ id: job.data.id, started_at: new Date(), message_id: randomUUID() });
  }, { prefix, connection: createRedis(redisUrl, 'worker'), concurrency });
  worker.on('error', (err) => console.error(err));
}
