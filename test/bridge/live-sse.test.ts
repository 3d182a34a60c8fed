/**
 * The live channel as Server-Sent Events (`GET /0/events`, docs/api.md) through a real socket: a whole bridge, users
 * made over HTTP, devices as the bridge keeps them after a hello, changes through REST.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { type ConfigOverrides, type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { SseStream } from '../support/live.js';
import { until } from '../support/wait.js';

async function signup(http: HttpClient, login: string): Promise<string> {
  const r = await http.post('/0/session/signup', { form: { login, password: 'correct horse battery' } });
  expect(r.status).toBe(201);
  return `sid=${http.sid!}`;
}

/** A device as the bridge keeps it after a hello, owned by `login` when given; its id and auth code. */
async function seedDevice(b: LiveBridge, login?: string): Promise<{ id: string; authcode: string }> {
  const id = randomUUID();
  const authcode = randomBytes(16).toString('hex');
  const now = Date.now();
  const user = login ? await b.bridge.store.userByLogin(b.bridge.defaultFrontend.id, login) : undefined;
  await b.bridge.store.write(async ({ devices }) => {
    await devices.touch(id, now);
    await devices.setAuthcode(id, authcode);
    await devices.setMeta(id, 'unique', id, now, 'device');
    await devices.setMeta(id, 'state', 'connected', now, 'server');
    if (user) await devices.claim(id, user.id, now);
  });
  return { id, authcode };
}

describe('GET /0/events', () => {
  let bridge: LiveBridge | undefined;
  const streams: SseStream[] = [];
  afterEach(async () => {
    for (const s of streams.splice(0)) s.close();
    await bridge?.close();
    bridge = undefined;
  });

  async function start(config?: ConfigOverrides) {
    bridge = await startLiveBridge(config ? { config } : {});
    return bridge;
  }

  async function open(headers: Record<string, string>): Promise<SseStream> {
    const s = await SseStream.open(bridge!.url, headers);
    streams.push(s);
    return s;
  }

  it('answers 401 no-session without a logged-in session', async () => {
    const b = await start();
    const none = await open({});
    await none.ended;
    expect([none.status, none.body]).toEqual([401, 'no-session']);
    const anon = b.client();
    expect((await anon.post('/0/session/')).status).toBe(201);
    const anonymous = await open({ cookie: `sid=${anon.sid!}` });
    await anonymous.ended;
    expect([anonymous.status, anonymous.body]).toEqual([401, 'no-session']);
  });

  it('answers HEAD with the head of a stream, and opens none', async () => {
    const b = await start();
    const u = b.client();
    await signup(u, 'head@example.com');
    const r = await u.request('HEAD', '/0/events');
    expect([r.status, r.contentType, r.body]).toEqual([200, 'text/event-stream; charset=utf-8', '']);
    expect(b.sink.events('live.opened')).toEqual([]);
  });

  it('streams the devices, then each change and claim as events with increasing ids, and pings', async () => {
    const b = await start({ live: { pingMs: 100 } });
    const u = b.client();
    const cookie = await signup(u, 'sse@example.com');
    const owned = await seedDevice(b, 'sse@example.com');
    const later = await seedDevice(b);
    const s = await open({ cookie });
    expect(s.status).toBe(200);
    expect(s.contentType).toBe('text/event-stream; charset=utf-8');
    const first = await s.next((e) => e, 'the snapshot');
    expect(first.event).toBe('devices');
    expect(first.id).toMatch(/^\d+\.[0-9a-f]{8}$/);
    expect(Object.keys(JSON.parse(first.data).devices as object)).toEqual([owned.id]);

    expect((await u.post(`/0/devices/${owned.id}/s/color`, { form: { value: 'red' } })).body).toBe('device-ok');
    const delta = await s.next((e) => (e.event === 'delta' ? e : undefined), 'the delta');
    expect(JSON.parse(delta.data)).toMatchObject({ delta: { [owned.id]: { s: { color: { value: 'red' } } } } });

    expect((await u.post('/0/devices/', { form: { auth: later.authcode } })).status).toBe(201);
    const claimed = await s.next((e) => (e.event === 'events' ? e : undefined), 'the claim');
    expect(JSON.parse(claimed.data)).toMatchObject({ events: { [later.id]: { type: 'device-claimed' } } });

    const ids = s.events.map((e) => Number(e.id!.split('.')[0]));
    expect(ids).toEqual([...ids].sort((x, y) => x - y));
    expect(new Set(ids).size).toBe(ids.length);
    await until(() => s.comments >= 2, 'the pings');
  });

  it('resumes after Last-Event-ID with the frames missed; an id it does not know gets a snapshot', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'resume@example.com');
    const { id } = await seedDevice(b, 'resume@example.com');
    const s = await open({ cookie });
    await s.next((e) => e.event === 'devices' || undefined, 'the snapshot');
    await u.post(`/0/devices/${id}/s/step`, { form: { value: '1' } });
    const one = await s.next((e) => (e.event === 'delta' ? e : undefined), 'step 1');
    s.close();
    await until(() => b.sink.events('live.closed').length === 1, 'the close');

    // While no stream is open.
    await u.post(`/0/devices/${id}/s/step`, { form: { value: '2' } });
    await u.post(`/0/devices/${id}/s/other`, { form: { value: 'x' } });

    const resumed = await open({ cookie, 'last-event-id': one.id! });
    await resumed.next((e) => (e.data.includes('"other"') ? true : undefined), 'the missed frames');
    expect(resumed.events.some((e) => e.event === 'devices')).toBe(false);
    const steps = resumed
      .data('delta')
      .map((m) => m.delta![id]!.s!.step?.value)
      .filter((v) => v !== undefined);
    expect(steps).toEqual(['2']);
    expect(b.sink.events('live.opened').at(-1)).toMatchObject({ kind: 'sse', resumed: true });

    for (const unknown of ['1.00000000', 'nonsense']) {
      const fresh = await open({ cookie, 'last-event-id': unknown });
      const first = await fresh.next((e) => e, 'the first event');
      expect(first.event).toBe('devices');
      expect(JSON.parse(first.data).devices[id].s.step.value).toBe('2');
    }
  });

  it('starts with a snapshot when the frames after Last-Event-ID were not kept (live.sseResumeMs past)', async () => {
    const b = await start({ live: { sseResumeMs: 0 } });
    const u = b.client();
    const cookie = await signup(u, 'noresume@example.com');
    const { id } = await seedDevice(b, 'noresume@example.com');
    const s = await open({ cookie });
    const first = await s.next((e) => (e.event === 'devices' ? e : undefined), 'the snapshot');
    s.close();
    await until(() => b.sink.events('live.closed').length === 1, 'the close');
    await u.post(`/0/devices/${id}/s/gone`, { form: { value: 'while away' } });
    const again = await open({ cookie, 'last-event-id': first.id! });
    const next = await again.next((e) => e, 'the first event');
    expect(next.event).toBe('devices');
    expect(JSON.parse(next.data).devices[id].s.gone.value).toBe('while away');
  });

  it('ends the stream of a session that logs out, saying why', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'bye@example.com');
    const s = await open({ cookie });
    await s.next((e) => e.event === 'devices' || undefined, 'the snapshot');
    expect((await u.post('/0/session/logout')).status).toBe(201);
    await s.ended;
    expect(s.events.at(-1)).toEqual({ event: 'close', data: '{"code":4001,"reason":"session ended"}' });
  });
});
