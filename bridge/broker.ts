/**
 * The bridge's embedded MQTT broker (aedes), used when no external broker is configured (docs/decisions.md §4
 * and §5). Its hooks do what per-device credentials and ACLs do on Mosquitto in production:
 *
 * - authenticate: a device logs in with its uuid as username and its secret as password. A known device must
 *   present its secret. An unknown one is refused unless open enrolment is on: then, with an enrolment
 *   credential, it enrols as it does at Mosquitto (a login with the credential that may only publish its id and
 *   secret on `ENROL_TOPIC`); without one, on first connect (trust on first use). Enrolments are capped per client
 *   address and in all (docs/operations.md, "Enrolment"). Secrets are kept as hashes only.
 * - authorize: a device publishes only under its own `up/` and `state`, and subscribes only to its own
 *   `down/`. Anything else is refused and logged.
 *
 * - rate limits: a device's messages over its limits are dropped, and a device that keeps going over is
 *   disconnected and refused for a while (bridge/devices/ratelimit.ts), before the bridge handles anything.
 * - packet size: a client whose packet header announces more than `MAX_PACKET_BYTES` (protocol/) is disconnected
 *   before the rest of the packet is read (docs/protocol.md, "Packet size").
 *
 * The bridge's own client connects with a credential made at start that no device can guess.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { createRequire } from 'node:module';
import { type AddressInfo, type Server, type Socket, createServer } from 'node:net';
import { Aedes, type AuthenticateError, type Client, type PublishPacket } from 'aedes';
import type { Logger } from '../lib/log.js';
import { ENROL_TOPIC, MAX_PACKET_BYTES, TOPIC_ROOT, isDeviceId, parseTopic } from '../protocol/index.js';
import { RateLimiter } from './accounts/ratelimit.js';
import type { DeviceRateLimiter } from './devices/ratelimit.js';
import { EnrolRequest } from './mqtt/dynsec.js';
import { indexedMemoryPersistence } from './retained.js';

/** Where enrolled devices' secret hashes are kept; the bridge store implements it. */
export interface DeviceCredentials {
  secretHash(deviceId: string): Promise<string | undefined>;
  /** Records a device's secret hash, enrolled at `at` (ms since the epoch), durably. */
  enroll(deviceId: string, secretHash: string, at: number): Promise<void>;
}

/** Credentials kept in memory, for a broker whose devices need not survive a restart. */
export class MemoryCredentials implements DeviceCredentials {
  private readonly hashes = new Map<string, string>();
  secretHash(deviceId: string): Promise<string | undefined> {
    return Promise.resolve(this.hashes.get(deviceId));
  }
  enroll(deviceId: string, secretHash: string): Promise<void> {
    this.hashes.set(deviceId, secretHash);
    return Promise.resolve();
  }
}

/**
 * Device secrets are 256 random bits, so a fast hash is as strong as a slow one here; what matters is that
 * the broker never keeps the secret itself.
 */
export function hashSecret(secret: string | Buffer): string {
  return createHash('sha256').update(secret).digest('hex');
}

function sameHash(a: string, b: string): boolean {
  const x = Buffer.from(a, 'hex');
  const y = Buffer.from(b, 'hex');
  return x.length === y.length && timingSafeEqual(x, y);
}

export interface EmbeddedBrokerOptions {
  host: string;
  /** 0 picks a free port. */
  port: number;
  /** Enrol unknown devices: through `enrol` when given, else on first connect (trust on first use). */
  openEnrolment: boolean;
  /** The enrolment credential (with `openEnrolment`). */
  enrol?: { username: string; password: string } | undefined;
  /** Enrolments allowed per window from one client address, and in all; default 10 and 100 a minute. */
  enrolLimits?: { perAddress: number; total: number; windowMs: number };
  credentials: DeviceCredentials;
  log: Logger;
  /** The bridge's clock (bridge/bridge.ts): when a device enrolled. */
  now: () => number;
  /** Per-device limits on what devices publish, applied before the bridge sees a message. */
  deviceLimits?: DeviceRateLimiter | undefined;
  /** The largest MQTT packet, whole, in bytes; default `MAX_PACKET_BYTES`. */
  maxPacketBytes?: number;
}

/** What {@link EmbeddedBroker} reaches of aedes' per-connection packet parser (mqtt-packet). */
interface PacketParser {
  packet: { length: number };
  _parseLength: (this: PacketParser) => boolean;
  _emitError: (this: PacketParser, err: Error) => void;
}

/**
 * aedes writes packets with mqtt-packet, which by default keeps a buffer for each of the 65,536 packet
 * identifiers, made on the first packet the process writes: 40 to 50 ms with the event loop held, paid by whoever
 * connects first (a device, with the embedded broker), and 65,536 objects on the heap for the life of the process.
 * Writing an identifier's two bytes as it goes costs nothing measurable. The module is the copy aedes loads.
 */
