/**
 * Commands across crashes, with real processes killed by SIGKILL:
 * - the agent killed while one command runs and others wait: the running one is reported failed
 *   ("interrupted"), the waiting ones run exactly once each after the restart, in their order;
 * - the bridge killed while a command runs, and right after it answered a POST: on the device's next hello the
 *   bridge hands its open commands over again, and the agent answers the repeat without running it again.
 */
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { QueueJson } from '../../agent/local/messages.js';
import {
  type AgentProcess,
  type TestAgent,
  agentCli,
  spawnAgent,
  startAgent,
  tempDir,
  waitForSocket,
} from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type BridgeProcess, spawnBridge } from '../support/bridge-process.js';
import { freePort } from '../support/brokers.js';
import { missing } from '../support/system.js';
import { type Cmd, FINAL_STATES, newIdentity, runsIn, until, writeHandlers } from './support.js';

async function signupAndClaim(http: HttpClient, authcode: string, deviceId: string): Promise<void> {
  const signup = await http.post('/0/session/signup', {
    form: { login: 'faults@example.com', password: 'correct horse battery' },
  });
  expect(signup.status).toBe(201);
  const claim = await until(async () => {
    const r = await http.post('/0/devices/', { form: { auth: authcode } });
    return r.status === 201 ? r : undefined;
  }, 'the claim');
  expect(claim.body).toBe(deviceId);
}

/** The command's state, or `undefined` while the bridge is away. */
async function getCmd(http: HttpClient, deviceId: string, cmd: string): Promise<Cmd | undefined> {
  try {
    const r = await http.get(`/0/devices/${deviceId}/commands/${cmd}`);
    return r.status === 200 ? (JSON.parse(r.body) as Cmd) : undefined;
  } catch {
    return undefined;
  }
}

function finished(http: HttpClient, deviceId: string, cmd: string): Promise<Cmd> {
  return until(async () => {
    const c = await getCmd(http, deviceId, cmd);
    return c && FINAL_STATES.includes(c.state) ? c : undefined;
  }, `command ${cmd} to finish`);
}

async function post(http: HttpClient, deviceId: string, command: string, priority = '0'): Promise<string> {
  const r = await http.post(`/0/devices/${deviceId}/`, { form: { command, priority } });
  expect(r.status, r.body).toBe(200);
  return r.body;
}

