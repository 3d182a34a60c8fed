/**
 * Mosquitto as production runs it (config/mosquitto/devcloud.conf): TLS with a CA made here, no anonymous
 * clients, the dynamic security plugin from the Debian package, its file made with `mosquitto_ctrl dynsec init`,
 * and the bridge (`mqtt.dynsec`) managing one client per device. Provisioning through the CLI, a provisioned
 * agent end to end over TLS, isolation of one device from another, disabled devices, the bridge's credential
 * and client id out of a device's reach, and enrolment through the narrow enrolment credential.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, existsSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import mqtt, { type IClientOptions, type MqttClient } from 'mqtt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hashSecret } from '../../bridge/broker.js';
import { runCli } from '../../bridge/cli.js';
import { ENROL_TOPIC } from '../../bridge/mqtt/dynsec.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { encode, messageId, topicFor } from '../../protocol/index.js';
import { ROOT, type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { canConnect, endClient, freePort, upVars } from '../support/brokers.js';
import { missing, which } from '../support/system.js';
import { until } from '../support/wait.js';

const BRIDGE_USER = 'devcloud-bridge';
const ENROL_USER = 'devcloud-enrol';

/** The plugin as the Debian package installs it, whichever the architecture. */
function dynsecPlugin(): string {
  const listed = execFileSync('dpkg', ['-L', 'mosquitto'], { encoding: 'utf8' });
  const path = listed.split('\n').find((l) => l.endsWith('/mosquitto_dynamic_security.so'));
  if (!path) throw new Error('the mosquitto package has no mosquitto_dynamic_security.so');
  return path;
}

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: 'pipe' });
}

