/**
 * History retention (docs/api.md, "History"): entries older than `maxAgeDays`, and each variable's entries beyond
 * its newest `maxPerVariable`, are removed in the background.
 *
 * A pass runs at start and then every `everyMs`. It works in batches, each its own transaction, and after each
 * batch that leaves more to do it pauses `pauseFactor` times as long as the batch took (at least a turn of the
 * event loop): a request waits at most one batch, and the retention takes at most `1 / (1 + pauseFactor)` of the
 * process's time however large the backlog. A batch is time-boxed: what a batch costs depends less on its rows
 * than on the pages they sit on (entries removed by age belong to many variables, each on its own page of the
 * `history_var` index), so the rows of the next batch follow from what the last one took, aiming at `batchMs`,
 * between `MIN_BATCH_ROWS` and `batchRows`. The age limit walks the `history_time` index from the oldest entry.
 * The count limit looks only at the variables whose history grew since the last pass (the device store keeps that
 * set in memory); the first pass after start, and a pass after more variables grew than that set holds, look at
 * every variable instead.
 */
import type { Logger } from '../../lib/log.js';
import type { BridgeStore } from '../store/types.js';
import type { VarKey } from './store.js';

export interface RetentionOptions {
  store: BridgeStore;
  now: () => number;
  log: Logger;
  /** Entries older than this many days go; 0 keeps them whatever their age. */
  maxAgeDays: number;
  /** Each variable keeps its newest this many entries; 0: no limit. */
  maxPerVariable: number;
  /** Rows removed per batch (one transaction), at most. */
  batchRows?: number;
  /** The time a batch aims at, ms: the next batch removes fewer rows than `batchRows` if the last took longer. */
  batchMs?: number;
  /** Variables looked at per batch, at most. */
  batchVariables?: number;
  /** The pause after a batch, as a multiple of the time the batch took. */
  pauseFactor?: number;
  /** Time between two passes, ms. */
  everyMs?: number;
}

export interface PassResult {
  byAge: number;
  byCount: number;
  batches: number;
  ms: number;
}

const DAY_MS = 86_400_000;
/** The fewest rows a batch removes, however long the last one took. */
export const MIN_BATCH_ROWS = 10;

const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
/** How often a batch waiting for a checkpoint's end looks again, and how long it waits at most, ms. */
const CHECKPOINT_POLL_MS = 2;
const CHECKPOINT_WAIT_MS = 5_000;

export class HistoryRetention {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<PassResult> | undefined;
  private stopped = false;
  /** Rows removed since start, by the limit that removed them (metrics). */
  readonly removed = { age: 0, count: 0 };
  readonly batchRows: number;
  readonly batchMs: number;
  readonly batchVariables: number;
  /** Rows the next batch removes at most: `batchRows`, or fewer after batches that took longer than `batchMs`. */
  private rows: number;
  readonly pauseFactor: number;
  readonly everyMs: number;

  constructor(private readonly o: RetentionOptions) {
    this.batchRows = o.batchRows ?? 500;
    this.batchMs = o.batchMs ?? 3;
    this.rows = Math.max(MIN_BATCH_ROWS, Math.min(this.batchRows, 100));
    this.batchVariables = o.batchVariables ?? 100;
    this.pauseFactor = o.pauseFactor ?? 3;
    this.everyMs = o.everyMs ?? 300_000;
  }

  /**
   * After a batch of `rows` rows that began at `batchStart`: the size of the next batch, from the time this one
   * took (at most twice as many rows as this one, so that one quick batch does not make the next a long one).
   */
  private fit(rows: number, batchStart: number): void {
    const ms = Math.max(performance.now() - batchStart, 0.01);
    const next = Math.min(rows * 2, Math.floor((rows * this.batchMs) / ms));
    this.rows = Math.max(MIN_BATCH_ROWS, Math.min(this.batchRows, next));
  }

