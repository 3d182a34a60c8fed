/**
 * The bridge's event bus (docs/scaling.md, "The event bus"): what changed in the store, said once it is committed,
 * to the subscribers of this bridge and of every other bridge on the same database. Caches drop what an event says
 * changed; the live channel to app developers follows devices through it.
 *
 * - Events name what changed, never its values: a subscriber reads the store.
 * - `publish` comes after the commit that made the event true (callers publish once `store.write` resolved), and
 *   delivers to this bridge's subscribers at once, synchronously.
 * - {@link LocalBus}: one bridge (SQLite). {@link PostgresBus}: PostgreSQL's LISTEN/NOTIFY, on the channel
 *   {@link EVENTS_CHANNEL}; each bridge ignores its own echo.
 * - `bus.resync` is delivered to local subscribers only, when events may have been missed (the listener's
 *   connection was lost, a gap in another bridge's sequence, an event too large to send): every cache drops all
 *   it holds.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { z } from 'zod';
import type { Logger } from '../../lib/log.js';
import { safeUrl } from '../../lib/url.js';

const DeviceId = z.string().min(1);

/** One variable of a `device.vars` event, and what happened to it. */
export const VarChange = z.object({
  type: z.enum(['d', 's', 'meta']),
  name: z.string(),
  /** `version`: a new version (a deletion too); `ack`: the device acknowledged a push or a sync; `sync`: a new sync. */
  change: z.enum(['version', 'ack', 'sync']),
});
export type VarChange = z.infer<typeof VarChange>;

/** An event that crosses bridges; `bus.resync` ({@link ResyncEvent}) never does. */
export const BusEvent = z.discriminatedUnion('type', [
  /** Variables of a device changed (the bridge's own `lastactivity` stamps are not announced). */
  z.object({ type: z.literal('device.vars'), deviceId: DeviceId, vars: z.array(VarChange).min(1) }),
  /** A device's `meta` `state`. */
  z.object({
    type: z.literal('device.state'),
    deviceId: DeviceId,
    state: z.enum(['connected', 'disconnected', 'sleeping']),
  }),
  /** A claim (`owned`, by `userId`) or an unregister (`!owned`, by its former owner `userId`). */
  z.object({
    type: z.literal('device.registration'),
    deviceId: DeviceId,
    owned: z.boolean(),
    userId: z.number().int(),
  }),
  /**
   * The owner shared the device with `userId` (`shared`), or took the share back (`!shared`); an unregister
   * ends every share of the device with its `device.registration` event, without one of these per user.
   */
  z.object({
    type: z.literal('device.shared'),
    deviceId: DeviceId,
    userId: z.number().int(),
    shared: z.boolean(),
  }),
  /** A frontend was made or changed; making one the default changes every other one too. */
  z.object({ type: z.literal('frontend.changed'), id: z.string() }),
  /**
   * Sessions ended: with `idHash` (the stored sha256, never the cookie's value) that one session, whose user is
   * `userId` (null: anonymous); with `tokenId` and no `idHash`, the access token of that number was revoked, and
   * the live channels opened with it as a bearer token end (the sessions it started have events of their own);
   * with neither, every session of `userId` (a password reset).
   */
  z.object({
    type: z.literal('session.ended'),
    userId: z.number().int().nullable(),
    idHash: z.string().optional(),
    tokenId: z.number().int().optional(),
  }),
  /** A command moved to `state` (as the writer knows it: read the store for the record). */
  z.object({
    type: z.literal('command.changed'),
    deviceId: DeviceId,
    id: z.string(),
    state: z.enum(['queued', 'sent', 'running', 'done', 'failed', 'expired']),
  }),
  /** A notification rule fired (or was fired as a test): event `id` of the log, for `userId` (docs/notifications.md). */
  z.object({ type: z.literal('user.event'), userId: z.number().int(), id: z.number().int() }),
  /**
   * A rule on the device was made, changed or removed, or moved between states: the evaluators drop what they hold
   * of the device's rules.
   */
  z.object({ type: z.literal('rules.changed'), deviceId: DeviceId }),
]);
export type BusEvent = z.infer<typeof BusEvent>;

/**
 * The values a publisher committed, beside its `device.vars` event in this process only: the event object carries
 * names, as every event does, and is what crosses to other bridges; this map is never sent. A subscriber of this
 * bridge (`source.local`) may take a value from here instead of reading the store, and must read the store when
 * there is none (docs/scaling.md, "The event bus").
 */
const committedValues = new WeakMap<BusEvent, ReadonlyMap<string, Buffer | null>>();

