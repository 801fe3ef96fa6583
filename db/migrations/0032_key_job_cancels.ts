import type { Knex } from 'knex';

// A cancel asked of a key job while a batch of it holds its row: recorded here without touching
// that row (no foreign key, whose check would wait for the batch), and applied by whichever step
// takes the row next (lockKeyJob, domain/crypto/key-jobs.ts).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('key_job_cancels', (t) => {
    t.uuid('job_id').primary();
    t.timestamp('requested_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('key_job_cancels');
}
