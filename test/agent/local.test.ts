/**
 * The local interface over its real Unix socket: permissions, the requests and their JSON results, errors with
 * their codes on a connection that stays open, oversized lines, watch events, a second agent on the same
 * socket, and the CLI: in this process through its entry, and once as the real process.
 */
import { spawn } from 'node:child_process';
import { statSync } from 'node:fs';
import { type Socket, connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { LocalClient } from '../../agent/local/client.js';
import type { VarJson, WatchEvent } from '../../agent/local/messages.js';
import { SocketInUseError } from '../../agent/local/server.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { AGENT_MAIN, type CliResult, ROOT, type TestAgent, agentCli, startAgent, tempDir } from '../support/agent.js';

type Reply = { id: string | number | null; ok: boolean; result?: unknown; error?: { code: string; message: string } };

/** A client that writes raw lines and reads the replies in order, for what `LocalClient` would never send. */
class RawConn {
  private buffered = '';
  private readonly lines: string[] = [];
  private waiter: (() => void) | undefined;
  readonly closed: Promise<void>;

  private constructor(private readonly socket: Socket) {
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      this.buffered += chunk;
      let nl: number;
      while ((nl = this.buffered.indexOf('\n')) >= 0) {
        this.lines.push(this.buffered.slice(0, nl));
        this.buffered = this.buffered.slice(nl + 1);
      }
      this.waiter?.();
    });
    // Writing into a connection the agent has closed is expected in the oversized-line test.
    socket.on('error', () => undefined);
    this.closed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.once('close', () => this.waiter?.());
  }

  static connect(path: string): Promise<RawConn> {
    return new Promise((resolve, reject) => {
      const s = connect(path);
      s.once('connect', () => resolve(new RawConn(s)));
      s.once('error', reject);
    });
  }

  write(data: string): void {
    this.socket.write(data);
  }

  /** Sends one request line and returns the reply. */
  async ask(line: string | Record<string, unknown>): Promise<Reply> {
    this.write(`${typeof line === 'string' ? line : JSON.stringify(line)}\n`);
    return this.next();
  }

  async next(): Promise<Reply> {
    while (this.lines.length === 0) {
      if (this.socket.destroyed) throw new Error('connection closed');
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
    return JSON.parse(this.lines.shift()!) as Reply;
  }

  close(): void {
    this.socket.destroy();
  }
}

const cli = (args: string[]) => agentCli(args);