/** `event` with the values committed with it (keys `type:name`), for this bridge's subscribers. */
export function withValues<E extends BusEvent>(event: E, values: ReadonlyMap<string, Buffer | null>): E {
  if (values.size > 0) committedValues.set(event, values);
  return event;
}

/** A value committed with a local `device.vars` event (`null`: deleted); `undefined` when it did not come with one. */
export function committedValue(event: BusEvent, type: string, name: string): Buffer | null | undefined {
  return committedValues.get(event)?.get(`${type}:${name}`);
}

/** Events may have been missed: drop everything cached. Local subscribers only. */
export interface ResyncEvent {
  type: 'bus.resync';
}

export type DeliveredEvent = BusEvent | ResyncEvent;

/** Where an event came from: this bridge (`local`) or another one. */
export interface EventSource {
  local: boolean;
}

export type Subscriber = (event: DeliveredEvent, source: EventSource) => void;

export interface EventBus {
  /** Announces a committed change: to this bridge's subscribers now, to the others' soon after. */
  publish(event: BusEvent): void;
  /** Adds a subscriber; returns the function that removes it. A subscriber that throws is logged, not retried. */
  subscribe(fn: Subscriber): () => void;
  start(): Promise<void>;
  /** Sends what is still queued, then stops listening. */
  stop(): Promise<void>;
}

/** The subscribers of one bus. */
class Subscribers {
  private readonly fns = new Set<Subscriber>();

  constructor(private readonly log: Logger | undefined) {}

  subscribe(fn: Subscriber): () => void {
    // A function subscribed twice is called twice: each subscription is its own.
    const entry: Subscriber = (e, s) => fn(e, s);
    this.fns.add(entry);
    return () => {
      this.fns.delete(entry);
    };
  }

  deliver(event: DeliveredEvent, source: EventSource): void {
    for (const fn of [...this.fns]) {
      try {
        fn(event, source);
      } catch (err) {
        this.log?.error({ event: 'events.subscriber_failed', type: event.type, err: String(err) });
      }
    }
  }
}

/** In this process only: the bus of a bridge on SQLite. */
export class LocalBus implements EventBus {
  private readonly subscribers: Subscribers;

  constructor(log?: Logger) {
    this.subscribers = new Subscribers(log);
  }

  publish(event: BusEvent): void {
    this.subscribers.deliver(event, { local: true });
  }

  subscribe(fn: Subscriber): () => void {
    return this.subscribers.subscribe(fn);
  }

  start(): Promise<void> {
    return Promise.resolve();
  }

  stop(): Promise<void> {
    return Promise.resolve();
  }
}

/** The PostgreSQL channel of the events. */
export const EVENTS_CHANNEL = 'devcloud_events';

/** PostgreSQL refuses a NOTIFY payload of 8000 bytes or more (its default build). */
export const MAX_PAYLOAD_BYTES = 7999;

/** How the listener's connection shows in `pg_stat_activity`. */
export const LISTENER_APPLICATION_NAME = 'devcloud-bridge-events';

/**
 * One NOTIFY payload: the publishing bus (`o`), its sequence number (`s`, one more for each payload), and events
 * (`e`). `lost`: the publisher could not send something (too large): the receivers resync.
 */
const Envelope = z.object({
  o: z.string(),
  s: z.number().int(),
  e: z.array(z.unknown()),
  lost: z.literal(true).optional(),
});
type Envelope = z.infer<typeof Envelope>;

export interface PostgresBusOptions {
  /** The pool the NOTIFYs go through (the store's). */
  pool: pg.Pool;
  /** The database's URL, for the listener's own connection: LISTEN holds a connection, never one of the pool. */
  url: string;
  log: Logger;
  channel?: string;
  maxPayloadBytes?: number;
  applicationName?: string;
  /** The wait before the first attempt to reconnect the listener, doubled at each failure up to `maxMs`. */
  backoff?: { firstMs: number; maxMs: number };
  /** How often the listener's connection is checked with a query (a half-open connection delivers nothing), ms. */
  pingMs?: number;
  /** How long a connection or a check of the listener may take, ms. */
  timeoutMs?: number;
}

/**
 * The bus of bridges sharing a PostgreSQL database: NOTIFY through the pool, LISTEN on a dedicated client.
 *
 * Publishing: events go to local subscribers at once, and are queued; the events of one turn are packed into
 * payloads under the limit (a `device.vars` event too large alone is split by variables, anything else too large
 * is dropped, logged as `events.dropped`, and the others told to resync). The payloads go one after another,
 * each its own transaction: PostgreSQL delivers notifications in commit order, so each bridge's events arrive in
 * the order published. A NOTIFY that fails is logged (`events.notify_failed`); the receivers see the gap in the
 * sequence and resync.
 *
 * Listening: the client LISTENs from `start()`; a lost connection is logged (`events.listener_lost`) and made
 * again with backoff; once it is back (`events.listener_restored`), local subscribers get `bus.resync`.
 */
