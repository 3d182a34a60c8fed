/**
 * Real brokers for integration tests: aedes in-process on a port the OS picks, and a private Mosquitto on a
 * free port with a config written for the test. Never the machine's own broker, never a fixed port.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket, connect as netConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Aedes } from 'aedes';
import type { MqttClient } from 'mqtt';
import { encode, messageId } from '../../protocol/index.js';
import { missing, which } from './system.js';

export interface TestBroker {
  kind: 'aedes' | 'mosquitto';
  url: string;
  port: number;
  /** Stops the broker (connections drop); `start()` brings it back on the same port. */
  stop(): Promise<void>;
  start(): Promise<void>;
  close(): Promise<void>;
  /** The broker's process id when it runs in a process of its own (Mosquitto). */
  pid?(): number | undefined;
}

export type BrokerKind = TestBroker['kind'];

/**
 * The brokers a suite runs against, for `describe.each`: aedes and Mosquitto, or aedes alone where Mosquitto is not
 * installed (one line says so; under `CI=true` the file fails: test/support/system.ts).
 */
export function brokerKinds(): BrokerKind[] {
  return missing('mosquitto') ? ['aedes'] : ['aedes', 'mosquitto'];
}

export function startBroker(kind: BrokerKind): Promise<TestBroker> {
  return kind === 'aedes' ? startAedes() : startMosquitto();
}

/** A TCP port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return port;
}

export async function startAedes(): Promise<TestBroker> {
  let aedes: Aedes | undefined;
  let server: Server | undefined;
  let port = 0;
  const sockets = new Set<Socket>();
  const start = async () => {
    aedes = await Aedes.createBroker();
    const broker = aedes;
    server = createServer((socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      broker.handle(socket);
    });
    const srv = server;
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(port, '127.0.0.1', () => resolve());
    });
    port = (srv.address() as { port: number }).port;
  };
  const stop = async () => {
    const srv = server;
    const broker = aedes;
    server = undefined;
    aedes = undefined;
    for (const s of sockets) s.destroy();
    if (srv) await new Promise<void>((resolve) => srv.close(() => resolve()));
    if (broker) await new Promise<void>((resolve) => broker.close(() => resolve()));
  };
  await start();
  return {
    kind: 'aedes',
    get url() {
      return `mqtt://127.0.0.1:${port}`;
    },
    get port() {
      return port;
    },
    stop,
    start,
    close: stop,
  };
}

/** A private Mosquitto that lets anyone in; `lines` are added to its config. */
export async function startMosquitto(lines: readonly string[] = []): Promise<TestBroker> {
  const dir = mkdtempSync(join(tmpdir(), 'devcloud-mosq-'));
  const port = await freePort();
  const conf = join(dir, 'mosquitto.conf');
  writeFileSync(conf, mosquittoConf(port, ['allow_anonymous true', ...lines]));
  return { kind: 'mosquitto', ...(await runMosquitto(dir, conf, port)) };
}

/** Whether something accepts TCP connections on the port (a broker that has started). */
export function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = netConnect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/** One MQTT login in a private Mosquitto's password file. */
export interface MqttLogin {
  username: string;
  password: string;
}

export interface SecureMosquittoOptions {
  /** Devices log in with their uuid as username and their secret as password (docs/decisions.md §5). */
  devices: ReadonlyArray<{ id: string; secret: string }>;
  /** The bridge's login: it may read and write every device topic. */
  bridge: MqttLogin;
}

export interface SecureMosquitto extends TestBroker {
  kind: 'mosquitto';
  /** A file holding the bridge's password, for the bridge's `mqtt.passwordFile`. */
  bridgePasswordFile: string;
}

/**
 * A private Mosquitto as production runs it (docs/decisions.md §4 and §5): no anonymous clients, a password per
 * device and for the bridge (made with `mosquitto_passwd`), and ACL patterns on the username, so that a device
 * publishes only under its own `up/` and `state` and receives only its own `down/`.
 *
 * Mosquitto 2.0 refuses a publish the ACL denies without telling an MQTT 3.1.1 client (the PUBACK looks
 * normal; the message goes nowhere), and accepts a subscription the ACL denies but delivers nothing on it:
 * `read` is checked for each message sent to the client.
 */
