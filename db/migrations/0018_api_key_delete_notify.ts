import type { Knex } from 'knex';

// A key deleted with plain SQL instead of revoked must stop working at once too (0005 told of
// revocations only).
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    create or replace function api_key_revoked_notify() returns trigger language plpgsql as $$
    begin
      perform pg_notify('api_key_revoked', (case when tg_op = 'DELETE' then old.id else new.id end)::text);
      return null;
    end $$`);
  await knex.raw(`
    create trigger api_keys_deleted_notify after delete on api_keys
    for each row when (old.revoked_at is null)
    execute function api_key_revoked_notify()`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists api_keys_deleted_notify on api_keys');
  await knex.raw(`
    create or replace function api_key_revoked_notify() returns trigger language plpgsql as $$
    begin
      perform pg_notify('api_key_revoked', new.id::text);
      return null;
    end $$`);
}
