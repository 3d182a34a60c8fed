/**
 * `GET /healthz` and `GET /metrics` on a running bridge: healthy, then failing when its database fails and when
 * its external broker (a private Mosquitto, killed) stays away longer than the grace period; the metrics after
 * real HTTP requests and real MQTT traffic from an agent and a device client, parsed from the text format; and
 * the access control of `/metrics`.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import mqtt from 'mqtt';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../bridge/app.js';
import { hasherFor } from '../../bridge/accounts/password.js';
import { BridgeConfigSchema, outboxDir } from '../../bridge/config.js';
import { HealthObject } from '../../bridge/health.js';
import { createMailer } from '../../bridge/mail/mailer.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { topicFor } from '../../protocol/index.js';
import { LogSink, type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type LiveBridge, type TestBridge, startLiveBridge, startTestBridge } from '../support/bridge.js';
import { type TestBroker, startMosquitto, upVars } from '../support/brokers.js';
import { type Netns, makeNetns, netnsUnavailable } from '../support/netns.js';
import { requires, skipOrFail } from '../support/system.js';
import { until } from '../support/wait.js';

/** One sample of the text format: `name{label="value",...} number`. */
type Samples = Map<string, number>;

/** The samples of a scrape, keyed by name and labels in order of name (`name{a="x",b="y"}`). */
function parseMetrics(text: string): Samples {
  const out: Samples = new Map();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    expect(m, `a sample line: ${line}`).not.toBeNull();
    const labels = [...(m![2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)]
      .map(([, k, v]) => `${k}="${v}"`)
      .sort();
    out.set(labels.length > 0 ? `${m![1]}{${labels.join(',')}}` : m![1]!, Number(m![3]));
  }
  return out;
}

const key = (name: string, labels: Record<string, string> = {}) => {
  const parts = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .sort();
  return parts.length > 0 ? `${name}{${parts.join(',')}}` : name;
};

