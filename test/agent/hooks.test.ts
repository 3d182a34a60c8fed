/**
 * The change hook, run for real: a shell script that records the environment it was given, configured by flag
 * or config file, fed by changes from the cloud and from the gateway.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AGENT_OPTIONS, loadAgentConfig } from '../../agent/config.js';
import { ConfigError, parseArgs } from '../../lib/config.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';

type Run = Record<string, string>;

/**
 * Writes the hook into a folder whose name has a space (run through a shell, the path would be split and the
 * hook never found). Each run appends its whole
 * environment, NUL-separated, then a record separator. A value of `hang` makes it start a child and wait for
 * it, as a stuck script would; the child's pid goes to `child.pid`.
 */
function writeHook(dir: string): { exec: string; runs: () => Run[]; childPid: () => number | undefined } {
  const hookDir = join(dir, 'hook dir');
  mkdirSync(hookDir);
  const exec = join(hookDir, 'on-change');
  const out = join(dir, 'runs');
  const pidFile = join(dir, 'child.pid');
  writeFileSync(
    exec,
    [
      '#!/bin/sh',
      `{ env -0; printf '\\036'; } >> '${out}'`,
      'if [ "$DEVCLOUD_VAR_VALUE" = hang ]; then',
      '  sleep 300 &',
      `  echo $! > '${pidFile}'`,
      '  wait',
      'fi',
      '',
    ].join('\n'),
  );
  chmodSync(exec, 0o755);
  return {
    exec,
    runs: () => {
      if (!existsSync(out)) return [];
      return readFileSync(out, 'utf8')
        .split('\x1e')
        .filter((rec) => rec.length > 0)
        .map((rec) => {
          const vars: Run = {};
          for (const entry of rec.split('\0')) {
            const eq = entry.indexOf('=');
            if (eq > 0) vars[entry.slice(0, eq)] = entry.slice(eq + 1);
          }
          return vars;
        });
    },
    childPid: () => (existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8').trim()) : undefined),
  };
}

/** The `DEVCLOUD_` part of a run's environment. */
function devcloudVars(run: Run): Run {
  return Object.fromEntries(Object.entries(run).filter(([k]) => k.startsWith('DEVCLOUD_')));
}

function hookCounters(a: TestAgent): { ran: number; failed: number; dropped: number } {
  return a.agent.status().hook as { ran: number; failed: number; dropped: number };
}

/** Gone, or a zombie waiting for a parent that no longer cares. */
function processGone(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return true;
  }
}

