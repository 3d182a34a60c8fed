/**
 * The bridge's MQTT client (docs/decisions.md §4): one connection, to the embedded broker or to an external one
 * (`--mqtt-url`), subscribed to what every device publishes. Each payload is validated with `protocol/`; a
 * payload that fails is dropped with one warning line and a counter, never a crash.
 *
 * With an external broker the session is persistent (`clean: false`): the broker keeps what devices publish
 * while the bridge restarts. The embedded broker starts and stops with the bridge, so there the session is clean.
 *
 * Several bridges on one external broker (`mqtt.shareGroup`, docs/scaling.md) share the devices' `up/` messages
 * through an MQTT 5 shared subscription, each message going to one of them; each still reads every `state`.
 */
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import type { Aedes, AedesPublishPacket } from 'aedes';
import mqtt, { type MqttClient } from 'mqtt';
import type { Logger } from '../../lib/log.js';
import { mqttClientOptions } from '../../lib/mqtt-options.js';
import type { DeviceRateLimiter } from './ratelimit.js';
import { safeUrl } from '../../lib/url.js';
import {
  ALL_DEVICES_UP_FILTERS,
  DEVICES_STATE_FILTER,
  DEVICES_UP_FILTER,
  type DownTopic,
  type Payloads,
  type UpTopic,
  decode,
  encode,
  isUpTopic,
  parseTopic,
  topicFor,
} from '../../protocol/index.js';

export type UpMessage = { [K in UpTopic]: { deviceId: string; name: K; payload: Payloads[K] } }[UpTopic];

/**
 * How the bridge's services reach devices through a link: `false` when the message could not be handed to the
 * broker.
 */
export type SendDown = <K extends DownTopic>(deviceId: string, name: K, payload: Payloads[K]) => boolean;

export interface LinkOptions {
  url: string;
  clientId: string;
  username?: string | undefined;
  password?: string | undefined;
  /** The CA of an external broker's certificate (PEM). */
  ca?: Buffer | undefined;
  /** Persistent session at the broker. */
  persistent: boolean;
  /**
   * Several bridges on one broker (docs/scaling.md): the MQTT 5 shared subscription group they read devices' `up/`
   * messages through. Undefined: this link alone reads them, over MQTT 3.1.1.
   */
  shareGroup?: string | undefined;
  /**
   * With `shareGroup` and a persistent session: how long the broker keeps the session after the connection is
   * lost, seconds. `close()` ends it at once.
   */
  sessionExpirySec?: number | undefined;
  log: Logger;
  /** The bridge's clock: the `now` a device that reads it gets with every `down/` payload. */
  now: () => number;
  /**
   * Per-device limits, applied to each message before it is decoded. An external broker does not apply them, and
   * the bridge cannot disconnect a device there: a device over its limits is ignored for the penalty instead.
   */
  deviceLimits?: DeviceRateLimiter | undefined;
}

interface LinkEvents {
  /** Connected and subscribed. */
  up: [];
  down: [];
  message: [UpMessage];
}

/**
 * What both kinds of link share: what they emit, their counters, and the check of every payload a device
 * publishes (`protocol/`): one warning line and a counter for a bad one, never a crash.
 */
abstract class LinkBase extends EventEmitter<LinkEvents> {
  /** Dropped payloads: `invalid` failed validation, `foreign` came on a topic outside the contract. */
  readonly dropped = { invalid: 0, foreign: 0 };
  /** Valid payloads received, by topic name. */
  readonly received: Partial<Record<UpTopic, number>> = {};
  /** Devices whose latest hello says they read `now` (decision 24): every `down/` payload to them carries it. */
  private readonly clockDevices = new Set<string>();

  constructor(
    protected readonly log: Logger,
    private readonly now: () => number,
    private readonly deviceLimits?: DeviceRateLimiter,
  ) {
    super();
  }

  /** The payload as it goes to a device: with the bridge's clock when the device reads it (docs/sync.md#clocks). */
  protected stamped<K extends DownTopic>(deviceId: string, name: K, payload: Payloads[K]): Buffer {
    if (!this.clockDevices.has(deviceId)) return encode(name, payload);
    return encode(name, { ...payload, now: this.now() });
  }

