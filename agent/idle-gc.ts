/**
 * Gives back the heap a burst of work took, once the burst is over (docs/agent.md, memory). During a burst V8 lets
 * its old generation grow by at least 8 MB past what was live at the last full collection, whatever
 * `--heap-growing-percent` says, and keeps those pages until its memory reducer runs, some time after the
 * allocation rate has fallen, and not every time. Here, every `everyMs`, the agent looks at the heap: when it
 * is `growthBytes` larger than the smallest it has been and no work was done since the last look, a full
 * collection runs, so that a gateway's memory falls back soon after every burst, not at V8's own pace. One
 * collection moves only so much; while the heap stays that large the next quiet looks collect again, at most
 * `maxTries` times, after which its size is taken as the new normal. With
 * the agent's `--optimize-for-size`, V8 picks the pages to compact by its memory-saving rules (a page about a fifth
 * free qualifies), so that collection empties most of the pages the burst left fragmented and hands them back;
 * without it, V8 compacts only the emptiest few and the heap stays as large.
 *
 * Runs only with node's `--expose-gc` (the agent's own flags); otherwise it does nothing.
 */
import { getHeapStatistics } from 'node:v8';

export interface IdleCollectorOptions {
  /** A count that grows with the agent's work (changes, acks); a look that sees it unchanged finds the agent idle. */
  activity: () => number;
  everyMs?: number;
  growthBytes?: number;
  maxTries?: number;
  /** For tests: the collection (`globalThis.gc`) and the heap's size (V8's `total_heap_size`). */
  gc?: (() => void) | undefined;
  heapBytes?: () => number;
}

export class IdleCollector {
  private timer: NodeJS.Timeout | undefined;
  private readonly gc: (() => void) | undefined;
  private readonly heapBytes: () => number;
  private readonly growthBytes: number;
  private readonly maxTries: number;
  /** The smallest the heap has been (at start, after a collection, or as taken to be normal). */
  private floor: number;
  private lastActivity: number;
  /** Collections since the last work was seen. */
  private tries = 0;
  /** Collections run. */
  collections = 0;

  constructor(private readonly opts: IdleCollectorOptions) {
    const gc = 'gc' in opts ? opts.gc : (globalThis.gc as (() => void) | undefined);
    this.gc = typeof gc === 'function' ? gc : undefined;
    this.heapBytes = opts.heapBytes ?? (() => getHeapStatistics().total_heap_size);
    this.growthBytes = opts.growthBytes ?? 4 * 1024 * 1024;
    this.maxTries = opts.maxTries ?? 3;
    this.floor = this.heapBytes();
    this.lastActivity = opts.activity();
  }

  start(): void {
    if (!this.gc || this.timer) return;
    this.timer = setInterval(() => this.look(), this.opts.everyMs ?? 2000);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One look: collects when the heap has grown and the agent has been idle since the last look. */
  look(): boolean {
    const activity = this.opts.activity();
    if (activity !== this.lastActivity) {
      this.lastActivity = activity;
      this.tries = 0;
      return false;
    }
    const size = this.heapBytes();
    // A heap that shrank by itself (V8's memory reducer) is the new reference.
    this.floor = Math.min(this.floor, size);
    if (!this.gc || size < this.floor + this.growthBytes) return false;
    if (this.tries >= this.maxTries) {
      // What is live has grown: this is the heap's size now.
      this.floor = size;
      return false;
    }
    this.gc();
    this.collections++;
    this.tries++;
    this.floor = Math.min(this.floor, this.heapBytes());
    return true;
  }
}
