/**
 * Firmware downloads that break off, and cancels, end to end: a live bridge, in-process agents, and an HTTP proxy
 * in front of the bridge's image route (the bridge's `firmware.baseUrl` points devices at it). The proxy can cut
 * a response after some bytes or stall it there, and records what each request asked for and got, so a test can
 * tell that a resumed download asks only for what is missing.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { activeSlot } from '../../agent/fw/slots.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type SigningKeys, addToCatalog, buildImage, fwStates, makeKeys, metaOf } from '../support/firmware.js';
import { until } from '../support/wait.js';

/**
 * What the proxy does with one request: pass it through, or stop the body after `after` bytes: `stall` holds the
 * connection open, `cut` closes it once `before` (if given) resolves. `hold` delays forwarding the request.
 */
type Plan = { hold?: () => Promise<unknown> } & (
  | { kind: 'pass' }
  | { kind: 'stall'; after: number }
  | { kind: 'cut'; after: number; before?: (seen: Seen) => Promise<unknown> }
);

interface Seen {
  path: string;
  range: string | undefined;
  status: number;
  /** Body bytes written to the client. */
  sent: number;
  /** The client went away (or the proxy cut the connection). */
  closed: boolean;
}

interface Proxy {
  url: string;
  /** Where requests go; set once the bridge listens. */
  target: string;
  /** Plans for the next requests, in order; requests past the list pass through. */
  plans: Plan[];
  seen: Seen[];
  close(): Promise<void>;
}

const HEADERS = ['content-type', 'content-length', 'content-range', 'accept-ranges', 'cache-control'];

async function startProxy(): Promise<Proxy> {
  const proxy: Proxy = { url: '', target: '', plans: [], seen: [], close: () => Promise.resolve() };
  const server = http.createServer((req, res) => {
    const plan: Plan = proxy.plans.shift() ?? { kind: 'pass' };
    const seen: Seen = { path: req.url ?? '', range: req.headers.range, status: 0, sent: 0, closed: false };
    proxy.seen.push(seen);
    res.on('close', () => (seen.closed = true));
    void (plan.hold?.() ?? Promise.resolve()).then(() => {
      if (!seen.closed) forward(req, res, plan, seen);
    });
  });
  const forward = (req: http.IncomingMessage, res: http.ServerResponse, plan: Plan, seen: Seen): void => {
    const headers: Record<string, string> = {};
    for (const h of ['authorization', 'range', 'accept-encoding']) {
      const v = req.headers[h];
      if (typeof v === 'string') headers[h] = v;
    }
    const up = http.get(new URL(req.url ?? '/', proxy.target), { headers }, (upRes) => {
      seen.status = upRes.statusCode ?? 0;
      const out: Record<string, string> = {};
      for (const h of HEADERS) {
        const v = upRes.headers[h];
        if (typeof v === 'string') out[h] = v;
      }
      res.writeHead(seen.status, out);
      let stopped = false;
      upRes.on('data', (chunk: Buffer) => {
        if (stopped) return;
        let piece = chunk;
        if (plan.kind !== 'pass' && seen.sent + piece.length >= plan.after) {
          piece = chunk.subarray(0, plan.after - seen.sent);
          stopped = true;
          upRes.pause();
        }
        seen.sent += piece.length;
        const last = stopped;
        const wrote = res.write(piece, () => {
          if (!last || plan.kind !== 'cut') return;
          void (plan.before?.(seen) ?? Promise.resolve()).finally(() => res.socket?.destroy());
        });
        if (!wrote && !stopped) {
          upRes.pause();
          res.once('drain', () => upRes.resume());
        }
      });
      upRes.on('end', () => {
        if (!stopped) res.end();
      });
    });
    up.on('error', () => res.destroy());
    res.on('close', () => up.destroy());
  };
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  proxy.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  proxy.close = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return proxy;
}

const NAME = 'gateways/linux-x64/rootfs';
const dirs: string[] = [];