/** Runs the built `devcloud-agent ARGS` as a real process, as an engineer would on the gateway. */
function cliProcess(args: string[]): Promise<Omit<CliResult, 'code'> & { code: number | null }> {
  const proc = spawn(process.execPath, [AGENT_MAIN, ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => proc.once('close', (code) => resolve({ code, stdout, stderr })));
}

describe('local interface on the Unix socket', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent;
  let id: string;
  const open: Array<{ close(): void }> = [];

  beforeAll(async () => {
    broker = await startBroker('aedes');
  });
  afterAll(async () => {
    await broker?.close();
  });

  beforeEach(async () => {
    cloud = await FakeCloud.start(broker.url);
    agent = await startAgent({ mqttUrl: broker.url, flags: { 'store.maxValueBytes': 1024 } });
    id = agent.agent.identity.deviceId;
    await cloud.until(() => agent.agent.uplink.connected, 'agent connected');
  });

  afterEach(async () => {
    for (const c of open.splice(0)) c.close();
    await agent?.stop();
    await cloud?.close();
  });

  async function client(): Promise<LocalClient> {
    const c = await agent.client();
    open.push(c);
    return c;
  }

  async function raw(): Promise<RawConn> {
    const c = await RawConn.connect(agent.socket);
    open.push(c);
    return c;
  }

  it('creates the socket with mode 0660 by default, and with socket.mode when given', async () => {
    const st = statSync(agent.socket);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o660);

    const other = await startAgent({ mqttUrl: broker.url, flags: { 'socket.mode': '0600' } });
    try {
      expect(statSync(other.socket).mode & 0o777).toBe(0o600);
    } finally {
      await other.stop();
    }
  });

  it('answers list, get, set, rm and sync with JSON records', async () => {
    const c = await client();
    expect(await c.list('d')).toEqual([]);

    const set = await c.set('d', 'temp', '21.5');
    expect(set).toMatchObject({ type: 'd', name: 'temp', value: '21.5', origin: 'device' });
    expect(set.time).toBeGreaterThan(0);
    expect(set.acked).toBeLessThan(set.time);
    await c.set('s', 'note', 'hello');

    expect(await c.get('d', 'temp')).toMatchObject({ name: 'temp', value: '21.5', time: set.time });
    expect((await c.list('d')).map((v) => v.name)).toEqual(['temp']);
    expect((await c.list('s')).map((v) => `${v.type}/${v.name}=${v.value}`)).toEqual(['s/note=hello']);
    // `type` defaults to d.
    expect(await c.request<VarJson>({ op: 'get', name: 'temp' })).toMatchObject({ type: 'd', value: '21.5' });

    // The change reaches the cloud, and the agent records the acknowledgement.
    await cloud.until(() => cloud.value(id, 'temp') === '21.5', 'cloud has temp');
    await cloud.until(() => agent.agent.vars.get('d', 'temp')!.acked >= set.time, 'temp acked');
    expect((await c.get('d', 'temp')).acked).toBeGreaterThanOrEqual(set.time);

    const synced = await c.sync('d', 'temp');
    expect(synced.synced).toBeGreaterThan(0);
    expect(synced.time).toBe(set.time);
    await cloud.until(() => agent.agent.vars.get('d', 'temp')!.syncacked >= synced.synced, 'the cloud acked the sync');

    const removed = await c.rm('d', 'temp');
    expect(removed).toMatchObject({ name: 'temp', deleted: true, origin: 'device' });
    expect(removed.value).toBeUndefined();
    expect(removed.time).toBeGreaterThan(set.time);
    await expect(c.get('d', 'temp')).rejects.toMatchObject({ code: 'not-found' });
    expect(await c.list('d')).toEqual([]);
    await cloud.until(() => cloud.value(id, 'temp') === null, 'the deletion reached the cloud');
  });

  it('round-trips binary values as value64, both ways', async () => {
    const c = await client();
    const bytes = Buffer.from([0x00, 0x01, 0xff, 0xfe, 0x80, 0x0a, 0xc3]);
    const set = await c.set('d', 'blob', bytes);
    expect(set.value).toBeUndefined();
    expect(set.value64).toBe(bytes.toString('base64'));
    const got = await c.get('d', 'blob');
    expect(Buffer.from(got.value64!, 'base64').equals(bytes)).toBe(true);
    await cloud.until(() => cloud.get(id, 'blob')?.value?.equals(bytes) === true, 'cloud has the bytes');

    // Bytes that are valid UTF-8 come back as text.
    expect(await c.set('d', 'text', Buffer.from('héllo', 'utf8'))).toMatchObject({ value: 'héllo' });

    // Binary from the cloud.
    const fromCloud = Buffer.from([0xde, 0xad, 0xbe, 0xef]);
    const sent = cloud.set(id, 'cbin', fromCloud);
    await cloud.until(() => (cloud.get(id, 'cbin')?.acked ?? 0) >= sent.time, 'cloud binary acked');
    expect(await c.get('d', 'cbin')).toMatchObject({ value64: fromCloud.toString('base64'), origin: 'cloud' });
  });

  it('answers every error with its code and keeps the connection open', async () => {
    const r = await raw();
    const ok = async () => {
      const res = await r.ask({ op: 'list', id: 'probe' });
      expect(res).toMatchObject({ id: 'probe', ok: true });
    };
    const cases: Array<{ line: string | Record<string, unknown>; id: string | number | null; code: string }> = [
      { line: { op: 'get', id: 1, type: 'd', name: 'missing' }, id: 1, code: 'not-found' },
      { line: { op: 'rm', id: 2, name: 'missing' }, id: 2, code: 'not-found' },
      { line: { op: 'sync', id: 3, name: 'missing' }, id: 3, code: 'not-found' },
      { line: { op: 'set', id: 4, name: 'bad name', value: 'x' }, id: 4, code: 'bad-name' },
      { line: { op: 'set', id: 5, name: '-leading', value: 'x' }, id: 5, code: 'bad-name' },
      { line: { op: 'set', id: 6, name: 'n'.repeat(65), value: 'x' }, id: 6, code: 'bad-name' },
      { line: { op: 'get', id: 7, name: 'a/b' }, id: 7, code: 'bad-name' },
      { line: { op: 'set', id: 8, name: 'big', value: 'x'.repeat(1025) }, id: 8, code: 'too-large' },
      {
        line: { op: 'set', id: 9, name: 'big', value64: Buffer.alloc(1025).toString('base64') },
        id: 9,
        code: 'too-large',
      },
      { line: 'this is not json', id: null, code: 'bad-request' },
      { line: '{"op":"get","id":10,', id: null, code: 'bad-request' },
      { line: '[1,2,3]', id: null, code: 'bad-request' },
      { line: 'null', id: null, code: 'bad-request' },
      { line: { op: 'frobnicate', id: 11 }, id: 11, code: 'bad-request' },
      { line: { id: 12, name: 'x' }, id: 12, code: 'bad-request' },
      { line: { op: 'get', id: 13, name: 42 }, id: 13, code: 'bad-request' },
      { line: { op: 'list', id: 14, type: 'x' }, id: 14, code: 'bad-request' },
      { line: { op: 'set', id: 15, name: 'x', value: 5 }, id: 15, code: 'bad-request' },
      { line: { op: 'set', id: 16, name: 'x', value: 'a', value64: 'YQ==' }, id: 16, code: 'bad-request' },
      { line: { op: 'set', id: 17, name: 'x' }, id: 17, code: 'bad-request' },
      { line: { op: 'set', id: 18, name: 'x', value64: 'not base64!' }, id: 18, code: 'bad-request' },
      { line: { op: 'get', id: 19, name: 'x', extra: true }, id: 19, code: 'bad-request' },
      { line: { op: 'log-level', id: 20, level: 'loud' }, id: 20, code: 'bad-request' },
      { line: { op: 'sync', id: 21, type: 's', name: 'x' }, id: 21, code: 'bad-request' },
      { line: { op: 'get', id: { nested: 1 }, name: 'x' }, id: null, code: 'bad-request' },
    ];
    for (const c of cases) {
      const res = await r.ask(c.line);
      expect(res, JSON.stringify(c.line)).toMatchObject({ id: c.id, ok: false, error: { code: c.code } });
      expect(typeof res.error!.message).toBe('string');
      await ok();
    }
    // The limit itself is fine.
    expect(await r.ask({ op: 'set', id: 'max', name: 'big', value: 'x'.repeat(1024) })).toMatchObject({ ok: true });
    // Blank lines are skipped, and pipelined requests each get their reply, in order.
    r.write('\n\n{"op":"get","id":"p1","name":"big"}\n{"op":"get","id":"p2","name":"nope"}\n');
    expect(await r.next()).toMatchObject({ id: 'p1', ok: true });
    expect(await r.next()).toMatchObject({ id: 'p2', ok: false, error: { code: 'not-found' } });
  });

  it('refuses a request line over 1 MiB and keeps serving other clients', async () => {
    const bystander = await client();
    await bystander.set('d', 'keep', 'me');
    const r = await raw();
    // 2 MiB without a newline, then the newline.
    r.write('{"op":"set","id":1,"name":"x","value":"');
    r.write('x'.repeat(2 * 1024 * 1024));
    r.write('"}\n');
    const res = await r.next();
    expect(res).toMatchObject({ id: null, ok: false, error: { code: 'bad-request' } });
    expect(res.error!.message).toMatch(/too long/);
    await r.closed;
    expect(agent.sink.events('local.drop')).toHaveLength(1);
    expect(agent.agent.vars.get('d', 'x')).toBeUndefined();

    expect((await bystander.get('d', 'keep')).value).toBe('me');
    const fresh = await client();
    expect((await fresh.list('d')).map((v) => v.name)).toEqual(['keep']);
  });

  it('streams change, acked and syncacked events to watchers', async () => {
    const events: WatchEvent[] = [];
    const watcher = await client();
    await watcher.watch((ev) => events.push(ev));
    const c = await client();
    const seen = (pred: (ev: WatchEvent) => boolean) => events.some(pred);

    const set = await c.set('d', 'led', 'on');
    await cloud.until(
      () => seen((e) => e.event === 'change' && e.source === 'local' && e.var.name === 'led'),
      'local change event',
    );
    await cloud.until(() => seen((e) => e.event === 'acked' && e.var.name === 'led'), 'acked event');
    const acked = events.find((e) => e.event === 'acked' && e.var.name === 'led')!;
    expect(acked.var.acked).toBeGreaterThanOrEqual(set.time);

    const pushed = cloud.set(id, 'fan', 'high');
    await cloud.until(
      () => seen((e) => e.event === 'change' && e.source === 'cloud' && e.var.name === 'fan'),
      'cloud change event',
    );
    expect(events.find((e) => e.event === 'change' && e.var.name === 'fan')!.var).toMatchObject({
      value: 'high',
      origin: 'cloud',
      time: pushed.time,
    });

    await c.sync('d', 'led');
    await cloud.until(() => seen((e) => e.event === 'syncacked' && e.var.name === 'led'), 'syncacked event');

    await c.rm('d', 'led');
    await cloud.until(
      () => seen((e) => e.event === 'change' && e.var.name === 'led' && e.var.deleted === true),
      'deletion event',
    );
    // The client that changed things but did not ask to watch gets no events.
    const quiet = await raw();
    await quiet.ask({ op: 'set', id: 1, name: 'other', value: '1' });
    expect(await quiet.ask({ op: 'status', id: 2 })).toMatchObject({ id: 2, ok: true });
  });

  it('refuses to start a second agent on the same socket', async () => {
    await expect(startAgent({ mqttUrl: broker.url, flags: { 'socket.path': agent.socket } })).rejects.toBeInstanceOf(
      SocketInUseError,
    );
    // The first one is untouched.
    const c = await client();
    expect(await c.status()).toMatchObject({ deviceId: id });
  });

  it('serves the CLI: var set, get, list, rm, with its exit codes', async () => {
    const s = ['--socket', agent.socket];
    const nowhere = join(tempDir(), 'agent.sock');
    // What does not depend on the agent's state runs alongside.
    const independent = Promise.all([
      cli(['var', 'get', ...s]),
      cli(['var', 'frobnicate', ...s]),
      cli(['var', 'set', 'bad name', 'x', ...s]),
      cli(['var', 'list', '--type', 'x', ...s]),
      cli(['var', 'list', '--socket', nowhere]),
    ]);

    expect(await cli(['var', 'set', 'greeting', 'hello world', ...s])).toMatchObject({ code: 0 });
    expect(agent.agent.vars.get('d', 'greeting')?.value?.toString()).toBe('hello world');
    expect(await cli(['var', 'get', 'greeting', ...s])).toMatchObject({ code: 0, stdout: 'hello world\n' });

    const [text, json] = await Promise.all([cli(['var', 'list', ...s]), cli(['var', 'list', '--json', ...s])]);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^d greeting=hello world {2}\[device \S+ (acked|pending)\]\n$/);
    expect(json.code).toBe(0);
    const listed = JSON.parse(json.stdout) as VarJson[];
    expect(listed).toEqual([expect.objectContaining({ type: 'd', name: 'greeting', value: 'hello world' })]);

    expect(await cli(['var', 'rm', 'greeting', ...s])).toMatchObject({ code: 0 });
    expect(agent.agent.vars.get('d', 'greeting')).toBeUndefined();
    // The process exits with the status and writes to the streams the entry gives it.
    const [missing, missingProcess] = await Promise.all([
      cli(['var', 'get', 'greeting', ...s]),
      cliProcess(['var', 'get', 'greeting', ...s]),
    ]);
    for (const r of [missing, missingProcess]) {
      expect(r.code).toBe(1);
      expect(r.stderr).toContain('not-found');
      expect(r.stdout).toBe('');
    }

    const [noName, unknownSub, badName, badType, noAgent] = await independent;
    for (const r of [noName, unknownSub, badName, badType]) expect(r, r.stderr).toMatchObject({ code: 2 });
    expect(badName.stderr).toContain('bad-name');
    expect(noAgent.code).toBe(3);
    expect(noAgent.stderr).toContain(nowhere);
  });
});
