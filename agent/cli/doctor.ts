/**
 * `devcloud-agent doctor`: checks what the agent needs on this gateway, one line each, `OK`, `WARN` (works, but
 * look at it) or `FAIL` with what to do. Run it as root or as the agent's user: it reads the identity and writes
 * a probe file in the state directory as the agent would.
 */
import { createPublicKey } from 'node:crypto';
import { createSocket } from 'node:dgram';
import {
  closeSync,
  existsSync,
  openSync,
  readFileSync,
  statSync,
  statfsSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import mqtt from 'mqtt';
import { z } from 'zod';
import { type AgentConfig, defaultConfigFile, clientSocketPath } from '../config.js';
import { Identity, identityPath } from '../identity.js';
import { MqttTlsFileError, type MqttTls, mqttClientOptions, readMqttTls } from '../../lib/mqtt-options.js';
import { safeUrl } from '../../lib/url.js';
import { socketDenied, tryConnect } from './status.js';

interface Out {
  out: (s: string) => void;
  err: (s: string) => void;
}

const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

export type CheckStatus = 'OK' | 'WARN' | 'FAIL';

export interface Check {
  status: CheckStatus;
  /** What was checked, and what was found. */
  what: string;
  /** For WARN and FAIL: what to do. */
  todo?: string;
}

/** No agent of this version was built before this day: a clock showing an earlier time has not been set. */
export const CLOCK_FLOOR = Date.UTC(2026, 0, 1);
/** Below this SQLite and the journal of a firmware job may fail to write. */
export const MIN_FREE_BYTES = 16 * 1024 ** 2;
/** Below this a firmware image (downloaded, then unpacked into a slot) is unlikely to fit. */
export const LOW_FREE_BYTES = 256 * 1024 ** 2;
/** The broker check gives up after this long, or after `mqtt.connectTimeoutMs` if that is shorter. */
const BROKER_TIMEOUT_MS = 10_000;

/** CONNACK return codes (MQTT 3.1.1: 4 and 5; MQTT 5: 134 and 135) that mean the login was refused. */
const REFUSED_LOGIN = new Set([4, 5, 134, 135]);
const UNREACHABLE = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT']);

export interface DoctorInput {
  config: AgentConfig | undefined;
  /** Flag and config problems found while loading. */
  problems: string[];
  flags: Record<string, unknown>;
  params: string[];
  env: NodeJS.ProcessEnv;
  json: boolean;
  io: Out;
}

function line(c: Check): string {
  return `${c.status.padEnd(4)} ${c.what}${c.todo ? `: ${c.todo}` : ''}`;
}

export async function doctorCommand(input: DoctorInput): Promise<number> {
  const { config, problems, flags, env, io, json } = input;
  if (input.params.length > 0) {
    io.err('devcloud-agent: doctor takes no arguments');
    return EXIT.usage;
  }
  const checks: Check[] = [];
  const report = (c: Check) => {
    checks.push(c);
    if (!json) io.out(line(c));
  };
  const file = typeof flags.configFile === 'string' ? flags.configFile : env.DEVCLOUD_CONFIG || defaultConfigFile(env);
  const source = file ? `config file ${file}` : 'no config file';
  if (problems.length > 0 || config === undefined) {
    for (const p of problems) report({ status: 'FAIL', what: 'config', todo: p });
    report({ status: 'FAIL', what: `config from ${source}`, todo: 'fix the problems above; the other checks need it' });
    if (json) io.out(JSON.stringify(checks, null, 2));
    return EXIT.usage;
  }
  report({ status: 'OK', what: `config valid (${source})` });
  for (const c of await runChecks(config, env)) report(c);
  if (json) io.out(JSON.stringify(checks, null, 2));
  return checks.some((c) => c.status === 'FAIL') ? EXIT.failed : EXIT.ok;
}

/** Every check after the config's, in order. */
export async function runChecks(config: AgentConfig, env: NodeJS.ProcessEnv): Promise<Check[]> {
  const out: Check[] = [];
  const status = await runningStatus(config, env);
  const denied = status === undefined && socketDenied(config, env);
  const socket = clientSocketPath(config, env);
  if (status) out.push({ status: 'OK', what: `agent running (answers on ${socket}, ${String(status.state)})` });
  else if (denied) {
    out.push({
      status: 'WARN',
      what: `may not connect to the agent's socket ${socket} (permission denied)`,
      todo: "run doctor as root or as the agent's user",
    });
  } else {
    out.push({
      status: 'WARN',
      what: `agent not running (nothing answers on ${socket})`,
      todo: 'systemctl start devcloud-agent; if it stops again, devcloud-agent logs --level warn',
    });
  }
  out.push(checkStateDir(config.stateDir));
  const id = checkIdentity(config);
  out.push(id.check);
  // Whether a running agent is connected is unknown here: a login with its client id could take its connection over.
  out.push(
    denied
      ? {
          status: 'WARN',
          what: 'broker: not checked, the agent may be running',
          todo: "run doctor as root or as the agent's user",
        }
      : await checkBroker(config, id.identity, status),
  );
  out.push(await checkUdp(config, status));
  out.push(checkClock(config.stateDir));
  const storage = checkStorage(status);
  if (storage) out.push(storage);
  out.push(...checkDisk(config));
  out.push(...checkFirmwareKeys(config));
  return out;
}

async function runningStatus(
  config: AgentConfig,
  env: NodeJS.ProcessEnv,
): Promise<Record<string, unknown> | undefined> {
  const client = await tryConnect(config, env);
  if (!client) return undefined;
  try {
    return await client.status();
  } catch {
    return undefined;
  } finally {
    client.close();
  }
}

function errCode(err: unknown): string {
  return (err as NodeJS.ErrnoException).code ?? (err as Error).message;
}

/** The path itself if it exists, else its nearest existing parent. */
function existingAncestor(path: string): string {
  let p = path;
  while (!existsSync(p) && dirname(p) !== p) p = dirname(p);
  return p;
}

export function checkStateDir(dir: string): Check {
  const own = "chown it to the agent's user, or let systemd's StateDirectory= make it";
  let st;
  try {
    st = statSync(dir);
  } catch (err) {
    const code = errCode(err);
    if (code === 'ENOTDIR') {
      return {
        status: 'FAIL',
        what: `state directory ${dir}: a part of the path is a file`,
        todo: 'set stateDir to a directory',
      };
    }
    if (code !== 'ENOENT') return { status: 'FAIL', what: `state directory ${dir}: ${code}`, todo: own };
    const parent = existingAncestor(dir);
    if (!statSync(parent).isDirectory()) {
      return {
        status: 'FAIL',
        what: `state directory ${dir}: ${parent} is a file`,
        todo: 'set stateDir to a directory',
      };
    }
    const probe = probeWrite(parent);
    return probe === undefined
      ? { status: 'WARN', what: `state directory ${dir} does not exist yet`, todo: 'the agent creates it at start' }
      : {
          status: 'FAIL',
          what: `state directory ${dir} does not exist and ${parent} is not writable (${probe})`,
          todo: own,
        };
  }
  if (!st.isDirectory()) {
    return {
      status: 'FAIL',
      what: `state directory ${dir} is not a directory`,
      todo: 'remove the file or set stateDir elsewhere',
    };
  }
  const probe = probeWrite(dir);
  if (probe !== undefined)
    return { status: 'FAIL', what: `state directory ${dir} is not writable (${probe})`, todo: own };
  const db = join(dir, 'agent.db');
  if (existsSync(db)) {
    try {
      closeSync(openSync(db, 'r+'));
    } catch (err) {
      return { status: 'FAIL', what: `database ${db} is not writable (${errCode(err)})`, todo: own };
    }
  }
  return { status: 'OK', what: `state directory ${dir} is writable` };
}

/** Creates and removes a file, as the agent's atomic writes do; the error code when that fails. */
function probeWrite(dir: string): string | undefined {
  const probe = join(dir, `.doctor-${process.pid}`);
  try {
    writeFileSync(probe, '');
    unlinkSync(probe);
    return undefined;
  } catch (err) {
    return errCode(err);
  }
}

function firstIssue(error: z.ZodError): string {
  const issue = error.issues[0];
  return issue && issue.path.length > 0 ? `${issue.path.join('.')}: ${issue.message}` : (issue?.message ?? 'invalid');
}

export function checkIdentity(config: AgentConfig): { check: Check; identity?: Identity } {
  const path = identityPath(config.stateDir);
  const read = (file: string, schema: z.ZodType<Identity>): { identity?: Identity; problem?: string } => {
    let raw: unknown;
    try {
      raw = JSON.parse(readFileSync(file, 'utf8'));
    } catch (err) {
      if (err instanceof SyntaxError) return { problem: 'not valid JSON' };
      return { problem: errCode(err) };
    }
    const parsed = schema.safeParse(raw);
    // The field, never the value: it may be the secret.
    return parsed.success ? { identity: parsed.data } : { problem: firstIssue(parsed.error) };
  };
  if (existsSync(path)) {
    const r = read(path, Identity);
    if (r.identity)
      return { check: { status: 'OK', what: `identity ${r.identity.deviceId} (${path})` }, identity: r.identity };
    const todo =
      r.problem === 'EACCES'
        ? "run doctor as root or as the agent's user"
        : 'restore it from a backup, or remove it to make this gateway a new device';
    return { check: { status: 'FAIL', what: `identity file ${path}: ${r.problem}`, todo } };
  }
  const prov = config.identity.provisioningFile;
  if (prov !== undefined) {
    // A provisioning file may carry more fields than the identity.
    const r = read(prov, z.object(Identity.shape));
    if (r.identity) {
      return {
        check: {
          status: 'OK',
          what: `identity ${r.identity.deviceId} from provisioning file ${prov} (read at first start)`,
        },
        identity: r.identity,
      };
    }
    return {
      check: {
        status: 'FAIL',
        what: `provisioning file ${prov}: ${r.problem}`,
        todo: 'copy the file devcloud-bridge made again',
      },
    };
  }
  return {
    check: {
      status: 'WARN',
      what: 'no identity yet',
      todo: 'the agent makes one at first start (open enrolment); the broker must allow it, else give a provisioning file (--provision FILE)',
    },
  };
}

type ConnectResult =
  | { kind: 'ok' }
  | { kind: 'error'; err: Error & { code?: string | number } }
  | { kind: 'closed'; err?: Error & { code?: string | number } }
  | { kind: 'timeout' };

export async function checkBroker(
  config: AgentConfig,
  identity: Identity | undefined,
  running: Record<string, unknown> | undefined,
): Promise<Check> {
  const url = safeUrl(config.mqtt.url);
  if (running?.state === 'connected') return { status: 'OK', what: `broker ${url}: the running agent is connected` };
  const username = config.mqtt.username ?? identity?.deviceId;
  const password = config.mqtt.password ?? identity?.secret;
  if (identity === undefined || username === undefined || password === undefined) {
    return {
      status: 'WARN',
      what: `broker ${url}: not checked, there is no identity to log in with yet`,
      todo: 'run doctor again after the agent has started once',
    };
  }
  const timeout = Math.min(BROKER_TIMEOUT_MS, config.mqtt.connectTimeoutMs);
  let tls: MqttTls;
  try {
    tls = readMqttTls(config.mqtt);
  } catch (err) {
    if (!(err instanceof MqttTlsFileError)) throw err;
    return {
      status: 'FAIL',
      what: `broker ${url}: cannot read mqtt.${err.key} ${err.file} (${err.code})`,
      todo: 'fix the path or the file',
    };
  }
  const opts = mqttClientOptions({
    // The device's own client id, as the agent logs in; the agent is not connected, so nothing is taken over.
    clientId: identity.deviceId,
    username,
    password,
    clean: true,
    // mqtt.js's default: the check ends long before a keepalive is due.
    keepaliveSec: 60,
    connectTimeoutMs: timeout,
    // One attempt: the check reports what it met.
    reconnectPeriodMs: 0,
    lean: false,
    tls,
    rejectUnauthorized: config.mqtt.rejectUnauthorized,
  });
  let client: mqtt.MqttClient;
  try {
    client = mqtt.connect(config.mqtt.url, opts);
  } catch (err) {
    return { status: 'FAIL', what: `broker ${url}: ${(err as Error).message}`, todo: 'fix mqtt.url' };
  }
  let streamErr: (Error & { code?: string }) | undefined;
  client.stream?.on('error', (err: Error & { code?: string }) => (streamErr ??= err));
  const r = await new Promise<ConnectResult>((resolve) => {
    const timer = setTimeout(() => resolve({ kind: 'timeout' }), timeout);
    const done = (v: ConnectResult) => {
      clearTimeout(timer);
      resolve(v);
    };
    client.once('connect', () => done({ kind: 'ok' }));
    client.once('error', (err) => done({ kind: 'error', err }));
    client.once('close', () => done({ kind: 'closed', ...(streamErr ? { err: streamErr } : {}) }));
  });
  client.removeAllListeners();
  client.on('error', () => undefined);
  await new Promise<void>((resolve) => client.end(true, {}, () => resolve()));
  return brokerCheck(url, r, timeout);
}

function brokerCheck(url: string, r: ConnectResult, timeout: number): Check {
  if (r.kind === 'ok') return { status: 'OK', what: `broker ${url} accepts the device's login` };
  if (r.kind === 'timeout') {
    return {
      status: 'FAIL',
      what: `broker ${url}: no answer within ${timeout / 1000} s`,
      todo: 'check the host, the port and the firewall; an mqtts:// port answers nothing to mqtt:// and the other way round',
    };
  }
  const err = r.err;
  if (err === undefined) {
    return {
      status: 'FAIL',
      what: `broker ${url} closed the connection without answering`,
      todo: 'check the port and whether the broker wants TLS (mqtts://)',
    };
  }
  const code = err.code;
  if (typeof code === 'number') {
    if (REFUSED_LOGIN.has(code)) {
      return {
        status: 'FAIL',
        what: `broker ${url} refused the login (${err.message})`,
        todo: 'the broker does not know this device or its secret: provision it (devcloud-bridge device provision) or fix mqtt.username/mqtt.password',
      };
    }
    return {
      status: 'FAIL',
      what: `broker ${url} refused the connection (${err.message})`,
      todo: 'look at the broker log',
    };
  }
  if (code !== undefined && UNREACHABLE.has(code)) {
    return {
      status: 'FAIL',
      what: `broker ${url} unreachable (${code})`,
      todo:
        code === 'ENOTFOUND' || code === 'EAI_AGAIN'
          ? 'check the host name and DNS'
          : 'check that the broker runs, the host, the port and the firewall',
    };
  }
  if (code !== undefined && (/CERT|SSL|TLS/.test(code) || code === 'EPROTO')) {
    return {
      status: 'FAIL',
      what: `broker ${url}: TLS failed (${code}: ${err.message})`,
      todo: 'check mqtt.caFile (the CA that signed the broker certificate), the host name in the URL, and the clock',
    };
  }
  return {
    status: 'FAIL',
    what: `broker ${url}: ${code ?? ''} ${err.message}`.replace('  ', ' '),
    todo: 'look at the broker log',
  };
}

export async function checkUdp(config: AgentConfig, running: Record<string, unknown> | undefined): Promise<Check> {
  const { port, enabled } = config.udp;
  if (!enabled) return { status: 'OK', what: 'nearby listener off (udp.enabled false): no UDP port needed' };
  if (port === 0) return { status: 'OK', what: 'UDP port 0: the agent picks a free port' };
  const nearby = running?.nearby as { listening?: boolean; port?: number | null } | undefined;
  if (nearby?.listening && nearby.port === port) {
    return { status: 'OK', what: `UDP port ${port} held by the running agent` };
  }
  const err = await new Promise<NodeJS.ErrnoException | undefined>((resolve) => {
    // As the agent binds it: IPv4, every address, no address reuse.
    const socket = createSocket({ type: 'udp4', reuseAddr: false });
    socket.once('error', (e: NodeJS.ErrnoException) => {
      socket.close();
      resolve(e);
    });
    socket.bind({ port, address: '0.0.0.0', exclusive: true }, () => socket.close(() => resolve(undefined)));
  });
  if (err === undefined) {
    return running
      ? {
          status: 'WARN',
          what: `UDP port ${port} is free but the running agent does not listen on it`,
          todo: `its mode is ${String(running.mode)}; in master mode, look for nearby.bind_failed in devcloud-agent logs`,
        }
      : { status: 'OK', what: `UDP port ${port} can be bound` };
  }
  if (err.code === 'EADDRINUSE') {
    return {
      status: 'FAIL',
      what: `UDP port ${port} is in use by another program`,
      todo: `find it with ss -ulpn 'sport = :${port}', stop it, or set udp.port`,
    };
  }
  if (err.code === 'EACCES' && process.getuid?.() !== 0) {
    return {
      status: 'WARN',
      what: `UDP port ${port} cannot be bound by this user`,
      todo: 'ports below 1024 need CAP_NET_BIND_SERVICE, which the systemd unit grants; run doctor as root to check the port',
    };
  }
  return {
    status: 'FAIL',
    what: `UDP port ${port} cannot be bound (${err.code ?? err.message})`,
    todo: 'set udp.port',
  };
}

export function checkClock(stateDir: string, now = Date.now()): Check {
  const iso = new Date(now).toISOString();
  if (now < CLOCK_FLOOR) {
    return {
      status: 'FAIL',
      what: `clock says ${iso}, before this agent was built`,
      todo: 'set the time (timedatectl; enable NTP): TLS certificates and stamps depend on it',
    };
  }
  try {
    const written = statSync(join(stateDir, 'agent.db')).mtimeMs;
    // A day of slack: a gateway without a battery-backed clock may be off until NTP answers.
    if (written > now + 86_400_000) {
      return {
        status: 'WARN',
        what: `clock says ${iso}, earlier than the database's last write (${new Date(written).toISOString()})`,
        todo: 'check the time (timedatectl); the clock went back',
      };
    }
  } catch {
    // no database yet: nothing to compare with
  }
  return { status: 'OK', what: `clock ${iso}` };
}

/**
 * Whether the running agent's writes fail for lack of space (its `status`): the free-space check below sees
 * only how much is free now, not that the agent's last change was refused.
 */
export function checkStorage(running: Record<string, unknown> | undefined, now = Date.now()): Check | undefined {
  const storage = running?.storage as { full?: boolean; fullSince?: number | null; refused?: number } | undefined;
  if (storage === undefined) return undefined;
  if (storage.full) {
    const since =
      typeof storage.fullSince === 'number' ? `, for ${Math.round((now - storage.fullSince) / 1000)} s` : '';
    return {
      status: 'FAIL',
      what: `storage full: the agent's writes fail for lack of space${since}; changes answer storage-full, reads work`,
      todo: 'free space in the state directory; the agent writes again by itself, no restart needed',
    };
  }
  return { status: 'OK', what: "storage: the agent's last writes succeeded" };
}

function megabytes(n: number): string {
  return n >= 1024 ** 3 ? `${(n / 1024 ** 3).toFixed(1)} GB` : `${Math.floor(n / 1024 ** 2)} MB`;
}

export function checkDisk(config: AgentConfig): Check[] {
  const paths = [config.stateDir];
  if (config.firmware.installer === 'slots' && config.firmware.slotsDir !== undefined)
    paths.push(config.firmware.slotsDir);
  const out: Check[] = [];
  for (const p of paths) {
    const where = existingAncestor(p);
    let free: number;
    try {
      const s = statfsSync(where);
      free = s.bavail * s.bsize;
    } catch (err) {
      out.push({ status: 'WARN', what: `disk space of ${p} unknown (${errCode(err)})` });
      continue;
    }
    const what = `disk: ${megabytes(free)} free for ${p}`;
    if (free < MIN_FREE_BYTES) out.push({ status: 'FAIL', what, todo: 'free space: the database cannot grow' });
    else if (free < LOW_FREE_BYTES) {
      out.push({ status: 'WARN', what, todo: `a firmware image may not fit; keep ${megabytes(LOW_FREE_BYTES)} free` });
    } else out.push({ status: 'OK', what });
  }
  return out;
}

export function checkFirmwareKeys(config: AgentConfig): Check[] {
  const keys = config.firmware.publicKeys;
  if (keys.length === 0) {
    return [
      {
        status: 'WARN',
        what: 'no firmware public keys (firmware.publicKeys)',
        todo: 'every firmware update will fail; add the public key your images are signed with, if updates are used',
      },
    ];
  }
  return keys.map((file): Check => {
    try {
      const key = createPublicKey(readFileSync(file));
      if (key.asymmetricKeyType !== 'ed25519') {
        return {
          status: 'FAIL',
          what: `firmware key ${file} is ${key.asymmetricKeyType ?? 'not'} an Ed25519 key`,
          todo: 'use the Ed25519 public key (PEM)',
        };
      }
      return { status: 'OK', what: `firmware key ${file} readable (Ed25519)` };
    } catch (err) {
      return {
        status: 'FAIL',
        what: `firmware key ${file}: ${errCode(err)}`,
        todo: 'fix the path or the permissions; it must be a PEM public key',
      };
    }
  });
}
