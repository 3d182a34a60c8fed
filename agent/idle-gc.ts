/**
 * Gives back the heap a burst of work took, once the burst is over (docs/agent.md, memory). During a burst V8 lets
 * its old generation grow by at least 8 MB past what was live at the last full collection, whatever
 * `--heap-growing-percent` says, and keeps those pages until its memory reducer runs, some time after the
 * allocation rate has fallen, and not every time. Here, every `everyMs`, the agent looks at the heap: when it
 * has grown `growthBytes` past its size after the last collection and no work was done since the last look, one
 * full collection runs, so that a gateway's memory falls back soon after every burst, not at V8's own pace. With
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
  /** For tests: the collection (`globalThis.gc`) and the heap's size (V8's `total_heap_size`). */
  gc?: (() => void) | undefined;
  heapBytes?: () => number;
}

export class IdleCollector {
  private timer: NodeJS.Timeout | undefined;
  private readonly gc: (() => void) | undefined;
  private readonly heapBytes: () => number;
  private readonly growthBytes: number;
  /** The heap's size after the last collection (or at start). */
  private baseline: number;
  private lastActivity: number;
  /** Collections run. */
  collections = 0;

  constructor(private readonly opts: IdleCollectorOptions) {
    const gc = 'gc' in opts ? opts.gc : (globalThis.gc as (() => void) | undefined);
    this.gc = typeof gc === 'function' ? gc : undefined;
    this.heapBytes = opts.heapBytes ?? (() => getHeapStatistics().total_heap_size);
    this.growthBytes = opts.growthBytes ?? 4 * 1024 * 1024;
    this.baseline = this.heapBytes();
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
    const idle = activity === this.lastActivity;
    this.lastActivity = activity;
    const size = this.heapBytes();
    // A heap that shrank by itself (V8's memory reducer) is the new reference.
    if (size < this.baseline) this.baseline = size;
    if (!idle || !this.gc || size < this.baseline + this.growthBytes) return false;
    this.gc();
    this.collections++;
    this.baseline = this.heapBytes();
    return true;
  }
}
