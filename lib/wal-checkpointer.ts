/**
 * WAL checkpoints off the event loop (docs/api.md, "Retention"). SQLite's automatic checkpoint runs inside the
 * commit that crosses `wal_autocheckpoint` pages: it copies the whole log into the database and syncs both files,
 * tens of ms during which the process answers nothing. Here the connection's automatic checkpoint is off and a
 * worker thread with its own connection runs a `PASSIVE` checkpoint whenever the log has grown past as many pages:
 * it takes no lock a writer or reader waits for, so requests go on while the log is copied and synced. Bulk
 * writers look at `busy` and wait for the end of a checkpoint: while it syncs the disk, the file system may hold
 * up a write to the log (ext4 makes an append wait for the journal commit that an fsync forces).
 *
 * Should the worker fail or exit, the connection's automatic checkpoint is turned on again.
 */
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import type { Db } from './sqlite.js';

export interface WalCheckpointerOptions {
  /** Log size, in pages, past which a checkpoint runs (SQLite's own default: 1000). */
  pages?: number;
  /** How often the worker looks at the log's size, ms. */
  everyMs?: number;
  /**
   * A checkpoint failed (once per run of failures; the next look tries again), or the worker did (SQLite's own
   * checkpoint takes over).
   */
  onError?: (err: string) => void;
}

/** The worker, plain JavaScript so that it runs the same from sources and from the build. */
const WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const { statSync } = require('node:fs');
const Database = require(workerData.lib);
const db = new Database(workerData.path, { fileMustExist: true });
const limit = workerData.pages * db.pragma('page_size', { simple: true });
let failing = false;
const timer = setInterval(() => {
  let size = 0;
  try { size = statSync(workerData.path + '-wal').size; } catch { return; }
  if (size < limit) return;
  Atomics.store(workerData.state, 1, 1);
  try {
    db.pragma('wal_checkpoint(PASSIVE)');
    failing = false;
  } catch (err) {
    // Once per run of failures (a full disk fails every look until space returns).
    if (!failing) parentPort.postMessage(String(err));
    failing = true;
  } finally {
    Atomics.store(workerData.state, 1, 0);
  }
}, workerData.everyMs);
parentPort.on('message', () => {
  clearInterval(timer);
  try { db.close(); } finally {
    Atomics.store(workerData.state, 0, 1);
    Atomics.notify(workerData.state, 0);
    parentPort.close();
  }
});
`;

/** How long `close` waits for the worker to close its connection (it may be in the middle of a checkpoint). */
const CLOSE_WAIT_MS = 10_000;

export class WalCheckpointer {
  private readonly worker: Worker;
  /** [0]: the worker closed its connection; [1]: a checkpoint is under way. */
  private readonly state = new Int32Array(new SharedArrayBuffer(8));
  private stopped = false;
  readonly pages: number;

  constructor(
    private readonly db: Db,
    options: WalCheckpointerOptions = {},
  ) {
    this.pages = options.pages ?? 1000;
    const lib = createRequire(import.meta.url).resolve('better-sqlite3');
    db.pragma('wal_autocheckpoint = 0');
    this.worker = new Worker(WORKER, {
      eval: true,
      workerData: { lib, path: db.name, pages: this.pages, everyMs: options.everyMs ?? 100, state: this.state },
    });
    this.worker.unref();
    this.worker.on('message', (err: string) => options.onError?.(err));
    this.worker.on('error', (err) => {
      options.onError?.(String(err));
      this.fallBack();
    });
    this.worker.on('exit', () => this.fallBack());
  }

  /**
   * Whether a checkpoint is under way. While it syncs the disk, the file system may hold up writes to the log, so
   * that bulk writers (the history retention) wait for it to end rather than meet it with a commit.
   */
  get busy(): boolean {
    return !this.stopped && Atomics.load(this.state, 1) === 1;
  }

  /** The worker is gone: SQLite checkpoints by itself again. */
  private fallBack(): void {
    if (this.stopped || !this.db.open) return;
    this.stopped = true;
    this.db.pragma(`wal_autocheckpoint = ${this.pages}`);
  }

  /** Closes the worker's connection and waits for it, so that the caller's close is the last one. */
  close(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.worker.postMessage('close');
    Atomics.wait(this.state, 0, 0, CLOSE_WAIT_MS);
    void this.worker.terminate();
  }
}