async function scrape(url: string, headers: Record<string, string> = {}): Promise<Samples> {
  const r = await fetch(`${url}/metrics`, { headers });
  expect(r.status).toBe(200);
  expect(r.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return parseMetrics(await r.text());
}

async function health(url: string): Promise<{ status: number; body: HealthObject }> {
  const r = await fetch(`${url}/healthz`);
  expect(r.headers.get('content-type')).toMatch(/^application\/json/);
  expect(r.headers.get('cache-control')).toBe('no-store');
  const body = HealthObject.parse(await r.json());
  return { status: r.status, body };
}

describe('GET /healthz', () => {
  let live: LiveBridge | undefined;
  let broker: TestBroker | undefined;
  let test: TestBridge | undefined;

  afterEach(async () => {
    await live?.close();
    await broker?.close();
    await test?.close();
    live = broker = test = undefined;
  });

  it('answers 200 with the embedded broker connected, without a session or a frontend', async () => {
    live = await startLiveBridge({ config: { frontends: { allowDefault: false } } });
    const h = await health(live.url);
    expect(h.status).toBe(200);
    expect(h.body).toMatchObject({
      status: 'ok',
      database: 'ok',
      engine: 'sqlite',
      mqtt: { broker: 'embedded', connected: true, downSince: null },
    });
    // A request naming no frontend answers 404 when there is no default frontend; the probe is not one.
    expect((await fetch(`${live.url}/0/openapi.json`)).status).toBe(404);
  });

  it('answers 503 once the database fails, and logs it once', async () => {
    test = await startTestBridge({ transport: 'http' });
    expect((await health(test.url!)).status).toBe(200);
    await test.store.close();
    for (let i = 0; i < 2; i++) {
      const h = await health(test.url!);
      expect(h.status).toBe(503);
      expect(h.body).toMatchObject({ status: 'failing', database: 'failing', mqtt: { broker: 'none' } });
    }
    expect(test.sink.events('health.database_failed')).toHaveLength(1);
  });

  it('answers 503 once an external broker has been away longer than the grace period, and 200 when it is back', async (ctx) => {
    requires(ctx, 'mosquitto');
    broker = await startMosquitto();
    // Long enough that the first probe after the drop comes within it on a busy machine.
    const graceMs = 2000;
    live = await startLiveBridge({ config: { mqtt: { url: broker.url }, health: { linkGraceMs: graceMs } } });
    const up = await until(async () => {
      const h = await health(live!.url);
      return h.body.mqtt.connected && h;
    }, 'the link up');
    expect(up.status).toBe(200);
    expect(up.body.mqtt).toEqual({ broker: 'external', connected: true, downSince: null });
    expect((await scrape(live.url)).get('devcloud_mqtt_link_connected')).toBe(1);

    await broker.stop();
    const down = await until(async () => {
      const h = await health(live!.url);
      return !h.body.mqtt.connected && h;
    }, 'the link down');
    // Within the grace period: still healthy, and says since when the link is down.
    expect(down.status).toBe(200);
    expect(down.body.status).toBe('ok');
    expect(down.body.mqtt.downSince).toBeGreaterThan(Date.now() - graceMs);
    const metrics = await scrape(live.url);
    expect(metrics.get('devcloud_mqtt_link_connected')).toBe(0);
    expect(metrics.get('devcloud_mqtt_link_down_seconds')).toBeGreaterThan(0);

    const failing = await until(async () => {
      const h = await health(live!.url);
      return h.status === 503 && h;
    }, 'a 503 past the grace period');
    expect(failing.body).toMatchObject({ status: 'failing', database: 'ok', mqtt: { connected: false } });
    expect(Date.now() - failing.body.mqtt.downSince!).toBeGreaterThanOrEqual(graceMs);

    await broker.start();
    const back = await until(async () => {
      const h = await health(live!.url);
      return h.status === 200 && h;
    }, 'healthy again');
    expect(back.body.mqtt).toEqual({ broker: 'external', connected: true, downSince: null });
  });
});

describe('GET /metrics', () => {
  let live: LiveBridge;
  let agent: TestAgent;
  let device: mqtt.MqttClient;
  const deviceId = randomUUID();

  beforeAll(async () => {
    live = await startLiveBridge({ config: { devices: { historyPerVariable: 4 } } });
    agent = await startAgent({ mqttUrl: live.mqttUrl, flags: { 'udp.enabled': false } });
    device = await mqtt.connectAsync(live.mqttUrl, {
      clientId: deviceId,
      username: deviceId,
      password: randomBytes(16).toString('hex'),
      reconnectPeriod: 0,
    });
  });

  afterAll(async () => {
    await device?.endAsync();
    await agent?.stop();
    await live?.close();
  });

  it('counts requests, MQTT messages, devices, commands and firmware jobs, with the process figures', async () => {
    const store = live.bridge.store;
    const agentId = agent.agent.identity.deviceId;
    await until(async () => (await store.devices.connectedIds()).includes(agentId), 'the agent connected');
    await until(
      async () =>
        (await scrape(live.url)).get(key('devcloud_mqtt_messages_received_total', { topic: 'up/hello' })) === 1,
      'the hello counted',
    );

    // Requests: two to a route, and one that matches none.
    for (let i = 0; i < 2; i++) expect((await fetch(`${live.url}/0/openapi.json`)).status).toBe(200);
    expect((await fetch(`${live.url}/0/nothing/${randomUUID()}`)).status).toBe(404);
    // A payload that fails validation, on the device's own topic: dropped.
    await device.publishAsync(topicFor(deviceId, 'up/vars'), Buffer.from('{"not":"a vars message"'), { qos: 1 });
    // A queued command and an open firmware job, as the API would leave them.
    const now = Date.now();
    await store.write(async (tx) => {
      await tx.commands.add({
        id: randomUUID(),
        deviceId: agentId,
        userId: null,
        command: Buffer.from('ping'),
        priority: 0,
        createdAt: now,
        expiresAt: now + 60_000,
      });
      await tx.fwJobs.add({
        id: randomUUID(),
        deviceId: agentId,
        name: 'gw',
        sha256: '0'.repeat(64),
        size: 1,
        token: 'token',
        tokenExpires: now + 60_000,
        createdAt: now,
        url: 'http://127.0.0.1/image',
      });
    });

    const m = await until(async () => {
      const s = await scrape(live.url);
      return s.get(key('devcloud_mqtt_messages_dropped_total', { reason: 'invalid' })) === 1 && s;
    }, 'the invalid payload counted');
    const openapi = { method: 'GET', route: '/0/openapi.json' };
    expect(m.get(key('devcloud_http_requests_total', { ...openapi, status: '200' }))).toBe(2);
    expect(m.get(key('devcloud_http_request_duration_seconds_count', openapi))).toBe(2);
    expect(m.get(key('devcloud_http_request_duration_seconds_bucket', { ...openapi, le: '+Inf' }))).toBe(2);
    // Buckets are cumulative: both answers took less than 10 s, and the sum is their time.
    expect(m.get(key('devcloud_http_request_duration_seconds_bucket', { ...openapi, le: '10' }))).toBe(2);
    expect(m.get(key('devcloud_http_request_duration_seconds_sum', openapi))).toBeGreaterThan(0);
    expect(m.get(key('devcloud_http_requests_total', { method: 'GET', route: 'unmatched', status: '404' }))).toBe(1);
    // Earlier scrapes are counted under their route pattern.
    expect(
      m.get(key('devcloud_http_requests_total', { method: 'GET', route: '/metrics', status: '200' })),
    ).toBeGreaterThanOrEqual(1);

    expect(m.get(key('devcloud_mqtt_messages_received_total', { topic: 'up/hello' }))).toBe(1);
    expect(m.get(key('devcloud_mqtt_messages_received_total', { topic: 'state' }))).toBeGreaterThanOrEqual(1);
    expect(m.get(key('devcloud_mqtt_messages_received_total', { topic: 'up/cmd' }))).toBe(0);
    expect(m.get(key('devcloud_mqtt_messages_dropped_total', { reason: 'foreign' }))).toBe(0);
    expect(m.get(key('devcloud_mqtt_messages_dropped_total', { reason: 'hello_mismatch' }))).toBe(0);
    expect(m.get('devcloud_mqtt_link_connected')).toBe(1);
    expect(m.get('devcloud_mqtt_link_down_seconds')).toBe(0);

    // The agent and the device client are enrolled; only the agent says it is connected.
    expect(m.get('devcloud_devices_known')).toBe(2);
    expect(m.get('devcloud_devices_connected')).toBe(1);
    expect(m.get(key('devcloud_commands', { state: 'queued' }))).toBe(1);
    expect(m.get(key('devcloud_commands', { state: 'done' }))).toBe(0);
    expect(m.get('devcloud_firmware_jobs_open')).toBe(1);

    expect(m.get('process_resident_memory_bytes')).toBeGreaterThan(1_000_000);
    expect(m.has('nodejs_heap_size_used_bytes')).toBe(true);
  });

  it('reports the size of the database, which follows real traffic, and what the retention removed', async () => {
    const store = live.bridge.store;
    const before = await scrape(live.url);
    const bytes0 = before.get('devcloud_bridge_database_bytes')!;
    expect(bytes0).toBeGreaterThan(0);
    expect(before.get('devcloud_bridge_database_free_bytes')).toBeGreaterThanOrEqual(0);
    // 100 changes of 32 KiB from the device client, each a new version with its history entry: over 3 MiB.
    const value = 'x'.repeat(32 * 1024);
    for (let i = 0; i < 100; i++) {
      await device.publishAsync(topicFor(deviceId, 'up/vars'), upVars(`big${i % 10}`, `${i}${value}`), { qos: 1 });
    }
    await until(
      async () => (await store.devices.history(deviceId, 'd', 'big9', 100)).length === 10,
      'the changes stored',
    );
    const after = await scrape(live.url);
    const bytes1 = after.get('devcloud_bridge_database_bytes')!;
    expect(bytes1 - bytes0).toBeGreaterThan(3 * 1024 * 1024);
    // What the files hold: the main file and its write-ahead log, whatever of the log is not checkpointed yet.
    const files = ['bridge.db', 'bridge.db-wal'].map((f) => {
      try {
        return statSync(join(live.dataDir, f)).size;
      } catch {
        return 0;
      }
    });
    expect(bytes1).toBeGreaterThanOrEqual(files[1]!);
    expect(bytes1).toBeLessThanOrEqual(files[0]! + 2 * files[1]! + 1024 * 1024);
    expect(after.get(key('devcloud_history_pruned_total', { limit: 'count' }))).toBe(0);
    // This bridge keeps 4 entries a variable: a pass of the retention removes 6 of each, and leaves free pages.
    const pass = await live.bridge.devices.retention.pass();
    expect(pass.byCount).toBeGreaterThanOrEqual(60);
    for (let k = 0; k < 10; k++) expect(await store.devices.history(deviceId, 'd', `big${k}`, 100)).toHaveLength(4);
    const last = await scrape(live.url);
    expect(last.get(key('devcloud_history_pruned_total', { limit: 'count' }))).toBe(pass.byCount);
    expect(last.get(key('devcloud_history_pruned_total', { limit: 'age' }))).toBe(0);
    expect(last.get('devcloud_bridge_database_free_bytes')).toBeGreaterThan(
      after.get('devcloud_bridge_database_free_bytes')! + 1024 * 1024,
    );
  });
});

/** A GET with node's client, from a chosen local address (`fetch` cannot choose one). */
function rawGet(
  url: string,
  opts: { localAddress?: string; headers?: Record<string, string> } = {},
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const r = http.get(url, { headers: opts.headers, localAddress: opts.localAddress }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    r.on('error', reject);
  });
}