describe('firmware downloads cut, resumed and cancelled', () => {
  let proxy: Proxy;
  let live: LiveBridge;
  let web: HttpClient;
  let keys: SigningKeys;
  let size: number;
  const agents: TestAgent[] = [];

  beforeAll(async () => {
    proxy = await startProxy();
    live = await startLiveBridge({ config: { firmware: { baseUrl: proxy.url } } });
    proxy.target = live.url;
    const dir = tempDir('devcloud-fw-image-');
    dirs.push(dir);
    keys = makeKeys(dir);
    // Random bytes do not compress: the image is about 2 MB, large enough to cut in the middle.
    const image = buildImage({ name: 'rootfs', version: 2, files: { 'payload.bin': randomBytes(2_000_000) } }, dir);
    ({ size } = await addToCatalog(live.bridge.store, image, { name: NAME, version: 2 }, keys));
    web = live.client();
    await web.post('/0/session/signup', { form: { login: 'fw-dl@example.com', password: 'correct horse battery' } });
  });

  afterEach(async () => {
    for (const a of agents.splice(0)) await a.stop();
    proxy.plans = [];
    proxy.seen = [];
  });

  afterAll(async () => {
    await proxy?.close();
    await live?.close();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  async function agentOn(stateDir: string): Promise<TestAgent> {
    const a = await startAgent({
      mqttUrl: live.mqttUrl,
      stateDir,
      level: 'info',
      flags: {
        platform: 'linux-x64',
        'firmware.publicKeys': [keys.publicFile],
        // Retries at once: the default 2 s wait would only slow the test down.
        'firmware.downloadRetryDelayMs': 0,
      },
    });
    agents.push(a);
    return a;
  }

  async function stopAgent(a: TestAgent): Promise<void> {
    agents.splice(agents.indexOf(a), 1);
    await a.stop();
  }

  /** A new gateway, claimed, in mode `connected`, with the bridge seeing it online. */
  async function newDevice(): Promise<{ a: TestAgent; id: string; stateDir: string }> {
    const stateDir = tempDir('devcloud-fw-agent-');
    dirs.push(stateDir);
    const a = await agentOn(stateDir);
    const id = a.agent.identity.deviceId;
    const store = live.bridge.store;
    const auth = await until(async () => (await store.devices.device(id))?.authcode ?? undefined, 'the hello');
    expect((await web.post('/0/devices/', { form: { auth } })).status).toBe(201);
    await a.agent.vars.set('d', 'mode', Buffer.from('connected'));
    await until(async () => (await store.devices.getVar(id, 'd', 'mode'))?.acked, 'mode connected on the bridge');
    await until(async () => (await metaOf(store, id, 'state')) === 'connected', 'the device online');
    return { a, id, stateDir };
  }

  const startUpdate = async (id: string) => {
    const r = await web.post(`/0/devices/${id}/fw/${NAME}`);
    expect([r.status, r.body]).toEqual([200, 'device-ok']);
  };
  const fwstate = (id: string, state: string) =>
    until(async () => (await metaOf(live.bridge.store, id, 'fwstate')) === state, `fwstate ${state}`);
  /** The partial image of the job the proxy's request `n` was for. */
  const partOf = async (stateDir: string, n = 0) => {
    const seen = await until(() => proxy.seen[n], `image request ${n}`);
    return join(stateDir, 'fw', `${/\/jobs\/([^/]+)\/image$/.exec(seen.path)![1]}.part`);
  };
  const partSize = (path: string) => (existsSync(path) ? statSync(path).size : -1);
  const FULL_RUN = ['idle', 'downloading', 'verifying', 'installing', 'switching', 'restarting', 'committing', 'done'];

  it('resumes a download cut in the middle with a Range request for the rest only', async () => {
    const { a, id, stateDir } = await newDevice();
    const cut = Math.floor(size * 0.4);
    // The cut waits until the agent holds the bytes sent: fetch drops what it has queued when a connection breaks,
    // and that loss is not what this test is about.
    const held = async () => until(async () => partSize(await partOf(stateDir)) === cut, 'the bytes before the cut');
    proxy.plans = [{ kind: 'cut', after: cut, before: held }];
    await startUpdate(id);
    await fwstate(id, 'done');

    expect(proxy.seen.map((s) => [s.range, s.status, s.sent])).toEqual([
      [undefined, 200, cut],
      [`bytes=${cut}-`, 206, size - cut],
    ]);
    expect(a.sink.events('fw.download_retry')).toMatchObject([{ attempt: 1, waitMs: 0 }]);
    expect(a.sink.events('fw.downloaded')).toMatchObject([{ bytes: size, resumedFrom: cut }]);
    expect(await fwStates(live.bridge.store, id)).toEqual(FULL_RUN);
    expect(await activeSlot(join(stateDir, 'slots'))).toBe('b');
    const part = await partOf(stateDir);
    await until(() => !existsSync(part), 'the image file removed');
  });

  it('resumes from the bytes on disk after the agent restarts mid-download', async () => {
    const { a, id, stateDir } = await newDevice();
    const stall = Math.floor(size * 0.3);
    const hellos = () => live.sink.events('device.hello').filter((l) => l.deviceId === id).length;
    // The resumed request reaches the bridge only after the restarted agent's hello has: on a slow link it may, and
    // whatever the bridge does on that hello must not spoil the download under way.
    const helloBefore = hellos();
    proxy.plans = [
      { kind: 'stall', after: stall },
      { kind: 'pass', hold: () => until(() => hellos() > helloBefore, 'the hello of the restarted agent') },
    ];
    await startUpdate(id);
    await fwstate(id, 'downloading');
    const part = await partOf(stateDir);
    await until(() => partSize(part) === stall, 'the stalled bytes on disk');
    await stopAgent(a);
    await until(() => proxy.seen[0]?.closed, 'the stalled request dropped');

    const b = await agentOn(stateDir);
    expect(b.sink.events('fw.resume')).toMatchObject([{ state: 'downloading', attempt: 2 }]);
    await fwstate(id, 'done');
    expect(proxy.seen.map((s) => [s.range, s.status, s.sent])).toEqual([
      [undefined, 200, stall],
      [`bytes=${stall}-`, 206, size - stall],
    ]);
    expect(b.sink.events('fw.downloaded')).toMatchObject([{ bytes: size, resumedFrom: stall }]);
    expect(await fwStates(live.bridge.store, id)).toEqual(FULL_RUN);
    expect(await activeSlot(join(stateDir, 'slots'))).toBe('b');
  });

  it('cancels a download: cancelled, the partial image removed, the slot unchanged; the next update works', async () => {
    const { a, id, stateDir } = await newDevice();
    const slots = join(stateDir, 'slots');
    const before = await activeSlot(slots);
    const stall = Math.floor(size * 0.5);
    proxy.plans = [{ kind: 'stall', after: stall }];
    await startUpdate(id);
    const part = await partOf(stateDir);
    await until(() => partSize(part) === stall, 'the stalled bytes on disk');

    const r = await web.request('DELETE', `/0/devices/${id}/fw`);
    expect([r.status, r.body]).toEqual([200, 'firmware-ok']);
    await fwstate(id, 'cancelled');
    await until(() => !existsSync(part), 'the partial image removed');
    await until(() => proxy.seen[0]?.closed, 'the stalled request dropped');
    expect(a.agent.firmware.store.latest()).toMatchObject({ state: 'cancelled', fromSlot: null, toSlot: null });
    expect(await activeSlot(slots)).toBe(before);
    expect(await live.bridge.store.fwJobs.openOf(id)).toBeUndefined();
    expect(await fwStates(live.bridge.store, id)).toEqual(['idle', 'downloading', 'cancelled']);

    // A new update from scratch: a new job, a fresh download, installed and switched.
    await startUpdate(id);
    await fwstate(id, 'done');
    expect(proxy.seen.map((s) => [s.range, s.sent])).toEqual([
      [undefined, stall],
      [undefined, size],
    ]);
    expect(proxy.seen[1]!.path).not.toBe(proxy.seen[0]!.path);
    expect(await activeSlot(slots)).not.toBe(before);
  });

  it('keeps a cancel sent while the agent is down and delivers it when the agent is back', async () => {
    const { a, id, stateDir } = await newDevice();
    const slots = join(stateDir, 'slots');
    const before = await activeSlot(slots);
    const stall = Math.floor(size * 0.3);
    // The resumed request stalls too: a slow link, so that the cancel arrives while the download still runs.
    proxy.plans = [
      { kind: 'stall', after: stall },
      { kind: 'stall', after: 0 },
    ];
    await startUpdate(id);
    const part = await partOf(stateDir);
    await until(() => partSize(part) === stall, 'the stalled bytes on disk');
    await stopAgent(a);
    await until(async () => (await metaOf(live.bridge.store, id, 'state')) === 'disconnected', 'the device offline');

    // The bridge cannot reach the device; it answers firmware-ok and keeps the cancel for the device's return.
    const r = await web.request('DELETE', `/0/devices/${id}/fw`);
    expect([r.status, r.body]).toEqual([200, 'firmware-ok']);
    expect(await live.bridge.store.fwJobs.openOf(id)).toMatchObject({ cancelled: true });

    const b = await agentOn(stateDir);
    await fwstate(id, 'cancelled');
    await until(() => !existsSync(part), 'the partial image removed');
    expect(b.agent.firmware.store.latest()).toMatchObject({ state: 'cancelled' });
    expect(await activeSlot(slots)).toBe(before);
    expect(await live.bridge.store.fwJobs.openOf(id)).toBeUndefined();
    expect(await fwStates(live.bridge.store, id)).toEqual(['idle', 'downloading', 'cancelled']);
  });
});
