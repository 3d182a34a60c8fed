/**
 * The agent process as systemd runs it: a clean stop on SIGTERM and SIGINT (retained `offline`, exit 0 within
 * the 5 s the CLI allows, data kept), the last will after `kill -9`, and logs a field engineer can use: one
 * `event` and the device id on every line, no secrets, the level changed at runtime (docs/decisions.md, principle 10).
 */
import { createSocket } from 'node:dgram';
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Identity } from '../../agent/identity.js';
import { type TestBroker, type BrokerKind, brokerKinds, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import {
  type AgentProcess,
  type TestAgent,
  agentCli,
  spawnAgent,
  startAgent,
  tempDir,
  waitForSocket,
} from '../support/agent.js';

const dirs: string[] = [];
function fresh(): string {
  const d = tempDir('devcloud-lifecycle-');
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

type Line = Record<string, unknown>;

/** The JSON log lines a process wrote to stdout. */
function jsonLines(output: string): Line[] {
  return output
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);
}

/** Every line names its event; every line from the identity on names the device. */
function expectWellFormed(lines: Line[], deviceId: string): void {
  expect(lines.length).toBeGreaterThan(0);
  for (const line of lines)
    expect(typeof line.event === 'string' && line.event.length > 0, JSON.stringify(line)).toBe(true);
  const from = lines.findIndex((l) => l.event === 'agent.identity');
  expect(from).toBeGreaterThanOrEqual(0);
  for (const line of lines.slice(from)) expect(line.deviceId, JSON.stringify(line)).toBe(deviceId);
}

interface Running {
  p: AgentProcess;
  id: string;
}

describe.each<BrokerKind>(brokerKinds())('the agent process with %s', (kind) => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  const procs: AgentProcess[] = [];

  beforeAll(async () => {
    broker = await startBroker(kind);
    cloud = await FakeCloud.start(broker.url);
  });
  afterEach(async () => {
    // Whatever a failed test left running.
    for (const p of procs.splice(0)) await p.kill9();
  });
  afterAll(async () => {
    await cloud?.close();
    await broker?.close();
  });

  /** What a subscriber that comes later sees: the retained state. */
  async function retainedState(id: string, expected: string): Promise<void> {
    const late = await FakeCloud.start(broker.url);
    try {
      await late.until(() => late.device(id).state === expected, `retained ${expected}`);
    } finally {
      await late.close();
    }
  }

  async function run(stateDir: string): Promise<Running> {
    const p = spawnAgent([
      '--state-dir',
      stateDir,
      '--mqtt-url',
      broker.url,
      '--udp-port',
      '0',
      '--log-pretty',
      'never',
    ]);
    procs.push(p);
    const client = await waitForSocket(p.socket, 30_000);
    const { deviceId } = await client.status<{ deviceId: string }>();
    client.close();
    await cloud.until(() => cloud.device(deviceId).state === 'online', 'state online');
    return { p, id: deviceId };
  }

  it.each(['SIGTERM', 'SIGINT'] as const)('on %s publishes offline, exits 0 and keeps its data', async (signal) => {
    const stateDir = fresh();
    const { p, id } = await run(stateDir);
    const client = await waitForSocket(p.socket);
    await client.set('d', 'kept', `before ${signal}`);
    await client.set('s', 'local', 'only on the gateway');
    client.close();
    await cloud.until(() => cloud.value(id, 'kept') === `before ${signal}`, 'the change reached the cloud');

    p.proc.kill(signal);
    // The CLI exits 1 when a stop takes longer than 5 s, so 0 also says it stopped in time.
    expect(await p.exited).toEqual({ code: 0, signal: null });
    await cloud.until(() => cloud.device(id).state === 'offline', 'state offline');
    await retainedState(id, 'offline');
    const lines = jsonLines(p.output());
    const { secret, authcode } = JSON.parse(readFileSync(join(stateDir, 'identity.json'), 'utf8')) as Identity;
    expect(p.output()).not.toContain(secret);
    expect(p.output()).not.toContain(authcode);
    expectWellFormed(lines, id);
    expect(lines.find((l) => l.event === 'agent.signal')).toMatchObject({ signal });
    expect(lines.map((l) => l.event)).toContain('agent.stopped');
    expect(lines.map((l) => l.event)).not.toContain('agent.stop_timeout');

    // The same device comes back with its variables.
    const again = await run(stateDir);
    expect(again.id).toBe(id);
    const c2 = await waitForSocket(again.p.socket);
    expect((await c2.get('d', 'kept')).value).toBe(`before ${signal}`);
    expect((await c2.get('s', 'local')).value).toBe('only on the gateway');
    c2.close();
    again.p.proc.kill('SIGTERM');
    expect((await again.p.exited).code).toBe(0);
  });

  it('after kill -9 the last will says offline', async () => {
    const { p, id } = await run(fresh());
    await p.kill9();
    expect(p.proc.signalCode).toBe('SIGKILL');
    await cloud.until(() => cloud.device(id).state === 'offline', 'last will');
    await retainedState(id, 'offline');
    // No clean stop happened: the offline came from the broker.
    expect(jsonLines(p.output()).map((l) => l.event)).not.toContain('agent.stopping');
  });
});