  abstract get connected(): boolean;
  abstract start(timeoutMs: number): Promise<void>;
  /** Publishes at QoS 1; `false` when it cannot (what was to be sent is in the store, and goes at catch-up). */
  abstract publish<K extends DownTopic>(deviceId: string, name: K, payload: Payloads[K]): boolean;
  abstract close(): Promise<void>;

  protected onMessage(topic: string, payload: Buffer): void {
    const parsed = parseTopic(topic);
    if (!parsed || !isUpTopic(parsed.name)) {
      this.dropped.foreign++;
      this.log.warn({ event: 'mqtt.drop', topic: topic.slice(0, 200), reason: 'not a device topic' });
      return;
    }
    if (this.deviceLimits && this.deviceLimits.admit(parsed.deviceId, parsed.name, payload.length) !== 'ok') return;
    const decoded = decode(parsed.name, payload);
    if (!decoded.ok) {
      this.dropped.invalid++;
      this.log.warn({
        event: 'mqtt.drop',
        deviceId: parsed.deviceId,
        topic: parsed.name,
        reason: decoded.reason,
        bytes: payload.length,
      });
      return;
    }
    this.received[parsed.name] = (this.received[parsed.name] ?? 0) + 1;
    if (parsed.name === 'up/hello') {
      // An older agent refuses a payload with a field it does not know, so only those that say so get `now`.
      const hello = decoded.value as Payloads['up/hello'];
      if (hello.clock === true) this.clockDevices.add(parsed.deviceId);
      else this.clockDevices.delete(parsed.deviceId);
    }
    this.emit('message', { deviceId: parsed.deviceId, name: parsed.name, payload: decoded.value } as UpMessage);
  }
}

/**
 * The filters a link subscribes to. In a share group the `up/` messages, events each of which one bridge must
 * handle, come through the group; `state` stays a plain subscription of every bridge (docs/scaling.md, "What
 * happens to `state`"): it is the device's latest presence, retained, which a shared subscription never delivers
 * on subscribe, and every bridge that reads every change in order ends at the device's latest one.
 */
export function linkFilters(shareGroup: string | undefined): string[] {
  if (shareGroup === undefined) return [...ALL_DEVICES_UP_FILTERS];
  return [`$share/${shareGroup}/${DEVICES_UP_FILTER}`, DEVICES_STATE_FILTER];
}

/** MQTT 5's DISCONNECT reason when another connection took the client id. */
const SESSION_TAKEN_OVER = 0x8e;
/** Closes by the broker, each soon after the connect, that mean another client with the same id (below). */
const FLAPS = { count: 3, withinMs: 60_000, soonMs: 10_000 };

const yielding = new WeakSet<object>();

/** What {@link yieldBetweenReads} reaches of a TCP socket's handle (libuv's read start and stop). */
interface ReadHandle {
  readStart(): number;
  readStop(): number;
  /** `false` once Node itself stopped reading (backpressure): Node starts it again then, not this. */
  reading?: boolean;
}

/**
 * Lets the event loop serve everything else between two reads from the broker. The MQTT client parses and
 * handles all of a read (up to 64 KiB, a few hundred small messages) before it returns, and Node reads a socket
 * again and again, up to 32 times, while data waits: a burst one device made (thousands of messages the broker
 * passes on before the limits cut the device off) would otherwise be parsed, and dropped, in one stretch of
 * hundreds of ms, with every HTTP request waiting behind it. Reading stops after each read and starts again on
 * the next turn of the event loop. (`pause()` would not do: the client's pipe resumes the socket as soon as the
 * read is handled.) A socket without such a handle (another transport) is read as it comes.
 */
function yieldBetweenReads(stream: Partial<Socket> | undefined): void {
  const handle = (stream as { _handle?: Partial<ReadHandle> | null } | undefined)?._handle;
  if (!stream?.on || !handle || typeof handle.readStop !== 'function' || typeof handle.readStart !== 'function') return;
  if (yielding.has(stream)) return;
  yielding.add(stream);
  const h = handle as ReadHandle;
  const socket = stream as Socket;
  let stopped = false;
  socket.on('data', () => {
    if (stopped) return;
    stopped = true;
    h.readStop();
    setImmediate(() => {
      stopped = false;
      if (!socket.destroyed && h.reading !== false) h.readStart();
    });
  });
}

