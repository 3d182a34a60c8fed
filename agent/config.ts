/**
 * The agent's configuration: one schema with defaults, filled from a file, then `DEVCLOUD_*` environment
 * variables, then flags (see lib/config.ts). `config/agent.example.yaml` shows every key.
 */
import { existsSync } from 'node:fs';
import { arch } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { type OptionSpec, loadConfig } from '../lib/config.js';
import { LOG_OPTIONS, LogConfigSchema } from '../lib/log.js';
import { MAX_OUTPUT_BYTES, MAX_VALUE_BYTES } from '../protocol/index.js';

const mqttUrl = z
  .string()
  .refine(
    (s) => /^(mqtts?|wss?|tcp|ssl):\/\/[^\s/]+/.test(s),
    'must be a URL like mqtt://host:1883 or mqtts://host:8883',
  );

/** A command line without a shell: an array, or (from a flag or the environment) words split on whitespace. */
const commandLine = z.preprocess(
  (v) => (typeof v === 'string' ? v.split(/\s+/).filter((w) => w.length > 0) : v),
  z.array(z.string().min(1)).min(1, 'must name a command'),
);

export const AgentConfigSchema = z
  .object({
    /** Where the identity, the variable database and (by default) the socket live. */
    stateDir: z.string().min(1),
    /** Platform string reported in `up/hello` and matched against firmware images. */
    platform: z.string().min(1).max(128).default(`linux-${arch()}`),
    /** Version of the gateway's firmware, reported in `up/hello` and as `meta` `fwversion`. */
    fwVersion: z.string().min(1).max(128).default('0'),
    identity: z
      .object({
        /** A provisioning file made by `devcloud-bridge device provision`; read once, at first start. */
        provisioningFile: z.string().min(1).optional(),
      })
      .strict()
      .prefault({}),
    mqtt: z
      .object({
        url: mqttUrl.default('mqtt://localhost:1883'),
        /** Defaults to the device id. */
        username: z.string().min(1).optional(),
        /** Defaults to the device secret. */
        password: z.string().min(1).optional(),
        /**
         * Mosquitto with dynamic security and open enrolment (docs/operations.md): the enrolment credential's
         * password. When the broker refuses the device's own login, the agent asks to be enrolled with it.
         */
        enrolPassword: z.string().min(1).optional(),
        /** Its username (`devcloud-enrol` when unset). */
        enrolUsername: z.string().min(1).optional(),
        /** Seconds between keepalive pings. */
        keepaliveSec: z.number().int().min(5).max(3600).default(30),
        connectTimeoutMs: z.number().int().min(1000).max(300_000).default(15_000),
        /** Reconnect backoff: exponential from min to max, with full jitter. */
        backoffMinMs: z.number().int().min(50).max(600_000).default(1000),
        backoffMaxMs: z.number().int().min(100).max(3_600_000).default(60_000),
        /**
         * After losing a connection that was up at least `healthyAfterMs`, reconnect delays are capped at
         * `backoffFastMaxMs` for `backoffFastForMs`, then grow to `backoffMaxMs` if failures persist.
         */
        backoffFastMaxMs: z.number().int().min(100).max(3_600_000).default(5000),
        backoffFastForMs: z.number().int().min(0).max(86_400_000).default(120_000),
        healthyAfterMs: z.number().int().min(0).max(86_400_000).default(60_000),
        /** PEM files for TLS (`mqtts://`). */
        caFile: z.string().optional(),
        certFile: z.string().optional(),
        keyFile: z.string().optional(),
        rejectUnauthorized: z.boolean().default(true),
      })
      .strict()
      .prefault({}),
    udp: z
      .object({
        /** Decision 19: the port phones broadcast authcodes to. 0 picks a free port (tests). */
        port: z.number().int().min(0).max(65535).default(590),
        enabled: z.boolean().default(true),
        /** Decision 19: report one authcode at most once in this window. */
        dedupeMs: z.number().int().min(0).max(3_600_000).default(30_000),
        /** Heard authcodes older than this are not reported after an outage (decision 18). */
        maxAgeMs: z.number().int().min(1000).max(86_400_000).default(300_000),
        ipv6: z.boolean().default(true),
      })
      .strict()
      .prefault({}),
    socket: z
      .object({
        /** Unix socket of the local interface; default `$RUNTIME_DIRECTORY/agent.sock` or `<stateDir>/agent.sock`. */
        path: z.string().min(1).optional(),
        /** File mode of the socket, octal as a string (decision: 0660, group of the gateway apps). */
        mode: z
          .string()
          .regex(/^0?[0-7]{3}$/, 'an octal mode like "0660"')
          .default('0660'),
      })
      .strict()
      .prefault({}),
    log: LogConfigSchema,
    store: z
      .object({
        /** Rows of local variable history kept; older ones are pruned. */
        historyLimit: z.number().int().min(0).max(10_000_000).default(10_000),
        /** Decision 12: the largest value, in bytes. */
        maxValueBytes: z.number().int().min(1).max(MAX_VALUE_BYTES).default(MAX_VALUE_BYTES),
      })
      .strict()
      .prefault({}),
    sync: z
      .object({
        /** Items in one `up/vars` or `up/acks` message. */
        batchSize: z.number().int().min(1).max(1000).default(500),
        /** While connected, a change not acknowledged within this time is sent again. */
        retryMs: z.number().int().min(1000).max(3_600_000).default(30_000),
        /** Deadleaf mode: the longest a wake may last before the device sleeps anyway. */
        awakeMaxMs: z.number().int().min(1000).max(600_000).default(30_000),
        /** Deadleaf mode: quiet time after the last acknowledgement before sleeping. */
        quietMs: z.number().int().min(0).max(60_000).default(1000),
      })
      .strict()
      .prefault({}),
    commands: z
      .object({
        /** Executable command handlers, one file per handler name (docs/decisions.md §6). None: built-ins only. */
        dir: z.string().min(1).optional(),
        /** Commands run at once. */
        concurrency: z.number().int().min(1).max(64).default(1),
        /** A handler still running after this is stopped (SIGTERM to its process group, SIGKILL 2 s later). */
        timeoutMs: z.number().int().min(100).max(86_400_000).default(60_000),
        /** Bytes of a handler's output kept and reported (its end). */
        outputBytes: z.number().int().min(0).max(MAX_OUTPUT_BYTES).default(MAX_OUTPUT_BYTES),
        /** `frmt` deletes every variable of the agent: off unless the gateway's maker allows it. */
        allowFactoryReset: z.boolean().default(false),
        /** `reboot` runs `rebootCommand`. */
        allowReboot: z.boolean().default(true),
        rebootCommand: z.array(z.string().min(1)).min(1).default(['systemctl', 'reboot']),
        /** Finished commands are kept this long (to answer a repeated delivery, and for `devcloud-agent queue`). */
        keepDays: z.number().min(0.001).max(3650).default(7),
      })
      .strict()
      .prefault({}),
    hooks: z
      .object({
        /** An executable run (without a shell) after every committed variable change. */
        change: z.string().min(1).optional(),
        /** Which changes run the hook: made by the cloud, on the gateway, or both. */
        origins: z.array(z.enum(['cloud', 'device'])).default(['cloud']),
        timeoutMs: z.number().int().min(100).max(600_000).default(10_000),
      })
      .strict()
      .prefault({}),
    report: z
      .object({
        /** Seconds between reports of `meta` `uptime`, `pending`, `queue` and `rss` (agent/report.ts); 0: none. */
        intervalSec: z.number().int().min(0).max(86_400).default(300),
      })
      .strict()
      .prefault({}),
    firmware: z
      .object({
        /** Ed25519 public keys (PEM files); an image must verify with one of them. None: every job fails. */
        publicKeys: z.array(z.string().min(1)).default([]),
        /** Where the `slots` installer keeps images; the caller defaults it to `<stateDir>/slots`. */
        slotsDir: z.string().min(1).optional(),
        /** `slots`: A/B images switched by a link; `command`: `installCommand` is run with the image's path. */
        installer: z.enum(['slots', 'command']).default('slots'),
        installCommand: commandLine.optional(),
        /** Decides commit or rollback after a switch: a command (exit 0) or a URL (2xx); neither: healthy. */
        health: z
          .object({
            command: commandLine.optional(),
            url: z.url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' }).optional(),
            /** One attempt may take this long; a command still running is killed. */
            timeoutMs: z.number().int().min(10).max(3_600_000).default(30_000),
            /** Attempts after the first one fails. */
            retries: z.number().int().min(0).max(100).default(3),
            intervalMs: z.number().int().min(0).max(3_600_000).default(5000),
            /** A switched image not committed within this time is rolled back. */
            commitTimeoutMs: z.number().int().min(1000).max(86_400_000).default(300_000),
          })
          .strict()
          .refine((h) => h.command === undefined || h.url === undefined, {
            path: ['url'],
            message: 'set either command or url, not both',
          })
          .prefault({}),
        /** The longest an install (unpacking, the image's install script, or `installCommand`) may take. */
        installTimeoutMs: z.number().int().min(1000).max(86_400_000).default(600_000),
        /** The slots installer refuses an image that unpacks to more bytes, or holds more members, than these. */
        maxUnpackedBytes: z
          .number()
          .int()
          .min(1)
          .max(Number.MAX_SAFE_INTEGER)
          .default(4 * 1024 ** 3),
        maxFiles: z.number().int().min(1).max(10_000_000).default(100_000),
        /**
         * What restarts the new image after the switch (and the old one after a rollback): `none`; `command` runs
         * `restartCommand` (a service restart); `agent` stops the agent with exit status 75 so that its service
         * manager starts it again (the agent's own update); `reboot` runs `commands.rebootCommand`.
         */
        restart: z.enum(['none', 'command', 'agent', 'reboot']).default('none'),
        restartCommand: commandLine.optional(),
        /**
         * The loop counter: how many times the agent may start in one stretch of an update (before the switch,
         * or after it) before it gives up: `failed` before the switch, a rollback after it.
         */
        maxAttempts: z.number().int().min(1).max(100).default(3),
        /** Finished jobs kept for `devcloud-agent fw status`. */
        keepJobs: z.number().int().min(1).max(1000).default(20),
        /**
         * The wait before the second download attempt after a broken download, in milliseconds; doubled after each
         * failure, up to a minute. Unset: 2000.
         */
        downloadRetryDelayMs: z.number().int().min(0).max(60_000).optional(),
      })
      .strict()
      .refine((f) => f.installer !== 'command' || f.installCommand !== undefined, {
        path: ['installCommand'],
        message: 'is needed when installer is "command"',
      })
      .refine((f) => f.restart !== 'command' || f.restartCommand !== undefined, {
        path: ['restartCommand'],
        message: 'is needed when restart is "command"',
      })
      .prefault({}),
  })
  .strict();

