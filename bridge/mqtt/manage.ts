/**
 * The bridge's side of Mosquitto's dynamic security (`mqtt.dynsec`, bridge/mqtt/dynsec.ts): the connection the
 * running bridge keeps to manage device clients, and the `devcloud-bridge device` commands.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Logger } from '../../lib/log.js';
import { readMqttTls } from '../../lib/mqtt-options.js';
import { writeFileAtomic } from '../../lib/fsutil.js';
import { RateLimiter } from '../accounts/ratelimit.js';
import { hashSecret } from '../broker.js';
import type { BridgeConfig } from '../config.js';
import type { DeviceService } from '../devices/service.js';
import { isDeviceId } from '../../protocol/index.js';
import { Dynsec, type EnrolRequest } from './dynsec.js';

/** What the dynamic security side needs from the store: the devices' secret hashes (bridge/store/sqlite.ts). */
export interface CredentialStore {
  secretHash(deviceId: string): Promise<string | undefined>;
  enroll(deviceId: string, secretHash: string, at: number): Promise<void>;
}

function readSecretFile(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch (err) {
    throw new Error(`cannot read the ${what} file: ${(err as Error).message}`);
  }
}

/** The config `mqtt.dynsec` needs, or what is missing. */
function dynsecLogin(config: BridgeConfig): { url: string; username: string; passwordFile: string } {
  const m = config.mqtt;
  const missing = [
    m.url === undefined && 'mqtt.url',
    m.username === undefined && 'mqtt.username',
    m.passwordFile === undefined && 'mqtt.passwordFile',
  ].filter((x): x is string => typeof x === 'string');
  if (missing.length > 0) throw new Error(`mqtt.dynsec needs ${missing.join(', ')}`);
  return { url: m.url!, username: m.username!, passwordFile: m.passwordFile! };
}

export interface ManagedBroker {
  dynsec: Dynsec;
  close(): Promise<void>;
}

/**
 * Starts managing device clients at the broker: sets up roles at every connect, follows claims and unregisters,
 * and, with open enrolment and an enrolment password, enrols devices. Returns at once; `dynsec.ready` settles at
 * the first connect.
 */
export function startManagedBroker(opts: {
  config: BridgeConfig;
  store: CredentialStore;
  devices: DeviceService;
  password: string;
  ca?: Buffer | undefined;
  log: Logger;
  /** The bridge's clock: when a device enrolled. */
  now: () => number;
}): ManagedBroker {
  const { config, store, devices, log } = opts;
  const login = dynsecLogin(config);
  const m = config.mqtt;
  const enrolPassword =
    m.openEnrolment && m.enrolPasswordFile !== undefined
      ? readSecretFile(m.enrolPasswordFile, 'enrolment password')
      : undefined;
  const dynsec = new Dynsec(
    {
      url: login.url,
      username: login.username,
      password: opts.password,
      ca: opts.ca,
      clientId: `${m.clientId}-dynsec`,
      shareGroup: m.shareGroup,
      reconnect: true,
      log,
    },
    (d) => d.setup({ bridgeUsername: login.username, enrolUsername: m.enrolUsername, enrolPassword }),
  );

  // One request at a time: two requests for the same id must not both pass the "unknown" check.
  let queue: Promise<void> = Promise.resolve();
  // Requests reach the bridge through the broker, without the device's address: only the total is capped.
  const limits = new RateLimiter({ limit: m.enrolLimits.total, windowMs: m.enrolLimits.windowMs });
  const enrol = async (req: EnrolRequest): Promise<void> => {
    const { deviceId, secret } = req;
    if ((await store.secretHash(deviceId)) !== undefined) {
      log.warn({ event: 'dynsec.enrol_refused', deviceId, reason: 'known device' });
      return;
    }
    if (!limits.take('all').ok) {
      log.warn({ event: 'dynsec.enrol_refused', deviceId, reason: 'enrolment limit' });
      return;
    }
    if (!(await dynsec.createDevice(deviceId, secret))) {
      log.warn({ event: 'dynsec.enrol_refused', deviceId, reason: 'client exists' });
      return;
    }
    await store.enroll(deviceId, hashSecret(secret), opts.now());
    log.info({ event: 'dynsec.enrolled', deviceId });
  };
  if (enrolPassword !== undefined) {
    void dynsec
      .onEnrol((req) => {
        queue = queue
          .then(() => enrol(req))
          .catch((err: unknown) =>
            log.error({ event: 'dynsec.enrol_failed', deviceId: req.deviceId, err: (err as Error).message }),
          );
      })
      .catch(() => undefined);
  }

  // Decision: an unregistered device loses its broker access; a claim gives it back.
  const offRegistration = devices.onRegistration((deviceId, owned) => {
    dynsec.setEnabled(deviceId, owned).then(
      (found) =>
        log.info({ event: owned ? 'dynsec.enabled' : 'dynsec.disabled', deviceId, ...(found ? {} : { found }) }),
      (err: unknown) =>
        log.error({ event: 'dynsec.update_failed', deviceId, enable: owned, err: (err as Error).message }),
    );
  });

  return {
    dynsec,
    close: async () => {
      offRegistration();
      await queue;
      await dynsec.close();
    },
  };
}

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
}

