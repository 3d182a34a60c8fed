/**
 * SQLite with the durability rules of DESIGN section 8: WAL, `synchronous=FULL`, versioned migrations, and
 * group commit so that durability does not cost throughput.
 */
import Database from 'better-sqlite3';
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';

export type Db = Database.Database;

/** Migration N takes the schema from version N to N+1; its index is its number. Never edit a shipped one. */
export type Migration = (db: Db) => void;

export class SchemaTooNewError extends Error {
  override name = 'SchemaTooNewError';
}

export function openDatabase(path: string, migrations: readonly Migration[]): Db {
  mkdirSync(dirname(path), { recursive: true });
  const db = new Database(path);
  try {
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
    db.pragma('foreign_keys = ON');
    db.pragma('busy_timeout = 5000');
    migrate(db, migrations);
  } catch (err) {
    db.close();
    throw err;
  }
  return db;
}

/** Applies the migrations the file has not seen yet, each in its own transaction with the version bump. */
export function migrate(db: Db, migrations: readonly Migration[]): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > migrations.length) {
    throw new SchemaTooNewError(
      `database schema version ${current} is newer than this program knows (${migrations.length}); refusing to run`,
    );
  }
  for (let v = current; v < migrations.length; v++) {
    db.transaction(() => {
      migrations[v]!(db);
      db.pragma(`user_version = ${v + 1}`);
    })();
  }
}

interface Pending<T> {
  work: () => T;
  durable: boolean;
  resolve: (value: T) => void;
  reject: (err: unknown) => void;
}

/** Thrown out of a batch's transaction when one unit's work fails, so that the batch is redone unit by unit. */
class UnitFailed extends Error {}

export interface RunOptions {
  /**
   * `false` for work whose loss costs nothing but a repeat (an acknowledgement stamp): a batch of such work
   * only is committed without fsync. The next durable commit writes it to disk along with its own.
   */
  durable?: boolean;
}

/**
 * Runs units of work in one transaction per turn of the event loop. Each caller's promise resolves after the
 * transaction holding its work has committed (and so, with `synchronous=FULL`, is on disk). Work that throws
 * fails only itself: the batch is then redone with each unit in a savepoint. A failing commit rejects everyone
 * in the batch.
 */
export class GroupCommitter {
  private queue: Pending<unknown>[] = [];
  private scheduled = false;
  private closed = false;
  /** Batches committed, units of work in them, and batches committed without fsync. */
  readonly stats = { commits: 0, units: 0, relaxed: 0 };

  /** Built once: a transaction wrapper and the two pragmas cost more to prepare than to run. */
  private readonly runAll: (batch: Pending<unknown>[]) => Array<{ ok: true; value: unknown }>;
  private readonly relax: Database.Statement;
  private readonly tighten: Database.Statement;

  constructor(private readonly db: Db) {
    this.runAll = db.transaction((batch: Pending<unknown>[]) =>
      batch.map((p) => {
        try {
          return { ok: true as const, value: p.work() };
        } catch (err) {
          throw new UnitFailed('unit failed', { cause: err });
        }
      }),
    );
    this.relax = db.prepare('PRAGMA synchronous = NORMAL');
    this.tighten = db.prepare('PRAGMA synchronous = FULL');
  }

  run<T>(work: () => T, options: RunOptions = {}): Promise<T> {
    if (this.closed) return Promise.reject(new Error('database is closed'));
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ work, durable: options.durable ?? true, resolve, reject } as Pending<unknown>);
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    // A microtask, not a timer: batches form while the event loop is busy, and fake timers do not stop commits.
    queueMicrotask(() => this.flush());
  }

  /** Commits everything queued now. */
  flush(): void {
    this.scheduled = false;
    const batch = this.queue;
    this.queue = [];
    if (batch.length === 0) return;
    const relaxed = batch.every((p) => !p.durable);
    let results: Array<{ ok: true; value: unknown } | { ok: false; err: unknown }>;
    try {
      if (relaxed) this.relax.run();
      try {
        results = this.commitBatch(batch);
      } finally {
        if (relaxed) this.tighten.run();
      }
    } catch (err) {
      for (const p of batch) p.reject(err);
      return;
    }
    this.stats.commits++;
    this.stats.units += batch.length;
    if (relaxed) this.stats.relaxed++;
    batch.forEach((p, i) => {
      const r = results[i]!;
      if (r.ok) p.resolve(r.value);
      else p.reject(r.err);
    });
  }

  private commitBatch(batch: Pending<unknown>[]): Array<{ ok: true; value: unknown } | { ok: false; err: unknown }> {
    // The common case: every unit succeeds, and no savepoint is paid for.
    try {
      return this.runAll(batch);
    } catch (err) {
      if (!(err instanceof UnitFailed)) throw err;
    }
    // Some unit failed and the transaction rolled back: redo the batch, each unit in its own savepoint.
    const results: Array<{ ok: true; value: unknown } | { ok: false; err: unknown }> = [];
    this.db.transaction(() => {
      for (const p of batch) {
        this.db.exec('SAVEPOINT unit');
        try {
          results.push({ ok: true, value: p.work() });
          this.db.exec('RELEASE unit');
        } catch (err) {
          this.db.exec('ROLLBACK TO unit');
          this.db.exec('RELEASE unit');
          results.push({ ok: false, err });
        }
      }
    })();
    return results;
  }

  /** Commits what is queued and refuses further work. */
  close(): void {
    this.flush();
    this.closed = true;
  }
}
