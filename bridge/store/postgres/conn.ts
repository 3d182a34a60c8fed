/**
 * Where the PostgreSQL store's queries go (docs/scaling.md, "The PostgreSQL store"): the pool, each statement then
 * its own transaction, or the one connection of a transaction (`BridgeStore.write`). The repositories take a
 * {@link Conn} and serve both. Every query passes here, which turns a full disk into `StorageFullError` and notes
 * the writes that worked again.
 */
import pg from 'pg';
import { type StorageState, StorageFullError } from '../../../lib/sqlite.js';

/** SQLSTATE `disk_full`: the server could not extend a file of the database. */
export const DISK_FULL = '53100';

const parseBigint = (text: string): number => {
  const n = Number(text);
  if (!Number.isSafeInteger(n)) throw new RangeError(`a BIGINT beyond the integers a number holds exactly: ${text}`);
  return n;
};

/**
 * How the store's pool reads values: BIGINT (times in ms, ids, sizes, `count(*)`) as numbers, as SQLite's are,
 * instead of pg's strings; a value past 2^53 fails the query rather than losing digits. BYTEA is a Buffer and
 * BOOLEAN a boolean already.
 */
const defaultParser = pg.types.getTypeParser as (oid: number, format?: 'text' | 'binary') => unknown;

export const STORE_TYPES: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary'): unknown =>
    oid === (pg.types.builtins.INT8 as number) && format !== 'binary'
      ? parseBigint
      : defaultParser(oid, format)) as pg.CustomTypesConfig['getTypeParser'],
};

/** Whether writes fail for lack of space: refused writes become `StorageFullError`, a write that works clears it. */
export class StorageWatch {
  readonly state: StorageState = { full: false, fullSince: undefined, refused: 0 };

  constructor(
    private readonly onChange: (full: boolean, err?: unknown) => void,
    private readonly now: () => number,
  ) {}

  /** A full disk as `StorageFullError` (counted once), any other error as it is. */
  classify(err: unknown): unknown {
    if (err instanceof StorageFullError) return err;
    if ((err as { code?: unknown } | null)?.code !== DISK_FULL) return err;
    this.state.refused++;
    if (!this.state.full) {
      this.state.full = true;
      this.state.fullSince = this.now();
      this.onChange(true, err);
    }
    return new StorageFullError(err);
  }

  /** A write was committed. */
  wrote(): void {
    if (!this.state.full) return;
    this.state.full = false;
    this.state.fullSince = undefined;
    this.onChange(false);
  }
}

/**
 * Takes the values out of an error the server gave: a violated key's detail names its values (`Key (authcode)=(…)
 * already exists`) and a violated check shows the whole row (a password hash among them), which must not reach a
 * log or an answer. The names of the columns stay.
 */
export function withoutValues(err: unknown): unknown {
  const e = err as { detail?: unknown } | null;
  if (typeof e?.detail !== 'string') return err;
  if (e.detail.startsWith('Failing row contains')) e.detail = 'Failing row contains (values not shown).';
  else e.detail = e.detail.replace(/^(Key \([^)]*\))=\(.*\)/s, '$1=(…)');
  return err;
}

/**
 * The store's statements are few and run often: each is prepared once per connection (a named statement), so that
 * the server parses and plans it once, not at every call. Only reads and writes of rows are; `BEGIN`, `COMMIT` and
 * `SET` go as they are.
 */
const names = new Map<string, string>();
const PREPARED = /^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b/i;

function statement(text: string, values: readonly unknown[] | undefined): pg.QueryConfig {
  const config: pg.QueryConfig = { text, values: values as unknown[] | undefined };
  if (!PREPARED.test(text)) return config;
  let name = names.get(text);
  if (name === undefined) {
    // A bounded set: statements are written in the code, a handful of them built from a few fixed parts.
    if (names.size >= 1000) return config;
    name = `devcloud_${names.size + 1}`;
    names.set(text, name);
  }
  return { ...config, name };
}

/** Whether a statement changed rows (a write that reached the disk, as far as the store can tell). */
const changedRows = (r: pg.QueryResult): boolean =>
  (r.command === 'INSERT' || r.command === 'UPDATE' || r.command === 'DELETE') && (r.rowCount ?? 0) > 0;

/** Where a repository's queries go. */
export interface Conn {
  /** Whether the queries run inside one transaction (`write`, or `atomic`). */
  readonly inTransaction: boolean;
  query<R extends pg.QueryResultRow>(text: string, values?: readonly unknown[]): Promise<pg.QueryResult<R>>;
  /**
   * Runs `work` in one transaction: the one this connection is in, or a new one on a connection of its own, so
   * that a read-compare-write is atomic wherever it is called from (a `SELECT ... FOR UPDATE` holds its lock
   * until the end of the transaction).
   */
  atomic<T>(work: (c: Conn) => Promise<T>): Promise<T>;
  /** Runs `fn` once what was written is committed: now on the pool, after the `COMMIT` in a transaction. */
  afterCommit(fn: () => void): void;
}

