/**
 * Webhook delivery (docs/notifications.md, "Webhooks"): one attempt against real HTTPS receivers on loopback (a
 * self-signed certificate made with openssl, trusted through `ca`), the SSRF refusals, the signature receivers
 * check, and the worker over an outbox kept in memory here, with a clock the test moves instead of waiting out
 * the backoff.
 */
import dns from 'node:dns';
import { readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  type DeliveryOutcome,
  type DueDelivery,
  type WebhookOutbox,
  WebhookWorker,
} from '../../bridge/rules/webhook-worker.js';
import {
  EVENT_HEADER,
  SIGNATURE_HEADER,
  type WebhookConfig,
  WebhookConfigSchema,
  backoffMs,
  checkWebhookUrl,
  isPrivateAddress,
  sendWebhook,
  signWebhook,
  verifyWebhook,
} from '../../bridge/rules/webhook.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { TestClock, selfSignedCert } from '../support/bridge.js';
import { freePort } from '../support/brokers.js';
import { until } from '../support/wait.js';

const SECRET = 'whsec_0123456789abcdef0123456789abcdef';
const BODY = JSON.stringify({ id: 42, type: 'user-event', rule: 7, device: 'dev-1', value: 31.5, time: 1_900_000_000 });

let tls: { key: Buffer; cert: Buffer };
let certDir: string;
beforeAll(() => {
  certDir = tempDir('devcloud-webhook-');
  const made = selfSignedCert(certDir);
  tls = { cert: made.cert, key: readFileSync(made.keyFile) };
});
afterAll(() => rmSync(certDir, { recursive: true, force: true }));

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Received {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

type Handler = (req: http.IncomingMessage, res: http.ServerResponse, body: string) => void;

interface Receiver {
  port: number;
  url: string;
  requests: Received[];
  inFlight: number;
  maxInFlight: number;
  close(): Promise<void>;
}

/** An HTTPS (or plain HTTP) receiver on 127.0.0.1 that records what it gets and answers with `handler` (200). */
async function startReceiver(opts: { handler?: Handler; plain?: boolean; port?: number } = {}): Promise<Receiver> {
  const handler: Handler = opts.handler ?? ((_req, res) => res.end('ok'));
  const r: Receiver = {
    port: 0,
    url: '',
    requests: [],
    inFlight: 0,
    maxInFlight: 0,
    close: async () => {},
  };
  const onRequest = (req: http.IncomingMessage, res: http.ServerResponse) => {
    r.inFlight++;
    r.maxInFlight = Math.max(r.maxInFlight, r.inFlight);
    res.on('close', () => r.inFlight--);
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      r.requests.push({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, body });
      handler(req, res, body);
    });
  };
  const server = opts.plain ? http.createServer(onRequest) : https.createServer(tls, onRequest);
  await new Promise<void>((resolve) => server.listen(opts.port ?? 0, '127.0.0.1', resolve));
  r.port = (server.address() as { port: number }).port;
  r.url = `${opts.plain ? 'http' : 'https'}://127.0.0.1:${r.port}/hooks/devcloud?token=q-secret`;
  let closed = false;
  r.close = async () => {
    if (closed) return;
    closed = true;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  cleanups.push(() => r.close());
  return r;
}

function config(over: Partial<WebhookConfig> = {}): WebhookConfig {
  return WebhookConfigSchema.parse({ allowPrivateAddresses: true, ...over });
}

/** `ca`: the receivers' CA by default; `null` for none. */
function attempt(url: string, cfg: WebhookConfig, ca: Buffer | null = tls.cert, now = Date.now()) {
  return sendWebhook({ url, body: BODY, secret: SECRET, eventId: '42', now }, cfg, ca ?? undefined);
}

