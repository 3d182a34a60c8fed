/**
 * The bridge's controller (docs/README.md, "The bridge's parts"): it composes the services from the config, the
 * store, the log and the clock it is given, and owns start and stop. Each feature that runs is a part
 * (bridge/part.ts): the parts start in order and stop in reverse order. A part that fails to start stops the parts
 * already started, in reverse, and the start fails with a `PartError` naming it; a part that fails to stop is
 * logged (`bridge.part_failed`) and the others still stop.
 *
 * The bridge does not own the store: whoever opened it closes it after `stop()`.
 */
import { readFileSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import type { Logger } from '../lib/log.js';
import { isStorageFull } from '../lib/sqlite.js';
import { readMqttTls } from '../lib/mqtt-options.js';
import { safeUrl } from '../lib/url.js';
import { hasherFor } from './accounts/password.js';
import { buildApp } from './app.js';
import { EmbeddedBroker } from './broker.js';
import { CommandService } from './commands/service.js';
import { type BridgeConfig, outboxDir } from './config.js';
import { createDeviceService } from './devices/create.js';
import { DeviceLink, EmbeddedLink, type Link } from './devices/link.js';
import { DeviceRateLimiter } from './devices/ratelimit.js';
import type { DeviceService } from './devices/service.js';
import { type EventBus, eventBusFor } from './events/bus.js';
import { ensureDefaultFrontend } from './frontends/default.js';
import { LinkMonitor } from './health.js';
import { type Mailer, createMailer } from './mail/mailer.js';
import { type ManagedBroker, startManagedBroker } from './mqtt/manage.js';
import { type Part, PartError, Periodic, stopOnly } from './part.js';
import type { BridgeStore, Frontend } from './store/types.js';

/** What the bridge needs of its database: either engine of bridge/store/. */
export type BridgeDatabase = BridgeStore;

export interface BridgeDeps<S extends BridgeDatabase = BridgeDatabase> {
  config: BridgeConfig;
  /** The database; its opener closes it after `stop()`. */
  store: S;
  log: Logger;
  /** The clock every part reads, ms since the epoch (`Date.now` in the program). */
  now: () => number;
  /** Hold every HTTP answer to the API document (`http/checker.ts`): for tests, off in the program. */
  checkAnswers?: boolean;
}

/** The credentials the MQTT side reads from files at start. */
interface Secrets {
  mqttPassword: string | undefined;
  mqttCa: Buffer | undefined;
  /** The embedded broker's enrolment password (with `dynsec`, bridge/mqtt/manage.ts reads its own). */
  enrolPassword: string | undefined;
  /** `notifications.webhook.caFile`: more CAs webhook receivers' certificates may chain to. */
  webhookCa: Buffer | undefined;
}

/** Reads a credential file; one that cannot be read stops the start with the reason. */
function readCredential(what: string, file: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new Error(`cannot read the ${what} file: ${(err as Error).message}`);
  }
}

/** Reads them before any part starts. */
function readSecrets(config: BridgeConfig): Secrets {
  const m = config.mqtt;
  const text = (what: string, file: string | undefined): string | undefined =>
    file === undefined ? undefined : readCredential(what, file).toString('utf8').trim();
  return {
    // In this order: of several files that cannot be read, the start names the first.
    enrolPassword: m.url === undefined && m.openEnrolment ? text('enrolment password', m.enrolPasswordFile) : undefined,
    mqttPassword: text('MQTT password', m.passwordFile),
    // `cannot read the MQTT CA file: …` when it cannot be read.
    mqttCa: readMqttTls({ caFile: m.caFile }).ca,
    webhookCa:
      config.notifications.webhook.caFile === undefined
        ? undefined
        : readCredential('webhook CA', config.notifications.webhook.caFile),
  };
}

/** A port that cannot be had, said as one line that names the flag to change. */
function portError(err: unknown, port: number, flag: string): Error {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'EADDRINUSE') return new Error(`port ${port} is already in use; choose another with ${flag} N`);
  if (code === 'EACCES') return new Error(`port ${port} needs privileges; choose another with ${flag} N`);
  return err instanceof Error ? err : new Error(String(err));
}

/** `http`: the REST API, `/healthz` and `/metrics` (bridge/app.ts) on `host` and `http.port`. */
class HttpPart implements Part {
  readonly name = 'http';
  /** The base URL, once listening. */
  url: string | undefined;

  constructor(
    private readonly app: FastifyInstance,
    private readonly config: BridgeConfig,
  ) {}

