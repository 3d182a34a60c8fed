/**
 * A PostgreSQL database of its own for a test file, on the machine's server: `DEVCLOUD_TEST_DATABASE_URL`, by
 * default `postgres://postgres@127.0.0.1:5432/postgres` (Debian's `postgresql` with trust for local TCP, as
 * `.ci/run` sets it up). That URL is only for making and dropping databases; the tests work in one made for them.
 *
 *   describe.skipIf(await missingPostgres())('the PostgreSQL schema', () => {
 *     const db = usePostgres();       // made before the file's tests, dropped after them
 *     beforeEach(() => db.reset());   // when each test wants it empty
 *     it('...', async () => { await db.pool.query('SELECT 1'); openPostgres(db.url, ...); });
 *   });
 *
 * When no server answers, one line names what to install and how to start it, and those tests are skipped; under
 * `CI=true` the file fails instead (test/support/system.ts, {@link skipOrFail}).
 */
import { randomBytes } from 'node:crypto';
import { basename } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, expect } from 'vitest';
import { databaseUrl, dropDatabase, onServer as onServerAt, quoteIdent as quote } from './pg-server.js';
import { skipOrFail } from './system.js';

export const DEFAULT_TEST_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';

/** The server's URL for making and dropping test databases. */
export function testServerUrl(): string {
  return process.env.DEVCLOUD_TEST_DATABASE_URL || DEFAULT_TEST_DATABASE_URL;
}

/** The probe's answer per server URL: undefined when it answered, else why not. Asked once per worker. */
const probes = new Map<string, Promise<string | undefined>>();

/** Why the test server cannot be used, as a phrase for {@link skipOrFail}; undefined when it answers. */
export function postgresLacking(): Promise<string | undefined> {
  const url = testServerUrl();
  let probe = probes.get(url);
  if (!probe) {
    probe = (async () => {
      const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 });
      client.on('error', () => undefined);
      try {
        await client.connect();
        await client.query('SELECT 1');
        return undefined;
      } catch (err) {
        const why = err instanceof Error ? err.message || ((err as NodeJS.ErrnoException).code ?? err.name) : err;
        return (
          `needs a PostgreSQL server at ${url.replace(/:[^:@/]*@/, ':***@')} (${String(why)}): ` +
          'apt-get install postgresql, then service postgresql start (or pg_ctlcluster <version> main start), ' +
          'or set DEVCLOUD_TEST_DATABASE_URL'
        );
      } finally {
        await client.end().catch(() => undefined);
      }
    })();
    probes.set(url, probe);
  }
  return probe;
}

/**
 * For `describe.skipIf(await missingPostgres())`: false when the server answers; otherwise the line of
 * {@link skipOrFail} (an error under `CI=true`), and true.
 */
export async function missingPostgres(): Promise<boolean> {
  const why = await postgresLacking();
  if (why === undefined) return false;
  skipOrFail(why);
  return true;
}

/** Runs `work` on one connection to the test server's own database. */
const onServer = <T>(work: (c: pg.Client) => Promise<T>): Promise<T> => onServerAt(testServerUrl(), work);

export interface FreshDatabase {
  /** Its name: `devcloud_test_`, the test file's name, and random characters. */
  readonly name: string;
  /** Its URL, for the code under test (`openPostgres`, `--database-url`). */
  readonly url: string;
  /** A pool on it for the test's own queries, ended by {@link drop}. */
  readonly pool: pg.Pool;
  /** Ends the pool, closes every other connection to the database, and drops it. */
  drop(): Promise<void>;
}

export interface FreshDatabaseOptions {
  /**
   * Make it with this ICU locale as its default collation (`en-US`: the linguistic order most servers sort text in),
   * so that a query that sorts or compares text by the database's default rather than by the byte order the schema
   * asks for shows it. A server without ICU (or older than PostgreSQL 15) makes it with its own default.
   */
  icuLocale?: string;
}

/** Makes an empty database on the test server. */
export async function freshDatabase(label?: string, options: FreshDatabaseOptions = {}): Promise<FreshDatabase> {
  const testPath = expect.getState().testPath;
  const base = (label ?? (testPath ? basename(testPath).replace(/\.test\.ts$/, '') : 'test'))
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '_')
    .slice(0, 30);
  const name = `devcloud_test_${base}_${randomBytes(4).toString('hex')}`;
  await onServer(async (c) => {
    if (options.icuLocale !== undefined) {
      try {
        const locale = `'${options.icuLocale.replace(/'/g, "''")}'`;
        await c.query(`CREATE DATABASE ${quote(name)} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE ${locale}`);
        return;
      } catch (err) {
        // 42601: no LOCALE_PROVIDER before PostgreSQL 15; 0A000: built without ICU; 42704: no such locale.
        if (!['42601', '0A000', '42704'].includes((err as { code?: string }).code ?? '')) throw err;
      }
    }
    await c.query(`CREATE DATABASE ${quote(name)}`);
  });
  const url = databaseUrl(testServerUrl(), name);
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  // A connection closed under the pool (the drop, a test that kills backends) is dropped from it, not thrown.
  pool.on('error', () => undefined);
  let dropped = false;
  return {
    name,
    url,
    pool,
    async drop() {
      if (dropped) return;
      dropped = true;
      await pool.end().catch(() => undefined);
      await onServer((c) => dropDatabase(c, name));
    },
  };
}

export interface PostgresHandle {
  readonly name: string;
  readonly url: string;
  readonly pool: pg.Pool;
  /** Empties the database: drops the schema `public` with everything in it, and makes it again. */
  reset(): Promise<void>;
}

/**
 * A database for the tests of the surrounding `describe` (or file): made in `beforeAll`, dropped in `afterAll`.
 * Its fields can be read once the tests run.
 */
export function usePostgres(): PostgresHandle {
  let db: FreshDatabase | undefined;
  beforeAll(async () => {
    db = await freshDatabase();
  });
  afterAll(async () => {
    await db?.drop();
    db = undefined;
  });
  const current = (): FreshDatabase => {
    if (!db) throw new Error('usePostgres(): the database exists only while the tests run');
    return db;
  };
  return {
    get name() {
      return current().name;
    },
    get url() {
      return current().url;
    },
    get pool() {
      return current().pool;
    },
    async reset() {
      await current().pool.query('DROP SCHEMA public CASCADE; CREATE SCHEMA public');
    },
  };
}
