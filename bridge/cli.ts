/**
 * `devcloud-bridge`: runs the cloud side, and manages frontends.
 *
 * Exit codes: 0 success; 1 the operation failed; 2 usage or configuration error.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import { ConfigError, formatOptions, parseArgs } from '../lib/config.js';
import { createLogger } from '../lib/log.js';
import { readMqttTls } from '../lib/mqtt-options.js';
import { isStorageFull } from '../lib/sqlite.js';
import { safeUrl } from '../lib/url.js';
import { VERSION } from '../lib/version.js';
import { PasswordHasher } from './accounts/password.js';
import { buildApp, createDeviceService } from './app.js';
import { EmbeddedBroker } from './broker.js';
import { BRIDGE_OPTIONS, type BridgeConfig, loadBridgeConfig, outboxDir } from './config.js';
import { CommandService } from './commands/service.js';
import { DeviceLink, EmbeddedLink, type Link } from './devices/link.js';
import { DeviceRateLimiter } from './devices/ratelimit.js';
import type { DeviceService } from './devices/service.js';
import { FIRMWARE_FLAGS, FIRMWARE_USAGE, type FirmwareFlag, firmwareCommand } from './firmware/cli.js';
import { LinkMonitor } from './health.js';
import { createMailer } from './mail/mailer.js';
import { type ManagedBroker, provisionDevices, setDeviceEnabled, startManagedBroker } from './mqtt/manage.js';
import { SqliteStore } from './store/sqlite.js';
import { type BridgeStore, type Frontend, ProductConfig } from './store/types.js';

const USAGE = `devcloud-bridge ${VERSION}: the devcloud cloud side

Usage:
  devcloud-bridge [run] [options]                     serve the REST API and the MQTT side
  devcloud-bridge frontend create [--name NAME] [KEY=VALUE ...]
  devcloud-bridge frontend list [--json]
  devcloud-bridge frontend set ID [name=NAME] [default=true] [KEY=VALUE ...]
      KEY: nearby, registration, confirmationEmail, claimRequiresProximity (true or false)
${FIRMWARE_USAGE}
  devcloud-bridge device provision [--count N] [--out DIR]
  devcloud-bridge device enable|disable ID            (mqtt.dynsec: the device's broker client)

Options:
${formatOptions(BRIDGE_OPTIONS)}
  --name NAME            name of a new frontend (frontend create) or image (firmware add)
  --json                 print JSON (frontend and firmware commands)
  --out DIR              where firmware keygen writes signing.key and signing.pub, and device provision
                         the provisioning files (default: the current directory)
  --count N              how many devices device provision makes (default 1)
  --platform P           the image's platform (firmware add)
  --version N            the image's version, an integer from 0 (firmware add)
  --from P1,P2           the platforms a device may run to take the image (firmware add)
  --to-platform P        the platform a device runs after the update (firmware add; default --platform)
  --sign-key KEY         the Ed25519 private key (PKCS#8 PEM) that signs the image (firmware add)
  -h, --help             this help

Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error.
`;

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
}
const stdio: Io = { out: (s) => process.stdout.write(`${s}\n`), err: (s) => process.stderr.write(`${s}\n`) };

/** Makes the default frontend at first start (decision 15), so that a new bridge answers at once. */
export function ensureDefaultFrontend(store: BridgeStore, now: number): Frontend {
  const existing = store.defaultFrontend();
  if (existing) return existing;
  const f: Frontend = {
    id: randomUUID(),
    name: 'default',
    config: ProductConfig.parse({}),
    isDefault: true,
    createdAt: now,
  };
  store.createFrontend(f);
  return f;
}