/** The bridge's link to its devices, through whichever broker. */
export type Link = LinkBase;

export class DeviceLink extends LinkBase {
  private client: MqttClient | undefined;
  private isUp = false;
  /** When each connection the broker closed soon had been made, within the last minute; and the last report. */
  private closedByBroker: number[] = [];
  private lastTakenOver = -Infinity;

  constructor(private readonly opts: LinkOptions) {
    super(opts.log, opts.now, opts.deviceLimits);
  }

  get connected(): boolean {
    return this.isUp;
  }

  /** Connects; resolves at the first subscription, or rejects when `timeoutMs` passes first. */
  start(timeoutMs: number): Promise<void> {
    const o = this.opts;
    const shared = o.shareGroup !== undefined;
    const filters = linkFilters(o.shareGroup);
    const options = mqttClientOptions({
      clientId: o.clientId,
      username: o.username,
      password: o.password,
      clean: !o.persistent,
      // Shared subscriptions are MQTT 5's; so is the session expiry that lets the group take a lost bridge's share.
      protocolVersion: shared ? 5 : undefined,
      sessionExpirySec: shared && o.persistent ? (o.sessionExpirySec ?? 0) : undefined,
      keepaliveSec: 30,
      connectTimeoutMs: 10_000,
      // mqtt.js reconnects the bridge every second, and subscribes again (docs/protocol.md, "The cloud side").
      reconnectPeriodMs: 1000,
      resubscribe: true,
      lean: true,
      tls: { ca: o.ca },
    });
    const client = mqtt.connect(o.url, options);
    this.client = client;
    const where = safeUrl(o.url);
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no connection to the MQTT broker at ${where}`)), timeoutMs);
      timer.unref();
      this.once('up', () => {
        clearTimeout(timer);
        resolve();
      });
    });
    // When the current connection was made; and when the one before it was, if the broker closed it soon after.
    let connectedAt: number | undefined;
    let closedSoon: number | undefined;
    client.on('connect', (connack) => {
      const now = o.now();
      // Closed by the broker soon after the connect, with no error, and straight back in: another client with the
      // same id takes it over each time this one connects (Mosquitto before 2.0.15 does so without a word to an
      // MQTT 5 client). A broker that restarts makes the reconnect fail first.
      if (closedSoon !== undefined) this.closedSoon(closedSoon, now);
      closedSoon = undefined;
      connectedAt = now;
      const stream = client.stream as Partial<Socket> | undefined;
      stream?.setNoDelay?.(true);
      yieldBetweenReads(stream);
      // A session this client id had before it joined the group would still read every `up/` message.
      if (shared && connack.sessionPresent) client.unsubscribe(DEVICES_UP_FILTER);
      // A persistent session keeps its subscriptions; subscribing again is harmless and covers a broker that lost it.
      client.subscribe(filters, { qos: 1 }, (err, granted) => {
        // 128 and above: refused (MQTT 3.1.1 says 128; MQTT 5 gives the reason, e.g. 135, not authorized).
        if (err || granted?.some((g) => g.qos >= 128)) {
          o.log.error({ event: 'mqtt.subscribe_failed', url: where, err: err?.message ?? 'refused by the broker' });
          return;
        }
        this.isUp = true;
        o.log.info({
          event: 'mqtt.connected',
          url: where,
          sessionPresent: connack.sessionPresent,
          ...(shared ? { clientId: o.clientId, shareGroup: o.shareGroup } : {}),
        });
        this.emit('up');
      });
    });
    client.on('message', (topic, payload) => this.onMessage(topic, payload));
    client.on('error', (err) => {
      connectedAt = undefined;
      closedSoon = undefined;
      o.log.warn({ event: 'mqtt.error', url: where, err: err.message });
    });
    client.on('disconnect', (packet) => {
      if (packet.reasonCode === SESSION_TAKEN_OVER) this.takenOver('the broker says another client took the id');
    });
    client.on('close', () => {
      if (connectedAt !== undefined && this.client === client && o.now() - connectedAt < FLAPS.soonMs) {
        closedSoon = connectedAt;
      }
      connectedAt = undefined;
      if (!this.isUp) return;
      this.isUp = false;
      o.log.warn({ event: 'mqtt.disconnected', url: where });
      this.emit('down');
    });
    return ready;
  }

  /**
   * Counts a connection the broker closed soon after it was made, once the next one is made; the third within a
   * minute is reported.
   */
  private closedSoon(connectedAt: number, now: number): void {
    this.closedByBroker = [...this.closedByBroker.filter((t) => now - t < FLAPS.withinMs), connectedAt];
    if (this.closedByBroker.length < FLAPS.count) return;
    this.closedByBroker = [];
    this.takenOver(
      `the broker closed the connection ${FLAPS.count} times within a minute, each soon after it was made`,
    );
  }

  /** Another client holds the link's client id: said once a minute at most. */
  private takenOver(reason: string): void {
    const now = this.opts.now();
    if (now - this.lastTakenOver < FLAPS.withinMs) return;
    this.lastTakenOver = now;
    this.opts.log.error({
      event: 'mqtt.taken_over',
      url: safeUrl(this.opts.url),
      clientId: this.opts.clientId,
      reason,
    });
  }

  /** Publishes at QoS 1; `false` when not connected (what was to be sent is in the store, and goes at catch-up). */
  publish<K extends DownTopic>(deviceId: string, name: K, payload: Payloads[K]): boolean {
    const client = this.client;
    // Connected is enough: a persistent session hands over what the broker kept as soon as it accepts the
    // connection, before the subscription is confirmed, and the acknowledgements of those messages must go out.
    if (!client?.connected) return false;
    client.publish(topicFor(deviceId, name), this.stamped(deviceId, name, payload), { qos: 1 }, (err) => {
      if (err) this.opts.log.debug({ event: 'mqtt.publish_failed', topic: name, deviceId, err: err.message });
    });
    return true;
  }

  async close(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.isUp = false;
    if (!client) return;
    // In a share group the session ends with the connection: the group's other bridges get this one's share of the
    // messages from the next one on, instead of the broker keeping it for a bridge that may not come back.
    const leave = this.opts.shareGroup !== undefined ? { properties: { sessionExpiryInterval: 0 } } : {};
    await new Promise<void>((resolve) => {
      client.end(false, leave, () => resolve());
      setTimeout(resolve, 1000).unref();
    });
    client.removeAllListeners();
    client.on('error', () => undefined);
  }
}

/**
 * The link to the embedded broker, inside the bridge's process: it subscribes and publishes through the broker's
 * own interface, so that a message between the bridge and a device crosses one socket, not three. What devices may
 * do is the broker's authorize hooks' business either way.
 */
export class EmbeddedLink extends LinkBase {
  private isUp = false;
  private readonly deliver = (packet: AedesPublishPacket, done: () => void): void => {
    done();
    const payload = typeof packet.payload === 'string' ? Buffer.from(packet.payload) : packet.payload;
    this.onMessage(packet.topic, payload);
  };

  constructor(
    private readonly aedes: Aedes,
    log: Logger,
    now: () => number,
  ) {
    super(log, now);
  }

  get connected(): boolean {
    return this.isUp && !this.aedes.closed;
  }

  async start(): Promise<void> {
    await Promise.all(
      ALL_DEVICES_UP_FILTERS.map((f) => new Promise<void>((resolve) => this.aedes.subscribe(f, this.deliver, resolve))),
    );
    this.isUp = true;
    this.log.info({ event: 'mqtt.connected', url: 'embedded', sessionPresent: false });
    this.emit('up');
  }

  publish<K extends DownTopic>(deviceId: string, name: K, payload: Payloads[K]): boolean {
    if (!this.connected) return false;
    const packet = {
      cmd: 'publish' as const,
      topic: topicFor(deviceId, name),
      payload: this.stamped(deviceId, name, payload),
      qos: 1 as const,
      retain: false,
      dup: false,
    };
    this.aedes.publish(packet, (err) => {
      if (err) this.log.debug({ event: 'mqtt.publish_failed', topic: name, deviceId, err: err.message });
    });
    return true;
  }

  async close(): Promise<void> {
    if (!this.isUp) return;
    this.isUp = false;
    await Promise.all(
      ALL_DEVICES_UP_FILTERS.map(
        (f) => new Promise<void>((resolve) => this.aedes.unsubscribe(f, this.deliver, resolve)),
      ),
    );
  }
}
