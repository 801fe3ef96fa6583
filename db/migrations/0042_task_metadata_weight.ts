import type { Knex } from 'knex';

// What a task's metadata weighs once parsed (domain/storable-json.ts parsedWeight), written with the
// task, as migration 0025 does for messages and timeline items: a page of tasks is cut at its real
// weight, not at the most its text could weigh (12 times it: a page ended after 4 tasks of 200 kB
// string metadata). Null for tasks from before, which list-tasks bounds from their text. No default:
// added without rewriting the table.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('alter table tasks add column metadata_weight bigint');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('alter table tasks drop column if exists metadata_weight');
}