  /**
   * Between two batches: a turn of the event loop, a pause in proportion to what the batch took, and the end of a
   * WAL checkpoint under way (a batch's commit would meet its sync of the disk; docs/api.md, "Retention").
   */
  private async rest(batchStart: number): Promise<void> {
    await nextTurn();
    const ms = (performance.now() - batchStart) * this.pauseFactor;
    if (ms >= 1) await sleep(ms);
    const since = performance.now();
    while (this.o.store.checkpointing && !this.stopped && performance.now() - since < CHECKPOINT_WAIT_MS)
      await sleep(CHECKPOINT_POLL_MS);
  }

  /** Whether any limit is set. */
  get enabled(): boolean {
    return this.o.maxAgeDays > 0 || this.o.maxPerVariable > 0;
  }

  /** Runs a pass now, then one every `everyMs` after the end of the one before. */
  start(): void {
    if (!this.enabled || this.stopped) return;
    const loop = (): void => {
      this.timer = undefined;
      this.pass()
        .then((r) => {
          if (r.byAge + r.byCount > 0) this.o.log.info({ event: 'history.pruned', ...r });
        })
        .catch((err: unknown) => {
          if (!this.stopped) this.o.log.warn({ event: 'history.prune_failed', err: String(err) });
        })
        .finally(() => {
          if (this.stopped) return;
          this.timer = setTimeout(loop, this.everyMs);
          this.timer.unref();
        });
    };
    loop();
  }

  /** Stops the timer and waits for a pass under way to end its batch. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.running?.catch(() => undefined);
  }

  /** One pass over both limits; a second call while one runs gets the same pass. */
  pass(): Promise<PassResult> {
    this.running ??= this.runPass().finally(() => (this.running = undefined));
    return this.running;
  }

  private async runPass(): Promise<PassResult> {
    const t0 = performance.now();
    const r: PassResult = { byAge: 0, byCount: 0, batches: 0, ms: 0 };
    const { store } = this.o;
    if (this.o.maxAgeDays > 0) {
      const before = this.o.now() - this.o.maxAgeDays * DAY_MS;
      for (;;) {
        if (this.stopped) break;
        const t = performance.now();
        const rows = this.rows;
        const n = await store.write((tx) => tx.devices.pruneHistory(before, rows), { durable: false });
        r.byAge += n;
        this.removed.age += n;
        r.batches++;
        if (n < rows) break;
        this.fit(rows, t);
        await this.rest(t);
      }
    }
    if (this.o.maxPerVariable > 0) await this.pruneByCount(r);
    r.ms = Math.round(performance.now() - t0);
    return r;
  }

  /**
   * The count limit, variable by variable: from the set of those that grew, or by a walk over every variable in
   * key order. A batch looks at up to `batchVariables` variables and removes up to its rows (see `fit`); a variable
   * with more to remove than a batch takes stays first in line for the next.
   */
  private async pruneByCount(r: PassResult): Promise<void> {
    const { store } = this.o;
    const keep = this.o.maxPerVariable;
    const grown = await store.devices.takeGrown();
    let queue: VarKey[] = grown ?? [];
    let at = 0;
    let walkAfter: VarKey | undefined;
    let walking = grown === undefined;
    for (;;) {
      if (this.stopped) return;
      if (at === queue.length && walking) {
        queue = await store.devices.varKeys(walkAfter, this.batchVariables);
        at = 0;
        if (queue.length < this.batchVariables) walking = false;
        walkAfter = queue.at(-1);
      }
      if (at === queue.length) return;
      const batch = queue.slice(at, at + this.batchVariables);
      const t = performance.now();
      const rows = this.rows;
      const { removed, done } = await store.write(
        async (tx) => {
          let left = rows;
          let done = 0;
          for (const key of batch) {
            left -= await tx.devices.pruneVariableHistory(key, keep, left);
            // Stopped short: the variable may have more, and goes first in the next batch.
            if (left === 0) break;
            done++;
          }
          return { removed: rows - left, done };
        },
        { durable: false },
      );
      at += done;
      r.byCount += removed;
      this.removed.count += removed;
      r.batches++;
      this.fit(rows, t);
      if (at < queue.length || walking) await this.rest(t);
    }
  }
}
