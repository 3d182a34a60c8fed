/**
 * The options of every MQTT client devcloud makes, built in one place: the agent's uplink and its enrolment
 * request (agent/uplink.ts), `devcloud-agent doctor`'s broker check (agent/cli/doctor.ts), the bridge's link to an
 * external broker (bridge/devices/link.ts) and its dynamic security admin connection (bridge/mqtt/dynsec.ts, with
 * bridge/mqtt/manage.ts). Each caller states what differs between them (session, keepalive, timeouts, reconnects,
 * TLS); nothing is left to mqtt.js's defaults by accident. The contract for the agent's connection is
 * docs/protocol.md, "Connecting"; for the bridge's, docs/protocol.md, "The cloud side".
 */
import { readFileSync } from 'node:fs';
import type { IClientOptions } from 'mqtt';

/** The config keys that name a TLS file (`mqtt.caFile`, `mqtt.certFile`, `mqtt.keyFile`, on both sides). */
export type MqttTlsFileKey = 'caFile' | 'certFile' | 'keyFile';

const WHAT: { readonly [K in MqttTlsFileKey]: string } = {
  caFile: 'CA',
  certFile: 'client certificate',
  keyFile: 'client key',
};

/**
 * A TLS file that cannot be read. The message names it (`cannot read the MQTT CA file: ENOENT: …`); `key`, `file`
 * and `code` (the file system's code, such as `ENOENT`, else the reason) let a caller say it its own way.
 */
export class MqttTlsFileError extends Error {
  override name = 'MqttTlsFileError';
  readonly code: string;

  constructor(
    readonly key: MqttTlsFileKey,
    readonly file: string,
    cause: unknown,
  ) {
    const reason = cause instanceof Error ? cause.message : String(cause);
    super(`cannot read the MQTT ${WHAT[key]} file: ${reason}`, { cause });
    this.code = (cause as NodeJS.ErrnoException | undefined)?.code ?? reason;
  }
}

export interface MqttTlsFiles {
  caFile?: string | undefined;
  certFile?: string | undefined;
  keyFile?: string | undefined;
}

/** What TLS uses of those files (PEM): the CA that signed the broker's certificate, a client certificate and key. */
export interface MqttTls {
  ca?: Buffer | undefined;
  cert?: Buffer | undefined;
  key?: Buffer | undefined;
}

/**
 * Reads the TLS files that are named, in the order CA, certificate, key; throws {@link MqttTlsFileError} for the
 * first that cannot be read. An empty name is no file, as the agent has always taken it. Read at each call, so
 * that a connection made after a certificate rotation uses the new files.
 */
export function readMqttTls(files: MqttTlsFiles): MqttTls {
  const tls: MqttTls = {};
  for (const [key, field] of [
    ['caFile', 'ca'],
    ['certFile', 'cert'],
    ['keyFile', 'key'],
  ] as const) {
    const file = files[key];
    if (file === undefined || file === '') continue;
    try {
      tls[field] = readFileSync(file);
    } catch (err) {
      throw new MqttTlsFileError(key, file, err);
    }
  }
  return tls;
}

/** What one client is. Required fields are the ones the callers differ in: each says its own. */
export interface MqttClientSpec {
  clientId: string;
  username?: string | undefined;
  password?: string | undefined;
  /** `true`: a clean session; `false`: persistent, the broker keeps QoS 1 messages for the client while it is away. */
  clean: boolean;
  /** The MQTT version; mqtt.js's default (3.1.1, `4`) when left out. */
  protocolVersion?: 4 | 5 | undefined;
  /**
   * MQTT 5 only: how long the broker keeps a persistent session after the connection ends, seconds (MQTT 5 ends it
   * at once when this is left out; MQTT 3.1.1 has no such limit).
   */
  sessionExpirySec?: number | undefined;
  keepaliveSec: number;
  connectTimeoutMs: number;
  /** How long mqtt.js waits before it reconnects by itself; `0`: never (the caller reconnects itself, or gives up). */
  reconnectPeriodMs: number;
  /** Whether mqtt.js subscribes again after a reconnect of its own; mqtt.js's default (yes) when left out. */
  resubscribe?: boolean | undefined;
  /**
   * A long-lived connection that carries much: QoS 0 messages are not queued while it is down (whoever sends them
   * has them in a store, or they are `state`, which only matters as the latest value), and mqtt-packet's write
   * cache is off (it builds a table of 65,536 two-byte buffers, about 7 MB of heap, on the first write).
   */
  lean: boolean;
  /** The last will (the agent's retained `state` `offline`). */
  will?: IClientOptions['will'] | undefined;
  /** From {@link readMqttTls}; what is missing is not set. */
  tls?: MqttTls | undefined;
  /** Whether the broker's certificate must be valid; node's default (yes) when left out. */
  rejectUnauthorized?: boolean | undefined;
}

/** The mqtt.js options of one client: exactly what the spec says, and nothing it leaves out. */
export function mqttClientOptions(spec: MqttClientSpec): IClientOptions {
  const options: IClientOptions = {
    clientId: spec.clientId,
    clean: spec.clean,
    keepalive: spec.keepaliveSec,
    connectTimeout: spec.connectTimeoutMs,
    reconnectPeriod: spec.reconnectPeriodMs,
  };
  if (spec.protocolVersion !== undefined) options.protocolVersion = spec.protocolVersion;
  if (spec.sessionExpirySec !== undefined) {
    if (spec.protocolVersion !== 5) throw new TypeError('a session expiry needs MQTT 5');
    options.properties = { sessionExpiryInterval: spec.sessionExpirySec };
  }
  if (spec.username !== undefined) options.username = spec.username;
  if (spec.password !== undefined) options.password = spec.password;
  if (spec.resubscribe !== undefined) options.resubscribe = spec.resubscribe;
  if (spec.lean) {
    options.queueQoSZero = false;
    options.writeCache = false;
  }
  if (spec.will !== undefined) options.will = spec.will;
  if (spec.tls?.ca !== undefined) options.ca = spec.tls.ca;
  if (spec.tls?.cert !== undefined) options.cert = spec.tls.cert;
  if (spec.tls?.key !== undefined) options.key = spec.tls.key;
  if (spec.rejectUnauthorized !== undefined) options.rejectUnauthorized = spec.rejectUnauthorized;
  return options;
}