function parseSettings(pairs: string[], io: Io): { settings: Record<string, boolean>; name?: string } | undefined {
  const settings: Record<string, boolean> = {};
  let name: string | undefined;
  for (const p of pairs) {
    const eq = p.indexOf('=');
    const key = eq > 0 ? p.slice(0, eq) : '';
    const value = p.slice(eq + 1);
    if (key === 'name') {
      name = value;
      continue;
    }
    // An own key only: `in` would also accept inherited names such as `constructor`.
    if (!Object.hasOwn(ProductConfig.shape, key) || !/^(true|false)$/.test(value)) {
      io.err(
        `devcloud-bridge: ${p}: expected KEY=true|false with KEY one of ${Object.keys(ProductConfig.shape).join(', ')}`,
      );
      return undefined;
    }
    settings[key] = value === 'true';
  }
  return name === undefined ? { settings } : { settings, name };
}

function frontendCommand(
  config: BridgeConfig,
  params: string[],
  json: boolean,
  name: string | undefined,
  io: Io,
): number {
  const [sub, ...rest] = params;
  const store = new SqliteStore(config.dataDir);
  try {
    const now = Date.now();
    switch (sub) {
      case 'list': {
        ensureDefaultFrontend(store, now);
        const all = store.frontends();
        if (json) io.out(JSON.stringify(all));
        else
          for (const f of all)
            io.out(`${f.id}  ${f.isDefault ? '(default) ' : ''}${f.name}  ${JSON.stringify(f.config)}`);
        return 0;
      }
      case 'create': {
        const parsed = parseSettings(rest, io);
        if (!parsed) return 2;
        const f: Frontend = {
          id: randomUUID(),
          name: name ?? parsed.name ?? 'frontend',
          config: ProductConfig.parse(parsed.settings),
          isDefault: false,
          createdAt: now,
        };
        store.createFrontend(f);
        io.out(json ? JSON.stringify(f) : f.id);
        return 0;
      }
      case 'set': {
        const [id, ...pairs] = rest;
        const f = id ? store.frontend(id) : undefined;
        if (!f) {
          io.err(`devcloud-bridge: no frontend ${id ?? '(missing id)'}`);
          return 1;
        }
        const makeDefault = pairs.includes('default=true');
        const parsed = parseSettings(
          pairs.filter((p) => p !== 'default=true'),
          io,
        );
        if (!parsed) return 2;
        store.setFrontendConfig(f.id, ProductConfig.parse({ ...f.config, ...parsed.settings }), parsed.name ?? name);
        if (makeDefault) store.setDefaultFrontend(f.id);
        const updated = store.frontend(f.id)!;
        io.out(json ? JSON.stringify(updated) : `${updated.id}  ${updated.name}  ${JSON.stringify(updated.config)}`);
        return 0;
      }
      default:
        io.err('devcloud-bridge: frontend needs one of create, list, set');
        return 2;
    }
  } finally {
    store.close();
  }
}

export async function runCli(argv: string[], io: Io = stdio, env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const rest: string[] = [];
  let json = false;
  let name: string | undefined;
  let count: string | undefined;
  // The firmware commands' flags, as `--flag VALUE` or `--flag=VALUE`.
  const fwFlags: Partial<Record<FirmwareFlag, string>> = {};
  const fwMissing: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1;
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    if (arg === '--') {
      rest.push(...argv.slice(i));
      break;
    } else if (arg === '--json') json = true;
    else if (arg === '--name') name = argv[++i];
    else if (flag === '--count') count = eq > 0 ? arg.slice(eq + 1) : (argv[++i] ?? '');
    else if ((FIRMWARE_FLAGS as readonly string[]).includes(flag)) {
      const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
      if (value === undefined) fwMissing.push(flag);
      else fwFlags[flag as FirmwareFlag] = value;
    } else rest.push(arg);
  }
  const args = parseArgs(rest, BRIDGE_OPTIONS);
  if (args.help || args.positionals[0] === 'help') {
    io.out(USAGE);
    return 0;
  }
  // KEY=VALUE pairs belong to the frontend commands, not to the option parser.
  const [command = 'run', ...params] = args.positionals;
  let config: BridgeConfig | undefined;
  const problems = [...args.problems];
  if (argv.includes('--name') && name === undefined) problems.push('flag --name needs a value');
  for (const flag of fwMissing) problems.push(`flag ${flag} needs a value`);
  if (command !== 'firmware')
    for (const flag of Object.keys(fwFlags))
      if (!(command === 'device' && flag === '--out')) problems.push(`flag ${flag} is for the firmware commands`);
  if (count !== undefined && (command !== 'device' || !/^[1-9][0-9]{0,3}$/.test(count)))
    problems.push('flag --count is for device provision: a number from 1 to 9999');
  try {
    config = loadBridgeConfig(args.flags, env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }
  if (problems.length > 0 || !config) {
    io.err(`devcloud-bridge: ${new ConfigError(problems).message}`);
    io.err('Run devcloud-bridge --help for the options.');
    return 2;
  }
  switch (command) {
    case 'run':
      if (params.length > 0) {
        io.err(`devcloud-bridge: unexpected argument ${params[0]}`);
        return 2;
      }
      return runBridge(config, io);
    case 'frontend':
      return frontendCommand(config, params, json, name, io);
    case 'firmware':
      return firmwareCommand(config, params, { json, name, flags: fwFlags }, io);
    case 'device':
      return deviceCommand(config, params, { count: Number(count ?? 1), outDir: fwFlags['--out'] ?? '.' }, io);
    default:
      io.err(`devcloud-bridge: unknown command ${command}; run devcloud-bridge --help`);
      return 2;
  }
}

