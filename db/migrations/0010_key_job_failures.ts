import type { Knex } from 'knex';

// Every row a key job failed on, without the bound `key_jobs.errors` has (its first 1,000, for
// people): a DEK migration's sweeps leave these out, however many there are.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('key_job_failures', (t) => {
    t.uuid('job_id').notNullable().references('id').inTable('key_jobs').onDelete('CASCADE');
    t.text('item_id').notNullable();
    t.primary(['job_id', 'item_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('key_job_failures');
}
