/**
 * The agent's MQTT uplink (docs/decisions.md §4): one persistent connection with exponential backoff and full
 * jitter (kept short for a while after a healthy connection is lost: docs/agent.md, reconnect backoff), a retained
 * `state` with a last will, `up/hello` on every connect, and validated `down/` messages.
 *
 * Nothing is queued here while disconnected: what must reach the cloud is in SQLite and is sent again on the
 * next connect (see vars/sync.ts), so a fresh client is made for every attempt.
 */
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import mqtt, { type IClientOptions, type MqttClient } from 'mqtt';
import type { Logger } from '../lib/log.js';
import { mqttClientOptions, readMqttTls } from '../lib/mqtt-options.js';
import { safeUrl } from '../lib/url.js';
import {
  ENROL_TOPIC,
  type DownTopic,
  type HelloMessage,
  type Payloads,
  type StatePayload,
  type UpTopic,
  decode,
  downFilter,
  encode,
  isDownTopic,
  parseTopic,
  topicFor,
} from '../protocol/index.js';

export type DownMessage = { [K in DownTopic]: { name: K; payload: Payloads[K] } }[DownTopic];

export interface UplinkOptions {
  url: string;
  deviceId: string;
  username: string;
  password: string;
  /**
   * The enrolment credential (Mosquitto with dynamic security): when the broker refuses the device's login,
   * the device id and password are sent once on `ENROL_TOPIC` with it before the next attempt.
   */
  enrol?: { username: string; password: string } | undefined;
  keepaliveSec: number;
  connectTimeoutMs: number;
  backoffMinMs: number;
  backoffMaxMs: number;
  /** The cap of reconnect delays for `backoffFastForMs` after losing a connection that was up `healthyAfterMs`. */
  backoffFastMaxMs: number;
  backoffFastForMs: number;
  healthyAfterMs: number;
  caFile?: string | undefined;
  certFile?: string | undefined;
  keyFile?: string | undefined;
  rejectUnauthorized: boolean;
  /** Builds the hello sent on every connect. */
  hello: () => HelloMessage;
  log: Logger;
  /** For tests: the jitter source. */
  random?: () => number;
  /** For tests: the clock the backoff measures healthy connections and the fast phase with. */
  now?: () => number;
}

interface UplinkEvents {
  /** Connected, subscribed, `online` and hello published. */
  up: [];
  /** The connection is gone (emitted once per connection). */
  down: [];
  message: [DownMessage];
}

/** Full-jitter exponential backoff: a random delay up to min(max, base * 2^attempt). */
export function backoffDelay(attempt: number, minMs: number, maxMs: number, random: () => number): number {
  const ceiling = Math.min(maxMs, minMs * 2 ** Math.min(attempt, 30));
  return Math.round(minMs / 2 + random() * Math.max(0, ceiling - minMs / 2));
}

export interface BackoffPolicy {
  minMs: number;
  maxMs: number;
  fastMaxMs: number;
  fastForMs: number;
  healthyAfterMs: number;
}

/**
 * The reconnect schedule (docs/agent.md, reconnect backoff). Attempt _n_ after a failure waits
 * `backoffDelay(n, min, max)`. When a connection that had been up at least `healthyAfterMs` is lost, the broker
 * most likely restarted or a link blinked: for `fastForMs` from then every delay is capped at `fastMaxMs` (with
 * the same jitter), so the device is back within seconds of the broker; after that, if failures persist, the
 * delays grow from the fast cap to `maxMs` as usual.
 */
export class ReconnectBackoff {
  private attempt = 0;
  private upSince: number | undefined;
  /** While `now()` is before this, the fast cap holds. */
  private fastUntil: number | undefined;

  constructor(
    private readonly p: BackoffPolicy,
    private readonly random: () => number,
    private readonly now: () => number,
  ) {}

  /** A connection is up: the next failure starts the schedule again. */
  connected(): void {
    this.upSince = this.now();
    this.attempt = 0;
    this.fastUntil = undefined;
  }

  /** The connection that was up is gone. */
  lost(): void {
    const t = this.now();
    if (this.upSince !== undefined && t - this.upSince >= this.p.healthyAfterMs) this.fastUntil = t + this.p.fastForMs;
    this.upSince = undefined;
  }

  /** Whether the next delay is capped by the fast cap. */
  get fast(): boolean {
    return this.fastUntil !== undefined && this.now() < this.fastUntil;
  }

  /** The delay before the next attempt; each call counts one attempt. */
  next(): number {
    const { minMs, maxMs, fastMaxMs } = this.p;
    if (this.fastUntil !== undefined) {
      if (this.now() < this.fastUntil) {
        const cap = Math.min(fastMaxMs, maxMs);
        return Math.round(minMs / 2 + this.random() * Math.max(0, cap - minMs / 2));
      }
      // Failures persisted through the fast phase: the delays grow on from twice the fast cap.
      this.fastUntil = undefined;
      this.attempt = Math.ceil(Math.log2(Math.max(1, fastMaxMs / minMs))) + 1;
    }
    return backoffDelay(this.attempt++, minMs, maxMs, this.random);
  }
}