/** The pool: each statement is its own transaction. */
export class PoolConn implements Conn {
  readonly inTransaction = false;

  constructor(
    readonly pool: pg.Pool,
    readonly watch: StorageWatch,
  ) {}

  async query<R extends pg.QueryResultRow>(text: string, values?: readonly unknown[]): Promise<pg.QueryResult<R>> {
    let r: pg.QueryResult<R>;
    try {
      r = await this.pool.query<R>(statement(text, values));
    } catch (err) {
      throw this.watch.classify(withoutValues(err));
    }
    if (changedRows(r)) this.watch.wrote();
    return r;
  }

  atomic<T>(work: (c: Conn) => Promise<T>): Promise<T> {
    return transaction(this.pool, this.watch, work, true);
  }

  afterCommit(fn: () => void): void {
    fn();
  }
}

/** The connection of one transaction, for as long as it runs. */
class TxConn implements Conn {
  readonly inTransaction = true;
  /** Whether a statement changed rows. */
  wrote = false;
  private ended = false;
  readonly committed: Array<() => void> = [];

  constructor(
    private readonly client: pg.PoolClient,
    private readonly watch: StorageWatch,
  ) {}

  async query<R extends pg.QueryResultRow>(text: string, values?: readonly unknown[]): Promise<pg.QueryResult<R>> {
    if (this.ended) throw new Error('the store transaction has ended: a call on its `tx` came after `write` returned');
    let r: pg.QueryResult<R>;
    try {
      r = await this.client.query<R>(statement(text, values));
    } catch (err) {
      throw this.watch.classify(withoutValues(err));
    }
    if (changedRows(r)) this.wrote = true;
    return r;
  }

  atomic<T>(work: (c: Conn) => Promise<T>): Promise<T> {
    return work(this);
  }

  afterCommit(fn: () => void): void {
    this.committed.push(fn);
  }

  end(): void {
    this.ended = true;
  }
}

/**
 * Runs `work` in a transaction on a connection of the pool: `BEGIN`, the work, `COMMIT`; a throw rolls it all
 * back. The connection goes back to the pool, or, when even the `ROLLBACK` failed (the connection broke), is
 * released with the error, so that the pool closes it instead of handing it out again. `durable: false` lets the
 * commit return before its WAL is flushed (`synchronous_commit = off`, for this transaction only): a crash of the
 * server may then lose it, never corrupt anything.
 */
export async function transaction<T>(
  pool: pg.Pool,
  watch: StorageWatch,
  work: (c: Conn) => Promise<T>,
  durable: boolean,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await transactionOnce(pool, watch, work, durable);
    } catch (err) {
      if (attempt >= TX_ATTEMPTS || !RETRIED.has((err as { code?: unknown } | null)?.code as string)) throw err;
      // Two bridges locked rows in opposite orders, and the server chose this one to give way: it had written
      // nothing (rolled back whole), so it runs again, after a pause that keeps the two apart.
      await new Promise((resolve) => setTimeout(resolve, 5 + Math.random() * 20 * attempt));
    }
  }
}

/** SQLSTATEs after which a transaction is run again: `deadlock_detected` and `serialization_failure`. */
const RETRIED: ReadonlySet<string> = new Set(['40P01', '40001']);
/** Runs of one unit of work at most. */
const TX_ATTEMPTS = 3;

async function transactionOnce<T>(
  pool: pg.Pool,
  watch: StorageWatch,
  work: (c: Conn) => Promise<T>,
  durable: boolean,
): Promise<T> {
  const client = await pool.connect();
  // A checked-out client whose connection breaks emits `error`; the pool listens only while it is idle.
  let broken: Error | undefined;
  const onError = (err: Error) => {
    broken ??= err;
  };
  client.on('error', onError);
  const release = () => {
    client.removeListener('error', onError);
    client.release(broken);
  };
  const conn = new TxConn(client, watch);
  let value: T;
  try {
    await conn.query('BEGIN');
    if (!durable) await conn.query('SET LOCAL synchronous_commit = off');
    value = await work(conn);
    await conn.query('COMMIT');
  } catch (err) {
    conn.end();
    try {
      await client.query('ROLLBACK');
    } catch (rollbackErr) {
      broken ??= rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
    }
    release();
    throw watch.classify(err);
  }
  conn.end();
  release();
  if (conn.wrote) watch.wrote();
  for (const fn of conn.committed) fn();
  return value;
}
