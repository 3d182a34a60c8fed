/**
 * The arm64 and armhf releases on Debian 13's own Node.js for those CPUs, under qemu-user (docs/operations.md,
 * "Testing on real Debian"); long (`npm run test:long`). For each: scripts/debian-root.sh makes (once) a Debian 13
 * root with its nodejs unpacked, scripts/release.sh builds the release for that CPU (its native modules
 * cross-compiled, or from the cache) and loads them there under qemu, scripts/deb.sh makes the agent's package from
 * it, a bridge runs on this machine, and the agent as the package installs it runs under `qemu-<cpu>-static -L <root> <root>/usr/bin/node`: it opens its database, connects to
 * the bridge's broker, and a variable set through its local socket reaches the bridge and is acknowledged, and one
 * set through the bridge reaches it. qemu is called directly (binfmt_misc need not be set up), so a program the
 * agent itself started would not run: the test needs none. Emulation is slow (Node.js takes seconds to start), so
 * the waits are long, on the real clock.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type UnixDgramSocket, createSocket } from 'unix-dgram';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { VarJson } from '../../agent/local/messages.js';
import { type LocalClient } from '../../agent/local/client.js';
import { ROOT, tempDir, waitForSocket } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type Need, missing, which } from '../support/system.js';
import { until } from '../support/wait.js';

const LONG = !['', '0', 'false', undefined].includes(process.env.DEVCLOUD_LONG);
const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
/** Long waits: each step of an emulated Node.js takes seconds. */
const SLOW = 240_000;

const ARCHES = [
  {
    arch: 'arm64',
    node: 'arm64',
    qemu: 'qemu-aarch64',
    needs: ['qemu-aarch64-static', 'aarch64-linux-gnu-gcc', 'aarch64-linux-gnu-g++'] as Need[],
  },
  {
    arch: 'armhf',
    node: 'arm',
    qemu: 'qemu-arm',
    needs: ['qemu-arm-static', 'arm-linux-gnueabihf-gcc', 'arm-linux-gnueabihf-g++'] as Need[],
  },
];

/** The last line a script printed to stdout. */
function lastLine(out: string): string {
  return out.trim().split('\n').pop()!;
}