  async start(): Promise<void> {
    const { config } = this;
    try {
      await this.app.listen({ host: config.host, port: config.http.port });
    } catch (err) {
      await this.app.close();
      throw portError(err, config.http.port, '--http-port');
    }
    const address = this.app.server.address();
    const port = typeof address === 'object' && address ? address.port : config.http.port;
    const scheme = config.http.certFile ? 'https' : 'http';
    const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
    this.url = `${scheme}://${host.includes(':') ? `[${host}]` : host}:${port}`;
  }

  async stop(): Promise<void> {
    await this.app.close();
  }
}

/** `broker`: the embedded MQTT broker (bridge/broker.ts), without `mqtt.url`. */
class BrokerPart implements Part {
  readonly name = 'broker';
  broker: EmbeddedBroker | undefined;

  constructor(
    private readonly o: {
      config: BridgeConfig;
      store: BridgeDatabase;
      log: Logger;
      now: () => number;
      deviceLimits: DeviceRateLimiter;
      enrolPassword: string | undefined;
    },
  ) {}

  async start(): Promise<void> {
    const { config, store, log } = this.o;
    // A new embedded broker has no device connected, whatever the database says from before.
    // A bridge on a full disk still starts and serves reads (docs/operations.md, "A full disk"): the states are
    // put right as devices connect.
    const stale = await store
      .write((tx) => tx.devices.markAllDisconnected(this.o.now()), { durable: false })
      .catch((err: unknown) => {
        if (!isStorageFull(err)) throw err;
        log.warn({ event: 'devices.mark_failed', err: String(err) });
        return 0;
      });
    if (stale > 0) log.info({ event: 'devices.marked_disconnected', count: stale });
    const { enrolPassword } = this.o;
    try {
      this.broker = await EmbeddedBroker.start({
        host: config.host,
        port: config.mqtt.port,
        openEnrolment: config.mqtt.openEnrolment,
        enrol:
          enrolPassword === undefined ? undefined : { username: config.mqtt.enrolUsername, password: enrolPassword },
        enrolLimits: config.mqtt.enrolLimits,
        deviceLimits: this.o.deviceLimits,
        credentials: store.credentials,
        log,
        now: this.o.now,
      });
    } catch (err) {
      throw portError(err, config.mqtt.port, '--mqtt-port');
    }
  }

  async stop(): Promise<void> {
    await this.broker?.close();
  }
}

/** `dynsec`: the management of device clients at Mosquitto (bridge/mqtt/manage.ts), with `mqtt.dynsec`. */
class DynsecPart implements Part {
  readonly name = 'dynsec';
  managed: ManagedBroker | undefined;

  constructor(
    private readonly make: () => ManagedBroker,
    private readonly log: Logger,
  ) {}

  async start(): Promise<void> {
    const m = this.make();
    this.managed = m;
    // Roles first, so that the bridge may publish to devices once its link is up; a broker that is not there yet is
    // set up when it comes (at every connect).
    let timer: NodeJS.Timeout | undefined;
    const wait = new Promise((resolve) => {
      timer = setTimeout(resolve, 10_000);
      timer.unref();
    });
    await Promise.race([m.dynsec.ready, wait])
      .catch((err: unknown) => this.log.error({ event: 'dynsec.unavailable', err: (err as Error).message }))
      .finally(() => clearTimeout(timer));
  }

  async stop(): Promise<void> {
    await this.managed?.close();
  }
}

/**
 * `link`: the bridge's MQTT client (bridge/devices/link.ts), through the embedded broker's own interface or to the
 * external broker, wired to the device and command services and followed by the link monitor (bridge/health.ts).
 */
class LinkPart implements Part {
  readonly name = 'link';
  private current: Link | undefined;

  constructor(
    private readonly o: {
      config: BridgeConfig;
      log: Logger;
      now: () => number;
      monitor: LinkMonitor;
      devices: DeviceService;
      commands: CommandService;
      deviceLimits: DeviceRateLimiter;
      secrets: Secrets;
      /** The embedded broker, once started; undefined with `mqtt.url`. */
      broker: () => EmbeddedBroker | undefined;
    },
  ) {
    const { config } = o;
    // An external broker's link is followed from the bridge's start, so that `/healthz` counts the time it is
    // down from then.
    if (config.mqtt.url !== undefined) {
      this.use(
        new DeviceLink({
          url: config.mqtt.url,
          clientId: config.mqtt.clientId,
          username: config.mqtt.username,
          password: o.secrets.mqttPassword,
          ca: o.secrets.mqttCa,
          persistent: true,
          shareGroup: config.mqtt.shareGroup,
          sessionExpirySec: config.mqtt.sessionExpirySec,
          log: o.log,
          now: o.now,
          deviceLimits: o.deviceLimits,
        }),
        'external',
      );
    }
  }

  get link(): Link | undefined {
    return this.current;
  }

