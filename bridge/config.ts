/**
 * The bridge's configuration: one schema with defaults, filled from a file, then `DEVCLOUD_*` environment
 * variables, then flags (lib/config.ts), all problems reported at once.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { type OptionSpec, loadConfig } from '../lib/config.js';
import { LOG_OPTIONS, LogConfigSchema } from '../lib/log.js';
import { MAX_PACKET_BYTES } from '../protocol/index.js';
import { WebhookConfigSchema } from './rules/webhook.js';
import { MailConfigSchema } from './mail/mailer.js';

const limit = (limitDefault: number, windowMsDefault: number) =>
  z
    .object({
      /** Attempts allowed per window. */
      limit: z.number().int().min(1).max(1_000_000).default(limitDefault),
      windowMs: z.number().int().min(1000).max(86_400_000).default(windowMsDefault),
    })
    .strict()
    .prefault({});

/** The bridge's client id at an external broker when `mqtt.clientId` is not set. */
export const DEFAULT_CLIENT_ID = 'devcloud-bridge';

/** A share group's name: one MQTT topic level, without wildcards or `$` (docs/scaling.md). */
function isShareGroup(value: string): boolean {
  return !/[/+#$]/.test(value) && !value.includes('\u0000');
}

/** `scheme://host[:port]` over http or https, nothing after it but an optional slash. */
function isOrigin(value: string): boolean {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return false;
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return false;
  return value.replace(/\/$/, '').toLowerCase() === url.origin;
}

/** A PostgreSQL connection URL: `postgres://` or `postgresql://`, then what libpq and node-postgres read after it. */
export function isPostgresUrl(value: string): boolean {
  if (!/^postgres(ql)?:\/\//.test(value)) return false;
  try {
    new URL(value);
    return true;
  } catch {
    return false;
  }
}

export const BridgeConfigSchema = z
  .object({
    /** Database and outbox. */
    dataDir: z.string().min(1),
    /**
     * A PostgreSQL database instead of SQLite in `dataDir` (docs/scaling.md). Only `devcloud-bridge migrate` uses it
     * so far: the commands that work on the bridge's data refuse to start while it is set.
     */
    database: z
      .object({
        /**
         * `postgres://USER@HOST:PORT/DATABASE`; the password may be in it or in `PGPASSWORD`. Never logged with its
         * user or password.
         */
        url: z
          .string()
          .refine(isPostgresUrl, {
            message: 'expected a postgres:// or postgresql:// URL, e.g. postgres://devcloud@db.example.com/devcloud',
          })
          .optional(),
        /** Connections to PostgreSQL the bridge opens at most. */
        poolSize: z.number().int().min(1).max(1000).default(10),
      })
      .strict()
      .prefault({}),
    /** Address the HTTP and MQTT listeners bind. */
    host: z.string().min(1).default('127.0.0.1'),
    http: z
      .object({
        port: z.number().int().min(0).max(65535).default(8080),
        /** PEM files: both set means HTTPS. */
        certFile: z.string().min(1).optional(),
        keyFile: z.string().min(1).optional(),
        /** Behind a reverse proxy: trust its X-Forwarded-* headers (true, or a list of proxy addresses). */
        trustProxy: z.union([z.boolean(), z.array(z.string().min(1))]).default(false),
        /** The public base URL used in e-mailed links, e.g. https://devcloud.example.com. */
        publicUrl: z.string().url().optional(),
        /**
         * Origins of web apps on other sites that may send state-changing requests with a user's cookie, e.g.
         * https://app.example.com (docs/api.md, Cross-site requests).
         */
        allowedOrigins: z
          .array(
            z.string().refine(isOrigin, {
              message:
                'expected an origin: scheme://host[:port] with http or https and no path, e.g. https://app.example.com',
            }),
          )
          .max(1000)
          .default([]),
        /** Largest request body, bytes. */
        bodyLimit: z
          .number()
          .int()
          .min(1024)
          .max(16 * 1024 * 1024)
          .default(256 * 1024),
      })
      .strict()
      .prefault({}),
    mqtt: z
      .object({
        /** An external broker; without it the bridge runs its embedded broker. */
        url: z.string().min(1).optional(),
        /** Port of the embedded broker. */
        port: z.number().int().min(0).max(65535).default(1883),
        /**
         * Enrol unknown devices. Off by default: only provisioned devices connect (`devcloud-bridge device
         * provision`). On, with `enrolPasswordFile`: through the enrolment credential, at the embedded broker and
         * with `dynsec` alike; on without it, at the embedded broker only: on first connect (trust on first use,
         * what `npm start` runs). docs/operations.md, "Enrolment".
         */
        openEnrolment: z.boolean().default(false),
        /**
         * What one device may publish (docs/operations.md, "Device rate limits"): token buckets whose bursts cover
         * a healthy agent's catch-up; over them a message is dropped, and after `disconnectAfter` drops in a
         * minute the device is cut off for `penaltyMs`.
         */
        rate: z
          .object({
            messagesPerSecond: z.number().min(0.1).max(1_000_000).default(100),
            messageBurst: z.number().int().min(1).max(10_000_000).default(2000),
            bytesPerSecond: z
              .number()
              .min(1024)
              .max(1024 ** 3)
              .default(2 * 1024 * 1024),
            byteBurst: z
              .number()
              .int()
              .min(MAX_PACKET_BYTES)
              .max(16 * 1024 ** 3)
              .default(64 * 1024 * 1024),
            hellosPerMinute: z.number().int().min(1).max(100_000).default(5),
            disconnectAfter: z.number().int().min(1).max(1_000_000).default(20),
            penaltyMs: z.number().int().min(0).max(86_400_000).default(60_000),
          })
          .strict()
          .prefault({}),
        /** Enrolments allowed per window from one client address (embedded broker), and in all. */
        enrolLimits: z
          .object({
            perAddress: z.number().int().min(1).max(1_000_000).default(10),
            total: z.number().int().min(1).max(1_000_000).default(100),
            windowMs: z.number().int().min(1000).max(86_400_000).default(60_000),
          })
          .strict()
          .prefault({}),
        /**
         * External broker: the bridge's client id. Its session is persistent, so that the broker keeps what
         * devices publish while the bridge restarts.
         */
        clientId: z.string().min(1).max(128).default(DEFAULT_CLIENT_ID),
        /**
         * External broker, several bridges (docs/scaling.md): the MQTT 5 shared subscription group of every bridge
         * that serves the fleet, so that each message a device publishes on `up/` is handled by one of them. Each
         * bridge of the group needs a `clientId` of its own. Unset: this bridge alone reads everything.
         */
        shareGroup: z
          .string()
          .min(1)
          .max(128)
          .refine(isShareGroup, { message: 'expected one MQTT topic level, without /, +, # or $' })
          .optional(),
        /**
         * With `shareGroup`: how long the broker keeps the session of a bridge that went away without closing it (a
         * crash, a lost network), seconds; what its share of the messages was meanwhile reaches it if it is back
         * in time, and is lost otherwise. A bridge that stops ends its session at once.
         */
        sessionExpirySec: z.number().int().min(0).max(604_800).default(60),
        /** External broker: the bridge's username, and a file holding its password (kept out of the config). */
        username: z.string().min(1).optional(),
        passwordFile: z.string().min(1).optional(),
        /** External broker over TLS: the CA that signed its certificate (PEM). */
        caFile: z.string().min(1).optional(),
        /**
         * External Mosquitto with the dynamic security plugin, the bridge's credential its admin: the bridge
         * manages one client per device (bridge/mqtt/dynsec.ts).
         */
        dynsec: z.boolean().default(false),
        /** With `openEnrolment`: the enrolment credential's username, and a file with its password. */
        enrolUsername: z.string().min(1).max(128).default('devcloud-enrol'),
        enrolPasswordFile: z.string().min(1).optional(),
      })
      .strict()
      .superRefine((m, ctx) => {
        if (m.shareGroup === undefined) return;
        if (m.url === undefined) {
          ctx.addIssue({
            code: 'custom',
            path: ['shareGroup'],
            message: 'the embedded broker serves one bridge only: a share group needs an external broker (mqtt.url)',
          });
        } else if (m.clientId === DEFAULT_CLIENT_ID) {
          // The broker lets one connection hold a client id: bridges sharing one would take it from each other.
          ctx.addIssue({
            code: 'custom',
            path: ['clientId'],
            message:
              `with mqtt.shareGroup each bridge needs a client id of its own, not the default ${DEFAULT_CLIENT_ID}: ` +
              'set mqtt.clientId (--mqtt-client-id, DEVCLOUD_MQTT_CLIENT_ID) to a name no other bridge uses',
          });
        }
      })
      .prefault({}),
    devices: z
      .object({
        /** Decision 18: a device is nearby a user that long after it heard one of the user's authcodes. */
        nearbyWindowMs: z.number().int().min(1000).max(86_400_000).default(300_000),
        /** History entries older than this many days are removed (in the background); 0 keeps them for good. */
        historyDays: z.number().min(0).max(36500).default(30),
        /** Each variable keeps at most this many history entries, the newest (in the background); 0: no limit. */
        historyPerVariable: z.number().int().min(0).max(100_000_000).default(1000),
        /** Decision 12: the largest variable value, bytes. */
        maxValueBytes: z
          .number()
          .int()
          .min(1)
          .max(64 * 1024)
          .default(64 * 1024),
        /** `meta` `lastactivity` is written at most this often per device, ms. */
        lastActivityMs: z.number().int().min(0).max(3_600_000).default(5000),
        /**
         * A connected device that has not acknowledged a change gets it again after this long, ms; the wait
         * doubles after each resend up to `resendMaxMs`, and starts again after an acknowledgement or a hello.
         */
        resendFirstMs: z.number().int().min(10).max(3_600_000).default(5000),
        resendMaxMs: z.number().int().min(10).max(86_400_000).default(300_000),
        /**
         * `timestamp` on a variable's `POST` (docs/api.md): how far before the bridge's clock it may lie, ms.
         * Older stamps answer 400 `device-fail`.
         */
        timestampPastMs: z
          .number()
          .int()
          .min(0)
          .max(31 * 86_400_000)
          .default(3_600_000),
        /** `timestamp` on a variable's `POST`: how far after the bridge's clock it may lie, ms. */
        timestampFutureMs: z.number().int().min(0).max(3_600_000).default(60_000),
      })
      .strict()
      .refine((d) => d.resendFirstMs <= d.resendMaxMs, {
        message: 'resendFirstMs must not exceed resendMaxMs',
        path: ['resendFirstMs'],
      })
      .prefault({}),
    commands: z
      .object({
        /** Decision 13: commands not yet finished per device; one more is refused. */
        maxOpen: z.number().int().min(1).max(100_000).default(1000),
        /** Decision 12: the longest command, bytes. */
        maxBytes: z
          .number()
          .int()
          .min(1)
          .max(4 * 1024)
          .default(4 * 1024),
        /** Decision 13: `lifetime` when the caller gives none, and the largest accepted, ms. */
        defaultLifetimeMs: z.number().int().min(1).max(2_592_000_000).default(86_400_000),
        maxLifetimeMs: z.number().int().min(1).max(31_536_000_000).default(2_592_000_000),
        /** Finished commands are kept this many days on the bridge (removed hourly). */
        keepDays: z.number().min(0.001).max(36500).default(30),
      })
      .strict()
      .refine((c) => c.defaultLifetimeMs <= c.maxLifetimeMs, {
        message: 'defaultLifetimeMs must not exceed maxLifetimeMs',
        path: ['defaultLifetimeMs'],
      })
      .prefault({}),
    firmware: z
      .object({
        /** How long a job's image token stays valid, hours. */
        tokenHours: z.number().min(0.01).max(720).default(24),
        /** The base URL devices download images from; default `http.publicUrl`, else the URL the request came to. */
        baseUrl: z.string().url().optional(),
      })
      .strict()
      .prefault({}),
    frontends: z
      .object({
        /** Decision 15: requests that name no frontend go to the default one; production may switch it off. */
        allowDefault: z.boolean().default(true),
      })
      .strict()
      .prefault({}),
    sessions: z
      .object({
        /** Decision 2: sliding idle timeout and absolute lifetime, days. */
        idleDays: z.number().min(0.001).max(3650).default(30),
        absoluteDays: z.number().min(0.001).max(36500).default(365),
      })
      .strict()
      .prefault({}),
    accounts: z
      .object({
        /** scrypt cost: N = 2^logN (docs/decisions.md §9: 17). Lower only for tests. */
        scryptLogN: z.number().int().min(10).max(22).default(17),
        scryptR: z.number().int().min(1).max(32).default(8),
        scryptP: z.number().int().min(1).max(16).default(1),
        /** Hashes computed at once; the rest wait in a bounded queue. */
        hashConcurrency: z.number().int().min(1).max(64).default(1),
        hashQueue: z.number().int().min(1).max(100_000).default(32),
        /** Decision 6: confirmation links live 7 days; recovery links one hour. */
        confirmTokenHours: z.number().min(0.01).max(8760).default(168),
        recoverTokenHours: z.number().min(0.01).max(8760).default(1),
        /** Decision 12. */
        passwordMin: z.number().int().min(1).max(1024).default(8),
        passwordMax: z.number().int().min(8).max(4096).default(1024),
        loginMax: z.number().int().min(6).max(254).default(254),
        /** Decision 30: access tokens one user may hold at once; `POST /0/user/accesstoken` refuses more. */
        accessTokensPerUser: z.number().int().min(1).max(1000).default(20),
        userDataBytes: z
          .number()
          .int()
          .min(2)
          .max(16 * 1024 * 1024)
          .default(64 * 1024),
      })
      .strict()
      .prefault({}),
    rateLimits: z
      .object({
        login: limit(10, 60_000),
        signup: limit(20, 3_600_000),
        resend: limit(5, 3_600_000),
        recover: limit(5, 3_600_000),
        /**
         * Decision 30: `POST /0/session/` with a `token`, and live channels opened with a bearer token (decision
         * 31), per client address together (every attempt counts).
         */
        accessToken: limit(30, 60_000),
      })
      .strict()
      .prefault({}),
    health: z
      .object({
        /** `GET /healthz` answers 503 once the link to the MQTT broker has been down this long, ms. */
        linkGraceMs: z.number().int().min(0).max(86_400_000).default(60_000),
        /** `GET /healthz` answers 503 below this much free space for the data directory, bytes; 0: only failed writes. */
        minFreeBytes: z
          .number()
          .int()
          .min(0)
          .max(2 ** 50)
          .default(16 * 1024 * 1024),
      })
      .strict()
      .prefault({}),
    /** The live channel (docs/api.md, "Live channel"): WebSocket `/0/session/` and Server-Sent Events `/0/events`. */
    live: z
      .object({
        /** Open live channels (WebSocket and SSE together) one user may hold on this bridge; more answer 429. */
        maxPerUser: z.number().int().min(1).max(1_000_000).default(100),
        /** Open live channels from one client address on this bridge; more answer 429. */
        maxPerAddress: z.number().int().min(1).max(1_000_000).default(1000),
        /** Keepalive period, ms: a WebSocket ping (a peer that has not answered the previous one is cut), an SSE `: ping` line. */
        pingMs: z.number().int().min(100).max(600_000).default(30_000),
        /** The longest `throttletime` a client may ask for, ms; longer ones are clamped to it (0..this). */
        maxThrottleMs: z.number().int().min(0).max(600_000).default(10_000),
        /** Bytes a channel may have waiting in its socket before the bridge stops sending to it and only coalesces. */
        highWaterBytes: z
          .number()
          .int()
          .min(1024)
          .max(64 * 1024 * 1024)
          .default(1024 * 1024),
        /** Changed variables (device, type, name) a stalled channel may have waiting; one more closes it (code 4008). */
        maxPendingKeys: z.number().int().min(1).max(10_000_000).default(10_000),
        /** How long a channel may stay stalled above `highWaterBytes`, ms, before it is closed (code 4008). */
        maxLagMs: z.number().int().min(100).max(3_600_000).default(60_000),
        /** Largest message a WebSocket client may send, bytes; a larger one closes the channel (code 1009). */
        maxMessageBytes: z.number().int().min(64).max(65_536).default(4096),
        /** SSE frames kept per user: how far back a `Last-Event-ID` resume reaches, and how far a stalled stream may fall behind. */
        sseReplayFrames: z.number().int().min(1).max(100_000).default(256),
        /** How long a user's SSE frames are still recorded after their last stream closed, ms, so that a reconnect resumes. */
        sseResumeMs: z.number().int().min(0).max(3_600_000).default(60_000),
      })
      .strict()
      .prefault({}),
    /** Notification rules, the event log and its delivery (docs/notifications.md). */
    notifications: z
      .object({
        /** Rules one user may hold; more answer 400 `event-fail-limit`. */
        rulesPerUser: z.number().int().min(1).max(100_000).default(100),
        /** Least time between two events of one rule, ms: a crossing sooner is counted, logged and not delivered. */
        ruleMinIntervalMs: z.number().int().min(0).max(86_400_000).default(60_000),
        /** Events one user may get in any `userEventsWindowMs` (tests included); more are dropped and logged. */
        userEventsLimit: z.number().int().min(1).max(1_000_000).default(100),
        userEventsWindowMs: z.number().int().min(1000).max(86_400_000).default(3_600_000),
        /** Days the event log keeps an event; older ones are removed in the hourly pruning. */
        eventRetentionDays: z.number().int().min(1).max(3650).default(30),
        /** How often the rules waiting out a `for` are checked, ms: the precision of `for`. */
        pendingCheckMs: z.number().int().min(100).max(60_000).default(1000),
        /** Devices whose rules a bridge keeps in memory; the least recently changed beyond that are read again. */
        cacheDevices: z.number().int().min(1).max(10_000_000).default(100_000),
        /** Webhook delivery (docs/notifications.md, "Webhooks"). */
        webhook: WebhookConfigSchema.prefault({}),
      })
      .strict()
      .prefault({}),
    metrics: z
      .object({
        /** Serve `GET /metrics` (Prometheus text format). */
        enabled: z.boolean().default(true),
        /** A file holding the bearer token scrapers must send; without it `/metrics` asks for none. */
        tokenFile: z.string().min(1).optional(),
      })
      .strict()
      .prefault({}),
    /** Decision 20: SMTP when `smtp` is set; otherwise mails go to `outboxDir` (default `<dataDir>/outbox`). */
    mail: MailConfigSchema.extend({ outboxDir: z.string().min(1).optional() }).prefault({}),
    log: LogConfigSchema,
  })
  .strict();

export type BridgeConfig = z.infer<typeof BridgeConfigSchema>;

export const BRIDGE_OPTIONS: readonly OptionSpec[] = [
  {
    key: 'configFile',
    flag: '--config',
    env: 'DEVCLOUD_BRIDGE_CONFIG',
    kind: 'string',
    arg: 'FILE',
    help: 'config file (YAML or JSON)',
  },
  {
    key: 'dataDir',
    flag: '--data-dir',
    env: 'DEVCLOUD_DATA_DIR',
    kind: 'string',
    arg: 'DIR',
    help: 'database and mail outbox',
  },
  {
    key: 'database.url',
    flag: '--database-url',
    env: 'DEVCLOUD_DATABASE_URL',
    kind: 'string',
    arg: 'URL',
    help: 'PostgreSQL database, postgres://...; only migrate uses it so far',
  },
  {
    key: 'host',
    flag: '--host',
    env: 'DEVCLOUD_HOST',
    kind: 'string',
    arg: 'ADDR',
    help: 'address to listen on (default 127.0.0.1)',
  },
  {
    key: 'http.port',
    flag: '--http-port',
    env: 'DEVCLOUD_HTTP_PORT',
    kind: 'int',
    arg: 'N',
    help: 'HTTP(S) port (default 8080)',
  },
  {
    key: 'http.certFile',
    flag: '--tls-cert',
    env: 'DEVCLOUD_TLS_CERT',
    kind: 'string',
    arg: 'FILE',
    help: 'TLS certificate (PEM); with --tls-key, HTTPS',
  },
  {
    key: 'http.keyFile',
    flag: '--tls-key',
    env: 'DEVCLOUD_TLS_KEY',
    kind: 'string',
    arg: 'FILE',
    help: 'TLS private key (PEM)',
  },
  {
    key: 'http.trustProxy',
    flag: '--trust-proxy',
    env: 'DEVCLOUD_TRUST_PROXY',
    kind: 'bool',
    arg: 'BOOL',
    help: 'trust X-Forwarded-* from a reverse proxy',
  },
  {
    key: 'http.publicUrl',
    flag: '--public-url',
    env: 'DEVCLOUD_PUBLIC_URL',
    kind: 'string',
    arg: 'URL',
    help: 'base URL used in e-mailed links',
  },
  {
    key: 'http.allowedOrigins',
    flag: '--allowed-origin',
    env: 'DEVCLOUD_ALLOWED_ORIGINS',
    kind: 'list',
    arg: 'ORIGIN',
    help: 'origin of a web app on another site that may change state; repeat, or separate with commas',
  },
  {
    key: 'mqtt.url',
    flag: '--mqtt-url',
    env: 'DEVCLOUD_MQTT_URL',
    kind: 'string',
    arg: 'URL',
    help: 'external MQTT broker (default: the embedded one)',
  },
  {
    key: 'mqtt.port',
    flag: '--mqtt-port',
    env: 'DEVCLOUD_MQTT_PORT',
    kind: 'int',
    arg: 'N',
    help: 'port of the embedded MQTT broker (default 1883)',
  },
  {
    key: 'mqtt.clientId',
    flag: '--mqtt-client-id',
    env: 'DEVCLOUD_MQTT_CLIENT_ID',
    kind: 'string',
    arg: 'ID',
    help: 'client id at the external broker (default devcloud-bridge); each bridge of a share group its own',
  },
  {
    key: 'mqtt.shareGroup',
    flag: '--mqtt-share-group',
    env: 'DEVCLOUD_MQTT_SHARE_GROUP',
    kind: 'string',
    arg: 'NAME',
    help: 'shared subscription group of several bridges on one external broker (docs/scaling.md)',
  },
  {
    key: 'mqtt.username',
    flag: '--mqtt-username',
    env: 'DEVCLOUD_MQTT_USERNAME',
    kind: 'string',
    arg: 'NAME',
    help: 'username at the external broker',
  },
  {
    key: 'mqtt.passwordFile',
    flag: '--mqtt-password-file',
    env: 'DEVCLOUD_MQTT_PASSWORD_FILE',
    kind: 'string',
    arg: 'FILE',
    help: 'file holding the password at the external broker',
  },
  {
    key: 'mqtt.caFile',
    flag: '--mqtt-ca',
    env: 'DEVCLOUD_MQTT_CA',
    kind: 'string',
    arg: 'FILE',
    help: 'CA certificate of the external broker (PEM)',
  },
  {
    key: 'mqtt.dynsec',
    flag: '--mqtt-dynsec',
    env: 'DEVCLOUD_MQTT_DYNSEC',
    kind: 'bool',
    arg: 'BOOL',
    help: 'manage device clients through Mosquitto dynamic security',
  },
  {
    key: 'mqtt.openEnrolment',
    flag: '--open-enrolment',
    env: 'DEVCLOUD_OPEN_ENROLMENT',
    kind: 'bool',
    arg: 'BOOL',
    help: 'enrol unknown devices (default false; see mqtt.enrolPasswordFile)',
  },
  {
    key: 'metrics.enabled',
    flag: '--metrics',
    env: 'DEVCLOUD_METRICS',
    kind: 'bool',
    arg: 'BOOL',
    help: 'serve GET /metrics (default true)',
  },
  {
    key: 'metrics.tokenFile',
    flag: '--metrics-token-file',
    env: 'DEVCLOUD_METRICS_TOKEN_FILE',
    kind: 'string',
    arg: 'FILE',
    help: 'file holding the bearer token GET /metrics asks for',
  },
  ...LOG_OPTIONS,
];

export function defaultDataDir(env: NodeJS.ProcessEnv): string {
  return env.STATE_DIRECTORY?.split(':')[0] ?? '/var/lib/devcloud-bridge';
}

/** The installed config file, read when no other is named and it exists. */
export function defaultBridgeConfigFile(env: NodeJS.ProcessEnv): string | undefined {
  const path = join(env.CONFIGURATION_DIRECTORY?.split(':')[0] ?? '/etc/devcloud', 'bridge.yaml');
  return existsSync(path) ? path : undefined;
}

export function loadBridgeConfig(flags: Record<string, unknown>, env: NodeJS.ProcessEnv): BridgeConfig {
  const { configFile, ...rest } = flags;
  const file = typeof configFile === 'string' ? configFile : env.DEVCLOUD_BRIDGE_CONFIG || defaultBridgeConfigFile(env);
  return loadConfig(BridgeConfigSchema, {
    options: BRIDGE_OPTIONS.filter((o) => o.key !== 'configFile'),
    defaults: { dataDir: defaultDataDir(env) },
    file,
    env,
    flags: rest,
  });
}

export function outboxDir(config: BridgeConfig): string {
  return config.mail.outboxDir ?? join(config.dataDir, 'outbox');
}
