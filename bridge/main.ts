#!/usr/bin/env node
/**
 * `devcloud-bridge`: the cloud side. This build runs the embedded MQTT broker with device enrolment and
 * topic isolation; the REST API is not served yet.
 */
import { z } from 'zod';
import { ConfigError, type OptionSpec, formatOptions, loadConfig, parseArgs } from '../lib/config.js';
import { LOG_LEVELS, createLogger } from '../lib/log.js';
import { VERSION } from '../lib/version.js';
import { EmbeddedBroker, MemoryCredentials } from './broker.js';

const BridgeConfigSchema = z
  .object({
    host: z.string().min(1).default('127.0.0.1'),
    mqttPort: z.number().int().min(0).max(65535).default(1883),
    openEnrolment: z.boolean().default(true),
    log: z
      .object({
        level: z.enum(LOG_LEVELS).default('info'),
        pretty: z.enum(['auto', 'always', 'never']).default('auto'),
      })
      .strict()
      .prefault({}),
  })
  .strict();

const OPTIONS: readonly OptionSpec[] = [
  {
    key: 'configFile',
    flag: '--config',
    env: 'DEVCLOUD_BRIDGE_CONFIG',
    kind: 'string',
    arg: 'FILE',
    help: 'config file (YAML or JSON)',
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
    key: 'mqttPort',
    flag: '--mqtt-port',
    env: 'DEVCLOUD_MQTT_PORT',
    kind: 'int',
    arg: 'N',
    help: 'port of the embedded MQTT broker (default 1883)',
  },
  {
    key: 'openEnrolment',
    flag: '--open-enrolment',
    env: 'DEVCLOUD_OPEN_ENROLMENT',
    kind: 'bool',
    arg: 'BOOL',
    help: 'enrol unknown devices on first connect (default true)',
  },
  { key: 'log.level', flag: '--log-level', env: 'DEVCLOUD_LOG_LEVEL', kind: 'string', arg: 'LEVEL', help: 'log level' },
];

const args = parseArgs(process.argv.slice(2), OPTIONS);
if (args.help) {
  console.log(
    `devcloud-bridge ${VERSION}: the devcloud cloud side (embedded MQTT broker; the REST API is not served yet)\n\nOptions:\n${formatOptions(OPTIONS)}`,
  );
  process.exit(0);
}
let config: z.infer<typeof BridgeConfigSchema>;
try {
  if (args.problems.length > 0 || args.positionals.length > 0) {
    throw new ConfigError([...args.problems, ...args.positionals.map((p) => `unexpected argument ${p}`)]);
  }
  const { configFile, ...flags } = args.flags;
  config = loadConfig(BridgeConfigSchema, {
    options: OPTIONS.filter((o) => o.key !== 'configFile'),
    file: typeof configFile === 'string' ? configFile : process.env.DEVCLOUD_BRIDGE_CONFIG || undefined,
    env: process.env,
    flags,
  });
} catch (err) {
  if (!(err instanceof ConfigError)) throw err;
  console.error(`devcloud-bridge: ${err.message}`);
  process.exit(2);
}

const log = createLogger({ level: config.log.level, pretty: config.log.pretty, base: { service: 'devcloud-bridge' } });
let broker: EmbeddedBroker;
try {
  broker = await EmbeddedBroker.start({
    host: config.host,
    port: config.mqttPort,
    openEnrolment: config.openEnrolment,
    credentials: new MemoryCredentials(),
    log,
  });
} catch (err) {
  const code = (err as NodeJS.ErrnoException).code;
  const why =
    code === 'EADDRINUSE' ? `port ${config.mqttPort} is in use; choose another with --mqtt-port N` : String(err);
  log.fatal({ event: 'bridge.start_failed', msg: `cannot start the MQTT broker: ${why}` });
  process.exit(1);
}
log.info({ event: 'bridge.started', version: VERSION, mqtt: broker.url, openEnrolment: config.openEnrolment });
const stop = () => {
  log.info({ event: 'bridge.stopping' });
  void broker.close().then(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
