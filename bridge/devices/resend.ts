/**
 * The resend of what a connected device has not acknowledged (docs/sync.md, "Resend while connected").
 *
 * A cloud version or sync goes to the device once when it is made, and again on every hello. A device that stays
 * connected but does not acknowledge (its disk was full, or a message was lost on the way) would otherwise wait
 * for its next reconnect. So every device with something sent and not yet acknowledged has a due time in memory:
 * when it comes, what the device has not acknowledged and was sent at least `firstMs` ago is sent again, and
 * the wait doubles, from `firstMs` up to `maxMs`. (A busy device always has a few changes on their way; those are
 * not sent twice, and make no log line.) An acknowledgement or a hello brings the wait back to `firstMs`; a device that disconnects, or has
 * nothing left to acknowledge at its due time, leaves the schedule.
 *
 * Only devices with a due time are looked at, in due order (a heap), so a large fleet costs nothing per tick.
 * The schedule lives in memory: at start it is rebuilt by the catch-up of the devices connected then, which sends
 * what the store holds unacknowledged, and schedules each device it sent to.
 */
import type { Logger } from '../../lib/log.js';

export interface ResendOptions {
  now: () => number;
  /** The first wait after a send, an acknowledgement or a hello, ms. */
  firstMs: number;
  /** The longest wait, ms. */
  maxMs: number;
  /** Whether the device is connected now (its `meta` `state`). */
  connected: (deviceId: string) => Promise<boolean>;
  /**
   * Sends again what the device has not acknowledged and was sent at least `firstMs` ago. Resolves to how many
   * items were sent and how many were left for being younger, or `undefined` when the link could not take them
   * (the catch-up at the next link-up or hello sends them).
   */
  resend: (deviceId: string) => Promise<{ sent: number; young: number } | undefined>;
  log: Logger;
}

interface Entry {
  due: number;
  /** The wait that led to `due`; doubled after each resend that sent something. */
  waitMs: number;
}

/** One device's turn in the heap; stale once the device's entry has another due time or is gone. */
interface Turn {
  due: number;
  deviceId: string;
}

export class ResendSchedule {
  private readonly entries = new Map<string, Entry>();
  private readonly heap: Turn[] = [];
  private timer: NodeJS.Timeout | undefined;
  private armedFor = Infinity;
  private running = false;
  private stopped = false;
  /** Items sent again by the schedule, since start. */
  resent = 0;

  constructor(private readonly o: ResendOptions) {}

  /** Devices with a due time. */
  get size(): number {
    return this.entries.size;
  }

  /** The due time of a device, if it has one (tests, metrics). */
  dueOf(deviceId: string): number | undefined {
    return this.entries.get(deviceId)?.due;
  }

  /** Something that waits for the device's acknowledgement was sent: the device gets a due time if it has none. */
  sent(deviceId: string): void {
    if (this.stopped || this.entries.has(deviceId)) return;
    this.set(deviceId, this.o.firstMs);
  }

  /**
   * The device acknowledged something, or said hello (whose catch-up sent everything pending): the wait starts
   * again from `firstMs`. A device without a due time gets none: a hello's catch-up calls `sent` when it sends.
   */
  reset(deviceId: string): void {
    const e = this.entries.get(deviceId);
    if (this.stopped || !e) return;
    const due = this.o.now() + this.o.firstMs;
    if (e.due <= due) {
      e.waitMs = this.o.firstMs;
      return;
    }
    this.set(deviceId, this.o.firstMs);
  }

  /** The device disconnected: its next hello sends what it has not acknowledged. */
  forget(deviceId: string): void {
    this.entries.delete(deviceId);
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.entries.clear();
    this.heap.length = 0;
  }

  private set(deviceId: string, waitMs: number): void {
    const due = this.o.now() + waitMs;
    this.entries.set(deviceId, { due, waitMs });
    this.push({ due, deviceId });
    this.arm();
  }

  private arm(): void {
    if (this.running || this.stopped) return;
    const next = this.heap[0];
    if (!next) {
      clearTimeout(this.timer);
      this.timer = undefined;
      this.armedFor = Infinity;
      return;
    }
    if (this.timer !== undefined && next.due >= this.armedFor) return;
    clearTimeout(this.timer);
    this.armedFor = next.due;
    this.timer = setTimeout(() => void this.tick(), Math.max(0, next.due - this.o.now()));
    this.timer.unref();
  }

  /** Takes every device whose due time has come, one after the other. */
  private async tick(): Promise<void> {
    this.timer = undefined;
    this.armedFor = Infinity;
    this.running = true;
    try {
      for (;;) {
        const top = this.heap[0];
        if (!top || top.due > this.o.now() || this.stopped) break;
        this.pop();
        const e = this.entries.get(top.deviceId);
        if (!e || e.due !== top.due) continue;
        await this.turn(top.deviceId, e);
      }
    } finally {
      this.running = false;
      this.arm();
    }
  }

  private async turn(deviceId: string, e: Entry): Promise<void> {
    if (!(await this.o.connected(deviceId))) {
      this.entries.delete(deviceId);
      return;
    }
    let r: { sent: number; young: number } | undefined;
    try {
      r = await this.o.resend(deviceId);
    } catch (err) {
      // A database error: tried again after the same wait.
      this.o.log.warn({ event: 'vars.resend_failed', deviceId, err: String(err) });
      r = { sent: 0, young: 1 };
    }
    // A reset, a forget or a stop while the resend ran decides instead.
    if (this.stopped || this.entries.get(deviceId) !== e) return;
    if (r === undefined || r.sent + r.young === 0) {
      this.entries.delete(deviceId);
      return;
    }
    let waitMs = e.waitMs;
    if (r.sent > 0) {
      this.resent += r.sent;
      this.o.log.info({ event: 'vars.resend', deviceId, items: r.sent, waitedMs: e.waitMs });
      waitMs = Math.min(e.waitMs * 2, this.o.maxMs);
    }
    // Only items sent within the last `firstMs`, still on their way (a busy device): they get their turn later.
    const due = this.o.now() + (r.sent > 0 ? waitMs : this.o.firstMs);
    this.entries.set(deviceId, { due, waitMs });
    this.push({ due, deviceId });
  }

  // ---- a binary min-heap of turns by due time ----

  private push(t: Turn): void {
    const h = this.heap;
    h.push(t);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (h[p]!.due <= t.due) break;
      h[i] = h[p]!;
      i = p;
    }
    h[i] = t;
  }

  private pop(): void {
    const h = this.heap;
    const last = h.pop()!;
    if (h.length === 0) return;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= h.length) break;
      const r = l + 1;
      const c = r < h.length && h[r]!.due < h[l]!.due ? r : l;
      if (h[c]!.due >= last.due) break;
      h[i] = h[c]!;
      i = c;
    }
    h[i] = last;
  }
}
