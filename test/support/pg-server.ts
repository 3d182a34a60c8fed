/**
 * Making and dropping databases on a PostgreSQL server, for the tests (test/support/postgres.ts) and the fleet
 * benchmark (bench/support/fleet-cloud.ts). Free of vitest, so that a benchmark can import it.
 */
import pg from 'pg';

/** A name as an SQL identifier. */
export const quoteIdent = (name: string) => `"${name.replace(/"/g, '""')}"`;

/** The URL of another database on the same server, with the same user and options. */
export function databaseUrl(serverUrl: string, database: string): string {
  const u = new URL(serverUrl);
  u.pathname = `/${encodeURIComponent(database)}`;
  return u.toString();
}

/** Runs `work` on one connection to the database of `serverUrl`. */
export async function onServer<T>(serverUrl: string, work: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: serverUrl, connectionTimeoutMillis: 10_000 });
  client.on('error', () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/**
 * Drops the database `name` through `c`, a connection to another database of its server. A pool's end() answers
 * before its connections have closed: they get a moment to close by themselves, as terminating one that is closing
 * makes its pool emit an error (uncaught where the pool has no listener). Connections still open after that (left
 * by the code under test) would make DROP DATABASE fail: they are terminated first.
 */
export async function dropDatabase(c: pg.Client, name: string): Promise<void> {
  for (let wait = 0; wait < 40; wait++) {
    const open = await c.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1', [
      name,
    ]);
    if (open.rows[0]!.n === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  for (let attempt = 0; ; attempt++) {
    await c.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1', [name]);
    try {
      await c.query(`DROP DATABASE IF EXISTS ${quoteIdent(name)}`);
      return;
    } catch (err) {
      // 55006: still being accessed (a connection came in meanwhile).
      if ((err as { code?: string }).code !== '55006' || attempt >= 20) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
