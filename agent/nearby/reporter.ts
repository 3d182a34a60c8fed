/**
 * Reports heard authcodes on `up/heard`, batched. While disconnected it keeps a bounded queue and, on the next
 * connect, reports only what is still fresh: a code heard longer ago than the nearby window (decision 18)
 * would not make the device nearby anyway.
 */
import { messageId } from '../../protocol/index.js';
import type { UplinkPort } from '../vars/sync.js';

const MAX_QUEUED = 1000;
const MAX_BATCH = 100;

export class HeardReporter {
  private queue: Array<{ authcode: string; at: number }> = [];
  private scheduled = false;

  constructor(
    private readonly uplink: UplinkPort,
    private readonly maxAgeMs: number,
    private readonly now: () => number,
  ) {}

  heard(authcode: string, at: number): void {
    if (this.queue.length >= MAX_QUEUED) this.queue.shift();
    this.queue.push({ authcode, at });
    if (this.uplink.connected) this.schedule();
  }

  /** On every connect: send what is still fresh. */
  onConnected(): void {
    this.schedule();
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  private flush(): void {
    this.scheduled = false;
    if (!this.uplink.connected) return;
    const oldest = this.now() - this.maxAgeMs;
    const fresh = this.queue.filter((h) => h.at >= oldest);
    this.queue = [];
    for (let i = 0; i < fresh.length; i += MAX_BATCH) {
      const heard = fresh.slice(i, i + MAX_BATCH);
      if (!this.uplink.publish('up/heard', { id: messageId(), heard })) {
        // Lost the connection mid-way: keep the rest for the next connect.
        this.queue = fresh.slice(i);
        return;
      }
    }
  }
}
