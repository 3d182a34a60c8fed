/**
 * The agent's periodic report to the cloud: `meta` variables on `up/meta`, once at every connect and then every
 * `report.intervalSec` seconds while connected (0: never).
 *
 * - `uptime`: seconds since the agent started;
 * - `pending`: variable versions and syncs the cloud has not acknowledged yet;
 * - `queue`: commands waiting to run;
 * - `rss`: the agent's resident memory, bytes.
 *
 * A report is a snapshot: one that cannot go out (not connected) is skipped, not queued. The bridge keeps the
 * current values without history entries (bridge/devices/service.ts).
 */
import type { Logger } from '../lib/log.js';
import { type MetaMessage, messageId } from '../protocol/index.js';

/** The `meta` names of a report. */
export const REPORT_META = ['uptime', 'pending', 'queue', 'rss'] as const;
export type ReportFigures = Record<(typeof REPORT_META)[number], number>;

export interface MetaReporterOptions {
  /** 0: no reports. */
  intervalMs: number;
  /** The `up/meta` publisher. */
  reporter: { publish(payload: MetaMessage, onAck: () => void): boolean; readonly connected: boolean };
  figures: () => ReportFigures;
  now: () => number;
  log: Logger;
}

export class MetaReporter {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** Reports handed to the broker. */
  sent = 0;

  constructor(private readonly opts: MetaReporterOptions) {}

  /** At every connect: a report now, and the next ones counted from here. */
  onConnected(): void {
    if (this.opts.intervalMs === 0 || this.stopped) return;
    clearInterval(this.timer);
    this.report();
    this.timer = setInterval(() => this.report(), this.opts.intervalMs);
    // The uplink and the socket keep the agent running; this timer alone should not.
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Publishes one report; `false` when not connected. */
  report(): boolean {
    const { reporter, log } = this.opts;
    if (!reporter.connected) return false;
    const figures = this.opts.figures();
    const meta: Record<string, string> = {};
    for (const name of REPORT_META) meta[name] = String(figures[name]);
    const ok = reporter.publish({ id: messageId(), ts: this.opts.now(), meta }, () => undefined);
    if (ok) {
      this.sent++;
      log.debug({ event: 'report.sent', ...figures });
    }
    return ok;
  }
}
