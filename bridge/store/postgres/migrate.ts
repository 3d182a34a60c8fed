/**
 * Applies the PostgreSQL migrations (docs/scaling.md, "Migrations"): the versions applied are rows of
 * `schema_migrations`; each migration runs in its own transaction with the row that records it; and an advisory
 * lock, held for the whole run, makes a second bridge (or `devcloud-bridge migrate`) that starts meanwhile wait,
 * then find the work done. A database migrated by a newer program is refused.
 */
import type { ClientBase, Pool, PoolClient } from 'pg';
import type { Logger } from '../../../lib/log.js';
import { SchemaTooNewError } from '../../../lib/sqlite.js';
import { POSTGRES_MIGRATIONS, type PgMigration } from './schema.js';

/** The key of the advisory lock held while migrating: "devc" in ASCII. Advisory locks are per database. */
export const MIGRATION_LOCK_KEY = 0x64657663;

export interface MigrationOutcome {
  /** The schema version found, 0 for an empty database. */
  before: number;
  /** The schema version left: the number of migrations this program knows. */
  after: number;
}

export interface MigrateOptions {
  /** Default: the bridge's schema ({@link POSTGRES_MIGRATIONS}). */
  migrations?: readonly PgMigration[];
  log?: Logger;
}

const CREATE_VERSIONS = `
  CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY CHECK (version > 0),
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
  )`;

/** The schema version of the database: the highest migration recorded, 0 when none (or no table) is there. */
export async function postgresSchemaVersion(db: Pool | ClientBase): Promise<number> {
  const table = await db.query<{ t: string | null }>("SELECT to_regclass('schema_migrations')::text AS t");
  if (table.rows[0]?.t === null || table.rows[0]?.t === undefined) return 0;
  const max = await db.query<{ v: number | null }>('SELECT max(version) AS v FROM schema_migrations');
  return max.rows[0]?.v ?? 0;
}

/**
 * Brings the database to the newest version this program knows, and says from which version. Rejects with
 * {@link SchemaTooNewError} when the database is newer, and with the failing migration's error (its work rolled
 * back, the versions before it kept) when one fails.
 */
export async function migratePostgres(pool: Pool, options: MigrateOptions = {}): Promise<MigrationOutcome> {
  const migrations = options.migrations ?? POSTGRES_MIGRATIONS;
  const log = options.log;
  const client = await pool.connect();
  // A connection left in an unknown state is closed rather than given back to the pool.
  let broken: Error | undefined;
  // A checked-out client whose connection breaks emits `error`, which the pool listens to only while it is idle.
  const onError = (err: Error) => {
    broken ??= err;
  };
  client.on('error', onError);
  try {
    const got = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1) AS ok', [MIGRATION_LOCK_KEY]);
    if (got.rows[0]?.ok !== true) {
      log?.info({ event: 'postgres.migrate_waiting' });
      await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
    }
    try {
      return await migrateLocked(client, migrations, log);
    } finally {
      try {
        await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
      } catch (err) {
        // Closing the connection releases the lock.
        broken = err instanceof Error ? err : new Error(String(err));
      }
    }
  } finally {
    client.removeListener('error', onError);
    client.release(broken);
  }
}

async function migrateLocked(
  client: PoolClient,
  migrations: readonly PgMigration[],
  log: Logger | undefined,
): Promise<MigrationOutcome> {
  await client.query(CREATE_VERSIONS);
  const before = await postgresSchemaVersion(client);
  if (before > migrations.length) {
    throw new SchemaTooNewError(
      `PostgreSQL schema version ${before} is newer than this program knows (${migrations.length}); refusing to run: ` +
        'use a devcloud-bridge at least as new as the one that migrated it',
    );
  }
  for (let v = before; v < migrations.length; v++) {
    const m = migrations[v]!;
    await client.query('BEGIN');
    try {
      await m.up(client);
      await client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [v + 1, m.name]);
      await client.query('COMMIT');
    } catch (err) {
      // A connection that cannot even roll back is closed by the caller: its unlock fails too.
      await client.query('ROLLBACK').catch(() => undefined);
      throw new Error(
        `PostgreSQL migration ${v + 1} (${m.name}) failed: ${err instanceof Error ? err.message : String(err)}`,
        { cause: err },
      );
    }
  }
  if (migrations.length > before) log?.info({ event: 'postgres.migrated', from: before, to: migrations.length });
  return { before, after: migrations.length };
}
