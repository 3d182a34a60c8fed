/**
 * The bridge's PostgreSQL schema and its migrations (bridge/store/postgres/), against a real server in a database
 * made for this file: migrations apply on an empty database, once; two runs at once do not both migrate; a newer
 * database is refused; a failing migration leaves the versions before it. And the schema is SQLite's: tables,
 * columns with their types, keys, constraints and indexes read from both catalogs must match, so that a migration
 * added to one engine and not the other fails here.
 */
import Database from 'better-sqlite3';
import type pg from 'pg';
import { beforeEach, describe, expect, it } from 'vitest';
import { createLogger } from '../../lib/log.js';
import { SchemaTooNewError, migrate } from '../../lib/sqlite.js';
import { MIGRATION_LOCK_KEY, migratePostgres, postgresSchemaVersion } from '../../bridge/store/postgres/migrate.js';
import { openPostgres } from '../../bridge/store/postgres/pool.js';
import { BOOLEAN_COLUMNS, POSTGRES_MIGRATIONS, type PgMigration } from '../../bridge/store/postgres/schema.js';
import { BRIDGE_MIGRATIONS } from '../../bridge/store/sqlite.js';
import { LogSink } from '../support/agent.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';
import { until } from '../support/wait.js';

const N = POSTGRES_MIGRATIONS.length;

function logger() {
  const sink = new LogSink();
  return { sink, log: createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink }) };
}

/** One table of a catalog, in terms both engines share (PostgreSQL's types and spelling). */
interface Table {
  /** name: type, NOT NULL, default, identity, collation. */
  columns: Record<string, string>;
  primaryKey: string[];
  unique: string[];
  foreignKeys: string[];
  /** Indexes made by CREATE INDEX: name, columns, unique, partial. */
  indexes: string[];
  checks: number;
}

const column = (c: { type: string; notNull: boolean; dflt: string | null; identity: boolean; collation: string }) =>
  [c.type, c.notNull ? 'not null' : 'null', `default ${c.dflt ?? 'none'}`, c.identity ? 'identity' : '', c.collation]
    .filter(Boolean)
    .join(' ');