describe('agent logs', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent | undefined;

  beforeAll(async () => {
    broker = await startBroker('aedes');
    cloud = await FakeCloud.start(broker.url);
  });
  afterEach(async () => {
    await agent?.stop();
    agent = undefined;
  });
  afterAll(async () => {
    await cloud?.close();
    await broker?.close();
  });

  it('never hold the device secret, the broker password or auth codes, even at debug level', async () => {
    const stateDir = fresh();
    const password = `pw-${randomBytes(12).toString('hex')}`;
    const urlPassword = `url-${randomBytes(12).toString('hex')}`;
    const userCode = randomBytes(16).toString('hex');

    // First run: the device secret is the broker password.
    agent = await startAgent({ mqttUrl: broker.url, stateDir, level: 'debug' });
    const first = agent;
    const identity = first.agent.identity;
    const id = identity.deviceId;
    await cloud.until(() => first.agent.uplink.connected, 'connected');
    const c = await first.client();
    await c.set('d', 'led', 'on');
    await c.status();
    c.close();
    const pushed = cloud.set(id, 'fan', 'high');
    await cloud.until(() => (cloud.get(id, 'fan')?.acked ?? 0) >= pushed.time, 'cloud push acked');
    await cloud.until(() => (first.agent.vars.get('d', 'led')?.acked ?? 0) > 0, 'local change acked');
    // A user's authcode heard on UDP, and a payload the agent drops.
    const udp = createSocket('udp4');
    udp.send(`${userCode}\n`, first.agent.nearby.port, '127.0.0.1');
    await cloud.until(() => cloud.device(id).heard.some((h) => h.authcode === userCode), 'authcode reported');
    udp.close();
    await cloud.publishRaw(id, 'down/vars', '{"id":"x","items":[{"secret":"nope"}]}');
    await cloud.until(() => first.agent.uplink.dropped.invalid === 1, 'invalid payload dropped');
    await first.stop();
    agent = undefined;

    // Second run: the password comes from the config, and the URL carries credentials too.
    const url = broker.url.replace('mqtt://', `mqtt://gateway:${urlPassword}@`);
    agent = await startAgent({ mqttUrl: url, stateDir, level: 'debug', flags: { 'mqtt.password': password } });
    const second = agent;
    expect(second.agent.identity).toEqual(identity);
    await cloud.until(() => second.agent.uplink.connected, 'connected');
    // A broker restart: disconnect, errors and reconnects are logged with the broker URL.
    await broker.stop();
    await cloud.until(() => !second.agent.uplink.connected, 'disconnected');
    await broker.start();
    await cloud.until(() => second.agent.uplink.connected && second.agent.uplink.connects >= 2, 'reconnected');
    const c2 = await second.client();
    await c2.set('d', 'led', 'off');
    c2.close();
    await second.stop();
    agent = undefined;

    for (const sink of [first.sink, second.sink]) {
      const text = sink.text();
      // Debug was on and the story was told.
      expect(sink.lines.some((l) => l.level === 'debug')).toBe(true);
      expect(sink.events('mqtt.connected').length).toBeGreaterThan(0);
      for (const secret of [identity.secret, identity.authcode, password, urlPassword, userCode]) {
        expect(text).not.toContain(secret);
      }
      expectWellFormed(sink.lines, id);
    }
    expect(second.sink.events('mqtt.disconnected').length).toBeGreaterThan(0);
    expect(first.sink.events('mqtt.drop').length).toBe(1);
  });

  it('change level at runtime, through the CLI and the socket, without a restart', async () => {
    agent = await startAgent({ mqttUrl: broker.url, level: 'info' });
    const running = agent;
    const debugLines = () => running.sink.lines.filter((l) => l.level === 'debug');
    const changed = (name: string) =>
      running.sink.events('vars.local_change').filter((l) => l.name === name).length > 0;
    const c = await running.client();

    await c.set('d', 'before', '1');
    expect(debugLines()).toEqual([]);

    const cli = await agentCli(['log-level', 'debug', '--socket', running.socket]);
    expect(cli.code).toBe(0);
    expect(cli.stdout).toContain('log level is now debug');
    expect(running.sink.events('log.level_changed')).toMatchObject([{ level: 'debug' }]);

    await c.set('d', 'after', '2');
    expect(changed('after')).toBe(true);
    expect(changed('before')).toBe(false);

    await expect(c.request({ op: 'log-level', level: 'info' })).resolves.toEqual({ level: 'info' });
    await c.set('d', 'later', '3');
    expect(changed('later')).toBe(false);
    expect(running.agent.vars.get('d', 'later')).toBeDefined();

    // A level that does not exist is refused and changes nothing.
    await expect(c.request({ op: 'log-level', level: 'verbose' })).rejects.toMatchObject({ code: 'bad-request' });
    expect(running.log.level).toBe('info');
    c.close();
    expectWellFormed(running.sink.lines, running.agent.identity.deviceId);
  });
});