export class Uplink extends EventEmitter<UplinkEvents> {
  private client: MqttClient | undefined;
  private isUp = false;
  private stopping = false;
  /** Attempts since the last connection, for the log. */
  private attempt = 0;
  private readonly backoff: ReconnectBackoff;
  private retryTimer: NodeJS.Timeout | undefined;
  /** Dropped `down/` payloads by reason, for status and tests. */
  readonly dropped = { invalid: 0, foreign: 0 };
  /** Completed connections since start. */
  connects = 0;
  /** Enrolment requests sent since start. */
  enrolments = 0;

  constructor(private readonly opts: UplinkOptions) {
    super();
    this.backoff = new ReconnectBackoff(
      {
        minMs: opts.backoffMinMs,
        maxMs: opts.backoffMaxMs,
        fastMaxMs: opts.backoffFastMaxMs,
        fastForMs: opts.backoffFastForMs,
        healthyAfterMs: opts.healthyAfterMs,
      },
      opts.random ?? Math.random,
      opts.now ?? Date.now,
    );
  }

  get connected(): boolean {
    return this.isUp;
  }

  start(): void {
    this.stopping = false;
    this.connect();
  }

  /** One topic's publisher, for a part of the agent that reports on it (commands, firmware). */
  reporter<K extends Exclude<UpTopic, 'state'>>(
    name: K,
  ): { publish(payload: Payloads[K], onAck: () => void): boolean; readonly connected: boolean } {
    // eslint-disable-next-line @typescript-eslint/no-this-alias -- the getter below reads the live state
    const uplink = this;
    return {
      publish: (payload, onAck) => uplink.publish(name, payload, onAck),
      get connected() {
        return uplink.connected;
      },
    };
  }

  /**
   * Publishes a payload at QoS 1; `false` when not connected (the caller's durable state covers it). The
   * promise-free form keeps the hot path free of allocations per message.
   */
  publish<K extends Exclude<UpTopic, 'state'>>(name: K, payload: Payloads[K], onAck?: () => void): boolean {
    const client = this.client;
    if (!this.isUp || !client) return false;
    client.publish(topicFor(this.opts.deviceId, name), encode(name, payload), { qos: 1 }, (err) => {
      if (err) {
        if (!this.stopping) this.opts.log.debug({ event: 'mqtt.publish_failed', topic: name, err: err.message });
      } else onAck?.();
    });
    return true;
  }

  /**
   * Ends the connection cleanly: publishes the final state (retained) first, so that the cloud tells a
   * sleeping or stopped device from a lost one, then disconnects without the last will.
   */
  async stop(finalState: StatePayload = 'offline'): Promise<void> {
    this.stopping = true;
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    const client = this.client;
    this.client = undefined;
    const wasUp = this.isUp;
    this.isUp = false;
    // Said at once: a new connection may be up before the old one has finished closing.
    if (wasUp) this.emit('down');
    if (!client) return;
    if (wasUp && client.connected) {
      await new Promise<void>((resolve) => {
        client.publish(
          topicFor(this.opts.deviceId, 'state'),
          encode('state', finalState),
          { qos: 0, retain: true },
          () => resolve(),
        );
        // Never wait long for a broker that has gone away.
        setTimeout(resolve, 1000).unref();
      });
    }
    await new Promise<void>((resolve) => {
      client.end(!client.connected, {}, () => resolve());
      setTimeout(resolve, 1000).unref();
    });
    client.removeAllListeners();
    client.on('error', () => undefined);
  }

  /**
   * The device's connection (docs/protocol.md, "Connecting"); with `login`, the enrolment request's, which has no
   * last will. Throws when a TLS file cannot be read (read again at every connect, so a rotation is picked up).
   */
  private clientOptions(login?: { username: string; password: string }): IClientOptions {
    const o = this.opts;
    return mqttClientOptions({
      clientId: login?.username ?? o.deviceId,
      username: login?.username ?? o.username,
      password: login?.password ?? o.password,
      // The broker keeps nothing for the device: the cloud sends what it missed when it sees the hello.
      clean: true,
      keepaliveSec: o.keepaliveSec,
      connectTimeoutMs: o.connectTimeoutMs,
      // The uplink reconnects itself, with backoff and jitter (docs/agent.md, reconnect backoff).
      reconnectPeriodMs: 0,
      lean: true,
      ...(login
        ? {}
        : {
            will: {
              topic: topicFor(o.deviceId, 'state'),
              payload: encode('state', 'offline'),
              qos: 0 as const,
              retain: true,
            },
          }),
      tls: readMqttTls(o),
      rejectUnauthorized: o.rejectUnauthorized,
    });
  }