/** SQLite's catalog after every migration, with each column's type as PostgreSQL is to have it. */
function sqliteCatalog(): Record<string, Table> {
  const db = new Database(':memory:');
  try {
    migrate(db, BRIDGE_MIGRATIONS);
    const out: Record<string, Table> = {};
    const tables = db
      .prepare<[], { name: string; sql: string }>(
        "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
      )
      .all();
    for (const { name: t, sql } of tables) {
      const withoutRowid = db.prepare<[string], { wr: number }>('SELECT wr FROM pragma_table_list(?)').get(t)!.wr;
      const cols = db
        .prepare<[string], { name: string; type: string; notnull: number; dflt_value: string | null; pk: number }>(
          'SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?)',
        )
        .all(t);
      const pk = cols.filter((c) => c.pk > 0).sort((a, b) => a.pk - b.pk);
      const rowidAlias = withoutRowid === 0 && pk.length === 1 && pk[0]!.type === 'INTEGER' ? pk[0]!.name : undefined;
      const columns: Record<string, string> = {};
      for (const c of cols) {
        const flag = BOOLEAN_COLUMNS[t]?.includes(c.name) === true;
        const type = { INTEGER: flag ? 'boolean' : 'bigint', TEXT: 'text', BLOB: 'bytea' }[c.type];
        if (type === undefined) throw new Error(`${t}.${c.name}: SQLite type ${c.type} has no PostgreSQL mapping`);
        const dflt =
          flag && c.dflt_value !== null ? ({ '0': 'false', '1': 'true' }[c.dflt_value] ?? '?') : c.dflt_value;
        columns[c.name] = column({
          type,
          // SQLite lets a PRIMARY KEY column of a rowid table hold NULL; PostgreSQL does not, nor does the code.
          notNull: c.notnull === 1 || c.pk > 0,
          dflt,
          identity: c.name === rowidAlias,
          collation: type === 'text' ? 'C' : '',
        });
      }
      const indexCols = (index: string) =>
        db
          .prepare<[string], { name: string }>('SELECT name FROM pragma_index_info(?) ORDER BY seqno')
          .all(index)
          .map((r) => r.name);
      const indexList = db
        .prepare<[string], { name: string; unique: number; origin: string; partial: number }>(
          'SELECT name, "unique", origin, partial FROM pragma_index_list(?)',
        )
        .all(t);
      out[t] = {
        columns,
        primaryKey: pk.map((c) => c.name),
        unique: indexList
          .filter((i) => i.origin === 'u')
          .map((i) => indexCols(i.name).join(', '))
          .sort(),
        foreignKeys: db
          .prepare<[string], { table: string; from: string; to: string; on_delete: string }>(
            'SELECT "table", "from", "to", on_delete FROM pragma_foreign_key_list(?)',
          )
          .all(t)
          .map((f) => `${f.from} -> ${f.table} (${f.to}) on delete ${f.on_delete.toLowerCase()}`)
          .sort(),
        indexes: indexList
          .filter((i) => i.origin === 'c')
          .map(
            (i) =>
              `${i.name} (${indexCols(i.name).join(', ')})${i.unique ? ' unique' : ''}${i.partial ? ' partial' : ''}`,
          )
          .sort(),
        checks: [...sql.matchAll(/\bCHECK\s*\(/gi)].length,
      };
    }
    return out;
  } finally {
    db.close();
  }
}

const ON_DELETE: Record<string, string> = {
  a: 'no action',
  r: 'restrict',
  c: 'cascade',
  n: 'set null',
  d: 'set default',
};

/**
 * Tables only PostgreSQL has, left out of the comparison: `rate_limits` holds the attempt counts the bridges share
 * (migration 2); SQLite's single bridge keeps its limits in memory, so SQLite has no such table.
 */
const POSTGRES_ONLY = ['rate_limits'];

/** The catalog of the PostgreSQL database, but for the table of versions and {@link POSTGRES_ONLY}. */
async function postgresCatalog(pool: pg.Pool): Promise<Record<string, Table>> {
  const out: Record<string, Table> = {};
  const tables = await pool.query<{ name: string }>(
    `SELECT table_name AS name FROM information_schema.tables
      WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name <> 'schema_migrations'
        AND NOT (table_name = ANY ($1))
      ORDER BY table_name`,
    [POSTGRES_ONLY],
  );
  /** The names of a table's columns given by number, in their order. */
  const cols = (keys: string, rel: string) =>
    `array(SELECT a.attname::text FROM unnest(${keys}) WITH ORDINALITY k(n, o)
             JOIN pg_attribute a ON a.attrelid = ${rel} AND a.attnum = k.n ORDER BY k.o)`;
  for (const { name: t } of tables.rows) {
    const columns: Record<string, string> = {};
    const c = await pool.query<{
      name: string;
      type: string;
      nullable: string;
      dflt: string | null;
      identity: string;
      collation: string | null;
    }>(
      `SELECT column_name AS name, data_type AS type, is_nullable AS nullable, column_default AS dflt,
              is_identity AS identity, collation_name AS collation
         FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1
        ORDER BY ordinal_position`,
      [t],
    );
    for (const r of c.rows) {
      columns[r.name] = column({
        type: r.type,
        notNull: r.nullable === 'NO',
        // '{}'::text is '{}'.
        dflt: r.dflt === null ? null : r.dflt.replace(/::[a-z ]+$/, ''),
        identity: r.identity === 'YES',
        collation: r.collation ?? '',
      });
    }
    const constraints = await pool.query<{ type: string; cols: string[]; ref: string; refcols: string[]; del: string }>(
      `SELECT c.contype AS type, ${cols('c.conkey', 'c.conrelid')} AS cols,
              c.confrelid::regclass::text AS ref, ${cols('c.confkey', 'c.confrelid')} AS refcols, c.confdeltype AS del
         FROM pg_constraint c WHERE c.conrelid = $1::regclass`,
      [t],
    );
    const of = (type: string) => constraints.rows.filter((r) => r.type === type);
    const indexes = await pool.query<{ name: string; cols: string[]; unique: boolean; partial: boolean }>(
      `SELECT i.relname AS name, ${cols('x.indkey::int2[]', 'x.indrelid')} AS cols, x.indisunique AS unique,
              x.indpred IS NOT NULL AS partial
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = $1::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid AND c.conrelid = x.indrelid)`,
      [t],
    );
    out[t] = {
      columns,
      primaryKey: of('p')[0]?.cols ?? [],
      unique: of('u')
        .map((r) => r.cols.join(', '))
        .sort(),
      foreignKeys: of('f')
        .map((r) => `${r.cols.join(', ')} -> ${r.ref} (${r.refcols.join(', ')}) on delete ${ON_DELETE[r.del]}`)
        .sort(),
      indexes: indexes.rows
        .map((i) => `${i.name} (${i.cols.join(', ')})${i.unique ? ' unique' : ''}${i.partial ? ' partial' : ''}`)
        .sort(),
      checks: of('c').length,
    };
  }
  return out;
}

describe.skipIf(await missingPostgres())('the PostgreSQL schema', () => {
  const db = usePostgres();
  beforeEach(() => db.reset());

  /** Whether the migration lock is free: no run left it taken. */
  const lockIsFree = async () => {
    const client = await db.pool.connect();
    try {
      const r = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1) AS ok', [MIGRATION_LOCK_KEY]);
      if (r.rows[0]!.ok) await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
      return r.rows[0]!.ok;
    } finally {
      client.release();
    }
  };

  const versions = async () =>
    (await db.pool.query<{ version: number; name: string }>('SELECT version, name FROM schema_migrations ORDER BY 1'))
      .rows;

  it('applies every migration to an empty database, and a second run does nothing', async () => {
    const { sink, log } = logger();
    expect(await postgresSchemaVersion(db.pool)).toBe(0);
    expect(await migratePostgres(db.pool, { log })).toEqual({ before: 0, after: N });
    expect(await postgresSchemaVersion(db.pool)).toBe(N);
    expect(await versions()).toEqual(POSTGRES_MIGRATIONS.map((m, i) => ({ version: i + 1, name: m.name })));
    expect(sink.events('postgres.migrated')).toMatchObject([{ level: 'info', from: 0, to: N }]);

    expect(await migratePostgres(db.pool, { log })).toEqual({ before: N, after: N });
    expect(await versions()).toHaveLength(N);
    expect(sink.events('postgres.migrated')).toHaveLength(1);
    expect(await lockIsFree()).toBe(true);
  });

  it('two bridges migrating at once: one migrates, the other waits for it and finds the work done', async () => {
    // Held here until both are waiting for it, so that they surely meet.
    const holder = await db.pool.connect();
    try {
      await holder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
      const a = logger();
      const b = logger();
      const poolA = await openPostgres(db.url, a.log, { poolSize: 2 });
      const poolB = await openPostgres(db.url, b.log, { poolSize: 2 });
      try {
        const runs = [migratePostgres(poolA, { log: a.log }), migratePostgres(poolB, { log: b.log })];
        await until(async () => {
          const r = await db.pool.query<{ n: number }>(
            "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1",
            [MIGRATION_LOCK_KEY],
          );
          return r.rows[0]!.n === 2;
        }, 'both runs waiting for the migration lock');
        expect(a.sink.events('postgres.migrate_waiting')).toHaveLength(1);
        expect(b.sink.events('postgres.migrate_waiting')).toHaveLength(1);
        await holder.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
        const outcomes = await Promise.all(runs);
        expect(outcomes.map((o) => o.before).sort()).toEqual([0, N]);
        expect(outcomes.map((o) => o.after)).toEqual([N, N]);
        expect([...a.sink.events('postgres.migrated'), ...b.sink.events('postgres.migrated')]).toHaveLength(1);
        expect(await versions()).toHaveLength(N);
      } finally {
        await poolA.end();
        await poolB.end();
      }
    } finally {
      holder.release();
    }
  });

  it('refuses a database that a newer program migrated, and changes nothing in it', async () => {
    await migratePostgres(db.pool);
    await db.pool.query("INSERT INTO schema_migrations (version, name) VALUES ($1, 'from the future')", [N + 1]);
    const err = await migratePostgres(db.pool).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SchemaTooNewError);
    expect((err as Error).message).toBe(
      `PostgreSQL schema version ${N + 1} is newer than this program knows (${N}); refusing to run: ` +
        'use a devcloud-bridge at least as new as the one that migrated it',
    );
    expect(await postgresSchemaVersion(db.pool)).toBe(N + 1);
    expect(await lockIsFree()).toBe(true);
  });

  it('a migration that fails is rolled back whole, and the versions before it stay', async () => {
    const broken: PgMigration = {
      name: 'broken',
      up: async (client) => {
        await client.query('CREATE TABLE half_done (x BIGINT)');
        await client.query('SELECT 1 / 0');
      },
    };
    const err = await migratePostgres(db.pool, { migrations: [...POSTGRES_MIGRATIONS, broken] }).catch(
      (e: unknown) => e,
    );
    expect((err as Error).message).toBe(`PostgreSQL migration ${N + 1} (broken) failed: division by zero`);
    expect(await postgresSchemaVersion(db.pool)).toBe(N);
    const left = await db.pool.query("SELECT to_regclass('half_done') AS t");
    expect(left.rows[0]).toEqual({ t: null });
    // The connection went back to the pool in a clean state: the next run works on it.
    expect(await migratePostgres(db.pool)).toEqual({ before: N, after: N });
  });

  it('has the tables, columns, keys, constraints and indexes of the SQLite schema', async () => {
    await migratePostgres(db.pool);
    const sqlite = sqliteCatalog();
    const postgres = await postgresCatalog(db.pool);
    // The guard is only as good as what it reads: both sides must see the whole schema.
    expect(Object.keys(sqlite)).toHaveLength(15);
    expect(sqlite.vars!.primaryKey).toEqual(['device_id', 'type', 'name']);
    expect(sqlite.users!.columns.id).toBe('bigint not null default none identity');
    expect(sqlite.fw_jobs!.indexes).toEqual(['fw_jobs_open (device_id) unique partial']);
    expect(postgres).toEqual(sqlite);
    // The table left out is there, unlogged (its counts may go in a crash).
    const only = await db.pool.query<{ name: string; persistence: string }>(
      "SELECT relname AS name, relpersistence AS persistence FROM pg_class WHERE relname = ANY ($1) AND relkind = 'r'",
      [POSTGRES_ONLY],
    );
    expect(only.rows).toEqual([{ name: 'rate_limits', persistence: 'u' }]);
  });

  it('keeps times and ids past 32 bits, values as bytes, and orders text by bytes as SQLite does', async () => {
    await migratePostgres(db.pool);
    const t = 4_102_444_800_000; // 2100-01-01
    await db.pool.query('INSERT INTO devices (id, enrolled_at) VALUES ($1, $2)', ['d1', t]);
    for (const name of ['b', 'B', 'a', 'é', '_'])
      await db.pool.query(
        "INSERT INTO vars (device_id, type, name, value, time, origin) VALUES ('d1', 'd', $1, $2, $3, 'device')",
        [name, Buffer.from([0, 255, 1]), t],
      );
    const r = await db.pool.query<{ name: string; value: Buffer; time: string }>(
      "SELECT name, value, time FROM vars WHERE device_id = 'd1' ORDER BY name",
    );
    expect(r.rows.map((x) => x.name)).toEqual(['B', '_', 'a', 'b', 'é']);
    expect(r.rows[0]!.value).toEqual(Buffer.from([0, 255, 1]));
    expect(Number(r.rows[0]!.time)).toBe(t);
    const history = await db.pool.query<{ id: string }>(
      "INSERT INTO history (device_id, type, name, by, timestamp) VALUES ('d1', 'd', 'a', 'device', $1) RETURNING id",
      [t],
    );
    expect(history.rows[0]!.id).toBe('1');
  });
});