  private use(link: Link, kind: 'embedded' | 'external'): void {
    const { devices, commands } = this.o;
    this.current = link;
    this.o.monitor.attach(link, kind);
    devices.attach((deviceId, name, payload) => link.publish(deviceId, name, payload));
    commands.attach(
      (deviceId, name, payload) => link.publish(deviceId, name, payload),
      () => link.connected,
    );
    link.on('message', (msg) => void devices.handle(msg));
    link.on('up', () => {
      devices
        .onLinkUp()
        .catch((err: unknown) => this.o.log.warn({ event: 'devices.catch_up_failed', err: String(err) }));
    });
  }

  async start(): Promise<void> {
    const { config, log } = this.o;
    const broker = this.o.broker();
    // The embedded broker is reached through its own interface, in this process.
    if (broker) this.use(new EmbeddedLink(broker.aedes, log, this.o.now), 'embedded');
    const link = this.current;
    if (!link) throw new Error('no broker to link to');
    try {
      await link.start(broker ? 10_000 : 30_000);
    } catch (err) {
      if (broker) {
        await link.close();
        throw err;
      }
      // An external broker may come later: the client keeps trying, and devices catch up when it does.
      log.error({ event: 'mqtt.unreachable', url: safeUrl(config.mqtt.url!), err: (err as Error).message });
    }
  }

  async stop(): Promise<void> {
    await this.current?.close();
  }
}

const DAY_MS = 86_400_000;
const HOUR_MS = 3_600_000;

export class Bridge<S extends BridgeDatabase = BridgeDatabase> {
  readonly config: BridgeConfig;
  readonly store: S;
  readonly app: FastifyInstance;
  readonly devices: DeviceService;
  readonly commands: CommandService;
  readonly mailer: Mailer;
  /** The state of the link to the broker, for `/healthz` and `/metrics`. */
  readonly monitor: LinkMonitor;
  /**
   * The event bus (docs/scaling.md, "The event bus"): committed changes of devices, commands, frontends and
   * sessions, from this bridge and, on PostgreSQL, from every other one on the database. Subscribe here.
   */
  readonly events: EventBus;
  /** Made (or found) at start (decision 15). */
  defaultFrontend!: Frontend;
  /** The parts, in the order they start. */
  readonly parts: readonly Part[];
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly http: HttpPart;
  private readonly brokerPart: BrokerPart | undefined;
  private readonly dynsecPart: DynsecPart | undefined;
  private readonly linkPart: LinkPart;
  /** The parts started and not yet stopped, in the order they started. */
  private readonly running: Part[] = [];
  private startCalled = false;
  private stopping: Promise<void> | undefined;