describe('one webhook attempt', () => {
  it('POSTs the body signed, with the event id, to a receiver whose CA is given', async () => {
    const receiver = await startReceiver();
    const now = Date.now();
    const result = await attempt(receiver.url, config(), tls.cert, now);
    expect(result).toEqual({ ok: true, status: 200 });
    expect(receiver.requests).toHaveLength(1);
    const got = receiver.requests[0]!;
    expect(got.method).toBe('POST');
    expect(got.path).toBe('/hooks/devcloud?token=q-secret');
    expect(got.body).toBe(BODY);
    expect(got.headers['content-type']).toBe('application/json');
    expect(got.headers['user-agent']).toBe('devcloud-bridge');
    expect(got.headers[EVENT_HEADER]).toBe('42');
    expect(got.headers.host).toBe(`127.0.0.1:${receiver.port}`);
    const signature = got.headers[SIGNATURE_HEADER];
    expect(signature).toMatch(/^t=\d+,v1=[0-9a-f]{64}$/);
    expect(signature).toBe(signWebhook(SECRET, now, BODY));

    const header = String(signature);
    const tolerance = 5 * 60_000;
    expect(verifyWebhook(SECRET, header, got.body, now + 1000, tolerance)).toBe(true);
    expect(verifyWebhook(SECRET, header, got.body.replace('31.5', '31.6'), now, tolerance)).toBe(false);
    expect(verifyWebhook(`${SECRET}x`, header, got.body, now, tolerance)).toBe(false);
    expect(verifyWebhook(SECRET, header, got.body, now + tolerance + 1, tolerance)).toBe(false);
    expect(verifyWebhook(SECRET, header, got.body, now - tolerance - 1, tolerance)).toBe(false);
    // The timestamp is signed: moving it breaks the signature.
    expect(
      verifyWebhook(
        SECRET,
        header.replace(/^t=(\d+)/, (_m, t: string) => `t=${Number(t) + 1}`),
        got.body,
        now,
        tolerance,
      ),
    ).toBe(false);
    expect(verifyWebhook(SECRET, 'v1=00', got.body, now, tolerance)).toBe(false);
    expect(verifyWebhook(SECRET, '', got.body, now, tolerance)).toBe(false);
    // A second v1 (a signer between two secrets) is accepted when one of them matches.
    const v1 = header.split('v1=')[1]!;
    expect(verifyWebhook(SECRET, `t=${now},v1=${'0'.repeat(64)},v1=${v1}`, got.body, now, tolerance)).toBe(true);
  });

  it('fails on a receiver whose certificate no trusted CA signed', async () => {
    const receiver = await startReceiver();
    const result = await attempt(receiver.url, config(), null);
    expect(result.ok).toBe(false);
    expect(result.permanent).not.toBe(true);
    expect(result.error).toMatch(/self.signed|certificate/i);
  });

  it('is not ok on a 500, with the status, and not permanent', async () => {
    const receiver = await startReceiver({
      handler: (_req, res) => {
        res.statusCode = 500;
        res.end('boom');
      },
    });
    const result = await attempt(receiver.url, config());
    expect(result).toMatchObject({ ok: false, status: 500 });
    expect(result.permanent).not.toBe(true);
  });

  it('gives up on a receiver that does not answer within timeoutMs', async () => {
    const receiver = await startReceiver({ handler: () => {} });
    const t0 = performance.now();
    const result = await attempt(receiver.url, config({ timeoutMs: 1000 }));
    const took = performance.now() - t0;
    expect(result.ok).toBe(false);
    expect(result.error).toMatch(/no answer within 1000 ms/);
    expect(took).toBeGreaterThanOrEqual(900);
    expect(took).toBeLessThan(5000);
    expect(receiver.requests).toHaveLength(1);
  });

  it('follows no redirect: a 3xx is a failure', async () => {
    const receiver = await startReceiver({
      handler: (req, res) => {
        if (req.url?.startsWith('/hooks')) {
          res.writeHead(307, { location: '/elsewhere' });
          res.end();
        } else res.end('ok');
      },
    });
    const result = await attempt(receiver.url, config());
    expect(result).toMatchObject({ ok: false, status: 307 });
    expect(receiver.requests.map((r) => r.path)).toEqual(['/hooks/devcloud?token=q-secret']);
  });

  it('reads no more than maxResponseBytes of an answer that never ends', async () => {
    const receiver = await startReceiver({
      handler: (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        const chunk = Buffer.alloc(16 * 1024, 'x');
        const pump = () => {
          while (!res.destroyed && res.write(chunk));
          if (!res.destroyed) res.once('drain', pump);
        };
        pump();
      },
    });
    const t0 = performance.now();
    const result = await attempt(receiver.url, config({ maxResponseBytes: 1024, timeoutMs: 10_000 }));
    expect(result).toEqual({ ok: true, status: 200 });
    expect(performance.now() - t0).toBeLessThan(5000);
  });

  it('refuses http:// unless allowHttp', async () => {
    const receiver = await startReceiver({ plain: true });
    const refused = await attempt(receiver.url, config());
    expect(refused).toMatchObject({ ok: false, permanent: true });
    expect(refused.error).toMatch(/http/);
    expect(receiver.requests).toHaveLength(0);
    expect(await attempt(receiver.url, config({ allowHttp: true }))).toEqual({ ok: true, status: 200 });
    expect(receiver.requests).toHaveLength(1);
  });

  it('refuses a private address, literal or resolved, unless allowPrivateAddresses; without connecting', async () => {
    const receiver = await startReceiver();
    const strict = config({ allowPrivateAddresses: false });
    for (const url of [
      receiver.url,
      `https://localhost:${receiver.port}/hooks`,
      `https://[::ffff:127.0.0.1]:${receiver.port}/hooks`,
      `https://0x7f000001:${receiver.port}/hooks`,
    ]) {
      const result = await attempt(url, strict);
      expect(result, url).toMatchObject({ ok: false, permanent: true });
      expect(result.error, url).toMatch(/private or reserved/);
      // The reason is shown to the user: it does not name the address the host resolved to.
      expect(result.error, url).not.toMatch(/127\.0\.0\.1|::1/);
    }
    expect(receiver.requests).toHaveLength(0);
    expect(await attempt(receiver.url, config({ allowPrivateAddresses: true }))).toEqual({ ok: true, status: 200 });
  });

  it('connects to the address it resolved and checked, asking DNS once', async () => {
    const receiver = await startReceiver({ plain: true });
    // A name no DNS knows: only the answer the check saw can take the connection to the receiver.
    const lookup = vi
      .spyOn(dns.promises, 'lookup')
      .mockImplementation((() =>
        Promise.resolve([{ address: '127.0.0.1', family: 4 }])) as unknown as typeof dns.promises.lookup);
    const url = `http://hooks.devcloud.invalid:${receiver.port}/in`;
    const cfg = config({ allowHttp: true, allowPrivateAddresses: true });
    expect(await attempt(url, cfg)).toEqual({ ok: true, status: 200 });
    expect(lookup).toHaveBeenCalledTimes(1);
    expect(lookup.mock.calls[0]![0]).toBe('hooks.devcloud.invalid');
    expect(receiver.requests[0]!.headers.host).toBe(`hooks.devcloud.invalid:${receiver.port}`);
    expect(await attempt(url, { ...cfg, allowPrivateAddresses: false })).toMatchObject({ ok: false, permanent: true });
    // One private address among public ones is enough to refuse.
    lookup.mockImplementation((() =>
      Promise.resolve([
        { address: '93.184.216.34', family: 4 },
        { address: '10.0.0.1', family: 4 },
      ])) as unknown as typeof dns.promises.lookup);
    expect(await attempt(url, { ...cfg, allowPrivateAddresses: false })).toMatchObject({ ok: false, permanent: true });
    expect(receiver.requests).toHaveLength(1);
    lookup.mockRestore();
    // And through the system's resolver: localhost, IPv6 first or not.
    expect(await attempt(`http://localhost:${receiver.port}/in`, cfg)).toEqual({ ok: true, status: 200 });
  });

  it('refuses a URL that fails the syntax check, permanently', async () => {
    expect(await attempt('ftp://example.com/x', config())).toMatchObject({ ok: false, permanent: true });
  });

  it('is not ok, and not permanent, when nothing listens', async () => {
    const port = await freePort();
    const result = await attempt(`https://127.0.0.1:${port}/`, config());
    expect(result.ok).toBe(false);
    expect(result.permanent).not.toBe(true);
    expect(result.error).toMatch(/ECONNREFUSED/);
  });
});

