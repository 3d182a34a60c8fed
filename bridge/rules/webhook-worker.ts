/**
 * Delivers fired events to their webhooks from a durable outbox (docs/notifications.md, "Webhooks"). Every bridge
 * runs one; the outbox leases each due delivery to one of them, so an event is sent by one bridge at a time, and
 * records each attempt's outcome on the event. Delivery is at least once: a bridge stopped between the receiver's
 * answer and the record sends again once the lease ran out, and receivers deduplicate by the event header.
 *
 * Nothing here blocks anything else: attempts run side by side up to `concurrency`, a receiver that hangs holds one
 * slot for at most `timeoutMs`, and an outbox that fails (the database) is logged and tried again at the next poll.
 */
import type { Logger } from '../../lib/log.js';
import { type WebhookConfig, backoffMs, sendWebhook } from './webhook.js';

export interface DueDelivery {
  eventId: number;
  url: string;
  secret: string;
  body: string;
  attempts: number;
  firedAt: number;
}

export interface DeliveryOutcome {
  state: 'delivered' | 'pending' | 'failed';
  attempts: number;
  status: number | null;
  error: string | null;
  at: number;
  nextAt: number | null;
}

export interface WebhookOutbox {
  /**
   * Up to `limit` deliveries whose next attempt is due at `now`, each leased to this caller until `now + leaseMs`
   * (another worker or bridge skips a leased one).
   */
  claimDue(now: number, limit: number, leaseMs: number): Promise<DueDelivery[]>;
  /** Records an attempt's outcome on the event (and ends the lease). */
  record(eventId: number, outcome: DeliveryOutcome): Promise<void>;
}

/** A lease outlasts the attempt it covers (at most `timeoutMs`) by this much, for the record that follows it. */
const LEASE_MARGIN_MS = 5000;
/** After a kick, the poll waits this long, so that a burst of new events is claimed in one query. */
const KICK_DELAY_MS = 10;

/** What a log line may show of a receiver's URL: its origin. Paths and queries often carry the receiver's token. */
function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return '(invalid url)';
  }
}

export class WebhookWorker {
  readonly figures = { delivered: 0, failed: 0, retried: 0, inFlight: 0 };

  private readonly send: typeof sendWebhook;
  private readonly random: () => number;
  private readonly leaseMs: number;
  private readonly attempts = new Map<number, Promise<void>>();
  private timer: NodeJS.Timeout | undefined;
  private polling: Promise<void> | undefined;
  private started = false;
  private stopped = false;
  /** A poll is scheduled to run soon (after a kick): more kicks need nothing more. */
  private soon = false;
  /** A kick came while a poll ran: poll again right after it. */
  private kicked = false;
  /** The last poll filled every free slot: more may be due, so a freed slot polls again. */
  private backlog = false;

  constructor(
    private readonly d: {
      outbox: WebhookOutbox;
      config: WebhookConfig;
      ca?: Buffer;
      log: Logger;
      now: () => number;
      send?: typeof sendWebhook;
      random?: () => number;
    },
  ) {
    this.send = d.send ?? sendWebhook;
    this.random = d.random ?? Math.random;
    this.leaseMs = d.config.timeoutMs + LEASE_MARGIN_MS;
  }

  /** Polls every pollMs (setTimeout chain, unref'd), at most `concurrency` attempts in flight. */
  start(): void {
    if (this.started || this.stopped) return;
    this.started = true;
    this.soon = true;
    this.schedule(0);
  }

  /** A new delivery was queued: poll soon (coalesced). */
  kick(): void {
    if (!this.started || this.stopped) return;
    if (this.polling) {
      this.kicked = true;
      return;
    }
    if (this.soon) return;
    this.soon = true;
    this.schedule(KICK_DELAY_MS);
  }