function skipPacketIdCache(): void {
  const aedesEntry = createRequire(import.meta.url).resolve('aedes');
  const writer = createRequire(aedesEntry)('mqtt-packet') as { writeToStream?: { cacheNumbers?: boolean } };
  if (writer.writeToStream) writer.writeToStream.cacheNumbers = false;
}

/** Why a client was refused, for the log and for tests. */
export type Refusal =
  | 'bad-username'
  | 'bad-secret'
  | 'not-enrolled'
  | 'publish-denied'
  | 'subscribe-denied'
  | 'packet-too-large'
  | 'enrol-limited'
  | 'rate-limited';

/** MQTT 3.1.1 CONNACK return codes used here. */
const BAD_CREDENTIALS = 4;
const NOT_AUTHORIZED = 5;
const SERVER_UNAVAILABLE = 3;

/**
 * Where a publish the broker swallows goes: a `$` topic, which no wildcard subscription matches (MQTT 4.7.2) and
 * no device may subscribe to. The publisher still gets its PUBACK.
 */
const SINK_TOPIC = '$devcloud/swallowed';

export function swallow(packet: PublishPacket): void {
  packet.topic = SINK_TOPIC;
  packet.retain = false;
  packet.payload = Buffer.alloc(0);
}

/** The address a client connected from, for the enrolment limits. */
function addressOf(client: Client): string {
  return (client.conn as Partial<Socket> | undefined)?.remoteAddress ?? 'unknown';
}

export class EmbeddedBroker {
  readonly aedes: Aedes;
  /** The credential of the bridge's own client. */
  readonly bridgeUsername = 'devcloud-bridge';
  readonly bridgePassword = randomBytes(32).toString('hex');
  /** The client id the bridge's own MQTT client must use with that credential. */
  readonly bridgeClientId = `devcloud-bridge-${randomBytes(6).toString('hex')}`;
  readonly refusals: Record<Refusal, number> = {
    'bad-username': 0,
    'bad-secret': 0,
    'not-enrolled': 0,
    'publish-denied': 0,
    'subscribe-denied': 0,
    'packet-too-large': 0,
    'enrol-limited': 0,
    'rate-limited': 0,
  };
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private readonly bridgeClients = new WeakSet<Client>();
  /** Clients logged in with the enrolment credential: they may only publish an enrolment request. */
  private readonly enrolClients = new WeakSet<Client>();
  /** Each connection's packet parser, to stop reading from a client that is cut off. */
  private readonly parsers = new WeakMap<Client, PacketParser>();
  private readonly enrolByAddress: RateLimiter;
  private readonly enrolTotal: RateLimiter;

  private constructor(
    aedes: Aedes,
    private readonly opts: EmbeddedBrokerOptions,
  ) {
    this.aedes = aedes;
    const limits = opts.enrolLimits ?? { perAddress: 10, total: 100, windowMs: 60_000 };
    this.enrolByAddress = new RateLimiter({ limit: limits.perAddress, windowMs: limits.windowMs });
    this.enrolTotal = new RateLimiter({ limit: limits.total, windowMs: limits.windowMs });
  }

  /** Counts one enrolment from `client`'s address; `false` (and logged) when a limit is reached. */
  private mayEnrol(client: Client, deviceId: string): boolean {
    const address = addressOf(client);
    if (this.enrolByAddress.take(address).ok && this.enrolTotal.take('all').ok) return true;
    this.refusals['enrol-limited']++;
    this.opts.log.warn({ event: 'broker.enrol_limited', deviceId, address });
    return false;
  }

  /** An enrolment request published with the enrolment credential (the agent's side: agent/uplink.ts). */
  private async enrolRequest(client: Client, payload: Buffer | string): Promise<void> {
    const log = this.opts.log;
    let parsed: ReturnType<typeof EnrolRequest.safeParse>;
    try {
      parsed = EnrolRequest.safeParse(JSON.parse(payload.toString()));
    } catch {
      parsed = EnrolRequest.safeParse(undefined);
    }
    if (!parsed.success || !isDeviceId(parsed.data.deviceId)) {
      log.warn({ event: 'broker.enrol_refused', reason: 'malformed request', bytes: payload.length });
      return;
    }
    const { deviceId, secret } = parsed.data;
    // A known device's secret is never replaced.
    if ((await this.opts.credentials.secretHash(deviceId)) !== undefined) {
      log.warn({ event: 'broker.enrol_refused', deviceId, reason: 'known device' });
      return;
    }
    if (!this.mayEnrol(client, deviceId)) return;
    await this.opts.credentials.enroll(deviceId, hashSecret(secret), this.opts.now());
    log.info({ event: 'broker.enrolled', deviceId, via: 'credential' });
  }