describe('checkWebhookUrl', () => {
  const cases: Array<[string, boolean, boolean]> = [
    // url, accepted, accepted with allowHttp
    ['https://hooks.example.com/devcloud', true, true],
    ['https://hooks.example.com:8443/a/b?x=1&y=2', true, true],
    ['HTTPS://Hooks.Example.com/', true, true],
    ['https://[2001:db8::1]/x', true, true], // syntax only: the address is judged when sending
    ['http://hooks.example.com/', false, true],
    ['ftp://hooks.example.com/', false, false],
    ['javascript:alert(1)', false, false],
    ['file:///etc/passwd', false, false],
    ['https:hooks.example.com', false, false],
    ['https:///hooks.example.com', false, false],
    ['https:\\\\hooks.example.com', false, false],
    ['//hooks.example.com/x', false, false],
    ['/relative/path', false, false],
    ['hooks.example.com', false, false],
    ['https://user:pass@hooks.example.com/', false, false],
    ['https://user@hooks.example.com/', false, false],
    ['https://hooks.example.com/#frag', false, false],
    ['https://hooks.example.com/#', false, false],
    ['https://hooks.example.com/a b', false, false],
    [' https://hooks.example.com/', false, false],
    ['https://hooks.example.com/\n', false, false],
    ['https://', false, false],
    [`https://hooks.example.com/${'a'.repeat(2048 - 'https://hooks.example.com/'.length)}`, true, true],
    [`https://hooks.example.com/${'a'.repeat(2049 - 'https://hooks.example.com/'.length)}`, false, false],
    ['', false, false],
  ];
  it.each(cases)('%s', (url, strict, withHttp) => {
    const a = checkWebhookUrl(url, { allowHttp: false });
    const b = checkWebhookUrl(url, { allowHttp: true });
    expect(a.ok).toBe(strict);
    expect(b.ok).toBe(withHttp);
    if (!a.ok) expect(a.reason.length).toBeGreaterThan(0);
    if (a.ok) expect(a.url.href.toLowerCase()).toBe(new URL(url).href.toLowerCase());
  });
});