/** `devcloud-bridge device …`: provisioning, and the broker clients of devices (bridge/mqtt/manage.ts). */
async function deviceCommand(
  config: BridgeConfig,
  params: string[],
  args: { count: number; outDir: string },
  io: Io,
): Promise<number> {
  const [sub, id, ...extra] = params;
  // Stdout carries the command's output (file paths); the log goes to stderr, warnings and worse unless more is asked.
  const log = createLogger({
    level: config.log.level === 'info' ? 'warn' : config.log.level,
    pretty: 'never',
    base: { service: 'devcloud-bridge' },
    destination: process.stderr,
  });
  const wantsId = sub === 'enable' || sub === 'disable';
  if (sub !== 'provision' && !wantsId) {
    io.err('devcloud-bridge: device needs one of provision, enable, disable');
    return 2;
  }
  if ((wantsId ? extra : [id, ...extra]).some((p) => p !== undefined) || (wantsId && id === undefined)) {
    io.err(`devcloud-bridge: device ${sub} ${wantsId ? 'needs one device id' : 'takes no arguments'}`);
    return 2;
  }
  try {
    if (wantsId) return await setDeviceEnabled(config, id!, sub === 'enable', io, log);
    const store = new SqliteStore(config.dataDir);
    try {
      return await provisionDevices(config, store, args, io, log);
    } finally {
      store.close();
    }
  } catch (err) {
    io.err(`devcloud-bridge: ${err instanceof Error ? err.message : String(err)}`);
    return 1;
  }
}

/** The password hasher the config asks for. */
export function hasherFor(config: BridgeConfig): PasswordHasher {
  const a = config.accounts;
  return new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: a.hashConcurrency,
    maxQueued: a.hashQueue,
  });
}

export interface RunningBridge {
  app: FastifyInstance;
  broker: EmbeddedBroker | undefined;
  link: Link;
  devices: DeviceService;
  commands: CommandService;
  store: SqliteStore;
  /** With `mqtt.dynsec`: the management of device clients at Mosquitto. */
  managed: ManagedBroker | undefined;
  url: string;
  defaultFrontend: Frontend;
  close(): Promise<void>;
}

