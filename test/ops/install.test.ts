/**
 * The install of docs/operations.md end to end: scripts/release.sh builds the tarball, scripts/install.sh puts it
 * under a temporary root (DESTDIR), and the installed agent runs from there against a real broker with nothing
 * from the checkout. An upgrade keeps configuration and state, uninstall keeps them, purge removes them.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, tempDir, waitForSocket } from '../support/agent.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { until } from '../support/wait.js';

const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
/** The release for this machine, as scripts/release.sh names it by default: Node.js's `arm` is Debian's armhf. */
const ARCH = process.arch === 'arm' ? 'armhf' : process.arch;
const NAME = `devcloud-${VERSION}-linux-${ARCH}`;
/** A CPU this machine is not, as a release's RELEASE names it. */
const OTHER = process.arch === 'arm64' ? 'linux-x64' : 'linux-arm64';

describe('release and install (DESTDIR)', () => {
  let work: string;
  let tarball: string;
  let release: string;
  let root: string;
  let fakeLog: string;
  let path: string;
  let broker: TestBroker;
  /** The units of the release, which are those of the checkout when it was built. */
  let units: string[];
  const running = new Set<ChildProcess>();

  const at = (p: string) => join(root, p);

  beforeAll(async () => {
    work = tempDir('devcloud-install-');
    // The whole release build, as an operator runs it (about 20 s: tsc, a pruned node_modules copy, tar).
    const out = execFileSync('sh', [join(ROOT, 'scripts/release.sh'), '--out', join(work, 'out')], {
      cwd: ROOT,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    tarball = out.trim().split('\n').pop()!;
    expect(tarball).toBe(join(work, 'out', `${NAME}.tar.gz`));
    execFileSync('tar', ['-xzf', tarball, '-C', work]);
    release = join(work, NAME);
    units = readdirSync(join(release, 'systemd')).filter((f) => f.endsWith('.service'));
    root = join(work, 'root');

    // Stand-ins for every command that would change the machine itself: a DESTDIR install must call none of them.
    const fakeBin = join(work, 'fakebin');
    fakeLog = join(work, 'fake.log');
    mkdirSync(fakeBin);
    for (const cmd of ['systemctl', 'systemd-sysusers', 'useradd', 'userdel', 'chown', 'chgrp']) {
      writeFileSync(join(fakeBin, cmd), `#!/bin/sh\necho "${cmd} $*" >>'${fakeLog}'\nexit 1\n`);
      chmodSync(join(fakeBin, cmd), 0o755);
    }
    writeFileSync(fakeLog, '');
    path = [fakeBin, dirname(process.execPath), '/usr/bin', '/bin'].join(':');
    broker = await startBroker('aedes');
  }, 180_000);

  afterAll(async () => {
    for (const p of running) p.kill('SIGKILL');
    await broker?.close();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  /** Runs an install.sh with DESTDIR set, from outside the checkout; returns its status and messages. */
  function install(script: string, args: string[], destdir = root): { status: number | null; stderr: string } {
    const r = spawnSync('sh', [script, ...args], {
      cwd: work,
      env: { PATH: path, DESTDIR: destdir },
      encoding: 'utf8',
    });
    return { status: r.status, stderr: r.stderr };
  }

  /**
   * Starts the installed agent as its unit would, through the #! line of the installed file, with the working
   * directory outside the checkout and no NODE_PATH: every module must come from <root>/opt/devcloud.
   */
  async function runInstalled(): Promise<{
    proc: ChildProcess;
    status: Record<string, unknown>;
    output: () => string;
  }> {
    const state = at('var/lib/devcloud');
    const proc = spawn(
      at('opt/devcloud/dist/agent/main.js'),
      [
        'run',
        '--config',
        at('etc/devcloud/agent.yaml'),
        '--state-dir',
        state,
        '--mqtt-url',
        broker.url,
        '--udp-port',
        '0',
      ],
      { cwd: work, env: { PATH: path, HOME: work }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    running.add(proc);
    let out = '';
    proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const client = await waitForSocket(join(state, 'agent.sock')).catch((err: Error) => {
      throw new Error(`${err.message}; agent output:\n${out}`);
    });
    try {
      const status = await until(async () => {
        const s = await client.status();
        return s.state === 'connected' && s;
      }, `the installed agent to connect; its output:\n${out}`);
      return { proc, status, output: () => out };
    } finally {
      client.close();
    }
  }

  async function stop(proc: ChildProcess): Promise<void> {
    const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
    proc.kill('SIGTERM');
    expect(await exited).toBe(0);
    running.delete(proc);
  }

  it('installs the release with the layout the units expect, touching nothing outside DESTDIR', () => {
    // No argument: the release the script is in.
    const r = install(join(release, 'scripts/install.sh'), []);
    expect(r.stderr).toContain(`installed devcloud ${VERSION} in /opt/devcloud`);
    expect(r.status).toBe(0);

    const opt = at('opt/devcloud');
    for (const f of ['package.json', 'README.md', 'RELEASE', 'docs/operations.md', 'config/agent.example.yaml']) {
      expect(existsSync(join(opt, f)), f).toBe(true);
    }
    expect(statSync(join(opt, 'dist/agent/main.js')).mode & 0o111).toBe(0o111);
    expect(statSync(join(opt, 'dist/bridge/main.js')).mode & 0o111).toBe(0o111);
    // The web console is in the release, where the installed bridge looks for it (docs/console.md).
    for (const f of ['index.html', 'app.js', 'app.js.gz', 'style.css']) {
      expect(existsSync(join(opt, 'dist/console', f)), `dist/console/${f}`).toBe(true);
    }
    const dir = execFileSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        'const m = await import(process.argv[1]); console.log(m.consoleDir());',
        join(opt, 'dist/bridge/console/routes.js'),
      ],
      { encoding: 'utf8' },
    ).trim();
    expect(dir).toBe(join(opt, 'dist/console'));
    // Production dependencies only, the native ones compiled, their build leftovers gone.
    for (const dep of [
      'better-sqlite3/build/Release/better_sqlite3.node',
      'unix-dgram/build/Release/unix_dgram.node',
    ]) {
      expect(existsSync(join(opt, 'node_modules', dep)), dep).toBe(true);
    }
    for (const dev of ['typescript', 'vitest', 'tsx', 'eslint', 'better-sqlite3/build/Release/obj.target']) {
      expect(existsSync(join(opt, 'node_modules', dev)), dev).toBe(false);
    }
    const built = readFileSync(join(opt, 'RELEASE'), 'utf8');
    expect(built).toContain(`node_abi=${process.versions.modules}\n`);
    expect(built).toContain(`platform=${process.platform}-${process.arch}\n`);

    // Every unit of the checkout, as it is; whatever /opt/devcloud path a unit names exists in the install.
    expect(units.length).toBeGreaterThan(0);
    for (const unit of units) {
      const installed = readFileSync(at(`etc/systemd/system/${unit}`), 'utf8');
      expect(installed).toBe(readFileSync(join(release, 'systemd', unit), 'utf8'));
      for (const line of installed.split('\n').filter((l) => /^(ExecStart|WorkingDirectory)=/.test(l))) {
        for (const p of line.match(/\/opt\/devcloud[^\s]*/g) ?? [])
          expect(existsSync(at(p)), `${unit}: ${p}`).toBe(true);
      }
    }
    if (existsSync(join(release, 'systemd/devcloud-sysusers.conf'))) {
      expect(readFileSync(at('usr/lib/sysusers.d/devcloud.conf'), 'utf8')).toBe(
        readFileSync(join(release, 'systemd/devcloud-sysusers.conf'), 'utf8'),
      );
    }

    // A gateway by default: the agent's config from the example, readable only by root and the agent's group.
    expect(readFileSync(at('etc/devcloud/agent.yaml'), 'utf8')).toBe(
      readFileSync(join(release, 'config/agent.example.yaml'), 'utf8'),
    );
    expect(statSync(at('etc/devcloud/agent.yaml')).mode & 0o777).toBe(0o640);
    expect(statSync(at('var/lib/devcloud')).isDirectory()).toBe(true);
    expect(existsSync(at('etc/devcloud/bridge.yaml'))).toBe(false);
    expect(existsSync(at('var/lib/devcloud-bridge'))).toBe(false);

    expect(readlinkSync(at('usr/local/bin/devcloud-agent'))).toBe('/opt/devcloud/dist/agent/main.js');
    expect(readlinkSync(at('usr/local/bin/devcloud-bridge'))).toBe('/opt/devcloud/dist/bridge/main.js');
    expect(readFileSync(fakeLog, 'utf8')).toBe('');
  });

  it('runs the installed agent from /opt/devcloud alone, connected to the broker', async () => {
    const { proc, status } = await runInstalled();
    expect(status.version).toBe(VERSION);
    expect(typeof status.deviceId).toBe('string');
    // The SQLite binding the running agent loaded is the installed one, not the checkout's.
    const natives = readFileSync(`/proc/${proc.pid}/maps`, 'utf8')
      .split('\n')
      .map((l) => l.split(/\s+/)[5] ?? '')
      .filter((f) => f.endsWith('.node'));
    expect(natives.some((f) => f.endsWith('/better_sqlite3.node'))).toBe(true);
    for (const f of natives) expect(f.startsWith(at('opt/devcloud/node_modules/')), f).toBe(true);
    // unix-dgram (sd_notify) resolves and loads from the install too.
    const dgram = spawnSync(process.execPath, ['-p', 'require("unix-dgram") && require.resolve("unix-dgram")'], {
      cwd: at('opt/devcloud'),
      env: { PATH: path },
      encoding: 'utf8',
    });
    expect(dgram.stdout.trim().startsWith(at('opt/devcloud/node_modules/unix-dgram/'))).toBe(true);
    await stop(proc);
    expect(existsSync(at('var/lib/devcloud/identity.json'))).toBe(true);
  });

  it('refuses what is not a release, or a release this machine cannot run, and keeps the installed one', () => {
    const checkout = install(join(ROOT, 'scripts/install.sh'), [ROOT]);
    expect(checkout.status).toBe(1);
    expect(checkout.stderr).toContain('is not a devcloud release');

    /** A release of the given RELEASE whose SQLite binding is not one any machine can load. */
    const fake = (dir: string, release: string) => {
      const files: Record<string, string> = {
        RELEASE: release,
        'package.json': '{"name":"devcloud"}',
        'dist/agent/main.js': '',
        'config/agent.example.yaml': '{}\n',
        'scripts/install.sh': readFileSync(join(ROOT, 'scripts/install.sh'), 'utf8'),
        'node_modules/better-sqlite3/package.json': '{"name":"better-sqlite3","main":"better_sqlite3.node"}',
        'node_modules/better-sqlite3/better_sqlite3.node': 'not an ELF file',
        'README.md': 'broken release\n',
      };
      for (const [f, content] of Object.entries(files)) {
        mkdirSync(dirname(join(dir, f)), { recursive: true });
        writeFileSync(join(dir, f), content);
      }
      return join(dir, 'scripts/install.sh');
    };
    const kept = () => {
      expect(readFileSync(at('opt/devcloud/README.md'), 'utf8')).toBe(readFileSync(join(release, 'README.md'), 'utf8'));
      expect(readdirSync(at('opt'))).toEqual(['devcloud']);
    };

    // Built for this CPU, as far as it says, but its binding does not load (as one built for another CPU would not).
    const broken = install(fake(join(work, 'broken'), `version=${VERSION}\n`), []);
    expect(broken.status).toBe(1);
    expect(broken.stderr).toContain('this release does not run with');
    kept();

    // Another Node.js ABI: refused on what RELEASE says, naming it.
    const abi = install(
      fake(join(work, 'abi'), `version=${VERSION}\nplatform=${process.platform}-${process.arch}\nnode_abi=1\n`),
      [],
    );
    expect(abi.status).toBe(1);
    expect(abi.stderr).toContain(`Node.js ABI ${process.versions.modules}); it was built for: platform=`);
    kept();

    // Another CPU: refused before anything is loaded, naming the release to get instead.
    const other = fake(
      join(work, 'other'),
      `version=${VERSION}\nplatform=${OTHER}\nnode_abi=${process.versions.modules}\n`,
    );
    const cpu = install(other, []);
    expect(cpu.status).toBe(1);
    expect(cpu.stderr).toContain(
      `this release is for ${OTHER} and this machine is ${process.platform}-${process.arch}: install ${NAME}.tar.gz`,
    );
    kept();

    // Packaging it for that CPU: --any-arch, under DESTDIR only, installs it unchecked.
    const packaged = install(other, ['--any-arch'], join(work, 'root-other'));
    expect(packaged.stderr).toContain(`a release for ${OTHER}, on this ${process.platform}-${process.arch} machine`);
    expect(packaged.status).toBe(0);
    expect(readFileSync(join(work, 'root-other/opt/devcloud/README.md'), 'utf8')).toBe('broken release\n');
    const live = spawnSync('sh', [other, '--any-arch'], { cwd: work, env: { PATH: path }, encoding: 'utf8' });
    expect(live.status).toBe(1);
    expect(live.stderr).toContain('--any-arch goes with DESTDIR');
    expect(readFileSync(fakeLog, 'utf8')).toBe('');
  });

  it('upgrades /opt/devcloud as a whole, keeping configuration and state, and adds the bridge role', async () => {
    const identity = readFileSync(at('var/lib/devcloud/identity.json'), 'utf8');
    const { deviceId } = JSON.parse(identity) as { deviceId: string };
    writeFileSync(at('etc/devcloud/agent.yaml'), `${readFileSync(at('etc/devcloud/agent.yaml'), 'utf8')}# edited\n`);
    writeFileSync(at('var/lib/devcloud/keep-me'), 'state');

    // The next release, as a compressed tarball installed by path: README.md changed, docs/protocol.md gone.
    const changed = join(work, 'changed');
    mkdirSync(join(changed, NAME), { recursive: true });
    writeFileSync(join(changed, NAME, 'README.md'), 'the next release\n');
    const nextTar = join(work, 'next.tar');
    execFileSync('tar', [
      '-C',
      work,
      '-cf',
      nextTar,
      `--exclude=${NAME}/README.md`,
      `--exclude=${NAME}/docs/protocol.md`,
      NAME,
    ]);
    execFileSync('tar', ['-C', changed, '-rf', nextTar, `${NAME}/README.md`]);
    execFileSync('gzip', [nextTar]);
    const r = install(join(ROOT, 'scripts/install.sh'), ['--agent', '--bridge', `${nextTar}.gz`]);
    expect(r.stderr).toContain(`upgraded /opt/devcloud to ${VERSION}`);
    expect(r.status).toBe(0);

    expect(readFileSync(at('opt/devcloud/README.md'), 'utf8')).toBe('the next release\n');
    expect(existsSync(at('opt/devcloud/docs/protocol.md'))).toBe(false);
    expect(existsSync(at('opt/devcloud/docs/operations.md'))).toBe(true);
    expect(readdirSync(at('opt'))).toEqual(['devcloud']);
    expect(readFileSync(at('etc/devcloud/agent.yaml'), 'utf8')).toMatch(/# edited\n$/);
    expect(readFileSync(at('var/lib/devcloud/identity.json'), 'utf8')).toBe(identity);
    expect(readFileSync(at('var/lib/devcloud/keep-me'), 'utf8')).toBe('state');
    // --bridge: the bridge's config from its example, and its own state directory.
    expect(readFileSync(at('etc/devcloud/bridge.yaml'), 'utf8')).toBe(
      readFileSync(join(release, 'config/bridge.example.yaml'), 'utf8'),
    );
    expect(statSync(at('var/lib/devcloud-bridge')).isDirectory()).toBe(true);

    // The upgraded agent is the same device, with its database as it was.
    const { proc, status } = await runInstalled();
    expect(status.deviceId).toBe(deviceId);
    await stop(proc);
    expect(readFileSync(fakeLog, 'utf8')).toBe('');
  });

  it('uninstalls, keeping configuration and state; --purge removes them', () => {
    // As documented: the installed script removes the install it is part of.
    const r = install(at('opt/devcloud/scripts/install.sh'), ['--uninstall']);
    expect(r.status).toBe(0);
    expect(existsSync(at('opt/devcloud'))).toBe(false);
    for (const unit of units) expect(existsSync(at(`etc/systemd/system/${unit}`)), unit).toBe(false);
    expect(existsSync(at('usr/lib/sysusers.d/devcloud.conf'))).toBe(false);
    expect(existsSync(at('usr/local/bin/devcloud-agent'))).toBe(false);
    expect(existsSync(at('usr/local/bin/devcloud-bridge'))).toBe(false);
    expect(readFileSync(at('etc/devcloud/agent.yaml'), 'utf8')).toMatch(/# edited\n$/);
    expect(existsSync(at('var/lib/devcloud/identity.json'))).toBe(true);

    const purge = install(join(release, 'scripts/install.sh'), ['--uninstall', '--purge']);
    expect(purge.status).toBe(0);
    expect(existsSync(at('etc/devcloud'))).toBe(false);
    expect(existsSync(at('var/lib/devcloud'))).toBe(false);
    expect(existsSync(at('var/lib/devcloud-bridge'))).toBe(false);
    expect(readFileSync(fakeLog, 'utf8')).toBe('');
  });
});