export class PostgresBus implements EventBus {
  /** This bus's id in the payloads: its own echo is ignored. */
  readonly origin = randomUUID();
  readonly channel: string;
  private readonly subscribers: Subscribers;
  private readonly maxBytes: number;
  private readonly applicationName: string;
  private readonly backoff: { firstMs: number; maxMs: number };
  private readonly pingMs: number;
  private readonly timeoutMs: number;
  private queue: BusEvent[] = [];
  private draining: Promise<void> | undefined;
  private seq = 0;
  /** The last sequence number seen of each other bus. */
  private readonly seen = new Map<string, number>();
  private client: pg.Client | undefined;
  private started = false;
  private stopped = false;
  private downSince: number | undefined;
  private attempts = 0;
  private retryTimer: NodeJS.Timeout | undefined;
  private pingTimer: NodeJS.Timeout | undefined;

  constructor(private readonly o: PostgresBusOptions) {
    this.channel = o.channel ?? EVENTS_CHANNEL;
    this.subscribers = new Subscribers(o.log);
    this.maxBytes = o.maxPayloadBytes ?? MAX_PAYLOAD_BYTES;
    this.applicationName = o.applicationName ?? LISTENER_APPLICATION_NAME;
    this.backoff = o.backoff ?? { firstMs: 100, maxMs: 10_000 };
    this.pingMs = o.pingMs ?? 30_000;
    this.timeoutMs = o.timeoutMs ?? 10_000;
  }

  /** Whether the listener is connected now. */
  get listening(): boolean {
    return this.client !== undefined && this.downSince === undefined;
  }

  publish(event: BusEvent): void {
    this.subscribers.deliver(event, { local: true });
    if (this.stopped) return;
    this.queue.push(event);
    this.draining ??= Promise.resolve().then(() => this.drain());
  }

  subscribe(fn: Subscriber): () => void {
    return this.subscribers.subscribe(fn);
  }

