import type { Knex } from 'knex';

// A task's message items, as 0035 did for its artifact updates. A push snapshot at each status
// update takes the task's newest messages, and a retried send looks up its message's item: both
// walked back through every item of the task, so a task with one message and 50,000 progress
// updates read 50,000 rows for each delivery of them (quadratic in their number). Partial: status
// and artifact updates write no entry. The planner uses it only for queries naming its predicate as
// written here (`event_payload->>'type' = 'message'`). Built in the release's transaction, as 0035.
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`create index timeline_items_messages on timeline_items (task_id, seq) where event_payload->>'type' = 'message'`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists timeline_items_messages');
}
