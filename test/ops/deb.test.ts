/**
 * The Debian packages on a real Debian under a real systemd: scripts/deb.sh builds devcloud-agent and
 * devcloud-bridge from a release, lintian finds nothing to say, and a Debian 13 machine (scripts/debian-root.sh,
 * booted with `systemd-nspawn --boot`, systemd as PID 1, a network of its own) installs them with
 * `apt-get install ./…deb` as docs/operations.md says. Then, inside it: both services active, the agent's
 * `Type=notify` readiness, a variable synced with the bridge, `status` and `doctor`, the journal, the watchdog
 * restarting a hung agent, a crash loop handed to the rollback unit by `OnFailure=`, a firmware update whose new
 * agent cannot start rolled back by that unit, an upgrade that keeps
 * configuration and state, removal and purge.
 */
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, tempDir } from '../support/agent.js';
import { buildImage } from '../support/firmware.js';
import { BootedDebian, debianRoot } from '../support/nspawn.js';
import { missing } from '../support/system.js';

const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
const UPGRADE = `${VERSION}+up1`;
const FW_NAME = 'gateways/linux-x64/devcloud-agent';

/**
 * Run inside the machine with its node, against the bridge there: `start AUTH ID NAME` signs a user up, claims the
 * gateway and starts the update, keeping the session's cookie in a file; `fwstates ID` prints the device's
 * `fwstate` history in that session, oldest first.
 */
const API_SCRIPT = `
const [mode, ...args] = process.argv.slice(2);
import { readFileSync, writeFileSync } from 'node:fs';
const login = { login: 'fw@example.com', password: 'correct horse battery' };
let cookie = mode === 'start' ? '' : readFileSync('/var/tmp/api.cookie', 'utf8');
async function call(method, path, form) {
  const r = await fetch('http://127.0.0.1:8080' + path, {
    method,
    headers: { ...(form ? { 'content-type': 'application/x-www-form-urlencoded' } : {}), ...(cookie ? { cookie } : {}) },
    body: form ? new URLSearchParams(form).toString() : undefined,
  });
  const set = r.headers.get('set-cookie');
  if (set) cookie = set.split(';')[0];
  return [r.status, await r.text()];
}
if (mode === 'start') {
  const [auth, id, name] = args;
  const a = await call('POST', '/0/session/signup', login);
  const b = await call('POST', '/0/devices/', { auth });
  const c = await call('POST', '/0/devices/' + id + '/fw/' + name, {});
  writeFileSync('/var/tmp/api.cookie', cookie);
  console.log(a[0], b[0], c[0], c[1]);
} else {
  const [, body] = await call('GET', '/0/devices/' + args[0] + '/meta/fwstate?latest=100');
  console.log(JSON.parse(body).map((e) => e.value).reverse().join(' '));
}
`;
const NEEDS = missing('root', 'systemd-nspawn', 'nsenter', 'debootstrap', 'dpkg-deb', 'lintian', 'mount');