export type AgentConfig = z.infer<typeof AgentConfigSchema>;

/** Settings that come from flags and the environment; `docs/agent.md` lists them. */
export const AGENT_OPTIONS: readonly OptionSpec[] = [
  {
    key: 'configFile',
    flag: '--config',
    env: 'DEVCLOUD_CONFIG',
    kind: 'string',
    arg: 'FILE',
    help: 'config file (YAML or JSON)',
  },
  {
    key: 'stateDir',
    flag: '--state-dir',
    env: 'DEVCLOUD_STATE_DIR',
    kind: 'string',
    arg: 'DIR',
    help: 'state directory (identity, database)',
  },
  {
    key: 'mqtt.url',
    flag: '--mqtt-url',
    env: 'DEVCLOUD_MQTT_URL',
    kind: 'string',
    arg: 'URL',
    help: 'broker URL, mqtt:// or mqtts://',
  },
  {
    key: 'mqtt.username',
    env: 'DEVCLOUD_MQTT_USERNAME',
    kind: 'string',
    help: 'broker username (default: the device id)',
  },
  {
    key: 'mqtt.password',
    env: 'DEVCLOUD_MQTT_PASSWORD',
    kind: 'string',
    help: 'broker password (default: the device secret)',
  },
  {
    key: 'udp.port',
    flag: '--udp-port',
    env: 'DEVCLOUD_UDP_PORT',
    kind: 'int',
    arg: 'N',
    help: 'UDP port for user authcodes (default 590)',
  },
  {
    key: 'udp.enabled',
    flag: '--udp',
    env: 'DEVCLOUD_UDP',
    kind: 'bool',
    arg: 'BOOL',
    help: 'listen for authcodes (default true)',
  },
  {
    key: 'socket.path',
    flag: '--socket',
    env: 'DEVCLOUD_SOCKET',
    kind: 'string',
    arg: 'PATH',
    help: 'Unix socket of the local interface',
  },
  ...LOG_OPTIONS,
  {
    key: 'platform',
    flag: '--platform',
    env: 'DEVCLOUD_PLATFORM',
    kind: 'string',
    arg: 'NAME',
    help: 'platform reported to the cloud',
  },
  {
    key: 'fwVersion',
    flag: '--fw-version',
    env: 'DEVCLOUD_FW_VERSION',
    kind: 'string',
    arg: 'VERSION',
    help: 'firmware version reported to the cloud',
  },
  {
    key: 'identity.provisioningFile',
    flag: '--provision',
    env: 'DEVCLOUD_PROVISION',
    kind: 'string',
    arg: 'FILE',
    help: 'provisioning file, read at first start',
  },
  {
    key: 'hooks.change',
    flag: '--change-hook',
    env: 'DEVCLOUD_CHANGE_HOOK',
    kind: 'string',
    arg: 'EXE',
    help: 'executable run after each variable change',
  },
  {
    key: 'commands.dir',
    flag: '--commands-dir',
    env: 'DEVCLOUD_COMMANDS_DIR',
    kind: 'string',
    arg: 'DIR',
    help: 'folder of executable command handlers',
  },
  {
    key: 'firmware.publicKeys',
    flag: '--fw-public-key',
    env: 'DEVCLOUD_FW_PUBLIC_KEYS',
    kind: 'list',
    arg: 'FILE',
    help: 'firmware signing key (PEM); repeat, or separate with commas',
  },
  {
    key: 'firmware.slotsDir',
    flag: '--fw-slots',
    env: 'DEVCLOUD_FW_SLOTS',
    kind: 'string',
    arg: 'DIR',
    help: 'folder of the firmware slots (default <stateDir>/slots)',
  },
  {
    key: 'firmware.health.command',
    flag: '--fw-health-cmd',
    env: 'DEVCLOUD_FW_HEALTH_CMD',
    kind: 'string',
    arg: 'CMD',
    help: 'health check after a firmware switch; words split on spaces, no shell',
  },
];

