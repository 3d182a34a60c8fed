/**
 * `devcloud-bridge`: runs the cloud side (bridge/bridge.ts), manages frontends, firmware and device clients, and
 * migrates a PostgreSQL database (docs/scaling.md).
 *
 * Exit codes: 0 success; 1 the operation failed; 2 usage or configuration error.
 */
import { ConfigError, formatOptions, parseArgs } from '../lib/config.js';
import { createLogger } from '../lib/log.js';
import { safeUrl } from '../lib/url.js';
import { VERSION } from '../lib/version.js';
import { Bridge } from './bridge.js';
import { commandLog } from './command-log.js';
import { BRIDGE_OPTIONS, type BridgeConfig, loadBridgeConfig } from './config.js';
import { FIRMWARE_FLAGS, FIRMWARE_USAGE, type FirmwareFlag, firmwareCommand } from './firmware/cli.js';
import { frontendCommand } from './frontends/cli.js';
import { provisionDevices, setDeviceEnabled } from './mqtt/manage.js';
import { PartError } from './part.js';
import { migratePostgres } from './store/postgres/migrate.js';
import { openPostgres } from './store/postgres/pool.js';
import { openStore } from './store/open.js';
import type { BridgeStore } from './store/types.js';

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
  devcloud-bridge migrate [--database-url URL] [--json]
                                                      bring the PostgreSQL database to this program's schema

Options:
${formatOptions(BRIDGE_OPTIONS)}
  --name NAME            name of a new frontend (frontend create) or image (firmware add)
  --json                 print JSON (frontend, firmware and migrate commands)
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
  /** Where `run` writes its log; stdout by default. */
  log?: NodeJS.WritableStream;
}
const stdio: Io = { out: (s) => process.stdout.write(`${s}\n`), err: (s) => process.stderr.write(`${s}\n`) };

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
      return failsWithOneLine(io, () => frontendCommand(config, params, json, name, io, Date.now()));
    case 'firmware':
      return failsWithOneLine(io, () => firmwareCommand(config, params, { json, name, flags: fwFlags }, io));
    case 'device':
      return deviceCommand(config, params, { count: Number(count ?? 1), outDir: fwFlags['--out'] ?? '.' }, io);
    case 'migrate':
      return migrateCommand(config, params, json, io);
    default:
      io.err(`devcloud-bridge: unknown command ${command}; run devcloud-bridge --help`);
      return 2;
  }
}

/** A command whose unexpected failure (the database cannot be reached, say) is one line and exit 1. */
async function failsWithOneLine(io: Io, command: () => Promise<number>): Promise<number> {
  try {
    return await command();
  } catch (err) {
    io.err(`devcloud-bridge: ${err instanceof Error ? err.message : String(err)}`);
    return 1;
  }
}

/** `devcloud-bridge migrate`: applies the PostgreSQL migrations to `database.url`, and says the versions. */
async function migrateCommand(config: BridgeConfig, params: string[], json: boolean, io: Io): Promise<number> {
  if (params.length > 0) {
    io.err(`devcloud-bridge: migrate takes no arguments, not ${params[0]}`);
    return 2;
  }
  const url = config.database.url;
  if (url === undefined) {
    io.err('devcloud-bridge: migrate needs database.url: --database-url URL, DEVCLOUD_DATABASE_URL or the config file');
    return 2;
  }
  const log = commandLog(config);
  try {
    const pool = await openPostgres(url, log, { poolSize: config.database.poolSize });
    try {
      const { before, after } = await migratePostgres(pool, { log });
      if (json) io.out(JSON.stringify({ url: safeUrl(url), before, after }));
      else {
        const applied = after - before;
        const what = applied === 0 ? 'up to date' : `${applied} migration${applied === 1 ? '' : 's'} applied`;
        io.out(`${safeUrl(url)}: schema version ${before} -> ${after} (${what})`);
      }
      return 0;
    } finally {
      await pool.end();
    }
  } catch (err) {
    io.err(`devcloud-bridge: ${err instanceof Error ? err.message : String(err)}`);
    return 1;
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
  const log = commandLog(config);
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
    const store = await openStore(config, log);
    try {
      return await provisionDevices(config, store.credentials, { ...args, now: Date.now }, io, log);
    } finally {
      await store.close();
    }
  } catch (err) {
    io.err(`devcloud-bridge: ${err instanceof Error ? err.message : String(err)}`);
    return 1;
  }
}

/** `devcloud-bridge run`: starts the bridge, and stops it at SIGTERM or SIGINT. */
async function runBridge(config: BridgeConfig, io: Io): Promise<number> {
  const log = createLogger({
    ...config.log,
    base: { service: 'devcloud-bridge' },
    ...(io.log ? { destination: io.log } : {}),
  });
  const failed = (err: unknown): number => {
    const msg = err instanceof Error ? err.message : String(err);
    io.err(`devcloud-bridge: ${msg}`);
    log.fatal({ event: 'bridge.start_failed', ...(err instanceof PartError ? { part: err.part } : {}), err: msg });
    return 1;
  };
  let store: BridgeStore;
  try {
    store = await openStore(config, log, { backgroundCheckpoints: true });
  } catch (err) {
    return failed(err);
  }
  let bridge: Bridge;
  try {
    bridge = await Bridge.start({ config, store, log, now: Date.now });
  } catch (err) {
    await store.close();
    return failed(err);
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
      bridge
        .stop()
        .finally(() => store.close())
        .then(
          () => resolve(0),
          () => resolve(1),
        );
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
}