describe('isPrivateAddress', () => {
  const cases: Array<[string, boolean]> = [
    ['127.0.0.1', true],
    ['127.255.0.9', true],
    ['0.0.0.0', true],
    ['10.1.2.3', true],
    ['172.16.0.1', true],
    ['172.31.255.255', true],
    ['172.32.0.1', false],
    ['192.168.1.1', true],
    ['169.254.169.254', true],
    ['100.64.0.1', true],
    ['100.128.0.1', false],
    ['224.0.0.1', true],
    ['255.255.255.255', true],
    ['198.18.0.1', true],
    ['8.8.8.8', false],
    ['93.184.216.34', false],
    ['::', true],
    ['::1', true],
    ['fe80::1', true],
    ['fe80::1%eth0', true],
    ['fc00::1', true],
    ['fd12:3456::1', true],
    ['ff02::1', true],
    ['::ffff:127.0.0.1', true],
    ['::ffff:7f00:1', true],
    ['::ffff:8.8.8.8', false],
    ['64:ff9b::a00:1', true],
    ['64:ff9b::808:808', false],
    ['2002:c0a8:101::1', true],
    ['2001:db8::1', true],
    ['2606:4700:4700::1111', false],
    ['2a00:1450:4001:80b::200e', false],
    ['not an address', true],
  ];
  it.each(cases)('%s → %s', (address, expected) => {
    expect(isPrivateAddress(address)).toBe(expected);
  });
});

describe('backoffMs', () => {
  it('starts at 1 s, doubles, is capped at 10 min, with ±20 % jitter', () => {
    const mid = () => 0.5;
    expect([1, 2, 3, 4, 10, 11, 30, 1000].map((n) => backoffMs(n, mid))).toEqual([
      1000, 2000, 4000, 8000, 512_000, 600_000, 600_000, 600_000,
    ]);
    expect(backoffMs(1, () => 0)).toBe(800);
    expect(backoffMs(1, () => 0.999_999)).toBe(1200);
    expect(backoffMs(20, () => 0)).toBe(480_000);
    expect(backoffMs(20, () => 0.999_999)).toBe(720_000);
    for (let n = 1; n < 40; n++) {
      const base = Math.min(1000 * 2 ** (n - 1), 600_000);
      const d = backoffMs(n);
      expect(d).toBeGreaterThanOrEqual(base * 0.8);
      expect(d).toBeLessThanOrEqual(base * 1.2);
    }
  });
});

