import type { Knex } from 'knex';

// A task's artifact updates (A2A tasks/get and streams' first task, a push snapshot at each status
// update, a remote agent's run) were found on (task_id, seq) by reading every item of the task and
// dropping those of other types: a task that reports progress 50,000 times read 50,000 rows for each
// tasks/get (18 ms, 1,342 buffers, for 2,000 artifacts) and for each of its push deliveries, so
// delivering such a task's updates took time quadratic in their number. With this index, the
// artifact updates alone (3 ms). Partial: other items (every message and status update) write no
// entry. The planner uses it only for queries naming its predicate as written here
// (`event_payload->>'type' = 'artifact-update'`). Built in the release's transaction: writes to
// timeline_items wait while it is built, a read of the table (70 ms at 450,000 items).
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`create index timeline_items_artifact_updates on timeline_items (task_id, seq) where event_payload->>'type' = 'artifact-update'`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists timeline_items_artifact_updates');
}
