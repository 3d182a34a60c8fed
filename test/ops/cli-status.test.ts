/**
 * `devcloud-agent status` and `queue` on a seeded state directory: with the agent running (through its socket)
 * and after it stopped (read from the state directory). The state is seeded by a real agent: two commands from
 * the cloud (one done, one failed), then a change made while the broker is down (pending), which also leaves a
 * warning in the agent's ring of last errors.
 */
import { randomUUID } from 'node:crypto';
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { type CmdMessage, messageId } from '../../protocol/index.js';
import { createLogger, recentProblems } from '../../lib/log.js';
import { LogSink, type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type TestBroker, startAedes } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { until } from '../support/wait.js';

const etc = tempDir('devcloud-etc-');

async function cli(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  // An empty configuration folder: the machine's own /etc/devcloud stays out of it.
  const code = await runCli(
    args,
    { out: (s) => out.push(s), err: (s) => err.push(s) },
    { CONFIGURATION_DIRECTORY: etc },
  );
  return { code, out: out.join('\n'), err: err.join('\n') };
}

function command(text: string): { cmd: string; payload: CmdMessage } {
  const cmd = randomUUID();
  const now = Date.now();
  return {
    cmd,
    payload: {
      id: messageId(),
      cmd,
      command64: Buffer.from(text).toString('base64'),
      priority: 0,
      created: now,
      expires: now + 3_600_000,
    },
  };
}

describe('status and queue on a seeded state directory', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let a: TestAgent;
  let stateDir: string;
  let args: string[];
  const ping = command('ping');
  const nosuch = command('nosuch');

  beforeAll(async () => {
    broker = await startAedes();
    cloud = await FakeCloud.start(broker.url);
    stateDir = tempDir();
    a = await startAgent({ mqttUrl: broker.url, stateDir });
    args = ['--state-dir', stateDir, '--mqtt-url', broker.url];
    const id = a.agent.identity.deviceId;
    await until(() => a.agent.uplink.connected, 'the agent connected');
    cloud.publish(id, 'down/cmd', ping.payload);
    cloud.publish(id, 'down/cmd', nosuch.payload);
    await until(() => {
      const c = a.agent.queue.counts();
      return c.done === 1 && c.failed === 1;
    }, 'both commands finished');
    // The cloud's answer to the hello carries its clock; the status below shows it learnt.
    await until(() => a.agent.clock.status().source === 'cloud', "the cloud's clock learnt");
    await cloud.close();
    await broker.stop();
    await until(() => !a.agent.uplink.connected, 'the agent saw the broker go');
    const client = await a.client();
    await client.set('d', 'temp', '21.5');
    client.close();
  });

  afterAll(async () => {
    await a?.stop();
    await broker?.close();
    rmSync(stateDir, { recursive: true, force: true });
    rmSync(etc, { recursive: true, force: true });
  });

  it('status of the running agent: identity, connection, pending, queue, firmware, last errors', async () => {
    const { identity } = a.agent;
    const r = await cli(['status', ...args]);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^devcloud-agent: running for \d+/);
    expect(r.out).toMatch(new RegExp(`^  device id +${identity.deviceId}$`, 'm'));
    expect(r.out).toMatch(new RegExp(`^  auth code +${identity.authcode.slice(0, 6)}… `, 'm'));
    expect(r.out).toMatch(/^ {2}versions +agent \d+\.\d+\.\d+, firmware 0$/m);
    expect(r.out).toMatch(new RegExp(`^  broker +mqtt://127\\.0\\.0\\.1:${broker.port}$`, 'm'));
    expect(r.out).toMatch(/^ {2}state +disconnected \(1 connects since start\)$/m);
    expect(r.out).toMatch(/^ {2}mode +master$/m);
    // It learnt the cloud's clock from the cloud's messages before the cloud went away.
    expect(r.out).toMatch(/^ {2}clock +the cloud's: \+0s from the gateway's own, learnt \d+s ago$/m);
    expect(r.out).toMatch(/^ {2}pending +1 changes to push, 0 syncs$/m);
    expect(r.out).toMatch(/^ {2}queue +0 queued, 0 running, 1 done, 1 failed, 0 expired$/m);
    expect(r.out).toMatch(/^ {2}since start +2 received, 0 duplicates, 1 ran, 1 failed, 0 expired$/m);
    expect(r.out).toMatch(/^firmware\n {2}state +idle\n {2}version +0 \(running\)$/m);
    expect(r.out).toMatch(/^ {2}job +none received$/m);
    // The broker going away is a warning the ring kept.
    expect(r.out).toMatch(/^last warnings and errors \(\d+\)$/m);
    expect(r.out).toMatch(/^ {2}\S+ WARN +mqtt\.disconnected url=mqtt:\/\/127\.0\.0\.1:\d+$/m);
    // The auth code is a capability and the secret the broker password: neither is shown whole.
    expect(r.out).not.toContain(identity.authcode);
    expect(r.out).not.toContain(identity.secret);

    const j = await cli(['status', '--json', ...args]);
    expect(j.code).toBe(0);
    const s = JSON.parse(j.out) as Record<string, unknown>;
    expect(s).toMatchObject({
      deviceId: identity.deviceId,
      authcodePrefix: identity.authcode.slice(0, 6),
      state: 'disconnected',
      pending: { pushes: 1, syncs: 0 },
      commands: { queue: { done: 1, failed: 1 } },
      firmware: { state: 'idle' },
    });
    const problems = s.lastErrors as Array<{ level: string; event: string }>;
    expect(problems.map((p) => p.event)).toContain('mqtt.disconnected');
    expect(problems.every((p) => p.level === 'warn' || p.level === 'error' || p.level === 'fatal')).toBe(true);
    expect(j.out).not.toContain(identity.secret);
  });

  it('queue of the running agent', async () => {
    const r = await cli(['queue', ...args]);
    expect(r.code).toBe(0);
    expect(r.err).toBe('');
    expect(r.out).toMatch(/^running \(0\)\nqueued, in run order \(0\)\nrecent \(2\)$/m);
    expect(r.out).toMatch(new RegExp(`^  ${ping.cmd} +p0 +done .* ping exit 0$`, 'm'));
    expect(r.out).toMatch(new RegExp(`^  ${nosuch.cmd} +p0 +failed .* nosuch \\(unknown command nosuch`, 'm'));
  });

  it('status and queue from the state directory once the agent has stopped', async () => {
    await a.stop();
    const { identity } = a.agent;

    const r = await cli(['status', ...args]);
    expect(r.code).toBe(3);
    expect(r.out).toMatch(new RegExp(`^devcloud-agent: not running \\(nothing answers on ${stateDir}/agent\\.sock\\)`));
    expect(r.out).toMatch(new RegExp(`^  device id +${identity.deviceId}$`, 'm'));
    expect(r.out).toMatch(new RegExp(`^  auth code +${identity.authcode.slice(0, 6)}… `, 'm'));
    expect(r.out).toMatch(/^ {2}state +not running$/m);
    expect(r.out).toMatch(/^ {2}mode +master$/m);
    expect(r.out).toMatch(/^ {2}pending +1 changes to push, 0 syncs$/m);
    expect(r.out).toMatch(/^ {2}queue +0 queued, 0 running, 1 done, 1 failed, 0 expired$/m);
    expect(r.out).toMatch(/^firmware\n {2}state +idle$/m);
    expect(r.out).not.toContain(identity.authcode);

    const j = await cli(['status', '--json', ...args]);
    expect(j.code).toBe(3);
    expect(JSON.parse(j.out)).toMatchObject({
      running: false,
      stateDir,
      deviceId: identity.deviceId,
      authcodePrefix: identity.authcode.slice(0, 6),
      mode: 'master',
      pending: { pushes: 1, syncs: 0 },
      commands: { queue: { done: 1, failed: 1 } },
      firmware: { state: 'idle', job: null },
      problems: [],
    });

    const q = await cli(['queue', ...args]);
    expect(q.code).toBe(0);
    expect(q.err).toMatch(/the agent is not running; read from/);
    expect(q.out).toMatch(new RegExp(`^  ${ping.cmd} +p0 +done .* ping exit 0$`, 'm'));
    expect(q.out).toMatch(new RegExp(`^  ${nosuch.cmd} +p0 +failed `, 'm'));
    const qj = await cli(['queue', '--json', '--recent', '1', ...args]);
    expect(qj.code).toBe(0);
    expect((JSON.parse(qj.out) as { recent: unknown[] }).recent).toHaveLength(1);
  });

  it('status and queue where no agent ever ran', async () => {
    const empty = tempDir();
    try {
      const r = await cli(['status', '--state-dir', `${empty}/none`]);
      expect(r.code).toBe(3);
      expect(r.out).toMatch(/^note: the state directory .*\/none does not exist/m);
      const q = await cli(['queue', '--state-dir', `${empty}/none`]);
      expect(q.code).toBe(3);
      expect(q.err).toMatch(/Is the agent running\?/);
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  });
});

