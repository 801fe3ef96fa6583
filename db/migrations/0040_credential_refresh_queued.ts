import type { Knex } from 'knex';

// The credential refresh scan marks each credential it queues with how long its refresh may take
// (refresh_queued_until) and skips it until then: credentials whose refreshes wait out a provider's
// outage stayed the earliest due, and more of them than a scan takes kept every other credential
// from being queued. The scan's index holds the time a credential is next due for the scan, the
// later of its due time and its mark (greatest ignores a null), so that its range holds only those
// the scan takes, the earliest first, however many are marked; it replaces the index of
// next_rotation_time (0014), which only the scan read. Built in the release's transaction, as every
// migration is: writes to bridge_credentials wait while it is built, a read of the table.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('alter table bridge_credentials add column refresh_queued_until timestamptz');
  await knex.raw(`create index bridge_credentials_user_refresh_due on bridge_credentials ((greatest(next_rotation_time, refresh_queued_until)))
    where kind = 'user' and next_rotation_time is not null`);
  await knex.raw('drop index if exists bridge_credentials_user_rotation');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`create index if not exists bridge_credentials_user_rotation on bridge_credentials (next_rotation_time) where kind = 'user'`);
  await knex.raw('drop index if exists bridge_credentials_user_refresh_due');
  await knex.raw('alter table bridge_credentials drop column if exists refresh_queued_until');
}
