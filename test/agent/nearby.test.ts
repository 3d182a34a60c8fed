/**
 * The nearby listener through real UDP sockets (decisions 18 and 19): what is an authcode, what is
 * ignored, dedupe, reports after an outage, a port that cannot be bound, and the modes that switch it off.
 */
import { type Socket, createSocket } from 'node:dgram';
import { type Server, type Socket as TcpSocket, connect as tcpConnect, createServer } from 'node:net';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { type TestAgent, startAgent } from '../support/agent.js';

const CODE = '0123456789abcdef0123456789abcdef';

/** What this machine can do with IPv6: bind the wildcard (what the agent does), and reach `::1`. */
async function ipv6Support(): Promise<{ wildcard: boolean; loopback: boolean }> {
  const tryBind = (address: string) =>
    new Promise<boolean>((resolve) => {
      const s = createSocket({ type: 'udp6', ipv6Only: true });
      s.once('error', () => {
        s.close();
        resolve(false);
      });
      s.bind({ port: 0, address }, () => {
        s.close();
        resolve(true);
      });
    });
  return { wildcard: await tryBind('::'), loopback: await tryBind('::1') };
}

/** Binds a UDP socket exclusively on the IPv4 wildcard, as the agent does; rejects when the port is taken. */
function bindUdp4(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = createSocket({ type: 'udp4', reuseAddr: false });
    s.once('error', (err) => {
      s.close();
      reject(err);
    });
    s.bind({ port, address: '0.0.0.0', exclusive: true }, () => {
      s.removeAllListeners('error');
      resolve(s);
    });
  });
}

function closeUdp(s: Socket): Promise<void> {
  return new Promise((resolve) => s.close(() => resolve()));
}

/** A phone on the LAN: sends datagrams from one socket per family. */
class Phone {
  private readonly sockets = new Map<'udp4' | 'udp6', Socket>();

  send(port: number, payload: string | Buffer, host = '127.0.0.1'): Promise<void> {
    const family = host.includes(':') ? 'udp6' : 'udp4';
    let s = this.sockets.get(family);
    if (!s) {
      s = createSocket(family);
      this.sockets.set(family, s);
    }
    const sock = s;
    return new Promise((resolve, reject) => sock.send(payload, port, host, (err) => (err ? reject(err) : resolve())));
  }

  close(): void {
    for (const s of this.sockets.values()) s.close();
    this.sockets.clear();
  }
}

/**
 * A TCP relay between the agent and the broker: cutting it is a network outage for the agent alone, while the
 * fake cloud stays subscribed (a broker restart would race the cloud's resubscription against the agent's
 * first report).
 */
class Relay {
  private server: Server | undefined;
  private readonly conns = new Set<TcpSocket>();
  port = 0;

  constructor(private readonly target: number) {}

  get url(): string {
    return `mqtt://127.0.0.1:${this.port}`;
  }