/** Starts the HTTP(S) server and, without an external broker, the embedded one. */
export async function startBridge(
  config: BridgeConfig,
  log = createLogger({ ...config.log, base: { service: 'devcloud-bridge' } }),
): Promise<RunningBridge> {
  const store = new SqliteStore(config.dataDir, log, { backgroundCheckpoints: true });
  const defaultFrontend = ensureDefaultFrontend(store, Date.now());
  const hasher = hasherFor(config);
  const mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log);
  const commands = new CommandService({ store, log, now: Date.now, maxOpen: config.commands.maxOpen });
  const devices = createDeviceService(config, store, log, Date.now, commands);
  const linkState = new LinkMonitor();
  const app = buildApp({ config, store, hasher, mailer, log, devices, commands, link: linkState });
  let broker: EmbeddedBroker | undefined;
  const deviceLimits = new DeviceRateLimiter(config.mqtt.rate, log);
  const fail = async (err: unknown): Promise<never> => {
    await app.close();
    await broker?.close();
    await mailer.close();
    store.close();
    throw err;
  };
  let mqttPassword: string | undefined;
  let mqttCa: Buffer | undefined;
  let enrolPassword: string | undefined;
  try {
    // The embedded broker's enrolment credential (with `dynsec`, bridge/mqtt/manage.ts reads it).
    if (config.mqtt.url === undefined && config.mqtt.openEnrolment && config.mqtt.enrolPasswordFile !== undefined)
      enrolPassword = readFileSync(config.mqtt.enrolPasswordFile, 'utf8').trim();
  } catch (err) {
    await fail(new Error(`cannot read the enrolment password file: ${(err as Error).message}`));
  }
  try {
    if (config.mqtt.passwordFile !== undefined) mqttPassword = readFileSync(config.mqtt.passwordFile, 'utf8').trim();
  } catch (err) {
    await fail(new Error(`cannot read the MQTT password file: ${(err as Error).message}`));
  }
  try {
    // `cannot read the MQTT CA file: …` when it cannot be read.
    mqttCa = readMqttTls({ caFile: config.mqtt.caFile }).ca;
  } catch (err) {
    await fail(err);
  }
  try {
    await app.listen({ host: config.host, port: config.http.port });
  } catch (err) {
    await fail(portError(err, config.http.port, '--http-port'));
  }
  if (config.mqtt.url === undefined) {
    // A new embedded broker has no device connected, whatever the database says from before.
    // A bridge on a full disk still starts and serves reads (docs/operations.md, "A full disk"): the states are
    // put right as devices connect.
    const stale = await store
      .write(() => store.devices.markAllDisconnected(Date.now()), { durable: false })
      .catch((err: unknown) => {
        if (!isStorageFull(err)) throw err;
        log.warn({ event: 'devices.mark_failed', err: String(err) });
        return 0;
      });
    if (stale > 0) log.info({ event: 'devices.marked_disconnected', count: stale });
    try {
      broker = await EmbeddedBroker.start({
        host: config.host,
        port: config.mqtt.port,
        openEnrolment: config.mqtt.openEnrolment,
        enrol:
          enrolPassword === undefined ? undefined : { username: config.mqtt.enrolUsername, password: enrolPassword },
        enrolLimits: config.mqtt.enrolLimits,
        deviceLimits,
        credentials: store,
        log,
      });
    } catch (err) {
      await fail(portError(err, config.mqtt.port, '--mqtt-port'));
    }
  }
  const b = broker;
  // The embedded broker is reached through its own interface, in this process; an external one as a client.
  const link: Link = b
    ? new EmbeddedLink(b.aedes, log)
    : new DeviceLink({
        url: config.mqtt.url!,
        clientId: config.mqtt.clientId,
        username: config.mqtt.username,
        password: mqttPassword,
        ca: mqttCa,
        persistent: true,
        log,
        deviceLimits,
      });
  linkState.attach(link, b ? 'embedded' : 'external');
  devices.attach((deviceId, name, payload) => link.publish(deviceId, name, payload));
  commands.attach(
    (deviceId, name, payload) => link.publish(deviceId, name, payload),
    () => link.connected,
  );
  link.on('message', (msg) => void devices.handle(msg));
  link.on('up', () => devices.onLinkUp());
  let managed: ManagedBroker | undefined;
  if (config.mqtt.dynsec) {
    try {
      managed = startManagedBroker({ config, store, devices, password: mqttPassword ?? '', ca: mqttCa, log });
    } catch (err) {
      await fail(err);
    }
    // Roles first, so that the bridge may publish to devices once its link is up; a broker that is not there
    // yet is set up when it comes (at every connect).
    const m = managed!;
    await Promise.race([m.dynsec.ready, new Promise((resolve) => setTimeout(resolve, 10_000).unref())]).catch(
      (err: unknown) => log.error({ event: 'dynsec.unavailable', err: (err as Error).message }),
    );
  }
  try {
    await link.start(b ? 10_000 : 30_000);
  } catch (err) {
    if (b) {
      await link.close();
      await fail(err);
    }
    // An external broker may come later: the client keeps trying, and devices catch up when it does.
    log.error({ event: 'mqtt.unreachable', url: safeUrl(config.mqtt.url!), err: (err as Error).message });
  }
  // Expired sessions can no longer be used; removing them keeps the table the size of the live ones.
  const DAY_MS = 86_400_000;
  const prune = () => {
    const t = Date.now();
    store
      .write(() =>
        store.pruneSessions(t - config.sessions.idleDays * DAY_MS, t - config.sessions.absoluteDays * DAY_MS),
      )
      .then((n) => n > 0 && log.info({ event: 'sessions.pruned', count: n }))
      .catch((err: unknown) => log.warn({ event: 'sessions.prune_failed', err: String(err) }));
    devices
      .prune()
      .then((n) => n.nearby > 0 && log.info({ event: 'devices.pruned', ...n }))
      .catch((err: unknown) => log.warn({ event: 'devices.prune_failed', err: String(err) }));
    commands
      .prune(config.commands.keepDays)
      .then((n) => n > 0 && log.info({ event: 'cmd.pruned', count: n }))
      .catch((err: unknown) => log.warn({ event: 'cmd.prune_failed', err: String(err) }));
  };
  prune();
  const pruneTimer = setInterval(prune, 3_600_000);
  // History past its age or count limit goes in the background, in small batches (docs/api.md, "History").
  devices.retention.start();
  pruneTimer.unref();
  // Commands a device never received expire on the bridge once their lifetime ends.
  const sweepTimer = setInterval(() => {
    commands.sweep().catch((err: unknown) => log.warn({ event: 'cmd.sweep_failed', err: String(err) }));
  }, 1000);
  sweepTimer.unref();
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.http.port;
  const scheme = config.http.certFile ? 'https' : 'http';
  const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  return {
    app,
    broker,
    link,
    devices,
    commands,
    store,
    managed,
    url: `${scheme}://${host.includes(':') ? `[${host}]` : host}:${port}`,
    defaultFrontend,
    close: async () => {
      clearInterval(pruneTimer);
      clearInterval(sweepTimer);
      await app.close();
      await managed?.close();
      await link.close();
      await devices.close();
      await broker?.close();
      await mailer.close();
      store.close();
    },
  };
}

class PortError extends Error {}

function portError(err: unknown, port: number, flag: string): Error {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'EADDRINUSE') return new PortError(`port ${port} is already in use; choose another with ${flag} N`);
  if (code === 'EACCES') return new PortError(`port ${port} needs privileges; choose another with ${flag} N`);
  return err instanceof Error ? err : new Error(String(err));
}

async function runBridge(config: BridgeConfig, io: Io): Promise<number> {
  const log = createLogger({ ...config.log, base: { service: 'devcloud-bridge' } });
  let bridge: RunningBridge;
  try {
    bridge = await startBridge(config, log);
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    io.err(`devcloud-bridge: ${msg}`);
    log.fatal({ event: 'bridge.start_failed', err: msg });
    return 1;
  }
  log.info({
    event: 'bridge.started',
    version: VERSION,
    url: bridge.url,
    mqtt: bridge.broker?.url ?? safeUrl(config.mqtt.url!),
    defaultFrontend: bridge.defaultFrontend.id,
  });
  return new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      log.info({ event: 'bridge.stopping', signal });
      setTimeout(() => process.exit(1), 5000).unref();
      bridge.close().then(
        () => resolve(0),
        () => resolve(1),
      );
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
}
