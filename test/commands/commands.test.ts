/**
 * Commands through a listening bridge with its embedded broker and a real agent: the run order (priority, then
 * arrival), lifetimes ending on the agent and on the bridge, binary commands, a handler that hangs, a reboot
 * command that fails, output past the bound, who may send commands, malformed parameters, a full queue, the older
 * clients' spelling, and the `devcloud-agent queue` CLI.
 */
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import type { QueueJson } from '../../agent/local/messages.js';
import { tempDir } from '../support/agent.js';
import { type Rig, startRig, until } from './support.js';

/** Whether a process is still there (a zombie counts as gone: it runs nothing). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/** `devcloud-agent ARGS` in this process, its output captured. */
async function cli(args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const io = { out: (s: string) => (out += `${s}\n`), err: (s: string) => (err += `${s}\n`) };
  // An empty configuration folder: the machine's own /etc/devcloud stays out of it.
  const etc = tempDir();
  try {
    const code = await runCli(args, io, { CONFIGURATION_DIRECTORY: etc });
    return { code, out, err };
  } finally {
    rmSync(etc, { recursive: true, force: true });
  }
}

describe('commands through the embedded broker', () => {
  let rig: Rig | undefined;
  afterEach(async () => {
    await rig?.close();
    rig = undefined;
  });

  it('runs urgent commands first, in arrival order within a priority; the queue CLI shows the run order', async () => {
    const r = (rig = await startRig());
    const blocker = await r.send('block A');
    await until(async () => (await r.get(blocker)).state === 'running', 'the blocker running');

    // While A runs, commands arrive in this order; they run by priority, then by arrival.
    const arrivals: Array<[string, string]> = [
      ['rec a0', '0'],
      ['rec b1', '1'],
      ['rec c2', '2'],
      ['rec d0', '0'],
      ['rec e2', '2'],
      ['rec f1', '1'],
      ['rec g0', '0'],
    ];
    const ids = new Map<string, string>();
    for (const [command, priority] of arrivals) ids.set(command, await r.send(command, { priority }));
    const runOrder = ['rec c2', 'rec e2', 'rec b1', 'rec f1', 'rec a0', 'rec d0', 'rec g0'];
    await until(() => r.agent!.agent.queue.queued().length === arrivals.length, 'every command queued on the agent');
    for (const id of ids.values()) expect((await r.delivered(id)).state).toBe('sent');

    const text = await cli(['queue', '--socket', r.agent!.socket]);
    expect(text.code, text.err).toBe(0);
    const lines = text.out.split('\n');
    expect(lines[0]).toBe('running (1)');
    expect(lines[1]).toContain(`${blocker}  p0  running`);
    expect(lines[1]).toContain('block A');
    expect(lines[2]).toBe(`queued, in run order (${arrivals.length})`);
    const queuedLines = lines.slice(3, 3 + arrivals.length);
    expect(queuedLines.map((l) => /rec \w+/.exec(l)?.[0])).toEqual(runOrder);
    for (const [i, l] of queuedLines.entries())
      expect(l).toContain(`${ids.get(runOrder[i]!)}  p${runOrder[i]!.at(-1)}`);

    const json = await cli(['queue', '--socket', r.agent!.socket, '--json', '--recent', '3']);
    expect(json.code, json.err).toBe(0);
    const q = JSON.parse(json.out) as QueueJson;
    expect(q.running.map((c) => [c.id, c.command, c.state])).toEqual([[blocker, 'block A', 'running']]);
    expect(q.queued.map((c) => c.command)).toEqual(runOrder);
    expect(q.queued.map((c) => c.priority)).toEqual([2, 2, 1, 1, 0, 0, 0]);
    expect(q.recent.map((c) => c.command)).toEqual(['rec g0', 'rec f1', 'rec e2']);

    r.release('A');
    const done = await Promise.all(runOrder.map((c) => r.finished(ids.get(c)!)));
    expect(done.map((c) => c.state)).toEqual(runOrder.map(() => 'done'));
    expect(r.runs()).toEqual(['A', ...runOrder.map((c) => c.slice(4))]);
    // The bridge's `started` stamps (from the `running` reports) follow the run order.
    const started = done.map((c) => c.started!);
    expect(started.every((t) => t > 0)).toBe(true);
    expect([...started].sort((x, y) => x - y)).toEqual(started);
    expect(started[0]!).toBeGreaterThanOrEqual((await r.get(blocker)).finished!);

    const after = JSON.parse((await cli(['queue', '--socket', r.agent!.socket, '--json'])).out) as QueueJson;
    expect([after.running, after.queued]).toEqual([[], []]);
    expect(after.recent.map((c) => c.state)).toEqual(Array.from({ length: arrivals.length + 1 }, () => 'done'));
  });

  it('a lifetime that ends while the command waits behind a running one: expired, never run', async () => {
    const r = (rig = await startRig());
    const blocker = await r.send('block X');
    await until(async () => (await r.get(blocker)).state === 'running', 'the blocker running');
    const late = await r.send('rec late', { lifetime: '1000', priority: '2' });
    const onTime = await r.send('rec ontime');
    await r.delivered(late);
    await r.delivered(onTime);

    // Reported expired by the agent while X still runs, not only once X is done.
    const expired = await r.finished(late);
    expect(expired.state).toBe('expired');
    expect(expired.reason).toMatch(/lifetime ended before it could run/);
    expect(expired.started).toBeNull();
    expect(expired.finished!).toBeGreaterThanOrEqual(expired.expires);
    expect((await r.get(blocker)).state).toBe('running');
    expect(r.agent!.agent.queue.get(late)?.state).toBe('expired');

    r.release('X');
    expect((await r.finished(onTime)).state).toBe('done');
    expect((await r.finished(blocker)).state).toBe('done');
    expect(r.runs()).toEqual(['X', 'ontime']);
  });

  it('a device offline past the lifetime: expired on the bridge and never sent when it comes back', async () => {
    const r = (rig = await startRig());
    await r.stopAgent();
    await until(async () => (await r.metaState()) === 'disconnected', 'the device disconnected');
    const gone = await r.send('rec gone', { lifetime: '300' });
    const kept = await r.send('rec kept');
    expect((await r.get(gone)).state).toBe('queued');

    const expired = await r.finished(gone);
    expect(expired).toMatchObject({ state: 'expired', sent: null, delivered: null, started: null });
    expect(expired.reason).toMatch(/before the device received it/);
    expect(expired.finished).toBe(expired.expires);

    const agent = await r.startAgent();
    expect((await r.finished(kept)).state).toBe('done');
    // The hello handed over `kept` only; a command posted after it arrives after anything the hello sent.
    const after = await r.send('ping after');
    expect((await r.finished(after)).output).toBe('pong after');
    expect(agent.agent.queue.get(gone)).toBeUndefined();
    expect(agent.agent.queue.get(kept)?.state).toBe('done');
    expect(r.runs()).toEqual(['kept']);
    expect((await r.get(gone)).state).toBe('expired');
  });

  it('command64 carries any bytes but NUL to the handler; the status shows command64', async () => {
    const r = (rig = await startRig());
    const every = Buffer.from(Array.from({ length: 255 }, (_, i) => i + 1));
    const bytes = Buffer.concat([Buffer.from('bin '), every]);
    const id = await r.send('ignored', { command64: bytes.toString('base64') });
    const c = await r.finished(id);
    expect(c).toMatchObject({ state: 'done', exitCode: 0, command64: bytes.toString('base64') });
    expect(c.command).toBeUndefined();
    expect(readFileSync(join(r.work, 'stdin.bin')).equals(bytes)).toBe(true);
    expect(Buffer.from(readFileSync(join(r.work, 'env64'), 'utf8'), 'base64').equals(bytes)).toBe(true);

    const list = JSON.parse((await r.http.get(`/0/devices/${r.deviceId}/commands/`)).body) as Array<{
      command64?: string;
    }>;
    expect(list[0]!.command64).toBe(bytes.toString('base64'));

    const withNul = Buffer.from('bin a\0b');
    const nul = await r.finished(await r.send('x', { command64: withNul.toString('base64') }));
    expect(nul).toMatchObject({ state: 'failed', command64: withNul.toString('base64') });
    expect(nul.reason).toMatch(/NUL/);
    // The handler did not run for it: what it wrote is still the first command's.
    expect(readFileSync(join(r.work, 'stdin.bin')).equals(bytes)).toBe(true);
  });

  it('a handler that hangs is killed at its timeout, with what it started', async () => {
    const r = (rig = await startRig({ agentFlags: { 'commands.timeoutMs': 300 } }));
    const id = await r.send('hang');
    const c = await r.finished(id);
    expect(c.state).toBe('failed');
    expect(c.reason).toBe('timed out after 300 ms');
    expect(c.signal).toBe('SIGTERM');
    const pidFile = join(r.work, 'child.pid');
    expect(existsSync(pidFile)).toBe(true);
    const child = Number(readFileSync(pidFile, 'utf8').trim());
    expect(child).toBeGreaterThan(0);
    await until(() => !alive(child), `the handler's child ${child} gone`, 5000);
    // The queue goes on.
    expect((await r.finished(await r.send('ping'))).state).toBe('done');
  });

  it('reboot runs the reboot command; one that exits non-zero fails the command with its status', async () => {
    const scratch = tempDir('devcloud-reboot-');
    const marker = join(scratch, 'ran');
    const r = (rig = await startRig({
      agentFlags: { 'commands.rebootCommand': ['sh', '-c', `touch "$0"; exit 3`, marker] },
    }));
    const c = await r.finished(await r.send('reboot'));
    expect(c).toMatchObject({
      state: 'failed',
      exitCode: 3,
      signal: null,
      reason: 'the reboot command exited with status 3',
    });
    // Run as given, without a shell of the agent's: its arguments reached it.
    expect(existsSync(marker)).toBe(true);
    rmSync(scratch, { recursive: true, force: true });
  });

  it('keeps the end of an output larger than the bound, at most 4096 bytes', async () => {
    const r = (rig = await startRig());
    const full = Array.from({ length: 3000 }, (_, i) => `${i + 1}\n`).join('');
    const big = await r.finished(await r.send('big'));
    expect(big).toMatchObject({ state: 'done', exitCode: 0, truncated: true });
    expect(Buffer.byteLength(big.output!)).toBe(4096);
    expect(full.endsWith(big.output!)).toBe(true);
    expect(big.output!.endsWith('2999\n3000\n')).toBe(true);

    // 4096 bytes from the end cut a three-byte character: its last byte is dropped, not shown as garbage.
    const utf = await r.finished(await r.send('utf'));
    expect(utf).toMatchObject({ state: 'done', truncated: true });
    expect(utf.output).toBe('€'.repeat(1365));
    expect(Buffer.byteLength(utf.output!)).toBe(4095);

    const small = await r.finished(await r.send('ping small'));
    expect(small).toMatchObject({ output: 'pong small', truncated: false });
  });

  it("refuses a command to another user's device, and any request without a session", async () => {
    const r = (rig = await startRig());
    const mine = await r.send('ping');
    await r.finished(mine);
    const other = r.bridge.client();
    expect(
      (await other.post('/0/session/signup', { form: { login: 'other@example.com', password: 'correct horse 2' } }))
        .status,
    ).toBe(201);
    const post = await other.post(`/0/devices/${r.deviceId}/`, { form: { command: 'rec intruder' } });
    expect([post.status, post.body]).toEqual([400, 'device-fail']);
    const alias = await other.post(`/0/devices/${r.deviceId}/ping`);
    expect([alias.status, alias.body]).toEqual([400, 'device-fail']);
    const list = await other.get(`/0/devices/${r.deviceId}/commands/`);
    expect([list.status, list.body]).toEqual([404, 'device-fail']);
    const one = await other.get(`/0/devices/${r.deviceId}/commands/${mine}`);
    expect([one.status, one.body]).toEqual([404, 'device-fail']);

    const anon = r.bridge.client();
    for (const res of [
      await anon.post(`/0/devices/${r.deviceId}/`, { form: { command: 'ping' } }),
      await anon.post(`/0/devices/${r.deviceId}/ping`),
      await anon.get(`/0/devices/${r.deviceId}/commands/`),
      await anon.get(`/0/devices/${r.deviceId}/commands/${mine}`),
    ]) {
      expect([res.status, res.body]).toEqual([401, 'no-session']);
    }
    const all = JSON.parse((await r.http.get(`/0/devices/${r.deviceId}/commands/`)).body) as unknown[];
    expect(all).toHaveLength(1);
    expect(r.runs()).toEqual([]);
  });

  it('answers malformed parameters with 400 device-fail and stores nothing; command64 wins over command', async () => {
    const r = (rig = await startRig());
    const b64 = (s: string | Buffer) => Buffer.from(s).toString('base64');
    const table: Array<[string, Record<string, string>]> = [
      ['priority 3', { command: 'ping', priority: '3' }],
      ['priority -1', { command: 'ping', priority: '-1' }],
      ['priority 1.5', { command: 'ping', priority: '1.5' }],
      ['priority abc', { command: 'ping', priority: 'abc' }],
      ['priority empty', { command: 'ping', priority: '' }],
      ['lifetime 0', { command: 'ping', lifetime: '0' }],
      ['lifetime -5', { command: 'ping', lifetime: '-5' }],
      ['lifetime past the maximum', { command: 'ping', lifetime: '2592000001' }],
      ['lifetime abc', { command: 'ping', lifetime: 'abc' }],
      ['lifetime 1e3', { command: 'ping', lifetime: '1e3' }],
      ['command empty', { command: '' }],
      ['command not ASCII', { command: 'ping héllo' }],
      ['command with a control character', { command: 'ping\ta' }],
      ['command past 4096 bytes', { command: `ping ${'a'.repeat(4092)}` }],
      ['command64 not base64', { command64: '@@@@' }],
      ['command64 without padding', { command64: 'cGluZw' }],
      ['command64 empty', { command64: '' }],
      ['command64 past 4096 bytes decoded', { command64: b64('a'.repeat(4097)) }],
      ['command64 far past the bound', { command64: b64('a'.repeat(9000)) }],
      ['neither', { priority: '1' }],
      ['a bad command64 beside a good command', { command: 'ping', command64: '!!!!' }],
    ];
    for (const [what, form] of table) {
      const res = await r.post(form);
      expect([res.status, res.body], what).toEqual([400, 'device-fail']);
    }
    const path = `/0/devices/${r.deviceId}/`;
    for (const [what, json] of [
      ['a JSON array', [{ command: 'ping' }]],
      ['a JSON string', 'ping'],
      ['priority as a JSON fraction', { command: 'ping', priority: 1.5 }],
    ] as const) {
      const res = await r.http.post(path, { json });
      expect([res.status, res.body], what).toEqual([400, 'device-fail']);
    }
    const list = await r.http.get(`/0/devices/${r.deviceId}/commands/`);
    expect(list.body).toBe('[]');

    // The bounds themselves are accepted.
    const longest = `ping ${'a'.repeat(4091)}`;
    const edge = await r.send(longest, { priority: '2', lifetime: '2592000000' });
    expect(await r.get(edge)).toMatchObject({ command: longest, priority: 2 });
    const edge64 = await r.post({ command64: b64(Buffer.alloc(4096, 0x61)) });
    expect(edge64.status).toBe(200);
    const asJson = await r.http.post(path, { json: { command: 'ping json', priority: 1, lifetime: 60_000 } });
    expect(asJson.status).toBe(200);
    const j = await r.finished(asJson.body);
    expect(j).toMatchObject({ state: 'done', output: 'pong json', priority: 1 });
    expect(j.expires - j.created).toBe(60_000);

    const both = await r.send('rec never', { command64: b64('ping from64') });
    expect(await r.finished(both)).toMatchObject({ state: 'done', command: 'ping from64', output: 'pong from64' });
    expect(r.runs()).toEqual([]);
  });

  it('refuses a command past the open-command limit until earlier ones finish', async () => {
    const r = (rig = await startRig({ bridgeConfig: { commands: { maxOpen: 5 } } }));
    await r.stopAgent();
    await until(async () => (await r.metaState()) === 'disconnected', 'the device disconnected');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(await r.send(`rec q${i}`));
    const sixth = await r.post({ command: 'rec q5' });
    expect([sixth.status, sixth.body]).toEqual([400, 'device-fail']);
    const alias = await r.http.post(`/0/devices/${r.deviceId}/ping`);
    expect([alias.status, alias.body]).toEqual([400, 'device-fail']);
    expect(JSON.parse((await r.http.get(`/0/devices/${r.deviceId}/commands/`)).body)).toHaveLength(5);

    await r.startAgent();
    for (const id of ids) expect((await r.finished(id)).state).toBe('done');
    expect(r.runs()).toEqual(['q0', 'q1', 'q2', 'q3', 'q4']);
    const again = await r.send('rec q6');
    expect((await r.finished(again)).state).toBe('done');
  });

  it("takes the older clients' POST /0/devices/<id>/<command>, not a reserved segment", async () => {
    const r = (rig = await startRig());
    const res = await r.http.post(`/0/devices/${r.deviceId}/ping`);
    expect(res.status).toBe(200);
    expect(await r.finished(res.body)).toMatchObject({ state: 'done', command: 'ping', priority: 0, output: 'pong' });
    const c = await r.get(res.body);
    expect(c.expires - c.created).toBe(86_400_000);
    for (const segment of ['d', 's', 'meta', 'commands']) {
      const bad = await r.http.post(`/0/devices/${r.deviceId}/${segment}`);
      expect([bad.status, bad.body], segment).toEqual([400, 'device-fail']);
    }
    const rec = await r.http.post(`/0/devices/${r.deviceId}/rec`);
    expect(await r.finished(rec.body)).toMatchObject({ state: 'done', command: 'rec' });
    // The handler ran with no arguments.
    expect(readFileSync(join(r.work, 'runs.log'), 'utf8')).toBe('\n');
  });
});