describe.skipIf(NEEDS)('Debian packages under systemd (systemd-nspawn --boot)', () => {
  let work: string;
  let debs: { agent: string; bridge: string; agentUp: string };
  let machine: BootedDebian;

  /** Builds the packages from one release: this version and an upgrade of it. */
  function buildPackages(): typeof debs {
    const release = execFileSync('sh', [join(ROOT, 'scripts/release.sh'), '--out', join(work, 'release')], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    })
      .trim()
      .split('\n')
      .pop()!;
    const deb = (...args: string[]) =>
      execFileSync('sh', [join(ROOT, 'scripts/deb.sh'), '--release', release, '--out', join(work, 'debs'), ...args], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'inherit'],
      })
        .trim()
        .split('\n');
    const [agent, bridge] = deb();
    const [agentUp] = deb('--version', UPGRADE, '--only', 'agent');
    return { agent: agent!, bridge: bridge!, agentUp: agentUp! };
  }

  /** Copies packages into the machine's /root (its /tmp is a fresh tmpfs) and installs them with apt. */
  function aptInstall(...files: string[]): string {
    const inside = files.map((f) => {
      copyFileSync(f, machine.path(`root/${basename(f)}`));
      return `./${basename(f)}`;
    });
    return machine.sh(`cd /root && apt-get install -y -q ${inside.join(' ')} 2>&1`, { timeoutMs: 180_000 });
  }

  const active = (unit: string) => machine.run(['systemctl', 'is-active', unit]).stdout.trim();
  const agentPid = () => Number(machine.show('devcloud-agent', 'MainPID').MainPID);

  /** A drop-in for the agent's unit (or none), applied with daemon-reload. */
  function agentDropIn(text: string | undefined): void {
    const dir = machine.path('etc/systemd/system/devcloud-agent.service.d');
    if (text === undefined) rmSync(dir, { recursive: true, force: true });
    else {
      mkdirSync(dir, { recursive: true });
      execFileSync('sh', ['-c', 'cat > "$1"', 'sh', join(dir, 'test.conf')], { input: text });
    }
    machine.sh('systemctl daemon-reload');
  }

  beforeAll(async () => {
    work = tempDir();
    debs = buildPackages();
    const lower = debianRoot('amd64');
    machine = await BootedDebian.boot(lower, join(work, 'machine'), `devcloud-deb-${process.pid}`);
  }, 600_000);

  afterAll(async () => {
    await machine?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  }, 60_000);

  it('builds packages lintian has nothing to say about, each with only its own program', () => {
    const out = execFileSync('lintian', ['--tag-display-limit', '0', debs.agent, debs.bridge], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    expect(out.trim()).toBe('');
    const files = (deb: string) => execFileSync('dpkg-deb', ['-c', deb], { encoding: 'utf8' });
    const agentFiles = files(debs.agent);
    expect(agentFiles).toContain(
      './usr/lib/devcloud-agent/node_modules/better-sqlite3/build/Release/better_sqlite3.node',
    );
    expect(agentFiles).toContain('./usr/lib/systemd/system/devcloud-agent-rollback.service');
    // Nothing of the bridge reaches a gateway.
    for (const bridgeOnly of ['dist/bridge/', 'node_modules/fastify/', 'node_modules/pg/', 'node_modules/aedes/']) {
      expect(agentFiles).not.toContain(`/usr/lib/devcloud-agent/${bridgeOnly}`);
    }
    expect(files(debs.bridge)).toContain('./usr/lib/devcloud-bridge/node_modules/fastify/');
    const control = execFileSync('dpkg-deb', ['-f', debs.agent], { encoding: 'utf8' });
    expect(control).toMatch(/^Architecture: amd64$/m);
    expect(control).toMatch(/^Depends: nodejs \(>= 20\.19\), nodejs \(<< \d+\)/m);
    expect(
      execFileSync('sh', ['-c', `dpkg-deb --ctrl-tarfile "$1" | tar -xO ./conffiles`, 'sh', debs.agent]).toString(),
    ).toBe('/etc/devcloud/agent.yaml\n');
    // lintian reads every file of both packages: a minute or more on a busy shared machine.
  }, 180_000);

  it('installs with apt: the users, the units enabled, both services active, the agent ready when systemd says so', async () => {
    const out = aptInstall(debs.bridge, debs.agent);
    expect(out).toContain('Setting up devcloud-agent');
    expect(machine.sh('getent passwd devcloud devcloud-bridge')).toMatch(/^devcloud:.*\n^devcloud-bridge:/m);
    expect(machine.sh('stat -c "%U:%G %a" /etc/devcloud/agent.yaml').trim()).toBe('root:devcloud 640');
    expect(machine.sh('systemctl is-enabled devcloud-agent devcloud-bridge').split('\n').slice(0, 2)).toEqual([
      'enabled',
      'enabled',
    ]);
    await machine.waitFor(() => active('devcloud-agent') === 'active', 'devcloud-agent to be active');
    await machine.waitFor(() => active('devcloud-bridge') === 'active', 'devcloud-bridge to be active');

    // Type=notify: systemd calls the agent started only after the agent said READY=1, which it does once it
    // listens (local.listening) and has logged agent.started; with Type=exec "Started" would come first.
    const unit = machine.show('devcloud-agent', 'Type', 'NotifyAccess', 'WatchdogUSec', 'StatusText');
    expect(unit).toMatchObject({ Type: 'notify', NotifyAccess: 'main', WatchdogUSec: '30s' });
    const journal = machine.journal('devcloud-agent');
    const startedByAgent = journal.findIndex((l) => l.includes('"event":"agent.started"'));
    const startedBySystemd = journal.findIndex((l) => l.startsWith('Started devcloud-agent.service'));
    expect(startedByAgent).toBeGreaterThanOrEqual(0);
    expect(startedBySystemd).toBeGreaterThan(startedByAgent);
  });

  it('syncs a variable with the bridge once the administrator opens enrolment, and status and doctor say so', async () => {
    // A fresh bridge admits only provisioned devices: the agent is refused until then.
    await machine.waitFor(
      () => machine.journal('devcloud-bridge').some((l) => l.includes('"event":"broker.refused"')),
      'the bridge to refuse the unknown agent',
    );
    machine.sh(`sed -i 's/^  openEnrolment: false/  openEnrolment: true/' /etc/devcloud/bridge.yaml`);
    machine.sh('systemctl restart devcloud-bridge');
    await machine.waitFor(
      () => /state\s+connected/.test(machine.run(['devcloud-agent', 'status']).stdout),
      'the agent to connect to the bridge',
    );
    const status = machine.run(['devcloud-agent', 'status', '--json']);
    expect(status.status).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({ state: 'connected', deviceId: expect.any(String) });

    machine.sh('devcloud-agent var set greeting hello');
    await machine.waitFor(() => {
      const r = machine.run(['devcloud-agent', 'var', 'get', 'greeting', '--json']);
      if (r.status !== 0) return false;
      const v = JSON.parse(r.stdout) as { value?: unknown; time?: number; acked?: number };
      return JSON.stringify(v.value).includes('hello') && typeof v.acked === 'number' && v.acked >= v.time!;
    }, 'the bridge to acknowledge the variable');

    // doctor, as root from a shell: it finds the service's socket and the port the running agent holds.
    const doctor = machine.run(['devcloud-agent', 'doctor']);
    expect(doctor.stdout).toMatch(/^OK\s+agent\b/m);
    expect(doctor.stdout).toMatch(/^OK\s+UDP port 590\b/m);
    expect(doctor.stdout).not.toMatch(/^FAIL/m);
    expect(doctor.status).toBe(0);
  });

  it('writes its events to the journal, where journalctl -u devcloud-agent and devcloud-agent logs read them', () => {
    const events = machine
      .journal('devcloud-agent')
      .filter((l) => l.startsWith('{'))
      .map((l) => (JSON.parse(l) as { event?: string }).event);
    expect(events).toEqual(expect.arrayContaining(['agent.started', 'local.listening', 'mqtt.connected']));
    const logs = machine.run(['devcloud-agent', 'logs', '--no-follow']);
    expect(logs.status, logs.stderr).toBe(0);
    expect(logs.stdout).toContain('mqtt.connected');
  });

  it('is killed and started again by the watchdog when it hangs', async () => {
    // The watchdog at 3 s instead of 30 s, and quick to kill and restart, so that the test is short.
    agentDropIn('[Service]\nWatchdogSec=3s\nTimeoutAbortSec=2s\nRestartSec=500ms\n');
    machine.sh('systemctl restart devcloud-agent');
    await machine.waitFor(() => active('devcloud-agent') === 'active', 'the agent to be active');
    const before = Number(machine.show('devcloud-agent', 'NRestarts').NRestarts);
    const hung = agentPid();
    // A stopped process answers nothing: no watchdog pings, as with a blocked event loop.
    machine.sh(`kill -STOP ${hung}`);
    await machine.waitFor(
      () => {
        const s = machine.show('devcloud-agent', 'NRestarts', 'MainPID', 'ActiveState');
        return Number(s.NRestarts) > before && Number(s.MainPID) !== hung && s.ActiveState === 'active';
      },
      'systemd to restart the hung agent',
      60_000,
    );
    expect(machine.journal('devcloud-agent').some((l) => l.includes('Watchdog timeout'))).toBe(true);
    // systemd 257 starts the OnFailure= unit after this one failure too; the rollback unit sees that the agent is
    // being restarted and does nothing.
    expect(machine.journal('devcloud-agent-rollback').some((l) => l.includes("Skipped due to 'exec-condition'"))).toBe(
      true,
    );
    expect(machine.journal('devcloud-agent-rollback').some((l) => l.includes('no firmware update'))).toBe(false);
    agentDropIn(undefined);
  }, 90_000);

  it('hands a crash loop to devcloud-agent-rollback.service, which starts the agent again', async () => {
    // The start limit at 2 quick failures, so that the loop is reached in seconds; and a setting the agent
    // refuses, given to the agent's unit alone (the rollback unit reads the same config file): the agent exits at
    // once, every time, as a bad update would make it.
    agentDropIn(
      '[Unit]\nStartLimitBurst=2\nStartLimitIntervalSec=60\n[Service]\nRestartSec=200ms\nEnvironment=DEVCLOUD_UDP_PORT=-1\n',
    );
    machine.sh('systemctl restart devcloud-agent || true');
    // Once the start limit is hit, the rollback runs (as the agent's user, in its sandbox; nothing to roll back
    // here, as no update happened) and starts the agent again.
    await machine.waitFor(
      () => machine.journal('devcloud-agent-rollback').some((l) => l.includes('no firmware update')),
      'OnFailure= to run the rollback',
      60_000,
    );
    expect(machine.journal('devcloud-agent').some((l) => l.includes('Start request repeated too quickly'))).toBe(true);
    // Fixed, the agent comes back through the rollback unit's start: no one runs systemctl start by hand.
    agentDropIn(undefined);
    await machine.waitFor(() => active('devcloud-agent') === 'active', 'the agent to run again', 60_000);
    machine.sh('systemctl reset-failed devcloud-agent devcloud-agent-rollback || true');
  }, 120_000);

  it('rolls back a firmware update whose agent cannot start, through OnFailure= and the rollback unit', async () => {
    // The operator's key and a signed image in the bridge's catalog, with the bridge's own CLI, as its user.
    const image = buildImage({ name: 'devcloud-agent', version: 5, files: { 'bin/agent.js': 'new agent' } }, work);
    copyFileSync(image, machine.path('var/tmp/image.tar.gz'));
    machine.sh(`chmod 644 /var/tmp/image.tar.gz
      runuser -u devcloud-bridge -- devcloud-bridge firmware keygen --out /var/tmp/keys
      install -m 644 /var/tmp/keys/signing.pub /etc/devcloud/firmware.pub
      runuser -u devcloud-bridge -- devcloud-bridge firmware add /var/tmp/image.tar.gz --name ${FW_NAME} \\
        --platform linux-x64 --version 5 --from linux-x64 --sign-key /var/tmp/keys/signing.key`);
    // The gateway takes signed images and restarts itself after the switch, as for its own update.
    machine.sh(`sed -i -e 's#^  publicKeys: \\[\\]#  publicKeys: [/etc/devcloud/firmware.pub]#' \\
      -e 's#^  restart: none#  restart: agent#' /etc/devcloud/agent.yaml
      systemctl restart devcloud-agent`);
    await machine.waitFor(
      () => /state\s+connected/.test(machine.run(['devcloud-agent', 'status']).stdout),
      'the agent to connect again',
    );
    machine.sh('devcloud-agent var set mode connected');
    // The new image's agent cannot start: once the switch restarts it, it fails at every start. Given to the
    // running unit now, it takes effect at that restart.
    agentDropIn(
      '[Unit]\nStartLimitBurst=2\nStartLimitIntervalSec=60\n[Service]\nRestartSec=200ms\nEnvironment=DEVCLOUD_UDP_PORT=-1\n',
    );

    // A user claims the gateway and starts the update through the API.
    const { authcode, deviceId } = JSON.parse(machine.sh('cat /var/lib/devcloud/identity.json')) as {
      authcode: string;
      deviceId: string;
    };
    writeFileSync(machine.path('var/tmp/api.mjs'), API_SCRIPT);
    const started = machine.sh(`node /var/tmp/api.mjs start ${authcode} ${deviceId} ${FW_NAME}`);
    expect(started.trim()).toBe('201 201 200 device-ok');

    // The switch, the restart into the failing agent, the start limit, then the rollback unit's real rollback.
    await machine.waitFor(
      () => machine.journal('devcloud-agent-rollback').some((l) => /rolled back|rollingback|rolledback/i.test(l)),
      'the rollback unit to roll the update back',
      120_000,
    );
    expect(readlinkSync(machine.path('var/lib/devcloud/slots/current'))).toBe('a');
    // The old agent starts again once the cause is gone, and reports the rollback to the bridge.
    agentDropIn(undefined);
    await machine.waitFor(() => active('devcloud-agent') === 'active', 'the agent to run again', 60_000);
    const fw = () =>
      JSON.parse(machine.sh('devcloud-agent fw status --json')) as { state?: string; job?: { state?: string } };
    await machine.waitFor(() => JSON.stringify(fw()).includes('rolledback'), 'fw status to say rolledback');
    // It ran up to the switch (the new slot was active) before it was rolled back.
    const steps = JSON.stringify(fw());
    expect(steps).toContain('switching');
    expect(steps).toContain('rollingback');
    // The agent, running again, reports it: the bridge's record of the update ends rolledback.
    let recorded = '';
    await machine
      .waitFor(() => {
        recorded = machine.sh(`node /var/tmp/api.mjs fwstates ${deviceId}`).trim();
        return recorded.endsWith('rolledback');
      }, 'the bridge to record the rollback')
      .catch((err: Error) => {
        throw new Error(`${err.message}; fwstate history: ${recorded}`);
      });
    // The rollback happened with no agent running, so the bridge hears its end (rolledback), after the switch.
    expect(recorded).toMatch(/^idle downloading verifying installing switching .*rolledback$/);
    machine.sh('systemctl reset-failed devcloud-agent devcloud-agent-rollback || true');
  }, 240_000);

  it('upgrades in place: configuration and state kept, the services restarted on the new code', async () => {
    machine.sh(`printf '# kept through upgrades\\n' >> /etc/devcloud/agent.yaml`);
    const id = machine.sh('cat /var/lib/devcloud/identity.json');
    const pid = agentPid();
    aptInstall(debs.agentUp);
    expect(machine.sh("dpkg-query -W -f '${Version}' devcloud-agent")).toBe(UPGRADE);
    await machine.waitFor(() => active('devcloud-agent') === 'active' && agentPid() !== pid, 'the restarted agent');
    expect(machine.sh('tail -1 /etc/devcloud/agent.yaml')).toBe('# kept through upgrades\n');
    expect(machine.sh('cat /var/lib/devcloud/identity.json')).toBe(id);
    expect(machine.sh('stat -c "%U:%G %a" /etc/devcloud/agent.yaml').trim()).toBe('root:devcloud 640');
    await machine.waitFor(
      () => /state\s+connected/.test(machine.run(['devcloud-agent', 'status']).stdout),
      'the upgraded agent to connect',
    );
    // The variable set before the upgrade is still there.
    expect(machine.sh('devcloud-agent var get greeting')).toContain('hello');
  }, 240_000);

  it('is removed keeping configuration and state, and purged without a trace', () => {
    machine.sh('apt-get remove -y -q devcloud-agent 2>&1', { timeoutMs: 120_000 });
    expect(active('devcloud-agent')).not.toBe('active');
    expect(existsSync(machine.path('usr/lib/devcloud-agent'))).toBe(false);
    expect(existsSync(machine.path('etc/devcloud/agent.yaml'))).toBe(true);
    expect(existsSync(machine.path('var/lib/devcloud/identity.json'))).toBe(true);
    machine.sh('apt-get purge -y -q devcloud-agent 2>&1', { timeoutMs: 120_000 });
    expect(existsSync(machine.path('etc/devcloud/agent.yaml'))).toBe(false);
    expect(existsSync(machine.path('var/lib/devcloud'))).toBe(false);
    // The bridge on the same machine is untouched.
    expect(existsSync(machine.path('etc/devcloud/bridge.yaml'))).toBe(true);
    expect(active('devcloud-bridge')).toBe('active');
  }, 240_000);
});
