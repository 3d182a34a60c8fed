/**
 * The agent's view of the cloud's clock (decision 24, docs/sync.md#clocks).
 *
 * The bridge puts its clock on the `down/` messages it sends (`now`). Each one gives an estimate of the cloud's
 * time at a point of the monotonic clock; from then on the corrected time is that estimate plus the monotonic
 * time elapsed, so a step of the gateway's own clock (NTP arriving, a wrong RTC) no longer moves it. Before the
 * first estimate the agent uses its own clock, and says so: such time is unverified.
 *
 * The estimate is kept in the database (`kv`, key `clock`) with the boot it was learnt in. CLOCK_MONOTONIC
 * counts from the boot, so an agent restarted within the same boot still has it before it reaches the cloud; after
 * a reboot (when a gateway without a real-time clock has lost its time) it starts unverified again.
 */
import { readFileSync } from 'node:fs';
import type { Logger } from '../lib/log.js';
import type { Db, GroupCommitter } from '../lib/sqlite.js';

/** Stamps before this (September 2020) are no clock at all: a bridge reporting one is ignored. */
const EARLIEST_PLAUSIBLE_MS = 1_600_000_000_000;
/**
 * A sample lower than the estimate by at most this much is a message that took longer on the way, and is ignored;
 * a lower one is the cloud's clock stepping back, and replaces the estimate.
 */
const DELAY_SLACK_MS = 2_000;
/** The estimate is saved again when it moved by more than this, or when the saved one is older than SAVE_EVERY_MS. */
const SAVE_MOVE_MS = 1_000;
const SAVE_EVERY_MS = 10 * 60_000;
/** A change of the offset larger than this is logged at info (`clock.offset`). */
const LOG_MOVE_MS = 1_000;

/** The monotonic clock of the whole system (CLOCK_MONOTONIC, counted from the boot), in milliseconds. */
export function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** This boot's id (Linux); `undefined` elsewhere, and then a saved estimate is never reused. */
export function bootId(): string | undefined {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

interface Saved {
  /** The cloud's time at monotonic 0 of the boot it was learnt in. */
  base: number;
  boot: string;
  /** The cloud's time when it was learnt. */
  at: number;
}

export interface ClockStatus {
  /** `cloud`: learnt from the bridge since start; `saved`: learnt earlier in this boot; `own`: the gateway's clock. */
  source: 'cloud' | 'saved' | 'own';
  /** Corrected time minus the gateway's own clock, or `null` before any estimate. */
  offsetMs: number | null;
  /** How long ago the estimate was learnt, or `null`. */
  ageMs: number | null;
}

export interface CloudClockOptions {
  db: Db;
  commit: GroupCommitter;
  log: Logger;
  /** The gateway's own clock (`Date.now`; a test's fake one). */
  own: () => number;
  /** The monotonic clock (`monotonicMs`). */
  monotonic: () => number;
  /** This boot's id (`bootId()`). */
  boot: string | undefined;
}

export class CloudClock {
  private base: number | undefined;
  private source: ClockStatus['source'] = 'own';
  /** Monotonic time of the last estimate taken. */
  private learntMono = 0;
  private saved: Saved | undefined;
  private readonly getSaved;
  private readonly putSaved;

  constructor(private readonly o: CloudClockOptions) {
    this.getSaved = o.db.prepare<[], { value: string }>("SELECT value FROM kv WHERE key = 'clock'");
    this.putSaved = o.db.prepare<[string]>("INSERT OR REPLACE INTO kv (key, value) VALUES ('clock', ?)");
    const row = this.getSaved.get();
    if (!row) return;
    try {
      const s = JSON.parse(row.value) as Saved;
      this.saved = s;
      if (o.boot !== undefined && s.boot === o.boot && Number.isFinite(s.base)) {
        this.base = s.base;
        this.source = 'saved';
        // Its age in this boot: the cloud's time now minus when it was learnt.
        this.learntMono = s.at - s.base;
      }
    } catch {
      // A row this version cannot read: learn again.
    }
  }

  /** The time to stamp and judge by: the cloud's clock when known, else the gateway's own. */
  readonly now = (): number => (this.base === undefined ? this.o.own() : Math.round(this.o.monotonic() + this.base));

  /** Time from the monotonic clock, for intervals: steps of the wall clock do not move it. */
  readonly monotonic = (): number => this.o.monotonic();

  /** Whether {@link now} comes from the cloud's clock (learnt in this boot). */
  get verified(): boolean {
    return this.base !== undefined;
  }

  status(): ClockStatus {
    if (this.base === undefined) return { source: 'own', offsetMs: null, ageMs: null };
    return {
      source: this.source,
      offsetMs: this.now() - this.o.own(),
      ageMs: Math.round(this.o.monotonic() - this.learntMono),
    };
  }

  /** A `down/` message carried the bridge's clock. */
  learn(cloudNow: number): void {
    if (cloudNow < EARLIEST_PLAUSIBLE_MS) {
      this.o.log.debug({ event: 'clock.implausible', cloudNow });
      return;
    }
    const mono = this.o.monotonic();
    const sample = cloudNow - mono;
    const prev = this.base;
    if (prev !== undefined && sample <= prev && sample >= prev - DELAY_SLACK_MS) {
      // Within the slack below the estimate: a slower delivery, or the same estimate again.
      if (this.source === 'saved') this.source = 'cloud';
      return;
    }
    const before = prev === undefined ? null : this.now() - this.o.own();
    this.base = sample;
    this.source = 'cloud';
    this.learntMono = mono;
    const offsetMs = this.now() - this.o.own();
    if (before === null || Math.abs(offsetMs - before) > LOG_MOVE_MS) {
      this.o.log.info({ event: 'clock.offset', offsetMs, previousMs: before });
    }
    this.save(cloudNow);
  }

  private save(cloudNow: number): void {
    const boot = this.o.boot;
    if (boot === undefined || this.base === undefined) return;
    const s = this.saved;
    const due =
      s === undefined ||
      s.boot !== boot ||
      Math.abs(s.base - this.base) > SAVE_MOVE_MS ||
      cloudNow - s.at > SAVE_EVERY_MS;
    if (!due) return;
    const next: Saved = { base: this.base, boot, at: cloudNow };
    this.saved = next;
    // Losing it costs one more unverified start, so it is written without fsync.
    this.o.commit
      .run(() => this.putSaved.run(JSON.stringify(next)), { durable: false })
      .catch((err: unknown) => this.o.log.warn({ event: 'clock.save_failed', err: String(err) }));
  }
}