/** Where the agent keeps its state unless told otherwise: systemd's `StateDirectory=`, else the FHS place. */
export function defaultStateDir(env: NodeJS.ProcessEnv): string {
  return env.STATE_DIRECTORY?.split(':')[0] ?? '/var/lib/devcloud';
}

export function socketPath(config: AgentConfig, env: NodeJS.ProcessEnv = process.env): string {
  if (config.socket.path !== undefined) return config.socket.path;
  const runtime = env.RUNTIME_DIRECTORY?.split(':')[0];
  return join(runtime ?? config.stateDir, 'agent.sock');
}

/** The installed service's socket: the unit's `RuntimeDirectory=devcloud`. */
export const SERVICE_SOCKET = '/run/devcloud/agent.sock';

/**
 * Where the engineer's CLI finds the running agent. An engineer's shell has no `$RUNTIME_DIRECTORY`, so with the
 * service's own state directory and no `socket.path`, the service's socket is taken when it is there; otherwise
 * the agent's rule (`socketPath`). docs/operations.md, "The engineer's CLI".
 */
export function clientSocketPath(
  config: AgentConfig,
  env: NodeJS.ProcessEnv = process.env,
  exists: (path: string) => boolean = existsSync,
): string {
  const own = socketPath(config, env);
  if (config.socket.path !== undefined || env.RUNTIME_DIRECTORY) return own;
  if (config.stateDir === defaultStateDir({}) && !exists(own) && exists(SERVICE_SOCKET)) return SERVICE_SOCKET;
  return own;
}

/**
 * The installed config file, read when no other is named and it exists: the service and the engineer's CLI on
 * the same gateway then agree on the broker, the state directory and the socket.
 */
export function defaultConfigFile(env: NodeJS.ProcessEnv): string | undefined {
  const path = join(env.CONFIGURATION_DIRECTORY?.split(':')[0] ?? '/etc/devcloud', 'agent.yaml');
  return existsSync(path) ? path : undefined;
}

export interface AgentConfigInput {
  flags: Record<string, unknown>;
  env: NodeJS.ProcessEnv;
}

/** Loads the agent config; throws `ConfigError` with every problem. */
export function loadAgentConfig({ flags, env }: AgentConfigInput): AgentConfig {
  const { configFile, ...rest } = flags;
  const file = typeof configFile === 'string' ? configFile : env.DEVCLOUD_CONFIG || defaultConfigFile(env);
  return loadConfig(AgentConfigSchema, {
    options: AGENT_OPTIONS.filter((o) => o.key !== 'configFile'),
    defaults: { stateDir: defaultStateDir(env) },
    file,
    env,
    flags: rest,
  });
}
