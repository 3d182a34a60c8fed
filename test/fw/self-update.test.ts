/**
 * The agent's own update (`firmware.restart: agent`), end to end with a live bridge: after the switch the agent
 * stops itself and leaves the restart to its service manager (exit status 75); the next start finishes the update.
 * When the new agent does not come up, systemd's `OnFailure=` runs `devcloud-agent fw rollback` on the state
 * directory with no agent running; the agent started after that reports the rollback.
 */
import { randomBytes } from 'node:crypto';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { activeSlot } from '../../agent/fw/slots.js';
import { type AgentProcess, type TestAgent, spawnAgent, startAgent, tempDir, waitForSocket } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type SigningKeys, addToCatalog, buildImage, fwStates, makeKeys, metaOf } from '../support/firmware.js';
import { until } from '../support/wait.js';

const NAME = 'gateways/linux-x64/devcloud-agent';
const FULL_RUN = ['idle', 'downloading', 'verifying', 'installing', 'switching', 'restarting', 'committing', 'done'];
const dirs: string[] = [];

function dir(prefix: string): string {
  const d = tempDir(prefix);
  dirs.push(d);
  return d;
}

describe("the agent's own update", () => {
  let live: LiveBridge;
  let web: HttpClient;
  let keys: SigningKeys;
  const agents: TestAgent[] = [];
  const procs: AgentProcess[] = [];

  beforeAll(async () => {
    live = await startLiveBridge();
    const work = dir('devcloud-fw-self-');
    keys = makeKeys(work);
    const image = buildImage(
      { name: 'devcloud-agent', version: 5, files: { 'bin/agent.js': randomBytes(20_000).toString('base64') } },
      work,
    );
    await addToCatalog(live.bridge.store, image, { name: NAME, version: 5 }, keys);
    web = live.client();
    await web.post('/0/session/signup', { form: { login: 'fw-self@example.com', password: 'correct horse battery' } });
  });

  afterEach(async () => {
    for (const a of agents.splice(0)) await a.stop();
    for (const p of procs.splice(0)) await p.kill9();
  });

  afterAll(async () => {
    await live?.close();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  /** An in-process agent whose own restart is counted instead of exiting the test's process. */
  async function agentOn(stateDir: string, extra: Record<string, unknown> = {}) {
    let restarts = 0;
    const a = await startAgent({
      mqttUrl: live.mqttUrl,
      stateDir,
      level: 'info',
      flags: { platform: 'linux-x64', 'firmware.publicKeys': [keys.publicFile], 'firmware.restart': 'agent', ...extra },
      onRestart: () => restarts++,
    });
    agents.push(a);
    return { a, restarts: () => restarts };
  }

  /** Claims the device that `deviceId` names and waits until it may take an update. */
  async function claim(id: string, setMode: () => Promise<unknown>): Promise<void> {
    const store = live.bridge.store;
    const auth = await until(async () => (await store.devices.device(id))?.authcode ?? undefined, 'the hello');
    expect((await web.post('/0/devices/', { form: { auth } })).status).toBe(201);
    await setMode();
    await until(async () => (await store.devices.getVar(id, 'd', 'mode'))?.acked, 'mode connected on the bridge');
    await until(async () => (await metaOf(store, id, 'state')) === 'connected', 'the device online');
  }

  const startUpdate = async (id: string) => {
    const r = await web.post(`/0/devices/${id}/fw/${NAME}`);
    expect([r.status, r.body]).toEqual([200, 'device-ok']);
  };
  const fwstate = (id: string, state: string) =>
    until(async () => (await metaOf(live.bridge.store, id, 'fwstate')) === state, `fwstate ${state}`);

  /** A device updated up to the switch: the agent has stopped itself for the restart and is not running. */
  async function switchedAndStopped() {
    const stateDir = dir('devcloud-fw-self-agent-');
    const first = await agentOn(stateDir);
    const id = first.a.agent.identity.deviceId;
    await claim(id, () => first.a.agent.vars.set('d', 'mode', Buffer.from('connected')));
    await startUpdate(id);
    await until(() => first.restarts() === 1, 'the agent stopped for its restart');
    agents.splice(agents.indexOf(first.a), 1);
    await fwstate(id, 'restarting');
    const slots = join(stateDir, 'slots');
    expect(await activeSlot(slots)).toBe('b');
    return { id, stateDir, slots };
  }

  it('stops itself after the switch; the next start commits and reports done', async () => {
    const { id, stateDir, slots } = await switchedAndStopped();

    // What the service manager does on exit status 75: start the agent again, on the same state directory.
    const second = await agentOn(stateDir);
    expect(second.a.sink.events('fw.resume')).toMatchObject([{ state: 'restarting', attempt: 2 }]);
    await fwstate(id, 'done');
    expect(await fwStates(live.bridge.store, id)).toEqual(FULL_RUN);
    expect(await metaOf(live.bridge.store, id, 'fwversion')).toBe('5');
    expect(await activeSlot(slots)).toBe('b');
    expect(second.restarts()).toBe(0);
    expect(second.a.agent.firmware.store.latest()).toMatchObject({ state: 'done', restartPending: false });
    expect(await live.bridge.store.fwJobs.openOf(id)).toBeUndefined();
  });

  /** `devcloud-agent fw rollback --json` in this process, with the agent's firmware settings from a config file. */
  async function cliRollback(stateDir: string): Promise<{ code: number; out: string[]; err: string[] }> {
    const config = join(stateDir, 'rollback.json');
    writeFileSync(config, JSON.stringify({ firmware: { restart: 'agent' } }));
    const out: string[] = [];
    const err: string[] = [];
    const code = await runCli(
      ['fw', 'rollback', '--json', '--config', config, '--state-dir', stateDir],
      { out: (s) => out.push(s), err: (s) => err.push(s) },
      {},
    );
    return { code, out, err };
  }

  const failures: Array<{ when: string; stuck?: (stateDir: string) => Promise<void> }> = [
    { when: 'the new agent never starts (restarting)' },
    {
      when: 'the new agent hangs in its health check (committing)',
      // A start that never gets healthy, stopped as systemd would stop a unit it gives up on.
      stuck: async (stateDir) => {
        const hung = await agentOn(stateDir, {
          'firmware.health.command': ['sleep', '30'],
          'firmware.health.timeoutMs': 60_000,
          'firmware.health.retries': 0,
        });
        await until(() => hung.a.sink.events('fw.health_check').length > 0, 'the health check running');
        await fwstate(hung.a.agent.identity.deviceId, 'committing');
        agents.splice(agents.indexOf(hung.a), 1);
        await hung.a.stop();
      },
    },
  ];

  it.each(failures)(
    'rolls back from the state directory when $when; the next start reports rolledback',
    async ({ stuck }) => {
      const { id, stateDir, slots } = await switchedAndStopped();
      await stuck?.(stateDir);

      // systemd's OnFailure=: the rollback without an agent running.
      const r = await cliRollback(stateDir);
      expect(r.code).toBe(0);
      expect(r.err.join('\n')).toContain('the agent is not running');
      const status = JSON.parse(r.out.join('\n')) as { state: string; activeSlot: string; version: string };
      expect(status).toMatchObject({ state: 'rolledback', activeSlot: 'a', version: '0' });
      expect(await activeSlot(slots)).toBe('a');

      // The agent started after the rollback reports it, and does not restart again.
      const next = await agentOn(stateDir);
      await fwstate(id, 'rolledback');
      expect(await metaOf(live.bridge.store, id, 'fwerror')).toContain('rolled back by hand');
      expect(await metaOf(live.bridge.store, id, 'fwversion')).toBe('0');
      expect((await fwStates(live.bridge.store, id)).slice(-2)).toEqual([
        stuck ? 'committing' : 'restarting',
        'rolledback',
      ]);
      expect(next.restarts()).toBe(0);
      expect(next.a.agent.firmware.store.latest()).toMatchObject({ state: 'rolledback', restartPending: false });
      expect(await activeSlot(slots)).toBe('a');
      expect(await live.bridge.store.fwJobs.openOf(id)).toBeUndefined();
    },
  );

  it('as a real process: exits with status 75 after the switch; started again, it reports done', async () => {
    const stateDir = dir('devcloud-fw-self-proc-');
    const config = join(stateDir, 'agent.json');
    writeFileSync(config, JSON.stringify({ platform: 'linux-x64', firmware: { restart: 'agent' } }));
    const args = [
      '--state-dir',
      stateDir,
      '--config',
      config,
      '--mqtt-url',
      live.mqttUrl,
      '--udp-port',
      '0',
      '--log-pretty',
      'never',
      '--fw-public-key',
      keys.publicFile,
    ];
    const first = spawnAgent(args);
    procs.push(first);
    const c = await waitForSocket(first.socket, 30_000);
    const { deviceId: id } = await c.status<{ deviceId: string }>();
    await claim(id, () => c.set('d', 'mode', 'connected'));
    c.close();
    await startUpdate(id);
    expect(await first.exited).toEqual({ code: 75, signal: null });
    await fwstate(id, 'restarting');

    const second = spawnAgent(args);
    procs.push(second);
    await fwstate(id, 'done');
    expect(await fwStates(live.bridge.store, id)).toEqual(FULL_RUN);
    expect(await activeSlot(join(stateDir, 'slots'))).toBe('b');
    expect(second.proc.exitCode).toBeNull();
  });
});