describe.each(ARCHES)('the $arch release under qemu-user, on Debian 13', ({ arch, node, qemu, needs }) => {
  // Checked only when the long tests run: a short run says nothing of what they need.
  const skip = !LONG || missing(...needs, 'debootstrap', 'make', 'python3', 'dpkg-deb', 'root');
  let work: string;
  let root: string;
  let release: string;
  let deb: string;
  let installed: string;
  let bridge: LiveBridge | undefined;
  let agent: ChildProcess | undefined;
  let local: LocalClient | undefined;
  let output = '';
  let stateDir: string;
  let notify: UnixDgramSocket | undefined;

  beforeAll(() => {
    if (skip) return;
    work = tempDir(`devcloud-qemu-${arch}-`);
    // About a minute the first time (debootstrap from Debian's mirror), then kept in /var/cache/devcloud-test.
    root = lastLine(
      execFileSync('sh', [join(ROOT, 'scripts/debian-root.sh'), '--arch', arch], { encoding: 'utf8', timeout: SLOW }),
    );
    // The release checks itself under qemu too: its native modules load and both CLIs start.
    const out = execFileSync(
      'sh',
      [join(ROOT, 'scripts/release.sh'), '--arch', arch, '--out', join(work, 'out'), '--qemu-root', root],
      { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const name = `devcloud-${VERSION}-linux-${arch}`;
    expect(lastLine(out)).toBe(join(work, 'out', `${name}.tar.gz`));
    execFileSync('tar', ['-xzf', lastLine(out), '-C', work]);
    release = join(work, name);
    // The gateway's package for the CPU, made from that release: the agent runs from what it installs.
    deb = lastLine(
      execFileSync('sh', [join(ROOT, 'scripts/deb.sh'), '--release', lastLine(out), '--only', 'agent', '--out', work], {
        cwd: ROOT,
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'pipe'],
      }),
    );
    execFileSync('dpkg-deb', ['-x', deb, join(work, 'pkg')]);
    installed = join(work, 'pkg/usr/lib/devcloud-agent');
  }, 900_000);

  afterAll(async () => {
    local?.close();
    notify?.close();
    if (agent && agent.exitCode === null && agent.signalCode === null) agent.kill('SIGKILL');
    await bridge?.close();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it.skipIf(skip)(
    `runs the ${arch} package's agent on Debian's Node.js for it: database, broker, a variable each way`,
    { timeout: 900_000 },
    async () => {
      expect(readFileSync(join(release, 'RELEASE'), 'utf8')).toContain(`platform=linux-${node}\n`);
      expect(execFileSync('dpkg-deb', ['-f', deb, 'Architecture'], { encoding: 'utf8' }).trim()).toBe(arch);
      bridge = await startLiveBridge();
      stateDir = join(work, 'state');
      const config = join(work, 'agent.yaml');
      // JSON is YAML: the broker on this machine, the socket in the state directory, no IPv6 for nearby.
      writeFileSync(
        config,
        JSON.stringify({
          stateDir,
          mqtt: { url: bridge.mqttUrl, backoffMinMs: 100, backoffMaxMs: 2000, connectTimeoutMs: 60_000 },
          udp: { port: 0, ipv6: false },
          log: { level: 'info', pretty: 'never' },
        }),
      );
      // systemd's notification socket, which the agent writes to with the release's unix-dgram, compiled for the CPU.
      const notifyPath = join(work, 'notify.sock');
      const notices: string[] = [];
      notify = createSocket('unix_dgram', (msg) => notices.push(msg.toString()));
      notify.bind(notifyPath);
      const program = which(`${qemu}-static`) ?? which(qemu)!;
      agent = spawn(
        program,
        ['-L', root, join(root, 'usr/bin/node'), join(installed, 'dist/agent/main.js'), 'run', '--config', config],
        {
          cwd: work,
          env: { PATH: process.env.PATH, HOME: work, NOTIFY_SOCKET: notifyPath },
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      agent.stdout!.on('data', (d: Buffer) => (output += d.toString()));
      agent.stderr!.on('data', (d: Buffer) => (output += d.toString()));
      const exited = new Promise<number | null>((resolve) => agent!.once('exit', (code) => resolve(code)));

      local = await waitForSocket(join(stateDir, 'agent.sock'), SLOW).catch((err: Error) => {
        throw new Error(`${err.message}; the agent's output:\n${output}`);
      });
      const status = await until(
        async () => {
          const s = await local!.status();
          return s.state === 'connected' && s;
        },
        `the emulated agent to connect; its output:\n${output}`,
        SLOW,
      );
      expect(status.version).toBe(VERSION);
      await until(() => notices.includes('READY=1\nSTATUS=running'), 'READY=1 on the notification socket', SLOW);
      // The SQLite binding qemu loaded for it is the package's, for this CPU.
      const maps = readFileSync(`/proc/${agent.pid}/maps`, 'utf8');
      expect(maps).toContain(join(installed, 'node_modules/better-sqlite3/build/Release/better_sqlite3.node'));

      // A change made on the gateway: stored, sent, acknowledged by the bridge.
      const set = await local.set('d', 'temp', '21.5');
      expect(set.value).toBe('21.5');
      const acked = await until(
        async () => {
          const v = await local!.get('d', 'temp');
          return v.acked >= v.time && v;
        },
        'temp acknowledged by the bridge',
        SLOW,
      );
      expect(acked.origin).toBe('device');

      // The bridge has it, for the user who claims the device.
      const { deviceId, authcode } = JSON.parse(readFileSync(join(stateDir, 'identity.json'), 'utf8')) as {
        deviceId: string;
        authcode: string;
      };
      expect(status.deviceId).toBe(deviceId);
      const http = bridge.client();
      expect(
        (
          await http.post('/0/session/signup', {
            form: { login: `${arch}@example.com`, password: 'correct horse battery' },
          })
        ).status,
      ).toBe(201);
      expect((await http.post('/0/devices/', { form: { auth: authcode } })).status).toBe(201);
      const temp = JSON.parse((await http.get(`/0/devices/${deviceId}/d/temp`)).body) as { value: string };
      expect(temp.value).toBe('21.5');

      // A change made through the bridge reaches the emulated agent's database and is acknowledged.
      expect((await http.post(`/0/devices/${deviceId}/d/led`, { form: { value: 'on' } })).body).toBe('device-ok');
      const led = await until(
        async () => {
          const v: VarJson | undefined = await local!.get('d', 'led').catch(() => undefined);
          return v?.value === 'on' && v;
        },
        'led on the emulated agent',
        SLOW,
      );
      expect(led.origin).toBe('cloud');
      await until(
        async () => {
          const r = JSON.parse((await http.get(`/0/devices/${deviceId}/d/led`)).body) as Record<string, number>;
          return r.acked! >= r.time! && r;
        },
        'led acknowledged on the bridge',
        SLOW,
      );

      // A clean stop, as systemd asks for one.
      local.close();
      local = undefined;
      agent.kill('SIGTERM');
      expect(await exited, output).toBe(0);
      expect(notices).toContain('STOPPING=1\nSTATUS=stopping');
    },
  );
});