  /** Composes the bridge; starts nothing. Throws when a credential file named in the config cannot be read. */
  constructor(deps: BridgeDeps<S>) {
    const { config, store, log, now } = deps;
    this.config = config;
    this.store = store;
    this.log = log;
    this.now = now;
    const secrets = readSecrets(config);
    // LISTEN/NOTIFY on PostgreSQL (its own connection to `database.url`), in this process on SQLite.
    const events = eventBusFor(store, config.database.url, log);
    this.events = events;
    // The store's copies follow the bus from now: the default frontend made at start is announced on it too.
    const unfollow = store.useEvents?.(events);
    this.mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log, now);
    this.commands = new CommandService({ store, log, now, maxOpen: config.commands.maxOpen, events });
    this.devices = createDeviceService(config, store, log, now, this.commands, events);
    this.monitor = new LinkMonitor(now);
    this.app = buildApp({
      config,
      store,
      hasher: hasherFor(config),
      mailer: this.mailer,
      log,
      now,
      devices: this.devices,
      commands: this.commands,
      link: this.monitor,
      events,
      checkAnswers: deps.checkAnswers === true,
      ...(secrets.webhookCa ? { webhookCa: secrets.webhookCa } : {}),
      // With several bridges on one database, the attempt limits are counted there (docs/api.md, Rate limits).
      ...(store.pool ? { rateLimitPool: store.pool } : {}),
    });
    const deviceLimits = new DeviceRateLimiter(config.mqtt.rate, log);
    this.http = new HttpPart(this.app, config);
    this.brokerPart =
      config.mqtt.url === undefined
        ? new BrokerPart({ config, store, log, now, deviceLimits, enrolPassword: secrets.enrolPassword })
        : undefined;
    this.dynsecPart = config.mqtt.dynsec
      ? new DynsecPart(
          () =>
            startManagedBroker({
              config,
              store: store.credentials,
              devices: this.devices,
              password: secrets.mqttPassword ?? '',
              ca: secrets.mqttCa,
              log,
              now,
            }),
          log,
        )
      : undefined;
    this.linkPart = new LinkPart({
      config,
      log,
      now,
      monitor: this.monitor,
      devices: this.devices,
      commands: this.commands,
      deviceLimits,
      secrets,
      broker: () => this.brokerPart?.broker,
    });
    const parts: Array<Part | undefined> = [
      // First to start and last to stop: every part after it may publish, and what they published is sent
      // before it stops (the store's pool is closed by the store's opener, after).
      {
        name: 'events',
        start: () => events.start(),
        stop: async () => {
          await events.stop();
          unfollow?.();
        },
      },
      stopOnly('mailer', () => this.mailer.close()),
      // The resend schedule and the history retention.
      stopOnly('devices', () => this.devices.close()),
      this.http,
      this.brokerPart,
      this.dynsecPart,
      this.linkPart,
      // Expired sessions, nearby records past the window and old finished commands: at start, then hourly.
      new Periodic('prune', { everyMs: HOUR_MS, atStart: true, run: () => this.prune() }),
      // History past its age or count limit goes in the background, in small batches (docs/api.md, "History").
      {
        name: 'retention',
        start: () => Promise.resolve(this.devices.retention.start()),
        stop: () => this.devices.retention.stop(),
      },
      // Commands a device never received expire on the bridge once their lifetime ends.
      new Periodic('sweep', {
        everyMs: 1000,
        atStart: false,
        run: () => {
          this.commands.sweep().catch((err: unknown) => log.warn({ event: 'cmd.sweep_failed', err: String(err) }));
        },
      }),
    ];
    this.parts = parts.filter((p): p is Part => p !== undefined);
  }

  /** Composes and starts a bridge. */
  static async start<S extends BridgeDatabase>(deps: BridgeDeps<S>): Promise<Bridge<S>> {
    const bridge = new Bridge(deps);
    await bridge.start();
    return bridge;
  }

  /** Starts the parts in order; when one fails, stops those started, in reverse, and throws its `PartError`. */
  async start(): Promise<void> {
    if (this.startCalled) throw new Error('the bridge was started already');
    this.startCalled = true;
    this.defaultFrontend = await ensureDefaultFrontend(this.store, this.now());
    for (const part of this.parts) {
      try {
        await part.start();
      } catch (err) {
        await this.stopRunning().catch(() => undefined);
        throw new PartError(part.name, err);
      }
      this.running.push(part);
    }
  }

  /**
   * Stops the parts started, in reverse order. A part that fails to stop is logged and the others still stop; the
   * promise then rejects, naming those that failed. A second call gets the same promise.
   */
  stop(): Promise<void> {
    this.stopping ??= this.stopRunning();
    return this.stopping;
  }

  private async stopRunning(): Promise<void> {
    const failed: string[] = [];
    for (const part of this.running.splice(0).reverse()) {
      try {
        await part.stop();
      } catch (err) {
        failed.push(part.name);
        this.log.error({
          event: 'bridge.part_failed',
          part: part.name,
          err: err instanceof Error ? err.message : String(err),
        });
      }
    }
    if (failed.length > 0) throw new Error(`could not stop: ${failed.join(', ')}`);
  }

  /** The base URL of the HTTP server, once started. */
  get url(): string {
    if (this.http.url === undefined) throw new Error('the bridge has not started');
    return this.http.url;
  }

  /** The embedded broker, once started; undefined with an external one. */
  get broker(): EmbeddedBroker | undefined {
    return this.brokerPart?.broker;
  }

  /** The link to the broker, once the link part started (or from the start, to an external broker). */
  get link(): Link {
    const link = this.linkPart.link;
    if (!link) throw new Error('the bridge has no link before it starts');
    return link;
  }

  /** With `mqtt.dynsec`: the management of device clients at Mosquitto, once started. */
  get managed(): ManagedBroker | undefined {
    return this.dynsecPart?.managed;
  }

  /** One round of pruning; each kind logs what it removed, or its failure. */
  private prune(): void {
    const { store, config, log } = this;
    // Expired sessions can no longer be used; removing them keeps the table the size of the live ones.
    const t = this.now();
    store
      .write((tx) => tx.pruneSessions(t - config.sessions.idleDays * DAY_MS, t - config.sessions.absoluteDays * DAY_MS))
      .then((n) => n > 0 && log.info({ event: 'sessions.pruned', count: n }))
      .catch((err: unknown) => log.warn({ event: 'sessions.prune_failed', err: String(err) }));
    this.devices
      .prune()
      .then((n) => n.nearby > 0 && log.info({ event: 'devices.pruned', ...n }))
      .catch((err: unknown) => log.warn({ event: 'devices.prune_failed', err: String(err) }));
    this.commands
      .prune(config.commands.keepDays)
      .then((n) => n > 0 && log.info({ event: 'cmd.pruned', count: n }))
      .catch((err: unknown) => log.warn({ event: 'cmd.prune_failed', err: String(err) }));
  }
}