/** A one-shot admin connection for a CLI command. */
async function adminConnection(config: BridgeConfig, log: Logger): Promise<Dynsec> {
  const login = dynsecLogin(config);
  const password = readSecretFile(login.passwordFile, 'MQTT password');
  const { ca } = readMqttTls({ caFile: config.mqtt.caFile });
  const d = new Dynsec({
    url: login.url,
    username: login.username,
    password,
    ca,
    clientId: `${config.mqtt.clientId}-cli-${randomBytes(4).toString('hex')}`,
    log,
  });
  try {
    await d.ready;
  } catch (err) {
    await d.close();
    throw err;
  }
  return d;
}

/**
 * `devcloud-bridge device provision [--count N] [--out DIR]`: makes N identities, registers their secrets'
 * hashes in the database and, with `mqtt.dynsec`, their broker clients, and writes one provisioning file per
 * device (`<DIR>/<id>.json`, mode 0600) in the format the agent reads at first start (agent/identity.ts).
 */
export async function provisionDevices(
  config: BridgeConfig,
  store: CredentialStore,
  args: { count: number; outDir: string; now: () => number },
  io: Io,
  log: Logger,
): Promise<number> {
  const dynsec = config.mqtt.dynsec ? await adminConnection(config, log) : undefined;
  try {
    for (let i = 0; i < args.count; i++) {
      const identity = {
        deviceId: randomUUID(),
        secret: randomBytes(32).toString('hex'),
        authcode: randomBytes(16).toString('hex'),
      };
      // The broker first, then the database, then the file: a file is written only for a device that works.
      if (dynsec && !(await dynsec.createDevice(identity.deviceId, identity.secret))) {
        throw new Error(`the broker has a client ${identity.deviceId} already`);
      }
      await store.enroll(identity.deviceId, hashSecret(identity.secret), args.now());
      const file = join(resolve(args.outDir), `${identity.deviceId}.json`);
      writeFileAtomic(file, `${JSON.stringify(identity, null, 2)}\n`, 0o600);
      io.out(file);
    }
    return 0;
  } finally {
    await dynsec?.close();
  }
}

/** `devcloud-bridge device enable|disable ID`: the device's broker client, by hand. */
export async function setDeviceEnabled(
  config: BridgeConfig,
  deviceId: string,
  enabled: boolean,
  io: Io,
  log: Logger,
): Promise<number> {
  if (!isDeviceId(deviceId)) {
    io.err(`devcloud-bridge: not a device id: ${deviceId}`);
    return 2;
  }
  if (!config.mqtt.dynsec) {
    io.err('devcloud-bridge: device enable and disable need mqtt.dynsec');
    return 2;
  }
  const dynsec = await adminConnection(config, log);
  try {
    if (!(await dynsec.setEnabled(deviceId, enabled))) {
      io.err(`devcloud-bridge: the broker has no client ${deviceId}`);
      return 1;
    }
    io.out(`${deviceId} ${enabled ? 'enabled' : 'disabled'}`);
    return 0;
  } finally {
    await dynsec.close();
  }
}
