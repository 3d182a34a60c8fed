/**
 * `devcloud-agent doctor` on a good setup (the agent stopped, then running) and on each kind of broken one: bad
 * config, unreachable broker, refused login (a private Mosquitto with a password file), TLS the agent does not
 * trust, UDP port taken, state directory not writable.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createTlsServer, type Server as TlsServer } from 'node:tls';
import { join } from 'node:path';
import { Aedes } from 'aedes';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { startAgent, tempDir } from '../support/agent.js';
import { selfSignedCert } from '../support/bridge.js';
import { type TestBroker, freePort, startAedes, startSecureMosquitto } from '../support/brokers.js';
import { makeKeys } from '../support/firmware.js';
import { requires } from '../support/system.js';
import { until } from '../support/wait.js';

const etc = tempDir('devcloud-etc-');
const dirs: string[] = [etc];

function dir(): string {
  const d = tempDir();
  dirs.push(d);
  return d;
}

async function doctor(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  // An empty configuration folder: the machine's own /etc/devcloud stays out of it.
  const code = await runCli(
    ['doctor', ...args],
    { out: (s) => out.push(s), err: (s) => err.push(s) },
    {
      CONFIGURATION_DIRECTORY: etc,
    },
  );
  return { code, out: out.join('\n'), err: err.join('\n') };
}

interface Id {
  deviceId: string;
  secret: string;
  authcode: string;
}

function newIdentity(): Id {
  return { deviceId: randomUUID(), secret: randomBytes(24).toString('hex'), authcode: randomBytes(16).toString('hex') };
}

/** A state directory holding an identity, as after the agent's first start. */
function stateWith(id: Id): string {
  const d = dir();
  writeFileSync(join(d, 'identity.json'), JSON.stringify(id), { mode: 0o600 });
  return d;
}