  private connect(): void {
    if (this.stopping) return;
    const log = this.opts.log;
    let client: MqttClient;
    try {
      client = mqtt.connect(this.opts.url, this.clientOptions());
    } catch (err) {
      log.error({ event: 'mqtt.config_error', url: safeUrl(this.opts.url), err: (err as Error).message });
      this.scheduleReconnect();
      return;
    }
    this.client = client;
    // Send every packet at once: with Nagle's algorithm the ack of a cloud push, written right after the PUBACK,
    // waits for the broker's delayed ACK (about 40 ms on Linux). A WebSocket stream has no such switch.
    (client.stream as Partial<Socket> | undefined)?.setNoDelay?.(true);
    let wasUp = false;
    client.on('connect', () => {
      client.subscribe(downFilter(this.opts.deviceId), { qos: 1 }, (err) => {
        if (err || this.client !== client) {
          if (err) log.warn({ event: 'mqtt.subscribe_failed', err: err.message });
          client.end(true);
          return;
        }
        // `state` is the one topic at QoS 0 (docs/decisions.md §4): it is retained, and only its latest value matters.
        client.publish(topicFor(this.opts.deviceId, 'state'), encode('state', 'online'), { qos: 0, retain: true });
        client.publish(topicFor(this.opts.deviceId, 'up/hello'), encode('up/hello', this.opts.hello()), { qos: 1 });
        wasUp = true;
        this.isUp = true;
        this.connects++;
        log.info({ event: 'mqtt.connected', url: safeUrl(this.opts.url), attempts: this.attempt + 1 });
        this.attempt = 0;
        this.backoff.connected();
        this.emit('up');
      });
    });
    client.on('message', (topic, payload) => this.onMessage(topic, payload));
    let refused = false;
    client.on('error', (err) => {
      // CONNACK 4 (bad username or password) or 5 (not authorized): the broker does not know this device yet.
      const code = (err as { code?: unknown }).code;
      if (code === 4 || code === 5) refused = true;
      log.warn({ event: 'mqtt.error', url: safeUrl(this.opts.url), err: err.message });
    });
    client.on('close', () => {
      if (this.client !== client) return;
      this.client = undefined;
      this.isUp = false;
      client.removeAllListeners();
      client.on('error', () => undefined);
      client.end(true);
      if (wasUp) {
        this.backoff.lost();
        log.warn({ event: 'mqtt.disconnected', url: safeUrl(this.opts.url) });
        this.emit('down');
      }
      if (refused && this.opts.enrol && this.opts.username === this.opts.deviceId) {
        void this.requestEnrolment(this.opts.enrol).finally(() => this.scheduleReconnect());
      } else this.scheduleReconnect();
    });
  }

  /**
   * Asks the cloud to enrol this device: one connection with the enrolment credential, which may only publish
   * this request; the cloud makes the device's own login unless its id is taken. Resolves either way.
   */
  private async requestEnrolment(enrol: { username: string; password: string }): Promise<void> {
    const log = this.opts.log;
    const client = mqtt.connect(this.opts.url, this.clientOptions(enrol));
    client.on('error', () => undefined);
    try {
      await new Promise<void>((resolve, reject) => {
        client.once('connect', () => resolve());
        client.once('close', () => reject(new Error('the broker refused the enrolment credential')));
      });
      const request = JSON.stringify({ deviceId: this.opts.deviceId, secret: this.opts.password });
      await client.publishAsync(ENROL_TOPIC, request, { qos: 1 });
      this.enrolments++;
      log.info({ event: 'mqtt.enrol_requested', url: safeUrl(this.opts.url) });
    } catch (err) {
      log.warn({ event: 'mqtt.enrol_failed', url: safeUrl(this.opts.url), err: (err as Error).message });
    } finally {
      await new Promise<void>((resolve) => {
        client.end(true, {}, () => resolve());
        setTimeout(resolve, 1000).unref();
      });
      client.removeAllListeners();
      client.on('error', () => undefined);
    }
  }

  private scheduleReconnect(): void {
    if (this.stopping) return;
    const fast = this.backoff.fast;
    const delay = this.backoff.next();
    this.attempt++;
    this.opts.log.debug({ event: 'mqtt.reconnect_scheduled', delayMs: delay, attempt: this.attempt, fast });
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      this.connect();
    }, delay);
  }

  private onMessage(topic: string, payload: Buffer): void {
    const parsed = parseTopic(topic);
    if (!parsed || parsed.deviceId !== this.opts.deviceId || !isDownTopic(parsed.name)) {
      this.dropped.foreign++;
      this.opts.log.warn({ event: 'mqtt.drop', topic, reason: 'not a down topic of this device' });
      return;
    }
    const name = parsed.name;
    const decoded = decode(name, payload);
    if (!decoded.ok) {
      this.dropped.invalid++;
      this.opts.log.warn({ event: 'mqtt.drop', topic: name, reason: decoded.reason, bytes: payload.length });
      return;
    }
    this.emit('message', { name, payload: decoded.value } as DownMessage);
  }
}
