import type { Knex } from 'knex';

// API processes cache resolved keys briefly; a revocation by any path (API, CLI, plain SQL)
// tells them at commit so the key stops working at once.
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    create function api_key_revoked_notify() returns trigger language plpgsql as $$
    begin
      perform pg_notify('api_key_revoked', new.id::text);
      return null;
    end $$`);
  await knex.raw(`
    create trigger api_keys_revoked_notify after update of revoked_at on api_keys
    for each row when (old.revoked_at is null and new.revoked_at is not null)
    execute function api_key_revoked_notify()`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists api_keys_revoked_notify on api_keys');
  await knex.raw('drop function if exists api_key_revoked_notify()');
}