/** A UDP port that was free a moment ago. */
async function freeUdpPort(): Promise<number> {
  const s = createSocket('udp4');
  await new Promise<void>((resolve) => s.bind(0, '0.0.0.0', resolve));
  const port = s.address().port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

function lines(out: string, status: 'OK' | 'WARN' | 'FAIL'): string[] {
  return out.split('\n').filter((l) => l.startsWith(`${status} `));
}

let aedes: TestBroker;
beforeAll(async () => {
  aedes = await startAedes();
});
afterAll(async () => {
  await aedes?.close();
  for (const d of dirs) {
    chmodSync(d, 0o700);
    rmSync(d, { recursive: true, force: true });
  }
});

describe('doctor on a good setup', () => {
  it('passes every check with the agent stopped, logging in to the broker itself', async () => {
    const id = newIdentity();
    const state = stateWith(id);
    const udp = await freeUdpPort();
    const keys = makeKeys(dir());
    const r = await doctor([
      '--state-dir',
      state,
      '--mqtt-url',
      aedes.url,
      '--udp-port',
      String(udp),
      '--fw-public-key',
      keys.publicFile,
    ]);
    expect(r.code, r.out).toBe(0);
    expect(lines(r.out, 'FAIL')).toEqual([]);
    expect(r.out).toMatch(/^OK {3}config valid \(no config file\)$/m);
    expect(r.out).toMatch(
      /^WARN agent not running \(nothing answers on .*agent\.sock\): systemctl start devcloud-agent/m,
    );
    expect(r.out).toMatch(new RegExp(`^OK {3}state directory ${state} is writable$`, 'm'));
    expect(r.out).toMatch(new RegExp(`^OK {3}identity ${id.deviceId} \\(`, 'm'));
    expect(r.out).toMatch(
      new RegExp(`^OK {3}broker mqtt://127\\.0\\.0\\.1:${aedes.port} accepts the device's login$`, 'm'),
    );
    expect(r.out).toMatch(new RegExp(`^OK {3}UDP port ${udp} can be bound$`, 'm'));
    expect(r.out).toMatch(/^OK {3}clock \d{4}-/m);
    expect(r.out).toMatch(/^OK {3}disk: [\d.]+ [MG]B free for /m);
    expect(r.out).toMatch(new RegExp(`^OK {3}firmware key ${keys.publicFile} readable \\(Ed25519\\)$`, 'm'));
    expect(r.out).not.toContain(id.secret);
  });

  it('with the agent running: its socket, its broker connection and its UDP port', async () => {
    const state = dir();
    const udp = await freeUdpPort();
    const a = await startAgent({ mqttUrl: aedes.url, stateDir: state, flags: { 'udp.port': udp } });
    try {
      await until(() => a.agent.uplink.connected, 'the agent connected');
      const r = await doctor(['--state-dir', state, '--mqtt-url', aedes.url, '--udp-port', String(udp)]);
      expect(r.code, r.out).toBe(0);
      expect(r.out).toMatch(new RegExp(`^OK {3}agent running \\(answers on ${state}/agent\\.sock, connected\\)$`, 'm'));
      expect(r.out).toMatch(/^OK {3}broker .*: the running agent is connected$/m);
      expect(r.out).toMatch(new RegExp(`^OK {3}UDP port ${udp} held by the running agent$`, 'm'));
      expect(r.out).toMatch(/^WARN no firmware public keys/m);
    } finally {
      await a.stop();
    }
  });
});

describe('doctor on a broken setup', () => {
  it('bad config: every problem listed, exit 2', async () => {
    const file = join(dir(), 'agent.json');
    writeFileSync(file, JSON.stringify({ udp: { port: 99999 }, mqtt: { keepaliveSecs: 5 } }));
    const r = await doctor(['--config', file, '--mqtt-url', 'nope', '--bogus']);
    expect(r.code).toBe(2);
    const fails = lines(r.out, 'FAIL');
    expect(fails.some((l) => /^FAIL config: .*--bogus/.test(l))).toBe(true);
    expect(fails.some((l) => /^FAIL config: mqtt\.url: /.test(l))).toBe(true);
    expect(fails.some((l) => /^FAIL config: udp\.port: /.test(l))).toBe(true);
    expect(fails.some((l) => /^FAIL config: .*keepaliveSecs/.test(l))).toBe(true);
    expect(fails.at(-1)).toMatch(new RegExp(`^FAIL config from config file ${file}: fix the problems above`));
    // Nothing else is checked against a config that is wrong.
    expect(lines(r.out, 'OK')).toEqual([]);
  });

  it('unreachable broker', async () => {
    const port = await freePort();
    const r = await doctor([
      '--state-dir',
      stateWith(newIdentity()),
      '--mqtt-url',
      `mqtt://127.0.0.1:${port}`,
      '--udp',
      'false',
    ]);
    expect(r.code).toBe(1);
    expect(lines(r.out, 'FAIL')).toEqual([
      `FAIL broker mqtt://127.0.0.1:${port} unreachable (ECONNREFUSED): check that the broker runs, the host, the port and the firewall`,
    ]);
  });

  it('wrong credentials are refused; the right ones pass (private Mosquitto with a password file)', async (ctx) => {
    requires(ctx, 'mosquitto', 'mosquitto_passwd');
    const id = newIdentity();
    const mosq = await startSecureMosquitto({
      devices: [{ id: id.deviceId, secret: id.secret }],
      bridge: { username: 'devcloud-bridge', password: randomBytes(12).toString('hex') },
    });
    try {
      const wrong = await doctor([
        '--state-dir',
        stateWith({ ...id, secret: 'not-the-secret-0123456789' }),
        '--mqtt-url',
        mosq.url,
        '--udp',
        'false',
      ]);
      expect(wrong.code).toBe(1);
      const fails = lines(wrong.out, 'FAIL');
      expect(fails).toHaveLength(1);
      expect(fails[0]).toMatch(
        new RegExp(`^FAIL broker ${mosq.url} refused the login \\(.*\\): the broker does not know this device`),
      );

      const right = await doctor(['--state-dir', stateWith(id), '--mqtt-url', mosq.url, '--udp', 'false']);
      expect(right.code, right.out).toBe(0);
      expect(right.out).toMatch(new RegExp(`^OK {3}broker ${mosq.url} accepts the device's login$`, 'm'));
    } finally {
      await mosq.close();
    }
  });

  it('TLS the agent does not trust fails as TLS; with the CA it passes', async (ctx) => {
    requires(ctx, 'openssl');
    const certs = dir();
    const { certFile, keyFile } = selfSignedCert(certs);
    const broker = await Aedes.createBroker();
    const server: TlsServer = createTlsServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, (s) =>
      broker.handle(s),
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `mqtts://127.0.0.1:${(server.address() as { port: number }).port}`;
    try {
      const state = stateWith(newIdentity());
      const untrusted = await doctor(['--state-dir', state, '--mqtt-url', url, '--udp', 'false']);
      expect(untrusted.code).toBe(1);
      expect(lines(untrusted.out, 'FAIL')).toEqual([
        expect.stringMatching(
          new RegExp(`^FAIL broker ${url}: TLS failed \\(DEPTH_ZERO_SELF_SIGNED_CERT: .*\\): check mqtt\\.caFile`),
        ),
      ]);
      const file = join(dir(), 'agent.json');
      writeFileSync(file, JSON.stringify({ mqtt: { caFile: certFile } }));
      const trusted = await doctor(['--config', file, '--state-dir', state, '--mqtt-url', url, '--udp', 'false']);
      expect(trusted.code, trusted.out).toBe(0);
      expect(trusted.out).toMatch(/^OK {3}broker mqtts:.* accepts the device's login$/m);
    } finally {
      server.close();
      await new Promise<void>((resolve) => broker.close(() => resolve()));
    }
  });

  it('UDP port taken by another program', async () => {
    const holder: UdpSocket = createSocket({ type: 'udp4', reuseAddr: false });
    await new Promise<void>((resolve) => holder.bind({ port: 0, address: '0.0.0.0', exclusive: true }, resolve));
    const port = holder.address().port;
    try {
      const r = await doctor([
        '--state-dir',
        stateWith(newIdentity()),
        '--mqtt-url',
        aedes.url,
        '--udp-port',
        String(port),
      ]);
      expect(r.code).toBe(1);
      expect(lines(r.out, 'FAIL')).toEqual([
        `FAIL UDP port ${port} is in use by another program: find it with ss -ulpn 'sport = :${port}', stop it, or set udp.port`,
      ]);
    } finally {
      await new Promise<void>((resolve) => holder.close(() => resolve()));
    }
  });

  it('state directory not writable: a file where the directory should be, a file in its path, a read-only directory', async () => {
    const base = dir();
    const file = join(base, 'file');
    writeFileSync(file, 'x');
    const common = ['--mqtt-url', aedes.url, '--udp', 'false'];

    const isFile = await doctor(['--state-dir', file, ...common]);
    expect(isFile.code).toBe(1);
    expect(isFile.out).toMatch(new RegExp(`^FAIL state directory ${file} is not a directory: `, 'm'));

    const under = await doctor(['--state-dir', join(file, 'state'), ...common]);
    expect(under.code).toBe(1);
    expect(under.out).toMatch(new RegExp(`^FAIL state directory ${file}/state: a part of the path is a file: `, 'm'));

    // sysfs lets no one, root included, create a file in it: a directory that is there but not writable.
    const sys = await doctor(['--state-dir', '/sys', ...common]);
    expect(sys.code).toBe(1);
    expect(sys.out).toMatch(/^FAIL state directory \/sys is not writable \((EACCES|EROFS|EPERM)\): chown it/m);

    // Root writes through permission bits, so this one can only fail for another user.
    if (process.getuid?.() !== 0) {
      const ro = join(base, 'ro');
      mkdirSync(ro);
      chmodSync(ro, 0o500);
      const r = await doctor(['--state-dir', ro, ...common]);
      expect(r.code).toBe(1);
      expect(r.out).toMatch(new RegExp(`^FAIL state directory ${ro} is not writable \\(EACCES\\): chown it`, 'm'));
    }
  });
});