  /** Connects the listener; rejects, naming the server, when it cannot. */
  async start(): Promise<void> {
    if (this.started) throw new Error('the event bus was started already');
    this.started = true;
    try {
      await this.connect();
    } catch (err) {
      throw new Error(`cannot listen for events at ${safeUrl(this.o.url)}: ${(err as Error).message}`, { cause: err });
    }
    this.pingTimer = setInterval(() => this.ping(), this.pingMs);
    this.pingTimer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.pingTimer);
    clearTimeout(this.retryTimer);
    await this.draining;
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }

  // ---- publishing ----

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        const events = this.queue;
        this.queue = [];
        for (const payload of this.pack(events)) {
          try {
            await this.o.pool.query('SELECT pg_notify($1, $2)', [this.channel, payload]);
          } catch (err) {
            this.o.log.warn({ event: 'events.notify_failed', err: String(err) });
          }
        }
      }
    } finally {
      this.draining = undefined;
    }
  }

  private envelope(events: readonly string[], lost: boolean, seq: number): string {
    const mark = lost ? ',"lost":true' : '';
    return `{"o":${JSON.stringify(this.origin)},"s":${seq},"e":[${events.join(',')}]${mark}}`;
  }

  /** The payloads that carry `events`, in order, each under the limit. */
  private pack(events: readonly BusEvent[]): string[] {
    // The envelope without events, with room for any sequence number and the `lost` mark.
    const overhead = Buffer.byteLength(this.envelope([], true, Number.MAX_SAFE_INTEGER));
    const room = this.maxBytes - overhead;
    const payloads: string[] = [];
    let batch: string[] = [];
    let size = 0;
    let lost = false;
    const flush = () => {
      if (batch.length === 0 && !lost) return;
      payloads.push(this.envelope(batch, lost, ++this.seq));
      batch = [];
      size = 0;
      lost = false;
    };
    for (const event of events) {
      for (const json of this.fitting(event, room)) {
        if (json === undefined) {
          lost = true;
          continue;
        }
        const bytes = Buffer.byteLength(json);
        if (batch.length > 0 && size + 1 + bytes > room) flush();
        size += (batch.length > 0 ? 1 : 0) + bytes;
        batch.push(json);
      }
    }
    flush();
    return payloads;
  }

  /** `event` as JSON in pieces of at most `room` bytes: a `device.vars` by its variables; undefined for one that cannot be sent. */
  private *fitting(event: BusEvent, room: number): Generator<string | undefined> {
    const json = JSON.stringify(event);
    if (Buffer.byteLength(json) <= room) {
      yield json;
      return;
    }
    if (event.type === 'device.vars' && event.vars.length > 1) {
      const half = Math.ceil(event.vars.length / 2);
      yield* this.fitting({ ...event, vars: event.vars.slice(0, half) }, room);
      yield* this.fitting({ ...event, vars: event.vars.slice(half) }, room);
      return;
    }
    this.o.log.error({ event: 'events.dropped', type: event.type, bytes: Buffer.byteLength(json), limit: room });
    yield undefined;
  }

  // ---- listening ----

  private async connect(): Promise<void> {
    const client = new pg.Client({
      connectionString: this.o.url,
      application_name: this.applicationName,
      connectionTimeoutMillis: this.timeoutMs,
      query_timeout: this.timeoutMs,
      keepAlive: true,
    });
    client.on('error', (err) => this.lost(client, err));
    client.on('end', () => this.lost(client));
    client.on('notification', (n) => {
      if (n.channel === this.channel && n.payload !== undefined) this.receive(n.payload);
    });
    try {
      await client.connect();
      await client.query(`LISTEN "${this.channel.replace(/"/g, '""')}"`);
    } catch (err) {
      await client.end().catch(() => undefined);
      throw err;
    }
    if (this.stopped) {
      await client.end().catch(() => undefined);
      return;
    }
    // Only now: a connection lost before it listened is a failed attempt, not a lost listener.
    this.client = client;
  }

  /** The listener's connection is gone: logged once, and made again. */
  private lost(client: pg.Client, err?: Error): void {
    if (this.stopped || this.client !== client) return;
    this.client = undefined;
    void client.end().catch(() => undefined);
    if (this.downSince === undefined) {
      this.downSince = performance.now();
      this.attempts = 0;
      this.o.log.warn({ event: 'events.listener_lost', err: err ? err.message : 'connection ended' });
    }
    this.retry();
  }

  private retry(): void {
    if (this.stopped) return;
    const wait = Math.min(this.backoff.maxMs, this.backoff.firstMs * 2 ** Math.min(this.attempts, 30));
    this.attempts++;
    this.retryTimer = setTimeout(() => void this.reconnect(), wait);
    this.retryTimer.unref();
  }

  private async reconnect(): Promise<void> {
    if (this.stopped) return;
    try {
      await this.connect();
    } catch (err) {
      this.o.log.debug({ event: 'events.listener_retry', attempts: this.attempts, err: String(err) });
      this.retry();
      return;
    }
    if (this.stopped) return;
    const downMs = Math.round(performance.now() - (this.downSince ?? performance.now()));
    this.downSince = undefined;
    this.o.log.info({ event: 'events.listener_restored', downMs, attempts: this.attempts });
    // Sequences start over: what came between is unknown anyway.
    this.seen.clear();
    this.subscribers.deliver({ type: 'bus.resync' }, { local: true });
  }

  private ping(): void {
    const client = this.client;
    if (!client || this.downSince !== undefined) return;
    client.query('SELECT 1').catch((err: unknown) => this.lost(client, err as Error));
  }

  private receive(payload: string): void {
    let env: Envelope;
    try {
      env = Envelope.parse(JSON.parse(payload));
    } catch (err) {
      this.o.log.warn({ event: 'events.malformed', bytes: Buffer.byteLength(payload), err: String(err) });
      return;
    }
    if (env.o === this.origin) return;
    const last = this.seen.get(env.o);
    this.seen.set(env.o, env.s);
    if (env.lost === true || (last !== undefined && env.s !== last + 1)) {
      this.o.log.warn({ event: 'events.missed', from: env.o, lost: env.lost === true, after: last, got: env.s });
      this.subscribers.deliver({ type: 'bus.resync' }, { local: false });
    }
    for (const item of env.e) {
      // An event of a kind this program does not know (a newer bridge's) is passed over.
      const parsed = BusEvent.safeParse(item);
      if (parsed.success) this.subscribers.deliver(parsed.data, { local: false });
    }
  }
}

/** The bus for a store: PostgreSQL's when the store has a pool (`url` is then `database.url`), else in process. */
export function eventBusFor(store: { pool?: pg.Pool }, url: string | undefined, log: Logger): EventBus {
  if (!store.pool) return new LocalBus(log);
  if (url === undefined) throw new Error('the event bus on PostgreSQL needs database.url');
  return new PostgresBus({ pool: store.pool, url, log });
}