/** The outbox as the stores keep it, in memory: what each event's delivery is, and every outcome recorded. */
class MemoryOutbox implements WebhookOutbox {
  readonly items = new Map<
    number,
    DueDelivery & { state: DeliveryOutcome['state']; nextAt: number; leaseUntil: number; outcomes: DeliveryOutcome[] }
  >();
  claims = 0;

  add(d: Omit<DueDelivery, 'attempts'>): void {
    this.items.set(d.eventId, { ...d, attempts: 0, state: 'pending', nextAt: d.firedAt, leaseUntil: 0, outcomes: [] });
  }

  claimDue(now: number, limit: number, leaseMs: number): Promise<DueDelivery[]> {
    this.claims++;
    const due = [...this.items.values()]
      .filter((x) => x.state === 'pending' && x.nextAt <= now && x.leaseUntil <= now)
      .sort((a, b) => a.nextAt - b.nextAt)
      .slice(0, limit);
    for (const x of due) x.leaseUntil = now + leaseMs;
    return Promise.resolve(
      due.map(({ eventId, url, secret, body, attempts, firedAt }) => ({
        eventId,
        url,
        secret,
        body,
        attempts,
        firedAt,
      })),
    );
  }

  record(eventId: number, outcome: DeliveryOutcome): Promise<void> {
    const x = this.items.get(eventId);
    if (!x) return Promise.reject(new Error(`no event ${eventId}`));
    x.outcomes.push(outcome);
    x.state = outcome.state;
    x.attempts = outcome.attempts;
    x.nextAt = outcome.nextAt ?? Infinity;
    x.leaseUntil = 0;
    return Promise.resolve();
  }

  get(eventId: number) {
    const x = this.items.get(eventId);
    if (!x) throw new Error(`no event ${eventId}`);
    return x;
  }
}

function worker(outbox: WebhookOutbox, clock: TestClock, over: Partial<WebhookConfig> = {}) {
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const w = new WebhookWorker({
    outbox,
    config: config({ pollMs: 100, ...over }),
    ca: tls.cert,
    log,
    now: clock.now,
    random: () => 0.5,
  });
  cleanups.push(() => w.stop());
  return { w, sink };
}

function event(id: number, url: string, clock: TestClock): Omit<DueDelivery, 'attempts'> {
  return {
    eventId: id,
    url,
    secret: `${SECRET}-${id}`,
    body: JSON.stringify({ id, type: 'user-event' }),
    firedAt: clock.t,
  };
}

