/**
 * SQLite with the durability rules of docs/decisions.md §8: WAL, `synchronous=FULL`, versioned migrations, and
 * group commit so that durability does not cost throughput.
 */
import Database from 'better-sqlite3';
import { mkdirSync, statfsSync } from 'node:fs';
import { dirname } from 'node:path';

export type Db = Database.Database;

/** Migration N takes the schema from version N to N+1; its index is its number. Never edit a shipped one. */
export type Migration = (db: Db) => void;

export class SchemaTooNewError extends Error {
  override name = 'SchemaTooNewError';
}

export interface OpenOptions {
  /**
   * The page size a new database gets (SQLite's default: 4096). A database made with another one is converted
   * once, at open, by a `VACUUM` outside WAL mode; when that cannot be done now (another connection, a full disk)
   * it keeps its page size and the next open tries again. Every WAL commit writes each page it changes whole, plus
   * a 24-byte header, so small rows changed one commit at a time cost less flash with smaller pages
   * (docs/operations.md, "Flash wear").
   */
  pageSize?: number;
  /**
   * The largest database converted to `pageSize` (default 64 MiB): a larger one keeps its page size, since its
   * `VACUUM` would hold up the start (the agent's unit allows 90 s) for a saving a smaller database gets too.
   */
  convertUpToBytes?: number;
  /** Told when a database was converted to `pageSize`: the page size it had, its size and how long it took. */
  onConverted?: (info: { fromPageSize: number; toPageSize: number; bytes: number; ms: number }) => void;
}

const CONVERT_UP_TO_BYTES = 64 * 1024 * 1024;

