// A second baseline of `npm run bench:reads`: a bare Koa server with a pg pool of the API's size that
// answers GET /task/{id} with two statements (the task row, its first messages, as the API's get-task
// read them before it read them in one), no key check, no validation, no middleware. Between hello and it lies what Postgres
// costs; between it and the API, what our service code costs.
import Koa from 'koa';
import pg from 'pg';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 20 });
const app = new Koa();
app.use(async (ctx) => {
  const id = /^\/task\/([0-9a-f-]{36})$/.exec(ctx.path)?.[1];
  if (!id) {
    ctx.body = 'ready';
    return;
  }
  const task = await pool.query('select * from tasks where id = $1', [id]);
  const messages = await pool.query(`select id, client_message_id, seq, task_id, role, parts, reference_task_ids, extensions, metadata, created_at
    from messages where task_id = $1 order by seq limit 101`, [id]);
  ctx.body = { task: task.rows[0], messages: messages.rows };
});
app.listen(Number(process.env.PORT), '127.0.0.1');
