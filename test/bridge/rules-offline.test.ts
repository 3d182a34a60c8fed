/**
 * `offline` rules against a device that vanishes (issue 17; docs/notifications.md, "Offline"): a real agent process
 * (the built `devcloud-agent`) connected to a real bridge and its embedded broker, killed with `kill -9`. It sends
 * nothing as it dies. Its connection runs through a TCP hop of the test's own (`Link`), as through a network:
 *
 * - killed while the link holds, the agent's host closes its connection and the broker publishes its will at once;
 * - killed once the link is cut (a device powered off, or cut from the network), nothing reaches the broker, and only
 *   the keepalive tells: 1.5 × the agent's `mqtt.keepaliveSec` without a packet, and the broker publishes the will.
 *
 * Either way the bridge records `meta` `state` `disconnected` and the rule fires within 1.5 × the keepalive (plus a
 * margin for the bridge), once per crossing: a restart makes `online` fire and arms `offline` again.
 */
import { createSocket } from 'node:dgram';
import { rmSync, writeFileSync } from 'node:fs';
import { type Server, type Socket, connect, createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AgentProcess, spawnAgent, tempDir, waitForSocket } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { LiveSocket } from '../support/live.js';
import { until } from '../support/wait.js';

/** The agent's MQTT keepalive: its smallest allowed value (agent/config.ts), so that the test is short. */
const KEEPALIVE_SEC = 5;
/** How long the broker waits for a packet before it declares a client gone (aedes, as MQTT 3.1.1 §3.1.2.10 says). */
const GONE_MS = 1.5 * KEEPALIVE_SEC * 1000;
/** The bridge's share: the will handled, the state committed, the rule evaluated and the event committed. */
const MARGIN_MS = 3000;

interface Event {
  id: number;
  rule: number;
  name: string;
  deviceid: string;
  trigger: string;
  variable: { type: string; name: string } | null;
  value: string | null;
  time: number;
  test: boolean;
}

function udpSend(port: number, payload: string): Promise<void> {
  const s = createSocket('udp4');
  return new Promise((resolve, reject) =>
    s.send(payload, port, '127.0.0.1', (err) => {
      s.close();
      if (err) reject(err);
      else resolve();
    }),
  );
}

/**
 * A TCP hop between the agent and the broker, standing for the network between them. Each connection made to it is
 * relayed to the broker; once `cut()`, nothing passes either way on the connections it has, and the agent's side
 * closing no longer closes the broker's: the broker holds a connection on which nothing comes, as after a power cut.
 * A connection made after the cut is relayed again.
 */
class Link {
  private readonly open = new Set<{ device: Socket; broker: Socket; cut: boolean }>();
  private readonly server: Server;
  url = '';
  private constructor(private readonly target: URL) {
    this.server = createServer((device) => this.relay(device));
  }

  static async start(brokerUrl: string): Promise<Link> {
    const link = new Link(new URL(brokerUrl));
    await new Promise<void>((resolve) => link.server.listen(0, '127.0.0.1', resolve));
    link.url = `mqtt://127.0.0.1:${(link.server.address() as { port: number }).port}`;
    return link;
  }

  private relay(device: Socket): void {
    const broker = connect(Number(this.target.port), this.target.hostname);
    const pair = { device, broker, cut: false };
    this.open.add(pair);
    device.on('data', (d: Buffer) => void (pair.cut || broker.write(d)));
    broker.on('data', (d: Buffer) => void (pair.cut || device.write(d)));
    device.on('close', () => {
      if (!pair.cut) broker.destroy();
    });
    broker.on('close', () => {
      this.open.delete(pair);
      device.destroy();
    });
    device.on('error', () => undefined);
    broker.on('error', () => undefined);
  }

  /** Nothing passes any longer on the connections open now. */
  cut(): void {
    for (const pair of this.open) pair.cut = true;
  }