export function openDatabase(path: string, migrations: readonly Migration[], options: OpenOptions = {}): Db {
  mkdirSync(dirname(path), { recursive: true });
  const db = new Database(path);
  try {
    if (options.pageSize !== undefined) {
      setPageSize(db, options.pageSize, options.convertUpToBytes ?? CONVERT_UP_TO_BYTES, options.onConverted);
    }
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

/**
 * Gives the database `pageSize`: at once when it is new (the page size holds from the first write), by a `VACUUM`
 * in rollback-journal mode when it has another (a crash during it leaves the old database, rolled back from the
 * journal at the next open). Left as it is when the conversion fails or the database is larger than
 * `convertUpToBytes`; `openDatabase` then turns WAL on again.
 */
function setPageSize(
  db: Db,
  pageSize: number,
  convertUpToBytes: number,
  onConverted: OpenOptions['onConverted'],
): void {
  const current = db.pragma('page_size', { simple: true }) as number;
  if (current === pageSize) return;
  const pages = db.pragma('page_count', { simple: true }) as number;
  if (pages * current > convertUpToBytes) return;
  db.pragma(`page_size = ${pageSize}`);
  if (pages === 0) return;
  try {
    // Only out of WAL mode does a VACUUM take a new page size; another connection open makes this fail at once.
    const busy = db.pragma('busy_timeout', { simple: true }) as number;
    db.pragma('busy_timeout = 0');
    try {
      if (db.pragma('journal_mode = DELETE', { simple: true }) !== 'delete') return;
      db.pragma('synchronous = FULL');
      const started = performance.now();
      db.exec('VACUUM');
      if (db.pragma('page_size', { simple: true }) === pageSize) {
        const ms = Math.round(performance.now() - started);
        onConverted?.({ fromPageSize: current, toPageSize: pageSize, bytes: pages * current, ms });
      }
    } finally {
      db.pragma(`busy_timeout = ${busy}`);
    }
  } catch {
    // Kept as it was; tried again at the next open.
  }
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

/**
 * A write refused because the file system holding the database is full (docs/operations.md, "A full disk").
 * Nothing of the refused work was kept; reads go on working, and writes work again once space is freed.
 */
export class StorageFullError extends Error {
  override name = 'StorageFullError';
  constructor(cause: unknown) {
    super('the disk holding the database is full', { cause });
  }
}

/** Below this many free bytes an I/O error of SQLite is taken for a full disk (SQLite does not pass on errno). */
const NEARLY_FULL_BYTES = 256 * 1024;

/** Free bytes for an unprivileged writer on the file system of `path`; undefined when unknown. */
export function freeBytes(path: string): number | undefined {
  try {
    const s = statfsSync(path);
    return s.bavail * s.bsize;
  } catch {
    return undefined;
  }
}

/**
 * Whether an error means that the disk is full: SQLite's `SQLITE_FULL`, a file write's `ENOSPC` or `EDQUOT`, or
 * an SQLite I/O error (`SQLITE_IOERR_WRITE`, `_FSYNC`, `_SHMSIZE`, ...) while the file system of `dir` has next
 * to no space left, which is how SQLite reports an `ENOSPC` from some of its calls.
 */
export function isStorageFull(err: unknown, dir?: string): boolean {
  if (err instanceof StorageFullError) return true;
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return false;
  if (code === 'SQLITE_FULL' || code === 'ENOSPC' || code === 'EDQUOT') return true;
  if (!code.startsWith('SQLITE_IOERR') || dir === undefined) return false;
  const free = freeBytes(dir);
  return free !== undefined && free < NEARLY_FULL_BYTES;
}

/** Whether the last writes failed for lack of space, for health checks and status. */
export interface StorageState {
  full: boolean;
  /** When the first write of the current run of failures failed, ms since the epoch. */
  fullSince: number | undefined;
  /** Writes refused for lack of space since start. */
  refused: number;
}

export interface GroupCommitterOptions {
  /** Called when writes start failing for lack of space (`true`) and when one succeeds again (`false`). */
  onStorageChange?: (full: boolean, err?: unknown) => void;
  now?: () => number;
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
 * What both group committers share: the full-disk bookkeeping (`storage`), and leaving a transaction that a failed
 * commit left open.
 */
abstract class CommitterBase {
  readonly storage: StorageState = { full: false, fullSince: undefined, refused: 0 };
  protected readonly dir: string;
  protected readonly totalChanges: Database.Statement<[], { n: number }>;

  constructor(
    protected readonly db: Db,
    protected readonly options: GroupCommitterOptions,
  ) {
    this.dir = dirname(db.name);
    this.totalChanges = db.prepare('SELECT total_changes() AS n');
  }

  /** A full disk as `StorageFullError`, noted in `storage`; any other error as it is. */
  protected classify(err: unknown): unknown {
    if (!isStorageFull(err, this.dir)) return err;
    this.storage.refused++;
    if (!this.storage.full) this.storageChanged(true, err);
    return err instanceof StorageFullError ? err : new StorageFullError(err);
  }

  protected storageChanged(full: boolean, err?: unknown): void {
    this.storage.full = full;
    this.storage.fullSince = full ? (this.options.now ?? Date.now)() : undefined;
    this.options.onStorageChange?.(full, err);
  }

  /** Batches committed, units of work in them, and batches committed without fsync. */
  readonly stats = { commits: 0, units: 0, relaxed: 0 };

  /** After a batch committed: counts it, notes a recovery from a full disk, and answers each unit. */
  protected settle(
    batch: ReadonlyArray<{ resolve: (value: unknown) => void; reject: (err: unknown) => void }>,
    results: ReadonlyArray<{ ok: true; value: unknown } | { ok: false; err: unknown }>,
    relaxed: boolean,
    changesBefore: number,
  ): void {
    this.stats.commits++;
    this.stats.units += batch.length;
    if (relaxed) this.stats.relaxed++;
    if (this.storage.full && this.totalChanges.get()!.n > changesBefore) this.storageChanged(false);
    batch.forEach((p, i) => {
      const r = results[i]!;
      if (r.ok) p.resolve(r.value);
      else p.reject(this.classify(r.err));
    });
  }

  /** Rolls back what a failed commit may have left open (SQLite keeps some transactions open after an error). */
  protected leaveTransaction(): void {
    if (!this.db.inTransaction) return;
    try {
      this.db.exec('ROLLBACK');
    } catch {
      // rolled back meanwhile
    }
  }
}

/**
 * Runs units of work in one transaction per turn of the event loop. Each caller's promise resolves after the
 * transaction holding its work has committed (and so, with `synchronous=FULL`, is on disk). Work that throws
 * fails only itself: the batch is then redone with each unit in a savepoint. A failing commit rejects everyone
 * in the batch.
 *
 * A full disk rejects with `StorageFullError`. SQLite may have rolled the whole transaction back by itself or
 * left it open; either way the connection is left outside any transaction, so that the next batch starts clean
 * (a batch begun inside a leftover transaction would only make savepoints, and never commit).
 */
export class GroupCommitter extends CommitterBase {
  private queue: Pending<unknown>[] = [];
  private scheduled = false;
  private closed = false;
  /** Built once: a transaction wrapper and the two pragmas cost more to prepare than to run. */
  private readonly runAll: (batch: Pending<unknown>[]) => Array<{ ok: true; value: unknown }>;
  private readonly relax: Database.Statement;
  private readonly tighten: Database.Statement;

  constructor(db: Db, options: GroupCommitterOptions = {}) {
    super(db, options);
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
    // While the disk is full, whether a batch wrote anything tells a recovery from a batch that only read.
    const changesBefore = this.storage.full ? this.totalChanges.get()!.n : 0;
    let results: Array<{ ok: true; value: unknown } | { ok: false; err: unknown }>;
    try {
      if (relaxed) this.relax.run();
      try {
        results = this.commitBatch(batch);
      } finally {
        if (relaxed) this.tighten.run();
      }
    } catch (err) {
      this.leaveTransaction();
      const failure = this.classify(err);
      for (const p of batch) p.reject(failure);
      return;
    }
    this.settle(batch, results, relaxed, changesBefore);
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
          // SQLite rolled the whole transaction back (it may, on a full disk): the batch fails as a whole.
          if (!this.db.inTransaction) throw err;
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

interface AsyncPending<T> {
  work: () => Promise<T>;
  durable: boolean;
  resolve: (value: T) => void;
  reject: (err: unknown) => void;
}

type Outcome = { ok: true; value: unknown } | { ok: false; err: unknown };

/**
 * Group commit for units of work that are asynchronous (the bridge's store, whose interface PostgreSQL also
 * implements): the units queued while the event loop was busy run one after another in one transaction, each
 * awaited before the next starts, and their promises resolve once it has committed. A unit that throws fails
 * only itself: the batch is then redone with each unit in a savepoint. Units must await nothing but this
 * connection's work, or the transaction stays open while they wait.
 *
 * Full-disk handling is that of `GroupCommitter`.
 */
export class AsyncGroupCommitter extends CommitterBase {
  private queue: AsyncPending<unknown>[] = [];
  private scheduled = false;
  private running = false;
  private closed = false;
  private readonly st;

  constructor(db: Db, options: GroupCommitterOptions = {}) {
    super(db, options);
    this.st = {
      begin: db.prepare('BEGIN'),
      commit: db.prepare('COMMIT'),
      savepoint: db.prepare('SAVEPOINT unit'),
      release: db.prepare('RELEASE unit'),
      rollbackTo: db.prepare('ROLLBACK TO unit'),
      relax: db.prepare('PRAGMA synchronous = NORMAL'),
      tighten: db.prepare('PRAGMA synchronous = FULL'),
    };
  }

  run<T>(work: () => Promise<T>, options: RunOptions = {}): Promise<T> {
    if (this.closed) return Promise.reject(new Error('database is closed'));
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ work, durable: options.durable ?? true, resolve, reject } as AsyncPending<unknown>);
      this.schedule();
    });
  }

  /** Resolves when nothing is queued or running. */
  async idle(): Promise<void> {
    while (this.running || this.queue.length > 0) {
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  private schedule(): void {
    if (this.scheduled || this.running) return;
    this.scheduled = true;
    queueMicrotask(() => void this.drain());
  }

  private async drain(): Promise<void> {
    this.scheduled = false;
    if (this.running) return;
    this.running = true;
    try {
      while (this.queue.length > 0) {
        const batch = this.queue;
        this.queue = [];
        await this.flushBatch(batch);
      }
    } finally {
      this.running = false;
    }
  }

  private async flushBatch(batch: AsyncPending<unknown>[]): Promise<void> {
    const relaxed = batch.every((p) => !p.durable);
    const changesBefore = this.storage.full ? this.totalChanges.get()!.n : 0;
    let results: Outcome[];
    try {
      if (relaxed) this.st.relax.run();
      try {
        results = await this.commitBatch(batch);
      } finally {
        if (relaxed) this.st.tighten.run();
      }
    } catch (err) {
      this.leaveTransaction();
      const failure = this.classify(err);
      for (const p of batch) p.reject(failure);
      return;
    }
    this.settle(batch, results, relaxed, changesBefore);
  }

  private async commitBatch(batch: AsyncPending<unknown>[]): Promise<Outcome[]> {
    // The common case: every unit succeeds, and no savepoint is paid for.
    this.st.begin.run();
    const results: Outcome[] = [];
    let failed = false;
    for (const p of batch) {
      try {
        results.push({ ok: true, value: await p.work() });
      } catch {
        failed = true;
        break;
      }
    }
    if (!failed) {
      this.st.commit.run();
      return results;
    }
    this.leaveTransaction();
    // Some unit failed: redo the batch, each unit in its own savepoint.
    const redone: Outcome[] = [];
    this.st.begin.run();
    for (const p of batch) {
      this.st.savepoint.run();
      try {
        redone.push({ ok: true, value: await p.work() });
        this.st.release.run();
      } catch (err) {
        // SQLite rolled the whole transaction back (it may, on a full disk): the batch fails as a whole.
        if (!this.db.inTransaction) throw err;
        this.st.rollbackTo.run();
        this.st.release.run();
        redone.push({ ok: false, err });
      }
    }
    this.st.commit.run();
    return redone;
  }

  /** Waits for what is queued and refuses further work. */
  async close(): Promise<void> {
    this.closed = true;
    await this.idle();
  }
}
