/**
 * The delivery of fired events through real edges (docs/notifications.md, "Delivery" and "Webhooks"): a whole
 * bridge with its embedded broker, devices on their own MQTT connections, and what the events reach: the user's
 * WebSocket and SSE channels (and nobody else's), a real SMTP server, and an HTTPS receiver with a self-signed
 * certificate the bridge trusts through `notifications.webhook.caFile`, down while the events fire and up later.
 * The bridge reads a clock the test moves: the webhook's backoff is moved past, not waited out. A test fire
 * (`POST /0/user/event/<id>` without fields) goes the same ways.
 */
import { readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { EVENT_HEADER, SIGNATURE_HEADER, verifyWebhook } from '../../bridge/rules/webhook.js';
import { tempDir } from '../support/agent.js';
import { type LiveBridge, TestClock, engines, selfSignedCert, startLiveBridge } from '../support/bridge.js';
import { freePort } from '../support/brokers.js';
import { LiveSocket, SseStream } from '../support/live.js';
import {
  type EventJson,
  type Person,
  type SimDevice,
  addRule,
  claimedDevice,
  eventsOf,
  frameEvents,
  ruleOf,
  signup,
  untilEvents,
  untilState,
} from '../support/rules.js';
import { type TestSmtpServer, startSmtpServer } from '../support/smtp.js';
import { until } from '../support/wait.js';

/** Several polls of the webhook worker (every 100 ms here). */
const SETTLE_MS = 350;
const settle = () => new Promise((r) => setTimeout(r, SETTLE_MS));

/** A receiver's tolerance for the signature's time (docs/notifications.md, "Verifying a delivery"). */
const TOLERANCE_MS = 5 * 60_000;

describe.each(await engines())('the delivery of fired events (%s)', (engine) => {
  const clock = new TestClock(Date.now());
  let b: LiveBridge;
  let smtp: TestSmtpServer;
  let certDir: string;
  let tls: { cert: Buffer; key: Buffer };
  const devices: SimDevice[] = [];
  const cleanups: Array<() => unknown> = [];

  beforeAll(async () => {
    certDir = tempDir('devcloud-rules-tls-');
    const made = selfSignedCert(certDir);
    tls = { cert: made.cert, key: readFileSync(made.keyFile) };
    smtp = await startSmtpServer();
    b = await startLiveBridge({
      engine,
      now: clock.now,
      config: {
        notifications: {
          ruleMinIntervalMs: 0,
          webhook: { caFile: made.certFile, allowPrivateAddresses: true, pollMs: 100 },
        },
        mail: { smtp: { host: '127.0.0.1', port: smtp.port } },
      },
    });
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
    for (const d of devices.splice(0)) await d.mqtt.close();
  });
  afterAll(async () => {
    await b?.close();
    await smtp?.close();
    rmSync(certDir, { recursive: true, force: true });
  });

  const person = (name: string) => signup(b.client(), name);
  const device = async (owner: Person) => {
    const d = await claimedDevice(b.mqttUrl, b.bridge.store, owner);
    devices.push(d);
    return d;
  };
  /** A WebSocket and an SSE stream of the user, past their first snapshot. */
  const channels = async (p: Person) => {
    const ws = await LiveSocket.open(b.url, { cookie: p.cookie, throttletime: 0 });
    cleanups.push(() => ws.ws.terminate());
    const sse = await SseStream.open(b.url, { cookie: p.cookie });
    cleanups.push(() => sse.close());
    await ws.next((m) => m.devices, 'the snapshot');
    await sse.next((e) => (e.event === 'devices' ? true : undefined), 'the SSE snapshot');
    return {
      ws,
      sse,
      /** The user-events each channel got, in order. */
      got: () => ({ ws: frameEvents(ws.messages), sse: frameEvents(sse.data('events')) }),
    };
  };
  const testFire = (p: Person, rule: number) =>
    p.http.post(`/0/user/event/${rule}`, { form: { app: b.bridge.defaultFrontend.id } });

  it("reaches the user's WebSocket and SSE stream as the log lists it, and no other user's", async () => {
    const jo = await person('live');
    const kim = await person('live-other');
    const dev = await device(jo);
    const kimDev = await device(kim);
    const id = await addRule(jo, { name: 'Hot', message: 'Too hot in here', trigger: 'd.temp > 30', deviceid: dev.id });
    const kimRule = await addRule(kim, { name: 'Mine', trigger: 'd.temp > 30', deviceid: kimDev.id });
    const mine = await channels(jo);
    const theirs = await channels(kim);

    await dev.report('temp', '31');
    const [event] = await untilEvents(jo, 1);
    expect(event).toMatchObject({ rule: id, value: '31', message: 'Too hot in here', deviceid: dev.id });
    const frame = await mine.ws.next((m) => m.events?.[String(event!.id)], 'the event on the WebSocket');
    expect(frame).toEqual(event);
    const sse = await mine.sse.next(
      (e) => (e.event === 'events' ? (JSON.parse(e.data) as { events: Record<string, EventJson> }) : undefined),
      'the event on the SSE stream',
    );
    expect(sse).toEqual({ events: { [String(event!.id)]: event } });

    // Kim's own event, after Jo's on the bus: by the time it arrives, Jo's would have.
    const test = await testFire(kim, kimRule);
    expect(test.status).toBe(201);
    await until(() => theirs.got().ws.length === 1 && theirs.got().sse.length === 1, "Kim's own event");
    expect(theirs.got().ws.map((e) => e.id)).toEqual([Number(test.body)]);
    expect(theirs.got().sse.map((e) => e.id)).toEqual([Number(test.body)]);
    expect(mine.got().ws.map((e) => e.id)).toEqual([event!.id]);
    expect(mine.got().sse.map((e) => e.id)).toEqual([event!.id]);
  });

  it('a test fire answers 201 with the event id; the event is marked test and reaches the live channel', async () => {
    const lee = await person('test-fire');
    const dev = await device(lee);
    await dev.report('temp', '12');
    const id = await addRule(lee, { name: 'Hot', trigger: 'd.temp > 30', deviceid: dev.id });
    const live = await channels(lee);
    // Only `app`, as the official client's testNotification sends it: no rule field, so a test.
    const r = await testFire(lee, id);
    expect({ status: r.status, body: r.body }).toEqual({ status: 201, body: expect.stringMatching(/^\d+$/) as string });
    const [event] = await eventsOf(lee);
    expect(event).toMatchObject({ id: Number(r.body), rule: id, test: true, value: '12', name: 'Hot' });
    expect(event!.variable).toEqual({ type: 'd', name: 'temp' });
    await until(() => live.got().ws.length === 1 && live.got().sse.length === 1, 'the test on the channels');
    expect(live.got().ws).toEqual([event]);
    expect(live.got().sse).toEqual([event]);
    // A test moves nothing: the rule is armed as before, and has never fired.
    expect(await ruleOf(lee, id)).toMatchObject({ state: 'armed', lastFired: null });
    // And it counts nothing towards a real crossing: the next one fires.
    await dev.report('temp', '31');
    expect((await untilEvents(lee, 2))[0]).toMatchObject({ test: false, value: '31' });
  });

  it('an event that fires while a WebSocket channel reads its snapshot follows the snapshot', async () => {
    const kim = await person('held-event');
    const dev = await device(kim);
    const id = await addRule(kim, { name: 'Held', trigger: 'd.temp > 30', deviceid: dev.id });
    // The snapshot's read of the device is held until the event has been logged and announced.
    const devicesRepo = b.bridge.store.devices;
    const read = devicesRepo.deviceJson.bind(devicesRepo);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let reads = 0;
    devicesRepo.deviceJson = async (deviceId: string) => {
      reads++;
      await held;
      return read(deviceId);
    };
    cleanups.push(() => {
      devicesRepo.deviceJson = read;
    });
    const socket = await LiveSocket.open(b.url, { cookie: kim.cookie });
    cleanups.push(() => socket.ws.terminate());
    await until(() => reads > 0, 'the snapshot being read');
    const r = await testFire(kim, id);
    expect(r.status).toBe(201);
    await until(async () => (await eventsOf(kim)).length === 1, 'the event logged');
    await settle();
    expect(socket.messages).toEqual([]);
    release();
    const at = await socket.next((m) => (m.events?.[r.body] ? true : undefined), 'the held event');
    expect(at).toBe(true);
    // The snapshot first, then the event.
    expect(Object.keys(socket.messages[0]!)).toEqual(['devices']);
    expect(socket.messages[1]!.events?.[r.body]).toMatchObject({ type: 'user-event', id: Number(r.body), test: true });
  });

  it("e-mails the event to the user's login, with the rule's name as subject, and records it sent", async () => {
    const max = await person('mail');
    const dev = await device(max);
    const id = await addRule(max, {
      name: 'Boiler hot',
      message: 'Check the boiler',
      trigger: 'd.temp > 30',
      deviceid: dev.id,
      email: 'true',
    });
    expect(await ruleOf(max, id)).toMatchObject({ email: true });
    // The user got the confirmation of their signup; the rule's mails are the others.
    const ruleMails = () => smtp.messages.filter((m) => m.to.includes(max.login) && m.subject.includes('Boiler'));
    await dev.report('temp', '31');
    const mail = await smtp.waitFor((m) => m.to.includes(max.login) && m.subject.includes('Boiler'));
    expect(mail.subject).toBe('Boiler hot');
    expect(mail.text).toContain('Check the boiler');
    expect(mail.text).toContain('Value of d.temp: 31');
    expect(mail.text).toContain(dev.id);
    const [event] = await until(async () => {
      const list = await eventsOf(max);
      return list[0]?.email === 'sent' ? list : undefined;
    }, 'the e-mail recorded sent');
    expect(event).toMatchObject({ rule: id, value: '31', email: 'sent' });
    expect(ruleMails()).toHaveLength(1);
    // A test is e-mailed too, marked as one.
    expect((await testFire(max, id)).status).toBe(201);
    const test = await smtp.waitFor((m) => m.to.includes(max.login) && m.subject.startsWith('[test]'));
    expect(test.subject).toBe('[test] Boiler hot');
    expect(ruleMails()).toHaveLength(2);
  });

  it('a webhook receiver that is down while 3 events fire gets each once when it comes up, signed', async () => {
    const ned = await person('webhook');
    const dev = await device(ned);
    const port = await freePort();
    const url = `https://127.0.0.1:${port}/hook?token=abc`;
    // Plain http:// is refused where allowHttp is not set.
    const plain = await ned.http.post('/0/user/event/', {
      form: { name: 'Hook', trigger: 'd.temp > 30', deviceid: dev.id, webhook: `http://127.0.0.1:${port}/hook` },
    });
    expect({ status: plain.status, body: plain.body }).toEqual({ status: 400, body: 'event-fail-webhook' });
    const id = await addRule(ned, { name: 'Hook', trigger: 'd.temp > 30', deviceid: dev.id, webhook: url });
    const rule = await ruleOf(ned, id);
    expect(rule.webhook).toBe(url);
    expect(rule.webhookSecret).toMatch(/^[A-Za-z0-9_-]{43}$/);

    // Three crossings while nothing listens on the port.
    for (const value of ['31', '32', '33']) {
      await dev.report('temp', value);
      await untilState(ned, id, 'fired');
      await dev.report('temp', '20');
      await untilState(ned, id, 'armed');
    }
    const failedOnce = await until(async () => {
      const list = await eventsOf(ned);
      return list.length === 3 && list.every((e) => e.webhook?.state === 'pending' && e.webhook.attempts === 1)
        ? list
        : undefined;
    }, 'the first attempts failed');
    for (const e of failedOnce) expect(e.webhook!.error).toBeTruthy();

    // The receiver comes up on the port; the bridge's clock moves past the first backoff (1 s, ±20 %).
    const posts: Array<{ path: string; headers: Record<string, string | string[] | undefined>; body: string }> = [];
    const server = https.createServer(tls, (req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        posts.push({ path: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
        res.writeHead(200).end('ok');
      });
    });
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
    cleanups.push(() => new Promise((resolve) => server.close(resolve)));
    clock.advance(1300);
    const delivered = await until(async () => {
      const list = await eventsOf(ned);
      return list.every((e) => e.webhook?.state === 'delivered') ? list : undefined;
    }, 'the three delivered');
    // Nothing more comes: each event once, counted as the receiver got them (no deduplication).
    await settle();
    expect(posts).toHaveLength(3);
    expect(posts.map((p) => Number(p.headers[EVENT_HEADER])).sort()).toEqual(delivered.map((e) => e.id).sort());
    const secret = (await ruleOf(ned, id)).webhookSecret!;
    for (const p of posts) {
      expect(p.path).toBe('/hook?token=abc');
      expect(p.headers['content-type']).toBe('application/json');
      const signature = String(p.headers[SIGNATURE_HEADER]);
      expect(verifyWebhook(secret, signature, p.body, clock.now(), TOLERANCE_MS)).toBe(true);
      expect(verifyWebhook('another secret', signature, p.body, clock.now(), TOLERANCE_MS)).toBe(false);
      const body = JSON.parse(p.body) as Record<string, unknown>;
      const logged = delivered.find((e) => e.id === Number(p.headers[EVENT_HEADER]))!;
      const { email, webhook, ...rest } = logged;
      void email;
      void webhook;
      expect(body).toEqual(rest);
    }
    expect(delivered.map((e) => e.value)).toEqual(['33', '32', '31']);
    for (const e of delivered) {
      expect(e.webhook).toMatchObject({ url, state: 'delivered', status: 200, error: null });
      expect(e.webhook!.attempts).toBeGreaterThanOrEqual(2);
    }
    expect(b.sink.events('webhook.delivered')).toHaveLength(3);
    // The log shows the receiver's origin, never the token in its query.
    expect(JSON.stringify(b.sink.events('webhook.retry'))).not.toContain('token=abc');
  });
});