describe('access to /metrics', () => {
  const dirs: string[] = [];
  let ns: Netns | undefined;
  afterAll(async () => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    await ns?.close();
  });

  function tokenFile(content: string): string {
    const dir = tempDir('devcloud-metrics-');
    dirs.push(dir);
    const file = join(dir, 'token');
    writeFileSync(file, content, { mode: 0o600 });
    return file;
  }

  it('asks for the bearer token of metrics.tokenFile when one is set', async () => {
    const token = randomBytes(24).toString('base64url');
    const b = await startTestBridge({ transport: 'http', config: { metrics: { tokenFile: tokenFile(`${token}\n`) } } });
    try {
      for (const authorization of [undefined, 'Bearer wrong', `Bearer ${token}x`, `Basic ${token}`, token]) {
        const r = await fetch(`${b.url}/metrics`, authorization ? { headers: { authorization } } : {});
        expect(r.status, String(authorization)).toBe(401);
        expect(r.headers.get('www-authenticate')).toBe('Bearer');
        expect(await r.text()).toBe('unauthorized');
      }
      const ok = await scrape(b.url!, { authorization: `Bearer ${token}` });
      expect(ok.get(key('devcloud_http_requests_total', { method: 'GET', route: '/metrics', status: '401' }))).toBe(5);
      // The health probe needs no token.
      expect((await fetch(`${b.url}/healthz`)).status).toBe(200);
      // The document says so.
      const doc = (await (await fetch(`${b.url}/0/openapi.json`)).json()) as {
        paths: Record<string, { get: { responses: Record<string, unknown> } }>;
      };
      expect(Object.keys(doc.paths['/metrics']!.get.responses)).toContain('401');
    } finally {
      await b.close();
    }
  });

  it('answers only loopback clients without a token; another machine needs the token', async (ctx) => {
    // Another machine: a network namespace of the test's own, joined to this one by a veth pair.
    let missing = netnsUnavailable();
    if (missing === undefined) {
      try {
        ns = await makeNetns();
      } catch (e) {
        missing = `needs root with CAP_NET_ADMIN to make a network namespace (${(e as Error).message})`;
      }
    }
    if (ns === undefined) {
      skipOrFail(`a client in a network namespace ${missing}`);
      ctx.skip();
      return;
    }
    const far = ns;
    // Listening on every address: the same bridge is reached over loopback and over the veth, whose connections
    // come from the namespace's (non-loopback) address.
    const open = await startTestBridge({ transport: 'http', host: '0.0.0.0' });
    const token = randomBytes(24).toString('base64url');
    const guarded = await startTestBridge({
      transport: 'http',
      host: '0.0.0.0',
      config: { metrics: { tokenFile: tokenFile(token) } },
    });
    try {
      const port = (b: TestBridge) => Number(new URL(b.url!).port);
      const local = await rawGet(`http://127.0.0.1:${port(open)}/metrics`, { localAddress: '127.0.0.1' });
      expect(local.status).toBe(200);
      expect(local.body).toContain('devcloud_http_requests_total');
      // Any address of 127.0.0.0/8 is loopback.
      expect((await rawGet(`http://127.0.0.1:${port(open)}/metrics`, { localAddress: '127.3.2.1' })).status).toBe(200);
      const refused = await far.get(`http://${far.hostAddress}:${port(open)}/metrics`);
      expect([refused.status, refused.body]).toEqual([403, 'metrics-local-only']);
      // With a token, the other machine is let in by the token, and only by it.
      const url = `http://${far.hostAddress}:${port(guarded)}/metrics`;
      expect((await far.get(url)).status).toBe(401);
      expect((await far.get(url, { authorization: 'Bearer wrong' })).status).toBe(401);
      const ok = await far.get(url, { authorization: `Bearer ${token}` });
      expect(ok.status).toBe(200);
      expect(ok.body).toContain('devcloud_http_requests_total');
      // The health probe stays open to everyone.
      expect((await far.get(`http://${far.hostAddress}:${port(open)}/healthz`)).status).toBe(200);
      // The refusal was the client's address, not the way in: loopback on the same bridge is still answered.
      expect((await rawGet(`http://127.0.0.1:${port(open)}/metrics`)).status).toBe(200);
    } finally {
      await open.close();
      await guarded.close();
    }
  });

  it('takes a client through a proxy for local only when http.trustProxy trusts the proxy', async () => {
    const direct = await startTestBridge({ transport: 'http' });
    const proxied = await startTestBridge({ transport: 'http', config: { http: { trustProxy: ['127.0.0.1'] } } });
    try {
      // Through a proxy the bridge does not trust, any client looks local: forwarding headers give it away.
      const viaProxy: Array<Record<string, string>> = [
        { 'x-forwarded-for': '127.0.0.1' },
        { forwarded: 'for=203.0.113.7' },
      ];
      for (const headers of viaProxy) {
        const r = await rawGet(`${direct.url}/metrics`, { headers });
        expect([r.status, r.body]).toEqual([403, 'metrics-local-only']);
      }
      expect((await rawGet(`${direct.url}/metrics`)).status).toBe(200);
      // A trusted proxy names the client: a remote one is refused, a local one answered.
      const far = await rawGet(`${proxied.url}/metrics`, { headers: { 'x-forwarded-for': '203.0.113.7' } });
      expect([far.status, far.body]).toEqual([403, 'metrics-local-only']);
      const spoofed = await rawGet(`${proxied.url}/metrics`, {
        headers: { 'x-forwarded-for': '127.0.0.1, 203.0.113.7' },
      });
      expect(spoofed.status).toBe(403);
      expect((await rawGet(`${proxied.url}/metrics`, { headers: { 'x-forwarded-for': '127.0.0.1' } })).status).toBe(
        200,
      );
      expect((await rawGet(`${proxied.url}/metrics`)).status).toBe(200);
    } finally {
      await direct.close();
      await proxied.close();
    }
  });

  it('is not served with metrics.enabled false, nor in the document', async () => {
    const b = await startTestBridge({ config: { metrics: { enabled: false } } });
    try {
      const r = await b.client().get('/metrics');
      expect([r.status, r.body]).toEqual([404, 'not found']);
      expect((await b.client().get('/healthz')).status).toBe(200);
      const doc = JSON.parse((await b.client().get('/0/openapi.json')).body) as { paths: Record<string, unknown> };
      expect(doc.paths['/metrics']).toBeUndefined();
      expect(doc.paths['/healthz']).toBeDefined();
      const enabled = await startTestBridge();
      try {
        const open = JSON.parse((await enabled.client().get('/0/openapi.json')).body) as {
          paths: Record<string, unknown>;
        };
        expect(open.paths['/metrics']).toBeDefined();
      } finally {
        await enabled.close();
      }
    } finally {
      await b.close();
    }
  });

  it('refuses to start with an empty or missing token file', async () => {
    const dataDir = tempDir('devcloud-metrics-');
    dirs.push(dataDir);
    const log = createLogger({ level: 'silent', pretty: 'never', base: {}, destination: new LogSink() });
    const store = new SqliteStore(dataDir);
    try {
      for (const [file, message] of [
        [tokenFile(' \n'), /is empty/],
        [join(dataDir, 'missing'), /cannot read the metrics token file/],
      ] as const) {
        const config = BridgeConfigSchema.parse({ dataDir, metrics: { tokenFile: file } });
        const mailer = createMailer({ ...config.mail, outboxDir: outboxDir(config) }, log, Date.now);
        expect(() => buildApp({ config, store, hasher: hasherFor(config), mailer, log, checkAnswers: true })).toThrow(
          message,
        );
        void mailer.close();
      }
    } finally {
      await store.close();
    }
  });
});
