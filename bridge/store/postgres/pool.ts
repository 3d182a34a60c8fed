/**
 * The connection pool to the bridge's PostgreSQL database (docs/scaling.md): `pg` (node-postgres), one pool per
 * process. The URL is never logged with its user name or password (lib/url.ts).
 */
import pg from 'pg';
import type { Logger } from '../../../lib/log.js';
import { safeUrl } from '../../../lib/url.js';

/** How long making a connection may take before it fails, ms. */
export const CONNECT_TIMEOUT_MS = 10_000;

export interface PostgresOptions {
  /** Connections the pool opens at most (`database.poolSize`). */
  poolSize?: number;
  connectTimeoutMs?: number;
  /** How column values are read; the store's pool reads BIGINT as numbers (store/postgres/conn.ts). */
  types?: pg.CustomTypesConfig;
}

/**
 * A pool on `url`, once one connection to it worked. Rejects, naming the server (not the password) and what went
 * wrong, when none can be made. An error on an idle connection (the server restarted, the connection was killed)
 * is logged and the connection dropped; the pool opens another when it needs one. The caller ends the pool.
 */
export async function openPostgres(url: string, log: Logger, options: PostgresOptions = {}): Promise<pg.Pool> {
  const poolSize = options.poolSize ?? 10;
  const pool = new pg.Pool({
    connectionString: url,
    max: poolSize,
    connectionTimeoutMillis: options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS,
    application_name: 'devcloud-bridge',
    ...(options.types && { types: options.types }),
  });
  pool.on('error', (err) => log.warn({ event: 'postgres.connection_failed', url: safeUrl(url), err: err.message }));
  let serverVersion: string | undefined;
  try {
    const r = await pool.query<{ server_version: string }>('SHOW server_version');
    serverVersion = r.rows[0]?.server_version;
  } catch (err) {
    await pool.end().catch(() => undefined);
    throw new Error(`cannot reach the PostgreSQL database at ${safeUrl(url)}: ${reason(err)}`, { cause: err });
  }
  log.info({ event: 'postgres.connected', url: safeUrl(url), serverVersion, poolSize });
  return pool;
}

/** What went wrong, in words: a refused connection to a name with several addresses is an `AggregateError` without a message. */
function reason(err: unknown): string {
  if (err instanceof AggregateError && err.message === '') return [...new Set(err.errors.map(reason))].join('; ');
  if (err instanceof Error) return err.message || ((err as NodeJS.ErrnoException).code ?? err.name);
  return String(err);
}