  /** Stops polling, waits for attempts in flight (each ends within `timeoutMs`). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.polling;
    await Promise.all(this.attempts.values());
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.run();
    }, ms);
    this.timer.unref();
  }

  private async run(): Promise<void> {
    this.soon = false;
    this.kicked = false;
    const poll = this.poll();
    this.polling = poll;
    await poll;
    this.polling = undefined;
    if (this.stopped) return;
    if (this.kicked) {
      this.kicked = false;
      this.soon = true;
      this.schedule(KICK_DELAY_MS);
    } else {
      this.schedule(this.d.config.pollMs);
    }
  }

  private async poll(): Promise<void> {
    const room = this.d.config.concurrency - this.attempts.size;
    if (room <= 0) return;
    let due: DueDelivery[];
    try {
      due = await this.d.outbox.claimDue(this.d.now(), room, this.leaseMs);
    } catch (err) {
      this.d.log.error({ event: 'webhook.outbox_failed', op: 'claim', err });
      return;
    }
    // An outbox that answered more than asked would break the bound: the rest stay leased and come back later.
    const taken = due.filter((x) => !this.attempts.has(x.eventId)).slice(0, room);
    this.backlog = due.length >= room;
    for (const delivery of taken) this.launch(delivery);
  }

  private launch(delivery: DueDelivery): void {
    const attempt = this.attempt(delivery)
      .catch((err: unknown) => {
        // attempt() catches what it expects; this is a bug, and it must not stop the others.
        this.d.log.error({ event: 'webhook.outbox_failed', op: 'attempt', eventId: delivery.eventId, err });
      })
      .finally(() => {
        this.attempts.delete(delivery.eventId);
        this.figures.inFlight = this.attempts.size;
        if (this.backlog) this.kick();
      });
    this.attempts.set(delivery.eventId, attempt);
    this.figures.inFlight = this.attempts.size;
  }

  private async attempt(delivery: DueDelivery): Promise<void> {
    const { eventId } = delivery;
    const { config, log, now } = this.d;
    const started = performance.now();
    const sentAt = now();
    let result;
    try {
      result = await this.send(
        { url: delivery.url, body: delivery.body, secret: delivery.secret, eventId: String(eventId), now: sentAt },
        config,
        this.d.ca,
      );
    } catch (err) {
      // sendWebhook never throws; one passed in may.
      result = { ok: false, error: err instanceof Error ? err.message : String(err) };
    }
    const at = now();
    const attempts = delivery.attempts + 1;
    const status = result.status ?? null;
    const error = result.ok ? null : (result.error ?? (status !== null ? `HTTP ${status}` : 'failed'));
    let outcome: DeliveryOutcome;
    let wait = 0;
    let givenUp = false;
    if (result.ok) {
      outcome = { state: 'delivered', attempts, status, error: null, at, nextAt: null };
    } else {
      wait = backoffMs(attempts, this.random);
      givenUp = result.permanent !== true && at + wait > delivery.firedAt + config.retryForMs;
      outcome =
        result.permanent === true || givenUp
          ? { state: 'failed', attempts, status, error, at, nextAt: null }
          : { state: 'pending', attempts, status, error, at, nextAt: at + wait };
    }
    try {
      await this.d.outbox.record(eventId, outcome);
    } catch (err) {
      // Not recorded: the lease runs out and the delivery is attempted again (at least once, never lost).
      log.error({ event: 'webhook.outbox_failed', op: 'record', eventId, state: outcome.state, err });
      return;
    }
    const origin = originOf(delivery.url);
    if (outcome.state === 'delivered') {
      this.figures.delivered++;
      const ms = Math.round(performance.now() - started);
      log.info({ event: 'webhook.delivered', eventId, origin, status, attempts, ms });
    } else if (outcome.state === 'failed') {
      this.figures.failed++;
      const reason = givenUp ? `given up after ${config.retryForMs} ms of retries: ${error}` : error;
      log.warn({ event: 'webhook.failed', eventId, origin, attempts, status, reason });
    } else {
      this.figures.retried++;
      // Info, not warn: the receiver is the user's, and its outage is not the operator's problem.
      const fields = { eventId, origin, attempts, ...(status !== null ? { status } : { error }), nextInMs: wait };
      log.info({ event: 'webhook.retry', ...fields });
    }
  }
}