describe('the webhook worker', () => {
  it('delivers each event once to a receiver that was down, then up, recording every attempt', async () => {
    const clock = new TestClock();
    const port = await freePort();
    const url = `https://127.0.0.1:${port}/hooks/devcloud?token=q-secret`;
    const outbox = new MemoryOutbox();
    for (const id of [1, 2, 3]) outbox.add(event(id, url, clock));
    const { w, sink } = worker(outbox, clock);
    w.start();

    // Down: every event tried once, refused, and due again after 1 s (no jitter at random() = 0.5).
    await until(() => [1, 2, 3].every((id) => outbox.get(id).attempts === 1), 'first attempts');
    for (const id of [1, 2, 3]) {
      const [o] = outbox.get(id).outcomes;
      expect(o).toMatchObject({ state: 'pending', attempts: 1, status: null, at: clock.t, nextAt: clock.t + 1000 });
      expect(o!.error).toMatch(/ECONNREFUSED/);
    }
    expect(sink.events('webhook.retry')).toHaveLength(3);
    expect(sink.events('webhook.retry')[0]).toMatchObject({ level: 'info', attempts: 1, nextInMs: 1000 });
    expect(w.figures).toMatchObject({ retried: 3, delivered: 0, inFlight: 0 });

    // Not due yet: the polls that run meanwhile send nothing.
    const claims = outbox.claims;
    await until(() => outbox.claims >= claims + 2, 'two more polls');
    expect([1, 2, 3].map((id) => outbox.get(id).attempts)).toEqual([1, 1, 1]);

    // Up, and the backoff over.
    const receiver = await startReceiver({ port });
    clock.advance(1000);
    await until(() => [1, 2, 3].every((id) => outbox.get(id).state === 'delivered'), 'deliveries');
    for (const id of [1, 2, 3]) {
      expect(outbox.get(id).outcomes.at(-1)).toEqual({
        state: 'delivered',
        attempts: 2,
        status: 200,
        error: null,
        at: clock.t,
        nextAt: null,
      });
    }
    // Much later, still once each.
    clock.advance(3_600_000);
    const later = outbox.claims;
    await until(() => outbox.claims >= later + 2, 'two more polls');
    const ids = receiver.requests.map((r) => r.headers[EVENT_HEADER]).sort();
    expect(ids).toEqual(['1', '2', '3']);
    for (const r of receiver.requests) {
      const id = Number(r.headers[EVENT_HEADER]);
      expect(verifyWebhook(`${SECRET}-${id}`, String(r.headers[SIGNATURE_HEADER]), r.body, clock.t, 3_700_000)).toBe(
        true,
      );
      expect(JSON.parse(r.body)).toEqual({ id, type: 'user-event' });
    }
    expect(w.figures).toMatchObject({ delivered: 3, retried: 3, failed: 0, inFlight: 0 });
    expect(sink.events('webhook.delivered')).toHaveLength(3);
    expect(sink.events('webhook.delivered')[0]).toMatchObject({
      status: 200,
      attempts: 2,
      origin: `https://127.0.0.1:${port}`,
    });
    // Neither the secret nor the URL's path and query reach the log.
    expect(sink.text()).not.toContain(SECRET);
    expect(sink.text()).not.toContain('q-secret');
    expect(sink.text()).not.toContain('/hooks');
  });

  it('gives up once the next attempt would come after retryForMs', async () => {
    const clock = new TestClock();
    const receiver = await startReceiver({
      handler: (_req, res) => {
        res.statusCode = 503;
        res.end();
      },
    });
    const outbox = new MemoryOutbox();
    outbox.add(event(9, receiver.url, clock));
    const { w, sink } = worker(outbox, clock, { retryForMs: 60_000 });
    w.start();
    // Attempts at 0, 1, 3, 7, 15 and 31 s; the next would be at 63 s, past the 60 s.
    for (let n = 1; n <= 6; n++) {
      await until(() => outbox.get(9).attempts === n, `attempt ${n}`);
      const last = outbox.get(9).outcomes.at(-1)!;
      if (n < 6) {
        expect(last).toMatchObject({ state: 'pending', status: 503, error: 'HTTP 503' });
        clock.t = last.nextAt!;
      }
    }
    const last = outbox.get(9).outcomes.at(-1)!;
    expect(last).toMatchObject({ state: 'failed', attempts: 6, status: 503, nextAt: null });
    expect(last.at - outbox.get(9).firedAt).toBe(31_000);
    expect(receiver.requests).toHaveLength(6);
    expect(sink.events('webhook.failed')).toEqual([
      expect.objectContaining({ level: 'warn', eventId: 9, attempts: 6, reason: expect.stringMatching(/given up/) }),
    ]);
    expect(sink.events('webhook.retry').map((l) => l.level)).toEqual(['info', 'info', 'info', 'info', 'info']);
    expect(w.figures).toMatchObject({ failed: 1, retried: 5, delivered: 0 });
    clock.advance(86_400_000);
    const claims = outbox.claims;
    await until(() => outbox.claims >= claims + 2, 'two more polls');
    expect(receiver.requests).toHaveLength(6);
  });

  it('fails a refused URL at once, without retries', async () => {
    const clock = new TestClock();
    const receiver = await startReceiver();
    const outbox = new MemoryOutbox();
    outbox.add(event(5, receiver.url, clock));
    const { w, sink } = worker(outbox, clock, { allowPrivateAddresses: false });
    w.start();
    await until(() => outbox.get(5).state === 'failed', 'failed');
    expect(outbox.get(5).outcomes).toEqual([
      expect.objectContaining({ state: 'failed', attempts: 1, status: null, nextAt: null }),
    ]);
    expect(sink.events('webhook.failed')[0]!.reason).toMatch(/private/);
    expect(receiver.requests).toHaveLength(0);
  });

  it('has at most `concurrency` attempts in flight; a hanging receiver holds no more than that', async () => {
    const clock = new TestClock();
    const held: http.ServerResponse[] = [];
    const receiver = await startReceiver({ handler: (_req, res) => held.push(res) });
    const outbox = new MemoryOutbox();
    for (let id = 1; id <= 7; id++) outbox.add(event(id, receiver.url, clock));
    const { w } = worker(outbox, clock, { concurrency: 2 });
    w.start();
    let delivered = 0;
    while (delivered < 7) {
      const expected = Math.min(2, 7 - delivered);
      await until(() => held.length === expected, `${expected} held`);
      // Three polls' time (pollMs 100) while the slots are taken: nothing more is claimed.
      await new Promise((r) => setTimeout(r, 350));
      expect(held).toHaveLength(expected);
      expect(receiver.inFlight).toBe(expected);
      expect(w.figures.inFlight).toBe(expected);
      for (const res of held.splice(0)) res.end('ok');
      delivered += expected;
      await until(() => w.figures.delivered === delivered, `${delivered} delivered`);
    }
    expect(receiver.maxInFlight).toBe(2);
    expect(receiver.requests).toHaveLength(7);
  });

  it('keeps going when the outbox fails, logging it; an unrecorded attempt is sent again', async () => {
    const clock = new TestClock();
    const receiver = await startReceiver();
    const inner = new MemoryOutbox();
    let claimFailures = 2;
    let recordFailures = 1;
    const outbox: WebhookOutbox = {
      claimDue: (now, limit, leaseMs) =>
        claimFailures-- > 0 ? Promise.reject(new Error('database is locked')) : inner.claimDue(now, limit, leaseMs),
      record: (eventId, outcome) =>
        recordFailures-- > 0 ? Promise.reject(new Error('disk I/O error')) : inner.record(eventId, outcome),
    };
    inner.add(event(3, receiver.url, clock));
    const { w, sink } = worker(outbox, clock, { timeoutMs: 2000 });
    w.start();
    await until(() => receiver.requests.length === 1, 'first delivery');
    await until(() => sink.events('webhook.outbox_failed').length === 3, 'three outbox failures');
    expect(sink.events('webhook.outbox_failed').map((l) => [l.level, l.op])).toEqual([
      ['error', 'claim'],
      ['error', 'claim'],
      ['error', 'record'],
    ]);
    expect(inner.get(3).state).toBe('pending');
    // Leased for timeoutMs + 5 s: before that no poll takes it again, after it one does.
    clock.advance(6999);
    const claims = inner.claims;
    await until(() => inner.claims >= claims + 2, 'two more polls');
    expect(receiver.requests).toHaveLength(1);
    clock.advance(1);
    await until(() => inner.get(3).state === 'delivered', 'delivered');
    expect(receiver.requests.map((r) => r.headers[EVENT_HEADER])).toEqual(['3', '3']);
    expect(inner.get(3).outcomes).toEqual([expect.objectContaining({ state: 'delivered', attempts: 1, status: 200 })]);
    expect(w.figures.delivered).toBe(1);
  });

  it('polls at once after a kick, rather than after pollMs', async () => {
    const clock = new TestClock();
    const receiver = await startReceiver();
    const outbox = new MemoryOutbox();
    const { w } = worker(outbox, clock, { pollMs: 60_000 });
    w.start();
    await until(() => outbox.claims === 1, 'the first poll');
    outbox.add(event(11, receiver.url, clock));
    outbox.add(event(12, receiver.url, clock));
    w.kick();
    w.kick();
    await until(() => outbox.get(11).state === 'delivered' && outbox.get(12).state === 'delivered', 'delivered');
    // Two kicks, one poll.
    expect(outbox.claims).toBe(2);
  });

  it('stop() ends polling and waits for the attempts in flight', async () => {
    const clock = new TestClock();
    const held: http.ServerResponse[] = [];
    const receiver = await startReceiver({ handler: (_req, res) => held.push(res) });
    const outbox = new MemoryOutbox();
    outbox.add(event(21, receiver.url, clock));
    const { w } = worker(outbox, clock);
    w.start();
    await until(() => held.length === 1, 'held');
    let stopped = false;
    const stopping = w.stop().then(() => (stopped = true));
    await new Promise((r) => setTimeout(r, 200));
    expect(stopped).toBe(false);
    held[0]!.end('ok');
    await stopping;
    expect(outbox.get(21).state).toBe('delivered');
    const claims = outbox.claims;
    outbox.add(event(22, receiver.url, clock));
    w.kick();
    await new Promise((r) => setTimeout(r, 300));
    expect(outbox.claims).toBe(claims);
  });
});