  async close(): Promise<void> {
    for (const { device, broker } of this.open) {
      device.destroy();
      broker.destroy();
    }
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

describe('an offline rule on a device killed with kill -9', () => {
  let bridge: LiveBridge;
  let http: HttpClient;
  let live: LiveSocket;
  let stateDir: string;
  let configDir: string;
  let configFile: string;
  let agent: AgentProcess;
  let link: Link;
  let deviceId: string;
  const rules = { offline: 0, offlineFor: 0, online: 0 };

  const start = (): void => {
    agent = spawnAgent([
      'run',
      '--config',
      configFile,
      '--state-dir',
      stateDir,
      '--mqtt-url',
      link.url,
      '--udp-port',
      '0',
      '--log-level',
      'warn',
      '--log-pretty',
      'never',
    ]);
  };
  const events = async (): Promise<Event[]> => {
    const r = await http.get('/0/user/events/?latest=100');
    expect(r.status).toBe(200);
    return JSON.parse(r.body) as Event[];
  };
  const ofRule = async (rule: number) => (await events()).filter((e) => e.rule === rule);
  const stateOf = async (rule: number) =>
    (JSON.parse((await http.get(`/0/user/event/${rule}`)).body) as { state: string }).state;
  const metaState = async () => JSON.parse((await http.get(`/0/devices/${deviceId}/meta/state`)).body) as string;
  /** The `user-event` frames the live channel got for `rule`, in the order they came. */
  const pushed = (rule: number) =>
    live.messages
      .flatMap((m) => Object.values(m.events ?? {}) as Array<Event & { type: string }>)
      .filter((e) => e.type === 'user-event' && e.rule === rule);

  beforeAll(async () => {
    bridge = await startLiveBridge({
      // Each crossing fires (no per-rule interval), and `for` is checked often enough to time it.
      config: { notifications: { ruleMinIntervalMs: 0, pendingCheckMs: 100 } },
    });
    link = await Link.start(bridge.mqttUrl);
    stateDir = tempDir('devcloud-agent-');
    configDir = tempDir('devcloud-agent-config-');
    configFile = join(configDir, 'agent.json');
    writeFileSync(configFile, JSON.stringify({ mqtt: { keepaliveSec: KEEPALIVE_SEC } }));
    start();
    const local = await waitForSocket(agent.socket);
    let nearbyPort: number;
    try {
      const status = await local.status<{ deviceId: string; nearby: { port: number | null } }>();
      deviceId = status.deviceId;
      nearbyPort = status.nearby.port!;
    } finally {
      local.close();
    }
    http = bridge.client();
    const signup = await http.post('/0/session/signup', {
      form: { login: 'dana@example.com', password: 'correct horse battery' },
    });
    expect(signup.status).toBe(201);
    const { authcode } = JSON.parse((await http.get('/0/user/')).body) as { authcode: string };
    // The claim needs the device to have heard the user nearby (decision 18).
    await udpSend(nearbyPort, `${authcode}\n`);
    // The network view is keyed by each device's auth code, which the claim names (decision 8).
    const auth = await until(async () => {
      const network = JSON.parse((await http.get('/0/network/')).body) as Record<
        string,
        { meta: { unique?: { value: string } } }
      >;
      return Object.keys(network).find((k) => network[k]!.meta.unique?.value === deviceId);
    }, 'the device in the nearby view');
    const claim = await http.post('/0/devices/', { form: { auth } });
    expect([claim.status, claim.body]).toEqual([201, deviceId]);
    expect(await metaState()).toBe('connected');
    for (const [key, trigger] of [
      ['offline', 'offline'],
      ['offlineFor', 'offline for 2s'],
      ['online', 'online'],
    ] as const) {
      const r = await http.post('/0/user/event/', { form: { name: key, trigger, deviceid: deviceId } });
      expect(r.status, r.body).toBe(201);
      rules[key] = Number(r.body);
    }
    live = await LiveSocket.open(bridge.url, { cookie: `sid=${http.sid!}`, throttletime: 0 });
    // Past its snapshot: a channel still reading it would miss an event (docs/notifications.md, "Delivery").
    await live.next((m) => m.devices, 'the live channel’s snapshot');
  });

  afterAll(async () => {
    await live?.close();
    await agent?.kill9();
    await link?.close();
    await bridge?.close();
    for (const dir of [stateDir, configDir]) if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /**
   * Kills the agent (after cutting its link, with `cut`) and waits for the `count`th `offline` event, at most as long
   * as the broker and the bridge may take.
   */
  const killAndWait = async (count: number, cut: boolean): Promise<{ killedAt: number; event: Event }> => {
    if (cut) link.cut();
    const killedAt = Date.now();
    await agent.kill9();
    const event = await until(
      async () => (await ofRule(rules.offline))[count - 1],
      `offline event ${count} within ${GONE_MS + MARGIN_MS} ms of the kill`,
      GONE_MS + MARGIN_MS,
    );
    return { killedAt, event };
  };

  it('killed behind a cut link: `offline` fires once the keepalive ran out, with meta.state "disconnected", once', async () => {
    const { killedAt, event } = await killAndWait(1, true);
    expect(event).toMatchObject({
      name: 'offline',
      deviceid: deviceId,
      trigger: 'offline',
      variable: { type: 'meta', name: 'state' },
      value: 'disconnected',
      test: false,
    });
    expect(event.time - killedAt).toBeLessThanOrEqual(GONE_MS + MARGIN_MS);
    // Not before the keepalive could have run out: the agent sends a packet at least every keepalive, so the broker
    // heard from it at most that long before the kill.
    expect(event.time - killedAt).toBeGreaterThanOrEqual(GONE_MS - KEEPALIVE_SEC * 1000);
    expect(await metaState()).toBe('disconnected');
    // On the live channel, as the same event.
    const frame = await until(
      () => pushed(rules.offline).find((e) => e.id === event.id),
      'the offline event on the live channel',
      5000,
    );
    expect(frame).toEqual({ ...event, type: 'user-event' });

    // `offline for 2s`: two seconds of the device gone later, without any further change.
    const later = await until(
      async () => (await ofRule(rules.offlineFor))[0],
      'the offline-for-2s event',
      2000 + MARGIN_MS,
    );
    expect(later).toMatchObject({ trigger: 'offline for 2s', value: 'disconnected' });
    expect(later.time - event.time).toBeGreaterThanOrEqual(2000);
    // By then the state is long settled: each rule fired once, `online` not at all.
    expect(await ofRule(rules.offline)).toHaveLength(1);
    expect(await ofRule(rules.offlineFor)).toHaveLength(1);
    expect(await ofRule(rules.online)).toHaveLength(0);
    expect(pushed(rules.offline)).toHaveLength(1);
    expect(await stateOf(rules.offline)).toBe('fired');
    expect(await stateOf(rules.offlineFor)).toBe('fired');
  });

  it('a restart fires `online` and arms `offline` again; a kill on a sound link fires it again', async () => {
    start();
    const online = await until(async () => (await ofRule(rules.online))[0], 'the online event');
    expect(online).toMatchObject({ variable: { type: 'meta', name: 'state' }, value: 'connected', test: false });
    await until(async () => (await stateOf(rules.offline)) === 'armed', '`offline` armed again', 5000);
    await until(async () => (await stateOf(rules.offlineFor)) === 'armed', '`offline for 2s` armed again', 5000);
    expect(await stateOf(rules.online)).toBe('fired');

    const { killedAt, event } = await killAndWait(2, false);
    expect(event).toMatchObject({ trigger: 'offline', value: 'disconnected' });
    expect(event.time - killedAt).toBeLessThanOrEqual(GONE_MS + MARGIN_MS);
    await until(async () => (await ofRule(rules.offlineFor)).length === 2, 'the second offline-for-2s event', 5000);
    expect(await ofRule(rules.offline)).toHaveLength(2);
    // The agent's hello and its `online` state both said connected: one crossing, one event.
    expect(await ofRule(rules.online)).toHaveLength(1);
    await until(() => pushed(rules.offline).length === 2, 'the second offline event on the live channel', 5000);
    expect(await stateOf(rules.online)).toBe('armed');
  });
});