describe('change hook', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent | undefined;
  let dir: string;
  let hook: ReturnType<typeof writeHook>;
  let id: string;

  beforeAll(async () => {
    broker = await startBroker('aedes');
    cloud = await FakeCloud.start(broker.url);
  });
  afterAll(async () => {
    await cloud?.close();
    await broker?.close();
  });
  afterEach(async () => {
    await agent?.stop();
    agent = undefined;
  });

  async function setup(flags: Record<string, unknown>): Promise<TestAgent> {
    agent = await startAgent({ mqttUrl: broker.url, flags });
    const a = agent;
    id = a.agent.identity.deviceId;
    await cloud.until(() => a.agent.uplink.connected, 'agent connected');
    return a;
  }

  function prepare(): string {
    dir = tempDir('devcloud-hook-');
    hook = writeHook(dir);
    return hook.exec;
  }

  const waitRuns = (n: number, what: string) => cloud.until(() => hook.runs().length >= n, what);

  it('runs for a cloud change with name, value, origin, type and time, and not for gateway changes', async () => {
    const exec = prepare();
    // Configured the way the command line does it.
    const args = parseArgs(['--change-hook', exec], AGENT_OPTIONS);
    expect(args.problems).toEqual([]);
    const a = await setup(args.flags);
    const c = await a.client();

    // A gateway change first: if it ran the hook, it would come before the cloud's (runs are in commit order).
    await c.set('d', 'fromgw', '1');
    await c.set('s', 'note', 'x');
    const sent = cloud.set(id, 'led', 'on');
    await waitRuns(1, 'hook ran');
    await cloud.until(() => hookCounters(a).ran === 1, 'run counted');
    c.close();

    const runs = hook.runs();
    expect(runs).toHaveLength(1);
    expect(devcloudVars(runs[0]!)).toEqual({
      DEVCLOUD_VAR_TYPE: 'd',
      DEVCLOUD_VAR_NAME: 'led',
      DEVCLOUD_VAR_VALUE: 'on',
      DEVCLOUD_VAR_ORIGIN: 'cloud',
      DEVCLOUD_VAR_TIME: String(sent.time),
    });
    expect(hookCounters(a)).toEqual({ ran: 1, failed: 0, dropped: 0 });
  });

  it('runs for gateway changes too with hooks.origins from the config file', async () => {
    const exec = prepare();
    const file = join(dir, 'agent.yaml');
    writeFileSync(file, `hooks:\n  change: '${exec}'\n  origins: [cloud, device]\n`);
    const a = await setup({ configFile: file });
    expect(a.config.hooks).toMatchObject({ change: exec, origins: ['cloud', 'device'] });
    const c = await a.client();

    const local = await c.set('d', 'temp', '21.5');
    await waitRuns(1, 'hook ran for the gateway change');
    await c.set('s', 'note', 'hello');
    await waitRuns(2, 'hook ran for the s variable');
    cloud.set(id, 'led', 'off');
    await waitRuns(3, 'hook ran for the cloud change');
    c.close();

    const runs = hook.runs().map(devcloudVars);
    expect(runs[0]).toEqual({
      DEVCLOUD_VAR_TYPE: 'd',
      DEVCLOUD_VAR_NAME: 'temp',
      DEVCLOUD_VAR_VALUE: '21.5',
      DEVCLOUD_VAR_ORIGIN: 'device',
      DEVCLOUD_VAR_TIME: String(local.time),
    });
    expect(runs[1]).toMatchObject({ DEVCLOUD_VAR_TYPE: 's', DEVCLOUD_VAR_NAME: 'note', DEVCLOUD_VAR_ORIGIN: 'device' });
    expect(runs[2]).toMatchObject({
      DEVCLOUD_VAR_NAME: 'led',
      DEVCLOUD_VAR_VALUE: 'off',
      DEVCLOUD_VAR_ORIGIN: 'cloud',
    });
  });

  it('tells a deletion and a binary value apart from a value', async () => {
    prepare();
    await setup({ 'hooks.change': hook.exec });

    cloud.set(id, 'led', 'on');
    await waitRuns(1, 'set');
    cloud.set(id, 'led', null);
    await waitRuns(2, 'delete');
    cloud.set(id, 'blob', Buffer.from([0xff, 0x00, 0x10]));
    await waitRuns(3, 'binary');
    // Valid UTF-8 with a NUL cannot go into an environment variable either.
    cloud.set(id, 'nul', Buffer.from('a\0b', 'utf8'));
    await waitRuns(4, 'NUL');

    const runs = hook.runs().map(devcloudVars);
    expect(runs[1]).toMatchObject({
      DEVCLOUD_VAR_NAME: 'led',
      DEVCLOUD_VAR_DELETED: '1',
      DEVCLOUD_VAR_ORIGIN: 'cloud',
    });
    expect(runs[1]).not.toHaveProperty('DEVCLOUD_VAR_VALUE');
    expect(runs[1]).not.toHaveProperty('DEVCLOUD_VAR_VALUE64');
    expect(runs[2]).toMatchObject({ DEVCLOUD_VAR_NAME: 'blob', DEVCLOUD_VAR_VALUE64: '/wAQ' });
    expect(runs[2]).not.toHaveProperty('DEVCLOUD_VAR_VALUE');
    expect(runs[2]).not.toHaveProperty('DEVCLOUD_VAR_DELETED');
    expect(runs[3]).toMatchObject({ DEVCLOUD_VAR_NAME: 'nul', DEVCLOUD_VAR_VALUE64: 'YQBi' });
    expect(runs[3]).not.toHaveProperty('DEVCLOUD_VAR_VALUE');
  });

  it('kills a hook that hangs, with what it started, warns, and runs the next change', async () => {
    // 100 ms is the least hooks.timeoutMs takes.
    const cfg = (timeoutMs: number) => () =>
      loadAgentConfig({ flags: { stateDir: '/nonexistent', 'hooks.timeoutMs': timeoutMs }, env: {} });
    expect(cfg(99)).toThrow(ConfigError);
    expect(cfg(100)().hooks.timeoutMs).toBe(100);

    prepare();
    // Well above a normal run even on a loaded machine, well below the 300 s the hung hook would take.
    const a = await setup({ 'hooks.change': hook.exec, 'hooks.timeoutMs': 1000 });
    cloud.set(id, 'job', 'hang');
    await cloud.until(() => a.sink.events('hook.failed').length > 0, 'hook.failed');
    const failed = a.sink.events('hook.failed');
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({ level: 'warn', name: 'job', exec: hook.exec });
    expect(String(failed[0]!.err)).toContain('1000 ms');
    // What the hook started went with it.
    const child = hook.childPid();
    expect(child).toBeGreaterThan(0);
    await cloud.until(() => processGone(child!), 'the hook child is gone');

    cloud.set(id, 'job', 'next');
    await waitRuns(2, 'next change ran');
    expect(devcloudVars(hook.runs()[1]!)).toMatchObject({ DEVCLOUD_VAR_NAME: 'job', DEVCLOUD_VAR_VALUE: 'next' });
    await cloud.until(() => hookCounters(a).ran === 1, 'run counted');
    expect(hookCounters(a)).toEqual({ ran: 1, failed: 1, dropped: 0 });
  });

  it('runs without a shell: a value is passed literally and nothing in it is executed', async () => {
    prepare();
    await setup({ 'hooks.change': hook.exec });
    const marker = (n: number) => join(dir, `pwned${n}`);
    const value = `$(touch ${marker(1)}) \`touch ${marker(2)}\`; touch ${marker(3)} && touch ${marker(4)} | x > y`;
    cloud.set(id, 'evil', value);
    await waitRuns(1, 'hook ran');
    cloud.set(id, 'after', 'x');
    await waitRuns(2, 'the next one ran too');
    expect(devcloudVars(hook.runs()[0]!)).toMatchObject({ DEVCLOUD_VAR_NAME: 'evil', DEVCLOUD_VAR_VALUE: value });
    for (const n of [1, 2, 3, 4]) expect(existsSync(marker(n)), marker(n)).toBe(false);
  });
});