  static async start(opts: EmbeddedBrokerOptions): Promise<EmbeddedBroker> {
    skipPacketIdCache();
    // Retained messages by topic level: a device's subscription does not scan every device's `state` (retained.ts).
    const aedes = await Aedes.createBroker({ id: 'devcloud-bridge', persistence: indexedMemoryPersistence() });
    const broker = new EmbeddedBroker(aedes, opts);
    broker.install();
    await broker.listen();
    return broker;
  }

  get port(): number {
    return (this.server?.address() as AddressInfo | null)?.port ?? 0;
  }

  get url(): string {
    const host = this.opts.host === '0.0.0.0' || this.opts.host === '::' ? '127.0.0.1' : this.opts.host;
    return `mqtt://${host.includes(':') ? `[${host}]` : host}:${this.port}`;
  }

  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
    await new Promise<void>((resolve) => this.aedes.close(() => resolve()));
  }

  private listen(): Promise<void> {
    const server = createServer((socket) => {
      // Every packet at once: with Nagle's algorithm a small packet written behind another waits for the peer's
      // delayed ACK (about 40 ms on Linux), which a push and its acknowledgement would pay at every hop.
      socket.setNoDelay(true);
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
      this.guardPacketSize(this.aedes.handle(socket), socket);
    });
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.opts.port, this.opts.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  }

  /**
   * Refuses a packet whose header announces more than the limit, before its body is buffered: aedes (1.x) has no
   * packet size option, and its parser (mqtt-packet) would otherwise hold the whole packet in memory first. The
   * check sits on the connection's parser, right after it has read a packet's remaining length; a parser that
   * does not look as expected (another aedes version) gets no connection at all rather than no limit.
   */
  private guardPacketSize(client: Client, socket: Socket): void {
    // The fixed header (one byte and up to four of length) is not part of the remaining length.
    const maxRemaining = (this.opts.maxPacketBytes ?? MAX_PACKET_BYTES) - 5;
    const parser = (client as unknown as { _parser?: PacketParser })._parser;
    const parseLength = parser?._parseLength;
    if (!parser || typeof parseLength !== 'function' || typeof parser._emitError !== 'function') {
      this.opts.log.error({ event: 'broker.packet_guard_missing' });
      socket.destroy();
      return;
    }
    this.parsers.set(client, parser);
    parser._parseLength = () => {
      const done = parseLength.call(parser);
      const announced = parser.packet.length;
      if (done && announced > maxRemaining) {
        this.refusals['packet-too-large']++;
        this.opts.log.warn({
          event: 'broker.packet_too_large',
          clientId: client.id,
          bytes: announced + 5,
          limit: maxRemaining + 5,
        });
        // The error closes the connection (aedes' client error handling); what follows is never read.
        parser._emitError(new Error('packet too large'));
        return false;
      }
      return done;
    };
  }

  private refuse(reason: Refusal, client: Client | null, detail: Record<string, unknown>): void {
    this.refusals[reason]++;
    this.opts.log.warn({ event: 'broker.refused', reason, clientId: client?.id, ...detail });
  }

  private install(): void {
    const { aedes, opts } = this;
    const log = opts.log;

    aedes.authenticate = (client, username, password, done) => {
      const fail = (code: number, reason: Refusal) => {
        this.refuse(reason, client, { username: username?.slice(0, 64) });
        const err = new Error(reason) as AuthenticateError;
        err.returnCode = code;
        done(err, false);
      };
      if (username === this.bridgeUsername) {
        // The bridge's own client, or a tool of the operator's that watches the traffic with the same credential
        // under a client id of its own (`<bridgeClientId>-<suffix>`, so that it does not take the bridge's place).
        const idOk = client.id === this.bridgeClientId || client.id.startsWith(`${this.bridgeClientId}-`);
        const ok = idOk && password !== undefined && sameHash(hashSecret(password), hashSecret(this.bridgePassword));
        if (ok) {
          this.bridgeClients.add(client);
          done(null, true);
        } else fail(BAD_CREDENTIALS, 'bad-secret');
        return;
      }
      const enrol = opts.openEnrolment ? opts.enrol : undefined;
      if (enrol !== undefined && username === enrol.username) {
        // The enrolment credential under its own client id, as at Mosquitto (bridge/mqtt/dynsec.ts).
        const ok =
          client.id === enrol.username &&
          password !== undefined &&
          sameHash(hashSecret(password), hashSecret(enrol.password));
        if (ok) {
          this.enrolClients.add(client);
          done(null, true);
        } else fail(BAD_CREDENTIALS, 'bad-secret');
        return;
      }
      if (username === undefined || !isDeviceId(username) || client.id !== username) {
        fail(NOT_AUTHORIZED, 'bad-username');
        return;
      }
      if (password === undefined || password.length === 0) {
        fail(BAD_CREDENTIALS, 'bad-secret');
        return;
      }
      const presented = hashSecret(password);
      const unavailable = (reason: string, err?: unknown): void => {
        if (err !== undefined) log.error({ event: 'broker.auth_failed', deviceId: username, err: errText(err) });
        const e = new Error(reason) as AuthenticateError;
        e.returnCode = SERVER_UNAVAILABLE;
        done(e, false);
      };
      void (async () => {
        let known: string | undefined;
        try {
          known = await opts.credentials.secretHash(username);
        } catch (err) {
          unavailable('store-unavailable', err);
          return;
        }
        if (known === undefined) {
          // With an enrolment credential, an unknown device enrols through it, never by logging in.
          if (!opts.openEnrolment || enrol !== undefined) {
            fail(NOT_AUTHORIZED, 'not-enrolled');
            return;
          }
          if (!this.mayEnrol(client, username)) {
            unavailable('enrol-limited');
            return;
          }
          try {
            await opts.credentials.enroll(username, presented, opts.now());
            // Two first connections at once: the secret kept is the first one written, and only it gets in.
            known = await opts.credentials.secretHash(username);
          } catch (err) {
            unavailable('store-unavailable', err);
            return;
          }
          if (known === undefined || !sameHash(known, presented)) {
            fail(BAD_CREDENTIALS, 'bad-secret');
            return;
          }
          log.info({ event: 'broker.enrolled', deviceId: username, via: 'first-connect' });
          done(null, true);
          return;
        }
        if (!sameHash(known, presented)) {
          fail(BAD_CREDENTIALS, 'bad-secret');
          return;
        }
        // A device cut off for flooding waits out its penalty (logged once, when it was cut off).
        if (opts.deviceLimits?.penalised(username)) {
          this.refusals['rate-limited']++;
          unavailable('rate-limited');
          return;
        }
        done(null, true);
      })();
    };

    aedes.authorizePublish = (client, packet, done) => {
      if (!client || this.isBridge(client)) {
        done(null);
        return;
      }
      if (this.enrolClients.has(client)) {
        if (packet.topic !== ENROL_TOPIC) {
          this.refuse('publish-denied', client, { topic: packet.topic.slice(0, 200) });
          done(new Error('publish denied'));
          return;
        }
        this.enrolRequest(client, packet.payload).catch((err: unknown) =>
          this.opts.log.error({ event: 'broker.auth_failed', err: String(err) }),
        );
        // The request holds a secret: handled here, it goes to no subscriber.
        swallow(packet);
        done(null);
        return;
      }
      const t = parseTopic(packet.topic);
      const own = t !== undefined && t.deviceId === client.id && (t.name === 'state' || t.name.startsWith('up/'));
      if (!own) {
        this.refuse('publish-denied', client, { topic: packet.topic.slice(0, 200) });
        done(new Error('publish denied'));
        return;
      }
      const verdict = opts.deviceLimits?.admit(client.id, t.name, packet.payload.length) ?? 'ok';
      switch (verdict) {
        case 'ok':
          done(null);
          return;
        case 'drop':
          swallow(packet);
          done(null);
          return;
        case 'disconnect':
          this.refusals['rate-limited']++;
          // The rest of what the client sent, in this read and after, is never parsed: the parser stops at its
          // error, and the error closes the connection.
          this.parsers.get(client)?._emitError(new Error('rate limit'));
          done(new Error('rate limit'));
          return;
      }
    };

    aedes.authorizeSubscribe = (client, sub, done) => {
      if (!client || this.isBridge(client)) {
        done(null, sub);
        return;
      }
      const prefix = `${TOPIC_ROOT}/${client.id}/down/`;
      const own =
        sub.topic === `${prefix}#` || (sub.topic.startsWith(prefix) && !sub.topic.slice(prefix.length).includes('+'));
      if (!own) {
        this.refuse('subscribe-denied', client, { topic: sub.topic.slice(0, 200) });
        // A null subscription tells the client it was refused (granted QoS 128).
        done(null, null);
        return;
      }
      done(null, sub);
    };
  }

  /** A client that authenticated with the bridge credential. */
  private isBridge(client: Client): boolean {
    return this.bridgeClients.has(client);
  }
}

function errText(err: unknown): string {
  return err instanceof Error ? err.message : typeof err === 'string' ? err : 'unknown error';
}