/** A CA and a server certificate for 127.0.0.1 signed by it, as docs/operations.md makes them. */
function makeCertificates(dir: string): { ca: string; cert: string; key: string } {
  const ca = join(dir, 'ca.crt');
  const caKey = join(dir, 'ca.key');
  const key = join(dir, 'server.key');
  const csr = join(dir, 'server.csr');
  const cert = join(dir, 'server.crt');
  const ext = join(dir, 'server.ext');
  openssl(['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', caKey]);
  openssl([
    'req',
    '-x509',
    '-new',
    '-key',
    caKey,
    '-sha256',
    '-days',
    '2',
    '-subj',
    '/CN=devcloud test CA',
    '-out',
    ca,
  ]);
  openssl(['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', key]);
  openssl(['req', '-new', '-key', key, '-subj', '/CN=127.0.0.1', '-out', csr]);
  writeFileSync(ext, 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  openssl([
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    ca,
    '-CAkey',
    caKey,
    '-CAcreateserial',
    '-days',
    '2',
    '-sha256',
    '-extfile',
    ext,
    '-out',
    cert,
  ]);
  return { ca, cert, key };
}

/**
 * The shipped config with this test's port and files: every other line as it is. The listener binds 127.0.0.1
 * only, and logs go to stderr.
 */
function testConfig(dir: string, port: number): string {
  const text = readFileSync(join(ROOT, 'config/mosquitto/devcloud.conf'), 'utf8');
  const lines = text.split('\n').map((line) => {
    if (/^listener 8883$/.test(line)) return `listener ${port} 127.0.0.1`;
    if (line.startsWith('plugin ')) return `plugin ${dynsecPlugin()}`;
    if (line.startsWith('log_dest ')) return 'log_dest stderr';
    if (line.startsWith('pid_file ')) return '';
    return line.replaceAll('/etc/mosquitto/certs/devcloud/', `${dir}/`).replaceAll('/var/lib/mosquitto/', `${dir}/`);
  });
  expect(lines.filter((l) => !l.startsWith('#') && /\/(etc|var)\//.test(l))).toEqual([]);
  return lines.join('\n');
}

interface Broker {
  url: string;
  ca: Buffer;
  caFile: string;
  passwordFile: string;
  enrolPassword: string;
  enrolPasswordFile: string;
  close(): Promise<void>;
}

async function startProductionMosquitto(): Promise<Broker> {
  const dir = tempDir('devcloud-mosq-dynsec-');
  const port = await freePort();
  const certs = makeCertificates(dir);
  const password = randomBytes(24).toString('hex');
  const passwordFile = join(dir, 'bridge-password');
  writeFileSync(passwordFile, `${password}\n`, { mode: 0o600 });
  const enrolPassword = randomBytes(24).toString('hex');
  const enrolPasswordFile = join(dir, 'enrol-password');
  writeFileSync(enrolPasswordFile, `${enrolPassword}\n`, { mode: 0o600 });
  execFileSync('mosquitto_ctrl', ['dynsec', 'init', join(dir, 'dynamic-security.json'), BRIDGE_USER, password], {
    stdio: 'pipe',
  });
  const conf = join(dir, 'mosquitto.conf');
  writeFileSync(conf, testConfig(dir, port));
  // Started as root, Mosquitto runs as its own user, as the installed service does: it must read the
  // certificates and write the plugin's file and its persistence.
  if (process.getuid?.() === 0) execFileSync('chown', ['-R', 'mosquitto:', dir]);
  else chmodSync(dir, 0o755);
  const proc: ChildProcess = spawn(which('mosquitto')!, ['-c', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  await until(async () => {
    if (proc.exitCode !== null) throw new Error(`mosquitto exited: ${stderr}`);
    return canConnect(port);
  }, `mosquitto on ${port}`);
  return {
    url: `mqtts://127.0.0.1:${port}`,
    ca: readFileSync(certs.ca),
    caFile: certs.ca,
    passwordFile,
    enrolPassword,
    enrolPasswordFile,
    close: async () => {
      if (proc.exitCode === null) {
        const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
        proc.kill('SIGKILL');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A raw MQTT 3.1.1 client over TLS, connected, that never reconnects by itself. */
function rawClient(broker: Broker, options: IClientOptions): Promise<MqttClient> {
  const client = mqtt.connect(broker.url, { reconnectPeriod: 0, connectTimeout: 5000, ca: broker.ca, ...options });
  return new Promise((resolve, reject) => {
    client.once('connect', () => resolve(client));
    client.once('error', (err) => {
      client.end(true);
      reject(err);
    });
    client.once('close', () => reject(new Error('connection closed')));
  });
}

interface Provisioned {
  deviceId: string;
  secret: string;
  authcode: string;
}

const noMosquitto = missing('mosquitto', 'mosquitto_ctrl', 'openssl', 'dpkg');

describe.skipIf(noMosquitto)('Mosquitto with TLS and dynamic security, managed by the bridge', () => {
  let broker: Broker;
  let bridge: LiveBridge;
  let provisionDir: string;
  const cleanups: Array<() => Promise<void>> = [];

  beforeAll(async () => {
    broker = await startProductionMosquitto();
    bridge = await startLiveBridge({
      config: {
        mqtt: {
          url: broker.url,
          username: BRIDGE_USER,
          passwordFile: broker.passwordFile,
          caFile: broker.caFile,
          dynsec: true,
          openEnrolment: true,
          enrolPasswordFile: broker.enrolPasswordFile,
        },
      },
    });
    await bridge.bridge.managed!.dynsec.ready;
    await until(() => bridge.bridge.link.connected, 'the bridge linked to mosquitto');
    provisionDir = tempDir('devcloud-provision-');
  }, 60_000);

  afterAll(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
    await bridge?.close();
    await broker?.close();
    if (provisionDir) rmSync(provisionDir, { recursive: true, force: true });
  });

  /** `devcloud-bridge device provision` against the running bridge's database and broker. */
  async function provision(count: number): Promise<Provisioned[]> {
    const out: string[] = [];
    const err: string[] = [];
    const code = await runCli(
      [
        'device',
        'provision',
        '--count',
        String(count),
        '--out',
        provisionDir,
        '--data-dir',
        bridge.dataDir,
        '--mqtt-url',
        broker.url,
        '--mqtt-username',
        BRIDGE_USER,
        '--mqtt-password-file',
        broker.passwordFile,
        '--mqtt-ca',
        broker.caFile,
        '--mqtt-dynsec',
        'true',
        '--log-level',
        'warn',
      ],
      { out: (s) => out.push(s), err: (s) => err.push(s) },
      { CONFIGURATION_DIRECTORY: '/nonexistent' },
    );
    expect([code, err]).toEqual([0, []]);
    expect(out).toHaveLength(count);
    return out.map((file) => {
      expect(statSync(file).mode & 0o777).toBe(0o600);
      return JSON.parse(readFileSync(file, 'utf8')) as Provisioned;
    });
  }

  function login(d: Provisioned, extra: IClientOptions = {}): IClientOptions {
    return { clientId: d.deviceId, username: d.deviceId, password: d.secret, ...extra };
  }

  async function getVar(http: HttpClient, deviceId: string, name: string): Promise<{ value?: string } | undefined> {
    const r = await http.get(`/0/devices/${deviceId}/d/${name}`);
    return r.status === 200 ? (JSON.parse(r.body) as { value?: string }) : undefined;
  }

  async function owner(d: Provisioned): Promise<HttpClient> {
    const http = bridge.client();
    const r = await http.post('/0/session/signup', {
      form: { login: `${randomUUID()}@example.com`, password: 'correct horse battery' },
    });
    expect(r.status).toBe(201);
    // The bridge learns the device's auth code from its hello.
    await until(async () => (await http.post('/0/devices/', { form: { auth: d.authcode } })).status === 201, 'claim');
    return http;
  }

  it('a provisioned agent connects over TLS and syncs a variable both ways', async () => {
    const [id] = await provision(1);
    expect(await bridge.bridge.store.credentials.secretHash(id!.deviceId)).toMatch(/^[0-9a-f]{64}$/);
    const agent: TestAgent = await startAgent({
      mqttUrl: broker.url,
      flags: {
        'identity.provisioningFile': join(provisionDir, `${id!.deviceId}.json`),
        'mqtt.caFile': broker.caFile,
      },
    });
    cleanups.push(async () => {
      await agent.stop();
      rmSync(agent.config.stateDir, { recursive: true, force: true });
    });
    expect(agent.agent.identity).toEqual(id);
    const http = await owner(id!);
    expect((await http.post(`/0/devices/${id!.deviceId}/d/led`, { form: { value: 'on' } })).body).toBe('device-ok');
    const local = await agent.client();
    await until(async () => (await local.get('d', 'led').catch(() => undefined))?.value === 'on', 'led on the agent');
    await local.set('d', 'temp', '21.5');
    await until(async () => (await getVar(http, id!.deviceId, 'temp'))?.value === '21.5', 'temp through the API');
    local.close();
  });

  it("a device's publish to another device's topics never arrives, nor does another's down/ reach it", async () => {
    const [a, b] = (await provision(2)) as [Provisioned, Provisioned];
    const store = bridge.bridge.store;
    const probe = await rawClient(broker, login(a));
    cleanups.push(() => endClient(probe));
    const received: string[] = [];
    probe.on('message', (topic) => received.push(topic));
    // The plugin refuses the subscription to B's down/ (granted 128), and grants A's own.
    const refused = await probe.subscribeAsync(`dc/v1/${b.deviceId}/down/#`, { qos: 1 }).catch(() => [{ qos: 128 }]);
    expect(refused.map((g) => g.qos)).toEqual([128]);
    expect((await probe.subscribeAsync(`dc/v1/${a.deviceId}/down/#`, { qos: 1 })).map((g) => g.qos)).toEqual([1]);

    await probe.publishAsync(topicFor(b.deviceId, 'up/vars'), upVars('intruder', 'x'), { qos: 1 });
    await probe.publishAsync(topicFor(b.deviceId, 'state'), encode('state', 'online'), { qos: 1 });
    await probe.publishAsync(`dc/v1/${b.deviceId}/down/vars`, upVars('intruder', 'x'), { qos: 1 });
    // A's own publish after them: once it has arrived, so would they have.
    await probe.publishAsync(topicFor(a.deviceId, 'up/vars'), upVars('probe', 'mine'), { qos: 1 });
    await until(() => store.devices.getVar(a.deviceId, 'd', 'probe'), "A's own publish");
    expect(await store.devices.getVar(b.deviceId, 'd', 'intruder')).toBeUndefined();
    expect(await store.devices.getVar(b.deviceId, 'meta', 'state')).toBeUndefined();

    // B's own login sees its down/, and nothing A sent there.
    const asB = await rawClient(broker, login(b));
    cleanups.push(() => endClient(asB));
    const bGot: string[] = [];
    asB.on('message', (topic) => bGot.push(topic));
    await asB.subscribeAsync(`dc/v1/${b.deviceId}/down/#`, { qos: 1 });
    expect(bridge.bridge.link.publish(b.deviceId, 'down/vars', { id: messageId(), items: [] })).toBe(true);
    await until(() => bGot.length > 0, "the bridge's publish to B");
    expect(bridge.bridge.link.publish(a.deviceId, 'down/vars', { id: messageId(), items: [] })).toBe(true);
    await until(() => received.includes(topicFor(a.deviceId, 'down/vars')), "the bridge's publish to A");
    expect(received.filter((t) => t.includes(b.deviceId))).toEqual([]);

    // Another device's secret, a wrong one, none: not let in.
    for (const bad of [
      { clientId: b.deviceId, username: b.deviceId, password: a.secret },
      { clientId: a.deviceId, username: a.deviceId, password: 'not-the-secret' },
      { clientId: `probe-${randomUUID()}` },
    ]) {
      await expect(rawClient(broker, bad)).rejects.toThrow();
    }
  });

  it('an unregistered device is disabled: it is disconnected and cannot connect until it is claimed again', async () => {
    const [d] = (await provision(1)) as [Provisioned];
    const conn = await rawClient(broker, login(d));
    const closed = new Promise<void>((resolve) => conn.once('close', () => resolve()));
    await conn.publishAsync(topicFor(d.deviceId, 'up/hello'), helloOf(d), { qos: 1 });
    const http = await owner(d);
    expect((await http.request('DELETE', `/0/devices/${d.deviceId}`)).body).toBe('device-ok');
    await closed;
    await endClient(conn);
    await expect(rawClient(broker, login(d))).rejects.toThrow(/Not authorized|Bad username|refused/i);

    // Claimed again (by its auth code, which the bridge still knows), it may connect again.
    expect((await http.post('/0/devices/', { form: { auth: d.authcode } })).status).toBe(201);
    const again = await until(() => rawClient(broker, login(d)).catch(() => undefined), 'enabled again');
    await endClient(again);
  });

  it("a device can use neither the bridge's client id nor its credential, nor reach $CONTROL", async () => {
    const [d] = (await provision(1)) as [Provisioned];
    const linkUp = () => bridge.bridge.link.connected;
    // Its own login under another client id (the bridge's) is refused: the bridge's session stays its own.
    await expect(rawClient(broker, login(d, { clientId: bridge.config.mqtt.clientId }))).rejects.toThrow();
    await expect(rawClient(broker, login(d, { clientId: `${d.deviceId}-x` }))).rejects.toThrow();
    // The bridge's username with anything a device knows is refused.
    await expect(
      rawClient(broker, { clientId: bridge.config.mqtt.clientId, username: BRIDGE_USER, password: d.secret }),
    ).rejects.toThrow();
    expect(linkUp()).toBe(true);

    // A device's login cannot administer the plugin: its command is dropped, its subscription refused.
    const conn = await rawClient(broker, login(d));
    cleanups.push(() => endClient(conn));
    const got: string[] = [];
    conn.on('message', (topic) => got.push(topic));
    const sub = await conn.subscribeAsync('$CONTROL/dynamic-security/#', { qos: 1 }).catch(() => [{ qos: 128 }]);
    expect(sub.map((g) => g.qos)).toEqual([128]);
    const evil = { username: `evil-${randomUUID()}`, password: randomBytes(16).toString('hex') };
    await conn.publishAsync(
      '$CONTROL/dynamic-security/v1',
      JSON.stringify({
        commands: [
          { command: 'createClient', ...evil, roles: [{ rolename: 'devcloud-bridge' }] },
          { command: 'addClientRole', username: d.deviceId, rolename: 'admin' },
        ],
      }),
      { qos: 1 },
    );
    // The bridge's own command after it: once answered, the device's would have been applied.
    expect(await bridge.bridge.managed!.dynsec.run({ command: 'getClient', username: d.deviceId })).toBeUndefined();
    await expect(rawClient(broker, { clientId: evil.username, ...evil })).rejects.toThrow();
    expect(await bridge.bridge.managed!.dynsec.run({ command: 'getClient', username: evil.username })).toMatch(
      /not found/i,
    );
    // Still confined to its own topics.
    const other = randomUUID();
    await conn.publishAsync(topicFor(other, 'up/vars'), upVars('intruder', 'x'), { qos: 1 });
    await conn.publishAsync(topicFor(d.deviceId, 'up/vars'), upVars('after', 'y'), { qos: 1 });
    await until(() => bridge.bridge.store.devices.getVar(d.deviceId, 'd', 'after'), 'its own publish');
    expect(await bridge.bridge.store.devices.getVar(other, 'd', 'intruder')).toBeUndefined();
    expect(got).toEqual([]);
    expect(linkUp()).toBe(true);
  });

  it('enrolment: the enrolment credential only asks; the bridge makes the client of an unknown id once', async () => {
    const enrol = await rawClient(broker, {
      clientId: ENROL_USER,
      username: ENROL_USER,
      password: broker.enrolPassword,
    });
    cleanups.push(() => endClient(enrol));
    const d = { deviceId: randomUUID(), secret: randomBytes(32).toString('hex') };
    await expect(rawClient(broker, login({ ...d, authcode: '' }))).rejects.toThrow();

    // The enrolment credential may not publish as a device, nor subscribe to anything.
    await enrol.publishAsync(topicFor(d.deviceId, 'up/vars'), upVars('sneaky', 'x'), { qos: 1 });
    const sub = await enrol.subscribeAsync('dc/v1/#', { qos: 1 }).catch(() => [{ qos: 128 }]);
    expect(sub.map((g) => g.qos)).toEqual([128]);

    await enrol.publishAsync(ENROL_TOPIC, JSON.stringify(d), { qos: 1 });
    const asDevice = await until(
      () => rawClient(broker, login({ ...d, authcode: '' })).catch(() => undefined),
      'enrolled',
    );
    await asDevice.publishAsync(topicFor(d.deviceId, 'up/vars'), upVars('enrolled', 'yes'), { qos: 1 });
    await until(() => bridge.bridge.store.devices.getVar(d.deviceId, 'd', 'enrolled'), "the enrolled device's publish");
    expect(await bridge.bridge.store.devices.getVar(d.deviceId, 'd', 'sneaky')).toBeUndefined();
    await until(() => bridge.bridge.store.credentials.secretHash(d.deviceId), 'the hash in the database');
    await endClient(asDevice);

    // A second request for the same id does not change its secret.
    const thief = { deviceId: d.deviceId, secret: randomBytes(32).toString('hex') };
    await enrol.publishAsync(ENROL_TOPIC, JSON.stringify(thief), { qos: 1 });
    await until(
      () => bridge.sink.events('dynsec.enrol_refused').some((l) => l.deviceId === d.deviceId),
      'the second request refused',
    );
    await expect(rawClient(broker, login({ ...thief, authcode: '' }))).rejects.toThrow();
    await endClient(await rawClient(broker, login({ ...d, authcode: '' })));

    // The enrolment credential is tied to its own client id.
    await expect(
      rawClient(broker, {
        clientId: bridge.config.mqtt.clientId,
        username: ENROL_USER,
        password: broker.enrolPassword,
      }),
    ).rejects.toThrow();
  });

  it('an agent without a provisioning file enrols with the enrolment credential, then syncs', async () => {
    const agent: TestAgent = await startAgent({
      mqttUrl: broker.url,
      flags: { 'mqtt.caFile': broker.caFile, 'mqtt.enrolPassword': broker.enrolPassword },
    });
    cleanups.push(async () => {
      await agent.stop();
      rmSync(agent.config.stateDir, { recursive: true, force: true });
    });
    const { deviceId } = agent.agent.identity;
    await until(() => agent.sink.events('mqtt.connected').length > 0, 'the agent connected with its own login');
    // The agent may ask again while the bridge is still making its client; the repeats are refused, harmlessly.
    expect(agent.sink.events('mqtt.enrol_requested').length).toBeGreaterThanOrEqual(1);
    expect(agent.sink.events('mqtt.enrol_failed')).toEqual([]);
    expect(bridge.sink.events('dynsec.enrolled').map((l) => l.deviceId)).toContain(deviceId);
    const local = await agent.client();
    await local.set('d', 'hello', 'enrolled');
    await until(() => bridge.bridge.store.devices.getVar(deviceId, 'd', 'hello'), 'its variable at the bridge');
    local.close();
    // The log never shows a secret.
    expect(agent.sink.text()).not.toContain(agent.agent.identity.secret);
    expect(bridge.sink.text()).not.toContain(agent.agent.identity.secret);
  });

  it('the provisioning files are the only copies of the secrets: the database keeps their hashes', () => {
    const files = readdirSync(provisionDir).filter((f) => f.endsWith('.json'));
    expect(files.length).toBeGreaterThan(0);
    const db = readFileSync(join(bridge.dataDir, 'bridge.db'));
    const wal = join(bridge.dataDir, 'bridge.db-wal');
    const all = Buffer.concat([db, existsSync(wal) ? readFileSync(wal) : Buffer.alloc(0)]);
    for (const f of files) {
      const { secret } = JSON.parse(readFileSync(join(provisionDir, f), 'utf8')) as Provisioned;
      expect(all.includes(Buffer.from(secret))).toBe(false);
    }
  });
});

/** A device's hello, so that the bridge knows its auth code (protocol/schemas.ts). */
function helloOf(d: Provisioned): Buffer {
  const now = Date.now();
  return encode('up/hello', {
    id: messageId(),
    protocol: 1,
    deviceId: d.deviceId,
    authcode: d.authcode,
    platform: 'test',
    agentVersion: '0.0.0',
    fwVersion: '0',
    mode: 'connected',
    bootTime: now,
    ts: now,
  });
}

describe('devcloud-bridge device, without a broker', () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  async function cli(args: string[]): Promise<{ code: number; out: string[]; err: string[] }> {
    const out: string[] = [];
    const err: string[] = [];
    const code = await runCli(
      [...args, '--log-level', 'warn'],
      { out: (s) => out.push(s), err: (s) => err.push(s) },
      { CONFIGURATION_DIRECTORY: '/nonexistent' },
    );
    return { code, out, err };
  }

  it('provisions for the embedded broker: the database knows the hash, the agent file the secret', async () => {
    const dataDir = tempDir('devcloud-bridge-');
    const outDir = join(tempDir('devcloud-provision-'), 'new');
    dirs.push(dataDir, join(outDir, '..'));
    const r = await cli(['device', 'provision', '--count=3', '--out', outDir, '--data-dir', dataDir]);
    expect([r.code, r.err]).toEqual([0, []]);
    expect(r.out.map((f) => f.slice(outDir.length + 1)).sort()).toEqual(readdirSync(outDir).sort());
    expect(r.out).toHaveLength(3);
    const store = new SqliteStore(dataDir);
    try {
      for (const file of r.out) {
        const id = JSON.parse(readFileSync(file, 'utf8')) as Provisioned;
        expect(Object.keys(id).sort()).toEqual(['authcode', 'deviceId', 'secret']);
        expect(file).toBe(join(outDir, `${id.deviceId}.json`));
        expect(await store.credentials.secretHash(id.deviceId)).toBe(hashSecret(id.secret));
      }
    } finally {
      await store.close();
    }
  });

  it('refuses bad arguments with exit 2, and dynsec without the broker settings with exit 1', async () => {
    const dataDir = tempDir('devcloud-bridge-');
    dirs.push(dataDir);
    for (const args of [
      ['device', 'provision', '--count', '0'],
      ['device', 'provision', '--count', 'many'],
      ['device', 'provision', 'extra'],
      ['device', 'bogus'],
      ['device', 'enable'],
      ['frontend', 'list', '--count', '2'],
    ]) {
      const r = await cli([...args, '--data-dir', dataDir]);
      expect([args, r.code]).toEqual([args, 2]);
    }
    const r = await cli(['device', 'provision', '--mqtt-dynsec', 'true', '--data-dir', dataDir]);
    expect(r.code).toBe(1);
    expect(r.err.join('\n')).toMatch(/mqtt\.dynsec needs mqtt\.url, mqtt\.username, mqtt\.passwordFile/);
  });
});