describe('commands across crashes', () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  function workFolder(): { work: string; handlers: string } {
    const work = tempDir('devcloud-cmd-work-');
    const handlers = join(work, 'handlers');
    writeHandlers(handlers, work);
    cleanups.push(() => {
      // Lets go of a handler the killed agent left behind, then removes the folder (which also ends it).
      writeFileSync(join(work, 'release-all'), '');
      rmSync(work, { recursive: true, force: true });
    });
    return { work, handlers };
  }

  /**
   * A bridge and an agent run as a real process on a state folder that outlives it, with the test handlers,
   * claimed by a user: `spawn()` starts the agent (again) on the same folder.
   */
  async function claimedAgentProcess(
    level: string,
    env: Record<string, string> = {},
  ): Promise<{
    bridge: LiveBridge;
    work: string;
    deviceId: string;
    http: ReturnType<LiveBridge['client']>;
    spawn: () => AgentProcess;
    first: AgentProcess;
  }> {
    const bridge: LiveBridge = await startLiveBridge();
    cleanups.push(() => bridge.close());
    const { work, handlers } = workFolder();
    const identity = newIdentity();
    const provision = join(work, 'provision.json');
    writeFileSync(provision, JSON.stringify(identity), { mode: 0o600 });
    const config = join(work, 'agent.json');
    writeFileSync(config, JSON.stringify({ mqtt: { backoffMinMs: 50, backoffMaxMs: 500 } }));
    const stateDir = tempDir('devcloud-cmd-agent-');
    cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
    const procs: AgentProcess[] = [];
    cleanups.push(async () => {
      for (const p of procs) await p.kill9();
    });
    const spawn = () => {
      const p = spawnAgent(
        [
          'run',
          '--state-dir',
          stateDir,
          '--mqtt-url',
          bridge.mqttUrl,
          '--udp-port',
          '0',
          '--commands-dir',
          handlers,
          '--provision',
          provision,
          '--log-level',
          level,
          '--log-pretty',
          'never',
          '--config',
          config,
        ],
        { CONFIGURATION_DIRECTORY: work, ...env },
      );
      procs.push(p);
      return p;
    };
    const first = spawn();
    (await waitForSocket(first.socket)).close();
    const { deviceId } = identity;
    const http = bridge.client();
    await until(async () => (await bridge.bridge.store.devices.device(deviceId))?.authcode ?? undefined, 'the hello');
    await signupAndClaim(http, identity.authcode, deviceId);
    return { bridge, work, deviceId, http, spawn, first };
  }

  it('kill -9 of the agent: the running command is interrupted, the queued ones run once each', async () => {
    const { work, deviceId, http, spawn, first } = await claimedAgentProcess('warn');

    const running = await post(http, deviceId, 'block first');
    await until(async () => (await getCmd(http, deviceId, running))?.state === 'running', 'first running');
    await until(() => runsIn(work).includes('first'), 'the first handler started');
    const waiting: Array<[string, string]> = [
      ['rec a', '0'],
      ['rec b', '2'],
      ['rec c', '1'],
      ['rec d', '0'],
    ];
    const ids = new Map<string, string>();
    for (const [command, priority] of waiting) ids.set(command, await post(http, deviceId, command, priority));
    for (const id of ids.values()) {
      await until(async () => (await getCmd(http, deviceId, id))?.delivered ?? undefined, `${id} delivered`);
    }

    await first.kill9();
    expect((await first.exited).signal).toBe('SIGKILL');
    const second = spawn();

    const interrupted = await finished(http, deviceId, running);
    expect(interrupted.state).toBe('failed');
    expect(interrupted.reason).toMatch(/^interrupted/);
    const outcomes = await Promise.all([...ids.values()].map((id) => finished(http, deviceId, id)));
    expect(outcomes.map((c) => c.state)).toEqual(['done', 'done', 'done', 'done']);
    expect(runsIn(work)).toEqual(['first', 'b', 'c', 'a', 'd']);

    // What the gateway's engineer sees: nothing left to run; the history with the interrupted one.
    const shown = await agentCli(['queue', '--json', '--socket', second.socket], { CONFIGURATION_DIRECTORY: work });
    expect(shown.code, shown.stderr).toBe(0);
    const q = JSON.parse(shown.stdout) as QueueJson;
    expect([q.running, q.queued]).toEqual([[], []]);
    expect(q.recent.map((c) => [c.command, c.state])).toEqual([
      ['rec d', 'done'],
      ['rec c', 'done'],
      ['rec b', 'done'],
      ['rec a', 'done'],
      ['block first', 'failed'],
    ]);
    expect(runsIn(work)).toEqual(['first', 'b', 'c', 'a', 'd']);
  });

  /** Whether a process is alive: a zombie left for init to reap counts as gone. */
  function alive(pid: number): boolean {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
    } catch {
      return false;
    }
  }

  /**
   * A handler dies with the agent (docs/agent.md, the command runner). With util-linux's `setpriv` on the agent's
   * PATH the kernel kills the handler the moment the agent dies; without it, the restarted agent kills the
   * process group that survived. Either way the handler's file never appears and the command is reported
   * interrupted.
   */
  const killedWithTheAgent = async (agentPath: string, pdeathsig: boolean) => {
    const { work, deviceId, http, spawn, first } = await claimedAgentProcess('info', { PATH: agentPath });

    // Far longer than a restart of the agent takes, even on a busy machine: the handler is ended long before its
    // work would be done.
    const delayMs = 60_000;
    const cmd = await post(http, deviceId, `slow ${delayMs / 1000}`);
    // The shell creates each file before it writes the pid into it: wait for the numbers, not the names.
    const pidIn = (name: string) => {
      const text = existsSync(join(work, name)) ? readFileSync(join(work, name), 'utf8') : '';
      return /^\d+\n$/.test(text) ? Number(text) : undefined;
    };
    const { pid, child } = await until(() => {
      const [p, c] = [pidIn('slow.pid'), pidIn('slow-child.pid')];
      return p !== undefined && c !== undefined ? { pid: p, child: c } : undefined;
    }, 'the handler to start');
    const startedAt = Date.now();
    expect(alive(pid) && alive(child)).toBe(true);

    await first.kill9();
    if (pdeathsig) {
      // The kernel ends the handler with its parent; its child in the group is left to the agent's next start.
      await until(() => !alive(pid), 'the handler to die with the agent', 5000);
    } else {
      // Nothing ends it: it is still at work when the agent is gone.
      expect(alive(pid)).toBe(true);
    }
    const second = spawn();
    (await waitForSocket(second.socket)).close();
    await until(() => !alive(pid) && !alive(child), 'the handler and its child to be gone');
    expect(Date.now() - startedAt).toBeLessThan(delayMs);

    const report = await finished(http, deviceId, cmd);
    expect(report.state).toBe('failed');
    expect(report.reason).toMatch(/^interrupted: the agent stopped while it ran/);
    // The handler and its child are gone, so nothing is left that could write its file: there is none.
    expect(existsSync(join(work, 'slow.out'))).toBe(false);
    expect(second.output()).toMatch(/"event":"cmd\.interrupted"/);
  };
  it.skipIf(missing('setpriv'))('kill -9 of the agent, setpriv on PATH: killed with the agent', () =>
    killedWithTheAgent(process.env.PATH ?? '/usr/bin:/bin', true),
  );
  it('kill -9 of the agent, no setpriv: killed when the agent starts again', () =>
    killedWithTheAgent('/nonexistent', false));

  it('kill -9 of the bridge: commands handed over again on hello run once', async () => {
    const dataDir = tempDir('devcloud-bridge-');
    const ports = { dataDir, httpPort: await freePort(), mqttPort: await freePort() };
    let bridge: BridgeProcess = await spawnBridge(ports);
    cleanups.push(async () => {
      await bridge.stop();
      rmSync(dataDir, { recursive: true, force: true });
    });
    const { work, handlers } = workFolder();
    const agent: TestAgent = await startAgent({ mqttUrl: bridge.mqttUrl, flags: { 'commands.dir': handlers } });
    cleanups.push(async () => {
      await agent.stop();
      rmSync(agent.config.stateDir, { recursive: true, force: true });
    });
    const { deviceId, authcode } = agent.agent.identity;
    // The ports stay across restarts: one client (and its session) serves every bridge.
    const http = bridge.client();
    await signupAndClaim(http, authcode, deviceId);
    const counters = agent.agent.commands.counters;

    // Killed while the handler runs: the bridge has it sent or running, never finished.
    const once = await post(http, deviceId, 'block once');
    await until(() => runsIn(work).includes('once'), 'the handler started');
    await bridge.kill9();
    const repeats = counters.duplicates;
    bridge = await spawnBridge(ports);
    await until(() => counters.duplicates > repeats, 'the command handed over again on hello');
    await until(async () => (await getCmd(http, deviceId, once))?.state === 'running', 'once running on the bridge');
    writeFileSync(join(work, 'release-once'), '');
    expect(await finished(http, deviceId, once)).toMatchObject({ state: 'done', output: 'released once\n' });
    expect(runsIn(work)).toEqual(['once']);

    // Killed right after it answered: whether or not the command went out, it runs once.
    const twice = await post(http, deviceId, 'rec twice');
    await bridge.kill9();
    bridge = await spawnBridge(ports);
    expect((await finished(http, deviceId, twice)).state).toBe('done');
    // Anything handed over again went before this one, and was answered, not run.
    expect((await finished(http, deviceId, await post(http, deviceId, 'ping'))).state).toBe('done');
    expect(runsIn(work)).toEqual(['once', 'twice']);
    expect(agent.agent.queue.get(twice)?.state).toBe('done');
  });
});