export async function startSecureMosquitto(opts: SecureMosquittoOptions): Promise<SecureMosquitto> {
  const dir = mkdtempSync(join(tmpdir(), 'devcloud-mosq-secure-'));
  // Started as root, Mosquitto drops to its own user before it reads the password and ACL files.
  chmodSync(dir, 0o755);
  const port = await freePort();
  const passwordFile = join(dir, 'passwords');
  const aclFile = join(dir, 'acl');
  const bridgePasswordFile = join(dir, 'bridge-password');
  const conf = join(dir, 'mosquitto.conf');
  writeFileSync(passwordFile, '', { mode: 0o644 });
  const addLogin = (username: string, password: string) =>
    execFileSync(which('mosquitto_passwd') ?? 'mosquitto_passwd', ['-b', passwordFile, username, password], {
      stdio: 'pipe',
    });
  addLogin(opts.bridge.username, opts.bridge.password);
  for (const d of opts.devices) addLogin(d.id, d.secret);
  writeFileSync(bridgePasswordFile, `${opts.bridge.password}\n`, { mode: 0o600 });
  writeFileSync(
    aclFile,
    [
      // Pattern lines apply to every user, %u being the username: each device its own topics.
      'pattern write dc/v1/%u/up/#',
      'pattern write dc/v1/%u/state',
      'pattern read dc/v1/%u/down/#',
      `user ${opts.bridge.username}`,
      'topic readwrite dc/v1/#',
      '',
    ].join('\n'),
    { mode: 0o644 },
  );
  writeFileSync(
    conf,
    mosquittoConf(port, ['allow_anonymous false', `password_file ${passwordFile}`, `acl_file ${aclFile}`]),
  );
  return { kind: 'mosquitto', ...(await runMosquitto(dir, conf, port)), bridgePasswordFile };
}

export interface DynsecMosquitto extends TestBroker {
  kind: 'mosquitto';
  /** The plugin's admin, made with `mosquitto_ctrl dynsec init`. */
  admin: MqttLogin;
}

/** Mosquitto's dynamic security plugin, where Debian's package puts it on this machine's architecture. */
function dynsecPlugin(): string {
  const listed = execFileSync('dpkg', ['-L', 'mosquitto'], { encoding: 'utf8' });
  const path = listed.split('\n').find((l) => l.endsWith('/mosquitto_dynamic_security.so'));
  if (!path) throw new Error('the mosquitto package has no mosquitto_dynamic_security.so');
  return path;
}

/**
 * A private Mosquitto with the dynamic security plugin and no anonymous clients: every login and ACL is the
 * plugin's, `admin` its admin (`mosquitto_ctrl dynsec init`), as in production but without TLS (the production
 * config itself runs in test/bridge/mosquitto-dynsec.test.ts). Needs `mosquitto`, `mosquitto_ctrl` and `dpkg`.
 */
export async function startDynsecMosquitto(admin: MqttLogin): Promise<DynsecMosquitto> {
  const dir = mkdtempSync(join(tmpdir(), 'devcloud-mosq-dynsec-'));
  const port = await freePort();
  const file = join(dir, 'dynamic-security.json');
  execFileSync(which('mosquitto_ctrl') ?? 'mosquitto_ctrl', ['dynsec', 'init', file, admin.username, admin.password], {
    stdio: 'pipe',
  });
  const conf = join(dir, 'mosquitto.conf');
  writeFileSync(
    conf,
    mosquittoConf(port, [
      'per_listener_settings false',
      'allow_anonymous false',
      `plugin ${dynsecPlugin()}`,
      `plugin_opt_config_file ${file}`,
    ]),
  );
  // Started as root, Mosquitto drops to its own user, which must write the plugin's file.
  if (process.getuid?.() === 0) execFileSync('chown', ['-R', 'mosquitto:', dir]);
  else chmodSync(dir, 0o755);
  return { kind: 'mosquitto', ...(await runMosquitto(dir, conf, port)), admin };
}

/** A Mosquitto config: a listener on 127.0.0.1, no persistence, errors only, and the given lines. */
function mosquittoConf(port: number, lines: string[]): string {
  return [
    `listener ${port} 127.0.0.1`,
    ...lines,
    'persistence false',
    'log_dest stderr',
    'log_type error',
    'max_inflight_messages 0',
    'max_queued_messages 100000',
    '',
  ].join('\n');
}

/** Runs `mosquitto -c conf` until it listens on `port`; stop kills it, start runs it again, close also removes `dir`. */
async function runMosquitto(dir: string, conf: string, port: number): Promise<Omit<TestBroker, 'kind'>> {
  let proc: ChildProcess | undefined;
  const start = async () => {
    // Debian puts it in /usr/sbin, which another user's PATH may lack.
    const child = spawn(which('mosquitto') ?? 'mosquitto', ['-c', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
    proc = child;
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const deadline = Date.now() + 10_000;
    while (!(await canConnect(port))) {
      if (child.exitCode !== null) throw new Error(`mosquitto exited: ${stderr}`);
      if (Date.now() > deadline) throw new Error(`mosquitto did not listen on ${port}: ${stderr}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  };
  const stop = async () => {
    const child = proc;
    proc = undefined;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGKILL');
    await exited;
  };
  await start();
  return {
    url: `mqtt://127.0.0.1:${port}`,
    port,
    pid: () => proc?.pid,
    stop,
    start,
    close: async () => {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Ends an MQTT client at once, without waiting for anything in flight. */
export function endClient(client: MqttClient): Promise<void> {
  return new Promise((resolve) => client.end(true, {}, () => resolve()));
}

/** A `d` variable as a device reports it on `up/vars`. */
export function upVars(name: string, value: string): Buffer {
  return encode('up/vars', {
    id: messageId(),
    items: [{ kind: 'push', type: 'd', name, value, time: Date.now(), origin: 'device' }],
  });
}
