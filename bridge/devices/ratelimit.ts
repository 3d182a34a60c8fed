/**
 * Per-device limits on what a device publishes (docs/operations.md, "Device rate limits"): messages per second,
 * bytes per second and hellos per minute, each a token bucket whose burst covers what a healthy agent sends at
 * once (its catch-up after a reconnect: one message per 500 variables). A message over a limit is dropped; a
 * device that keeps going over is cut off for `penaltyMs`: the embedded broker disconnects it and refuses it
 * meanwhile; with an external broker the bridge ignores it meanwhile. Logging is itself limited: one line per
 * device and minute with the count dropped since the last.
 *
 * What is dropped is not lost: a device re-sends what the cloud has not acknowledged (docs/sync.md).
 */
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../lib/log.js';

export interface DeviceLimits {
  messagesPerSecond: number;
  messageBurst: number;
  bytesPerSecond: number;
  byteBurst: number;
  hellosPerMinute: number;
  /** Drops within a minute after which the device is cut off. */
  disconnectAfter: number;
  /** How long a cut-off device stays refused (embedded broker) or ignored (external broker), ms. */
  penaltyMs: number;
}

/** What {@link DeviceRateLimiter.admit} decided. */
export type Admission = 'ok' | 'drop' | 'disconnect';

class Bucket {
  tokens: number;
  constructor(
    private readonly ratePerMs: number,
    private readonly burst: number,
    private at: number,
  ) {
    this.tokens = burst;
  }
  take(amount: number, now: number): boolean {
    this.tokens = Math.min(this.burst, this.tokens + (now - this.at) * this.ratePerMs);
    this.at = now;
    if (this.tokens < amount) return false;
    this.tokens -= amount;
    return true;
  }
  full(now: number): boolean {
    return this.tokens + (now - this.at) * this.ratePerMs >= this.burst;
  }
}

interface DeviceState {
  messages: Bucket;
  bytes: Bucket;
  hellos: Bucket;
  /** Drops in the current minute, and when it began. */
  drops: number;
  dropsSince: number;
  /** Until when the device is cut off; 0 when it is not. */
  penaltyUntil: number;
  /** Whether the one `state` message a cut-off device may still send (its last will) has passed. */
  willPassed: boolean;
  /** Drops not yet reported in a log line, and when the last line went. */
  unlogged: number;
  loggedAt: number;
}

const MINUTE = 60_000;

export class DeviceRateLimiter {
  private readonly devices = new Map<string, DeviceState>();
  private readonly now: () => number;
  private lastSweep: number;
  /** Messages dropped, and devices cut off, since start. */
  readonly counters = { dropped: 0, disconnected: 0, refused: 0 };

  constructor(
    private readonly limits: DeviceLimits,
    private readonly log: Logger,
    now?: () => number,
  ) {
    this.now = now ?? (() => performance.now());
    this.lastSweep = this.now();
  }

  /** Whether a device is cut off now (the embedded broker refuses its login meanwhile). */
  penalised(deviceId: string): boolean {
    const s = this.devices.get(deviceId);
    const cut = s !== undefined && s.penaltyUntil > this.now();
    if (cut) {
      this.counters.refused++;
      this.log.debug({ event: 'device.rate_refused', deviceId });
    }
    return cut;
  }

  /** Counts one message of `bytes` on topic `name` from a device and says what to do with it. */
  admit(deviceId: string, name: string, bytes: number): Admission {
    const now = this.now();
    if (now - this.lastSweep > MINUTE) this.sweep(now);
    const s = this.state(deviceId, now);
    if (s.penaltyUntil > now) {
      // A cut-off device's last will still tells the cloud it went offline.
      if (name === 'state' && !s.willPassed) {
        s.willPassed = true;
        return 'ok';
      }
      this.counters.dropped++;
      return 'drop';
    }
    const l = this.limits;
    // Each bucket is checked only when the ones before it passed, so that a dropped message costs no tokens.
    const ok =
      s.messages.take(1, now) &&
      s.bytes.take(Math.min(bytes, l.byteBurst), now) &&
      (name !== 'up/hello' || s.hellos.take(1, now));
    if (ok) return 'ok';
    this.counters.dropped++;
    if (now - s.dropsSince > MINUTE) {
      s.drops = 0;
      s.dropsSince = now;
    }
    s.drops++;
    s.unlogged++;
    if (s.drops >= l.disconnectAfter) {
      s.penaltyUntil = now + l.penaltyMs;
      s.willPassed = false;
      s.drops = 0;
      this.counters.disconnected++;
      this.log.warn({
        event: 'device.rate_disconnected',
        deviceId,
        dropped: s.unlogged,
        penaltyMs: l.penaltyMs,
      });
      s.unlogged = 0;
      s.loggedAt = now;
      return 'disconnect';
    }
    if (now - s.loggedAt >= MINUTE) {
      this.log.warn({ event: 'device.rate_limited', deviceId, topic: name, dropped: s.unlogged });
      s.unlogged = 0;
      s.loggedAt = now;
    }
    return 'drop';
  }

  private state(deviceId: string, now: number): DeviceState {
    let s = this.devices.get(deviceId);
    if (!s) {
      const l = this.limits;
      s = {
        messages: new Bucket(l.messagesPerSecond / 1000, l.messageBurst, now),
        bytes: new Bucket(l.bytesPerSecond / 1000, l.byteBurst, now),
        hellos: new Bucket(l.hellosPerMinute / MINUTE, l.hellosPerMinute, now),
        drops: 0,
        dropsSince: now,
        penaltyUntil: 0,
        willPassed: false,
        unlogged: 0,
        loggedAt: -Infinity,
      };
      this.devices.set(deviceId, s);
    }
    return s;
  }

  /** Forgets devices whose buckets are full again and that are not cut off: they are as new. */
  private sweep(now: number): void {
    this.lastSweep = now;
    for (const [id, s] of this.devices) {
      if (s.penaltyUntil <= now && s.messages.full(now) && s.bytes.full(now) && s.hellos.full(now)) {
        this.devices.delete(id);
      }
    }
  }
}