  async open(): Promise<void> {
    const server = createServer((client) => {
      const upstream = tcpConnect(this.target, '127.0.0.1');
      for (const s of [client, upstream]) {
        this.conns.add(s);
        s.on('close', () => this.conns.delete(s));
        s.on('error', () => undefined);
      }
      client.pipe(upstream);
      upstream.pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.port = (server.address() as { port: number }).port;
  }

  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.conns) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

describe('nearby listener on UDP', () => {
  let broker: TestBroker;
  let cloud: FakeCloud | undefined;
  let agent: TestAgent | undefined;
  let relay: Relay | undefined;
  let phone: Phone;
  const held: Socket[] = [];

  beforeAll(async () => {
    broker = await startBroker('aedes');
    return async () => {
      await broker.close();
    };
  });

  afterEach(async () => {
    await agent?.stop();
    agent = undefined;
    await cloud?.close();
    cloud = undefined;
    await relay?.cut();
    relay = undefined;
    phone?.close();
    for (const s of held.splice(0)) await closeUdp(s);
    vi.useRealTimers();
  });

  async function setup(flags: Record<string, unknown> = {}, mqttUrl = broker.url): Promise<TestAgent> {
    cloud = await FakeCloud.start(broker.url);
    phone = new Phone();
    agent = await startAgent({ mqttUrl, flags });
    const a = agent;
    await cloud.until(() => a.agent.uplink.connected, 'agent connected');
    return a;
  }

  const heardCodes = (a: TestAgent) => cloud!.device(a.agent.identity.deviceId).heard.map((h) => h.authcode);

  it('reports a valid authcode on up/heard, lower-cased, at the lengths and endings decision 19 allows', async () => {
    const a = await setup();
    const port = a.agent.nearby.port!;
    expect(port).toBeGreaterThan(0);
    const codes = [
      { sent: 'ABCDEF0123456789ABCDEF0123456789', heard: 'abcdef0123456789abcdef0123456789' },
      { sent: '1234abcd\n', heard: '1234abcd' }, // the shortest, with a newline
      { sent: `${'F'.repeat(128)}\r\n`, heard: 'f'.repeat(128) }, // the longest
    ];
    for (const c of codes) await phone.send(port, c.sent);
    await cloud!.until(() => heardCodes(a).length >= codes.length, 'three codes heard');
    expect(heardCodes(a).sort()).toEqual(codes.map((c) => c.heard).sort());
    expect(a.agent.nearby.counters).toMatchObject({ received: 3, reported: 3, ignored: 0 });
    for (const h of cloud!.device(a.agent.identity.deviceId).heard) expect(typeof h.at).toBe('number');
    // Authcodes are capabilities: the log shows a prefix only.
    expect(a.sink.text()).not.toContain(codes[0]!.heard);
    expect(cloud!.invalid).toEqual([]);
  });

  it('hears over IPv6 when the machine has it, and says so once when it does not', async () => {
    const v6 = await ipv6Support();
    const a = await setup();
    const listening = a.sink.events('nearby.listening');
    expect(listening).toHaveLength(1);
    if (v6.loopback) {
      expect(listening[0]).toMatchObject({ ipv6: true });
      await phone.send(a.agent.nearby.port!, `${CODE}\n`, '::1');
      await cloud!.until(() => heardCodes(a).includes(CODE), 'code heard over IPv6');
      expect(a.sink.events('nearby.ipv6_unavailable')).toHaveLength(0);
    } else if (!v6.wildcard) {
      expect(listening[0]).toMatchObject({ ipv6: false });
      const warned = a.sink.events('nearby.ipv6_unavailable');
      expect(warned).toHaveLength(1);
      expect(warned[0]).toMatchObject({ level: 'warn' });
      // IPv4 still works.
      await phone.send(a.agent.nearby.port!, CODE);
      await cloud!.until(() => heardCodes(a).includes(CODE), 'code heard over IPv4');
    } else {
      // IPv6 without a loopback address: the agent listens, there is just no way to reach it from here.
      expect(listening[0]).toMatchObject({ ipv6: true });
    }
  });

  it('ignores and counts garbage, and keeps serving', async () => {
    const a = await setup();
    const port = a.agent.nearby.port!;
    const garbage: Array<string | Buffer> = [
      '1234abc', // 7 digits: too short
      'a'.repeat(129), // too long
      'ghijklmnop', // not hex
      '0123abcd-4567', // not hex either
      '0123\nabcd', // embedded newline
      `${CODE}\n\n`, // two newlines
      ` ${CODE}`, // leading space
      Buffer.from([0x30, 0x31, 0x32, 0x33, 0x00, 0x34, 0x35, 0x36, 0x37]), // a NUL inside
      Buffer.from([0xff, 0xfe, 0xc3, 0x28, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85]), // binary
      Buffer.alloc(2000, 0x61), // a big datagram of hex-looking bytes
      Buffer.alloc(0), // empty
    ];
    for (const g of garbage) await phone.send(port, g);
    await cloud!.until(() => a.agent.nearby.counters.received >= garbage.length, 'garbage received');
    expect(a.agent.nearby.counters).toMatchObject({ received: garbage.length, ignored: garbage.length, reported: 0 });
    // Still listening, still reporting.
    await phone.send(port, CODE);
    await cloud!.until(() => heardCodes(a).length > 0, 'code heard after garbage');
    expect(heardCodes(a)).toEqual([CODE]);
    expect(a.agent.nearby.counters.ignored).toBe(garbage.length);
    const status = await (await a.client()).status<{ nearby: Record<string, unknown> }>();
    expect(status.nearby).toMatchObject({ listening: true, port, ignored: garbage.length, reported: 1 });
  });

  it('reports the same authcode once per 30 s', async () => {
    // The window runs on the monotonic clock (hrtime); advancing the fake time moves both.
    vi.useFakeTimers({ toFake: ['Date', 'hrtime'] });
    const t0 = Date.parse('2030-01-01T00:00:00Z');
    vi.setSystemTime(t0);
    const a = await setup();
    const port = a.agent.nearby.port!;
    const c = a.agent.nearby.counters;

    await phone.send(port, CODE);
    await cloud!.until(() => heardCodes(a).length === 1, 'first report');
    expect(cloud!.device(a.agent.identity.deviceId).heard[0]).toEqual({ authcode: CODE, at: t0 });

    // Again, in upper case, just before the window closes: the same code, not reported.
    vi.advanceTimersByTime(29_999);
    await phone.send(port, CODE.toUpperCase());
    await cloud!.until(() => c.repeated === 1, 'repeat counted');

    // Another code is not held back by the first one's window.
    const other = 'feedface';
    await phone.send(port, other);
    await cloud!.until(() => heardCodes(a).includes(other), 'other code heard');

    vi.advanceTimersByTime(1);
    await phone.send(port, CODE);
    await cloud!.until(() => heardCodes(a).filter((h) => h === CODE).length === 2, 'reported again after 30 s');
    expect(heardCodes(a)).toEqual([CODE, other, CODE]);
    expect(c).toMatchObject({ received: 4, reported: 3, repeated: 1 });
  });

  it('follows udp.dedupeMs', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'hrtime'] });
    const t0 = Date.parse('2030-01-01T00:00:00Z');
    vi.setSystemTime(t0);
    const a = await setup({ 'udp.dedupeMs': 5000 });
    const port = a.agent.nearby.port!;
    await phone.send(port, CODE);
    await cloud!.until(() => heardCodes(a).length === 1, 'first report');
    vi.advanceTimersByTime(4999);
    await phone.send(port, CODE);
    await cloud!.until(() => a.agent.nearby.counters.repeated === 1, 'repeat counted');
    vi.advanceTimersByTime(1);
    await phone.send(port, CODE);
    await cloud!.until(() => heardCodes(a).length === 2, 'reported again after 5 s');
  });

  it('reports codes heard while disconnected after reconnecting, unless older than udp.maxAgeMs', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const t0 = Date.parse('2030-01-01T00:00:00Z');
    vi.setSystemTime(t0);
    relay = new Relay(broker.port);
    await relay.open();
    const a = await setup({ 'udp.maxAgeMs': 60_000 }, relay.url);
    const port = a.agent.nearby.port!;
    const c = a.agent.nearby.counters;

    await relay.cut();
    await cloud!.until(() => !a.agent.uplink.connected, 'agent disconnected');
    const stale = 'aaaaaaaa';
    const fresh = 'bbbbbbbb';
    const edge = 'cccccccc';
    await phone.send(port, stale);
    await cloud!.until(() => c.reported === 1, 'stale code taken');
    vi.setSystemTime(t0 + 1);
    await phone.send(port, edge);
    await cloud!.until(() => c.reported === 2, 'edge code taken');
    // 60 s after the edge code: the stale one is now too old, the edge one exactly at the limit.
    vi.setSystemTime(t0 + 60_001);
    await phone.send(port, fresh);
    await cloud!.until(() => c.reported === 3, 'fresh code taken');
    expect(heardCodes(a)).toEqual([]);

    await relay.open();
    await cloud!.until(() => heardCodes(a).length > 0, 'reports after reconnect');
    // All of them leave in one batch on connect, so what is missing now was dropped.
    expect(heardCodes(a).sort()).toEqual([fresh, edge].sort());
    const heard = cloud!.device(a.agent.identity.deviceId).heard;
    expect(heard.find((h) => h.authcode === fresh)?.at).toBe(t0 + 60_001);
    expect(heard.find((h) => h.authcode === edge)?.at).toBe(t0 + 1);
  });

  it('logs one clear error when the port is taken, and everything else keeps running', async () => {
    const occupier = await bindUdp4(0);
    held.push(occupier);
    const taken = occupier.address().port;
    const a = await setup({ 'udp.port': taken });
    const id = a.agent.identity.deviceId;

    const failed = a.sink.events('nearby.bind_failed');
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({ level: 'error', port: taken, code: 'EADDRINUSE' });
    const text = String(failed[0]!.msg);
    expect(text).toContain(String(taken));
    expect(text).toContain('CAP_NET_BIND_SERVICE');
    expect(text).toContain('--udp-port');
    expect(a.sink.lines.filter((l) => l.level === 'error')).toHaveLength(1);
    expect(a.agent.nearby.listening).toBe(false);

    // The local socket answers, the uplink is up, variables sync both ways.
    const client = await a.client();
    const status = await client.status<{ nearby: { listening: boolean }; state: string }>();
    expect(status).toMatchObject({ state: 'connected', nearby: { listening: false } });
    await cloud!.until(() => cloud!.device(id).hellos.length > 0, 'hello');
    await client.set('d', 'temp', '20');
    await cloud!.until(() => cloud!.value(id, 'temp') === '20', 'gateway change reached the cloud');
    const sent = cloud!.set(id, 'led', 'on');
    await cloud!.until(() => (cloud!.get(id, 'led')?.acked ?? 0) >= sent.time, 'cloud change acknowledged');
    expect((await client.get('d', 'led')).value).toBe('on');
    client.close();
  });

  it('stops listening in connected mode and listens again in master mode', async () => {
    const a = await setup();
    const id = a.agent.identity.deviceId;
    const first = a.agent.nearby.port!;

    cloud!.set(id, 'mode', 'connected');
    await cloud!.until(() => !a.agent.nearby.listening, 'listener stopped');
    // The port is really released: another program can take it.
    held.push(await bindUdp4(first));
    expect(a.sink.events('mode.changed')).toEqual([expect.objectContaining({ from: 'master', to: 'connected' })]);

    const client = await a.client();
    await client.set('d', 'mode', 'master');
    client.close();
    await cloud!.until(() => a.agent.nearby.listening, 'listener back');
    const second = a.agent.nearby.port!;
    expect(second).not.toBe(first);
    await phone.send(second, CODE);
    await cloud!.until(() => heardCodes(a).includes(CODE), 'heard after returning to master');
  });
});