describe('the ring of last warnings and errors', () => {
  it('keeps the last ten as logged (redacted), counts a line repeated right after instead of keeping it twice', () => {
    const sink = new LogSink();
    const log = createLogger({ level: 'info', pretty: 'never', base: { service: 't' }, destination: sink });
    log.info({ event: 'quiet.info' });
    log.warn({ event: 'first.warn', password: 'hunter2-secret', detail: 'x'.repeat(1000) });
    for (let i = 0; i < 3; i++) log.warn({ event: 'mqtt.error', err: 'connect ECONNREFUSED' });
    log.child({ part: 'c' }).error({ event: 'child.error' });
    const got = recentProblems(log);
    expect(got.map((p) => [p.event, p.level, p.count])).toEqual([
      ['first.warn', 'warn', 1],
      ['mqtt.error', 'warn', 3],
      ['child.error', 'error', 1],
    ]);
    expect(got[0]!.fields.password).toBe('[redacted]');
    expect(String(got[0]!.fields.detail).length).toBeLessThan(310);
    expect(JSON.stringify(got)).not.toContain('hunter2');
    // Every line still reaches the log itself, whatever the ring keeps.
    expect(sink.lines.map((l) => l.event)).toEqual([
      'quiet.info',
      'first.warn',
      'mqtt.error',
      'mqtt.error',
      'mqtt.error',
      'child.error',
    ]);
    for (let i = 0; i < 12; i++) log.error({ event: `e${i}` });
    expect(recentProblems(log).map((p) => p.event)).toEqual([
      'e2',
      'e3',
      'e4',
      'e5',
      'e6',
      'e7',
      'e8',
      'e9',
      'e10',
      'e11',
    ]);
  });
});
