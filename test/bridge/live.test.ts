/**
 * The WebSocket live channel (docs/api.md, "Live channel") through real sockets: a whole bridge with its embedded
 * broker, a real agent, users made over HTTP, and `ws` clients as the official client opens them (subprotocol
 * `thsq-user`, the session cookie, `{"delta":true,"throttletime":N}` on open).
 *
 * Sharing (decision 23) moves devices in and out of a user's channels like a claim and an unregister. A channel may
 * be opened with an access token as `Authorization: Bearer <token>` (decision 30) instead of a cookie.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { outboxDir } from '../../bridge/config.js';
import type { BusEvent } from '../../bridge/events/bus.js';
import { afterEach, describe, expect, it } from 'vitest';
import { type TestAgent, agentCli, startAgent } from '../support/agent.js';
import { type ConfigOverrides, type HttpClient, type LiveBridge, engines, startLiveBridge } from '../support/bridge.js';
import { type LiveMessage, LiveSocket, SseStream } from '../support/live.js';
import { until } from '../support/wait.js';

async function signup(http: HttpClient, login: string): Promise<string> {
  const r = await http.post('/0/session/signup', { form: { login, password: 'correct horse battery' } });
  expect(r.status).toBe(201);
  return `sid=${http.sid!}`;
}

/** Claims the agent's device once it said hello (its auth code is known then). */
async function claim(http: HttpClient, agent: TestAgent): Promise<string> {
  const auth = agent.agent.identity.authcode;
  return until(async () => {
    const r = await http.post('/0/devices/', { form: { auth } });
    return r.status === 201 ? r.body : undefined;
  }, 'the claim');
}

/** The token of the newest recovery mail in the bridge's outbox, once there is one. */
function recoveryToken(b: LiveBridge): string | undefined {
  const dir = outboxDir(b.config);
  const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.includes('-recover-')) : [];
  if (files.length === 0) return undefined;
  const link = /https?:\/\/\S+/.exec(readFileSync(join(dir, files.sort().at(-1)!), 'utf8'))?.[0];
  return link ? (new URL(link).searchParams.get('token') ?? undefined) : undefined;
}

/** The values a variable's deltas carried, each run of one value (its later stamps: acks) counted once. */
function values(socket: LiveSocket, deviceId: string, name: string): string[] {
  const out: string[] = [];
  for (const r of socket.records(deviceId, 'd', name)) {
    const v = r.deleted ? '<deleted>' : r.value!;
    if (out[out.length - 1] !== v) out.push(v);
  }
  return out;
}

describe.each(await engines())('the WebSocket live channel (%s)', (engine) => {
  let bridge: LiveBridge | undefined;
  const agents: TestAgent[] = [];
  const sockets: LiveSocket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.ws.terminate();
    for (const a of agents.splice(0)) await a.stop();
    await bridge?.close();
    bridge = undefined;
  });

  async function start(config?: ConfigOverrides) {
    bridge = await startLiveBridge({ engine, ...(config ? { config } : {}) });
    return bridge;
  }

  async function open(cookie: string, opts: Parameters<typeof LiveSocket.open>[1] = {}): Promise<LiveSocket> {
    const s = await LiveSocket.open(bridge!.url, { cookie, throttletime: 0, ...opts });
    sockets.push(s);
    return s;
  }

  it('sends the owner its devices, then each change from the device, REST and the CLI once, in order; others see nothing', async () => {
    const b = await start();
    const agent = await startAgent({ mqttUrl: b.mqttUrl });
    agents.push(agent);
    const deviceId = agent.agent.identity.deviceId;
    const owner = b.client();
    const ownerCookie = await signup(owner, 'owner@example.com');
    const other = b.client();
    const otherCookie = await signup(other, 'other@example.com');
    expect(await claim(owner, agent)).toBe(deviceId);

    const mine = await open(ownerCookie);
    const theirs = await open(otherCookie);
    const snapshot = await mine.next((m) => m.devices, 'the snapshot');
    expect(Object.keys(snapshot)).toEqual([deviceId]);
    expect(snapshot[deviceId]!.meta.unique!.value).toBe(deviceId);
    expect(snapshot[deviceId]!.meta.state!.value).toBe('connected');
    expect(await theirs.next((m) => m.devices, 'the other snapshot')).toEqual({});

    // From the device.
    const local = await agent.client();
    await local.set('d', 'temp', '21.5');
    const fromDevice = await mine.next((m) => m.delta?.[deviceId]?.d?.temp, 'temp from the device');
    expect(fromDevice.value).toBe('21.5');
    // Every delta carries the device's state and last activity.
    const withTemp = mine.messages.find((m) => m.delta?.[deviceId]?.d?.temp)!;
    expect(withTemp.delta![deviceId]!.meta!.state!.value).toBe('connected');
    expect(withTemp.delta![deviceId]!.meta!.lastactivity).toBeDefined();

    // From REST, until the device acknowledged it.
    expect((await owner.post(`/0/devices/${deviceId}/d/led`, { form: { value: 'on' } })).body).toBe('device-ok');
    await mine.next((m) => {
      const r = m.delta?.[deviceId]?.d?.led;
      return r && r.value === 'on' && r.acked! >= r.time ? r : undefined;
    }, 'led acknowledged');

    // From the CLI on the gateway.
    const cli = await agentCli(['var', 'set', 'mode', 'eco', '--socket', agent.socket]);
    expect(cli.code).toBe(0);
    await mine.next((m) => m.delta?.[deviceId]?.d?.mode, 'mode from the CLI');

    // A burst of versions of one variable arrives in order, none twice.
    for (let i = 1; i <= 20; i++) {
      expect((await owner.post(`/0/devices/${deviceId}/s/seq`, { form: { value: String(i) } })).body).toBe('device-ok');
    }
    await mine.next((m) => (m.delta?.[deviceId]?.s?.seq?.value === '20' ? true : undefined), 'the last seq');
    const seq = mine.records(deviceId, 's', 'seq').map((r) => Number(r.value));
    expect(seq).toEqual([...seq].sort((a, b) => a - b));
    expect(new Set(seq).size).toBe(seq.length);
    expect(seq[seq.length - 1]).toBe(20);

    // A deletion is a record marked deleted.
    await local.rm('d', 'temp');
    const deleted = await mine.next((m) => {
      const r = m.delta?.[deviceId]?.d?.temp;
      return r?.deleted ? r : undefined;
    }, 'temp deleted');
    expect(deleted.value).toBeUndefined();
    local.close();

    expect(values(mine, deviceId, 'temp')).toEqual(['21.5', '<deleted>']);
    expect(values(mine, deviceId, 'led')).toEqual(['on']);
    expect(values(mine, deviceId, 'mode')).toEqual(['eco']);
    // The other user got their (empty) snapshot and nothing else.
    expect(theirs.messages).toEqual([{ devices: {} }]);
  });

  it('announces a claim and an unregister; after the unregister the old owner gets nothing of the device', async () => {
    const b = await start();
    const agent = await startAgent({ mqttUrl: b.mqttUrl });
    const sentinel = await startAgent({ mqttUrl: b.mqttUrl });
    agents.push(agent, sentinel);
    const deviceId = agent.agent.identity.deviceId;
    const owner = b.client();
    const cookie = await signup(owner, 'claims@example.com');
    const sentinelId = await claim(owner, sentinel);

    const s = await open(cookie);
    await s.next((m) => m.devices, 'the snapshot');
    expect(await claim(owner, agent)).toBe(deviceId);
    const claimed = await s.next((m) => m.events?.[deviceId], 'device-claimed');
    expect(claimed.type).toBe('device-claimed');
    expect(claimed.device!.meta.unique!.value).toBe(deviceId);

    // Its changes follow at once.
    expect((await owner.post(`/0/devices/${deviceId}/s/note`, { form: { value: 'mine' } })).body).toBe('device-ok');
    await s.next((m) => m.delta?.[deviceId]?.s?.note, 'the note');

    const removedAt = s.messages.length;
    expect((await owner.request('DELETE', `/0/devices/${deviceId}`)).body).toBe('device-ok');
    expect(await s.next((m) => m.events?.[deviceId], 'device-removed', removedAt)).toEqual({
      type: 'device-removed',
    });

    // A change of the former device, committed, then one of the sentinel: only the sentinel's arrives.
    const local = await agent.client();
    await local.set('d', 'after', 'x');
    local.close();
    await until(async () => (await b.bridge.store.devices.getVar(deviceId, 'd', 'after')) !== undefined, 'the change');
    expect((await owner.post(`/0/devices/${sentinelId}/s/mark`, { form: { value: '1' } })).body).toBe('device-ok');
    await s.next((m) => m.delta?.[sentinelId]?.s?.mark, 'the sentinel', removedAt);
    const after: LiveMessage[] = s.messages.slice(removedAt);
    expect(after.some((m) => JSON.stringify(m).includes(deviceId) && !m.events)).toBe(false);
  });

  it('closes the channel of a session that logs out (4001), and only that one', async () => {
    const b = await start();
    const one = b.client();
    const cookieOne = await signup(one, 'logout@example.com');
    const two = b.client();
    const login = await two.post('/0/session/login', {
      form: { login: 'logout@example.com', password: 'correct horse battery' },
    });
    expect(login.status).toBe(201);
    const first = await open(cookieOne);
    const second = await open(`sid=${two.sid!}`);
    await first.next((m) => m.devices, 'snapshot');
    expect((await one.post('/0/session/logout')).status).toBe(201);
    expect(await first.closed).toEqual({ code: 4001, reason: 'session ended' });
    expect(second.ws.readyState).toBe(second.ws.OPEN);
    expect(b.sink.events('live.closed').map((e) => e.reason)).toEqual(['session']);
    const metrics = (await one.get('/metrics')).body;
    expect(metrics).toContain('devcloud_live_channels_open{kind="ws"} 1');
    expect(metrics).toContain('devcloud_live_channels_closed_total{reason="session"} 1');
    expect(metrics).toContain('devcloud_live_frames_sent_total{kind="ws",type="devices"} 2');
  });

  it('refuses before the upgrade: no session 401, anonymous 401, no thsq-user 400, unknown frontend 404, other path 404', async () => {
    const b = await start();
    const user = b.client();
    const cookie = await signup(user, 'refused@example.com');
    const anon = b.client();
    expect((await anon.post('/0/session/')).status).toBe(201);
    const refused = (opts: Parameters<typeof LiveSocket.open>[1]) =>
      LiveSocket.open(b.url, opts).then(
        () => 'opened',
        (err: Error) => err.message,
      );
    expect(await refused({})).toBe('status 401 no-session');
    expect(await refused({ cookie: `sid=${anon.sid!}` })).toBe('status 401 no-session');
    expect(await refused({ cookie, protocol: null })).toBe('status 400 protocol-fail');
    expect(await refused({ cookie, protocol: 'chat' })).toBe('status 400 protocol-fail');
    expect(await refused({ cookie, path: '/0/session/00000000-0000-4000-8000-000000000000' })).toBe(
      'status 404 not found',
    );
    expect(await refused({ cookie, path: '/0/devices/' })).toBe('status 404 not found');
    expect(await refused({ cookie, headers: { origin: 'https://evil.example' } })).toBe('status 403 origin-fail');
    // The frontend named in the path, as the official client does.
    const ok = await open(cookie, { path: `/0/session/${b.bridge.defaultFrontend.id}` });
    expect(ok.ws.protocol).toBe('thsq-user');
    await ok.next((m) => m.devices, 'snapshot');
  });

  it('limits channels per user and per address with 429, and gives the place back when one closes', async () => {
    const b = await start({ live: { maxPerUser: 2, maxPerAddress: 3 } });
    const a = b.client();
    const cookieA = await signup(a, 'limit-a@example.com');
    const c = b.client();
    const cookieC = await signup(c, 'limit-c@example.com');
    const first = await open(cookieA);
    await open(cookieA);
    await expect(LiveSocket.open(b.url, { cookie: cookieA })).rejects.toThrow('status 429 too-many-requests');
    await open(cookieC);
    // The address is full (3), whoever asks.
    await expect(LiveSocket.open(b.url, { cookie: cookieC })).rejects.toThrow('status 429 too-many-requests');
    await first.close();
    await until(() => b.sink.events('live.closed').length === 1, 'the close');
    await open(cookieA);
    expect(b.sink.events('live.refused').map((e) => e.reason)).toEqual(['per_user', 'per_address']);
  });

  it('cuts a peer that does not answer pings', async () => {
    const b = await start({ live: { pingMs: 100 } });
    const u = b.client();
    const cookie = await signup(u, 'pong@example.com');
    const silent = await open(cookie, { autoPong: false });
    const polite = await open(cookie);
    expect((await silent.closed).code).toBe(1006);
    expect(polite.ws.readyState).toBe(polite.ws.OPEN);
    expect(b.sink.events('live.closed').map((e) => e.reason)).toEqual(['ping']);
  });

  it('a share: device-claimed then deltas to the shared user; unsharing and an unregister remove it; a third user sees nothing', async () => {
    const b = await start();
    const agent = await startAgent({ mqttUrl: b.mqttUrl });
    agents.push(agent);
    const deviceId = agent.agent.identity.deviceId;
    const owner = b.client();
    const ownerCookie = await signup(owner, 'sharer@example.com');
    const friend = b.client();
    const friendCookie = await signup(friend, 'friend@example.com');
    const stranger = b.client();
    const strangerCookie = await signup(stranger, 'stranger@example.com');
    expect(await claim(owner, agent)).toBe(deviceId);

    const o = await open(ownerCookie);
    const f = await open(friendCookie);
    const x = await open(strangerCookie);
    await o.next((m) => m.devices, 'the owner snapshot');
    expect(await f.next((m) => m.devices, 'the friend snapshot')).toEqual({});
    expect(await x.next((m) => m.devices, 'the stranger snapshot')).toEqual({});

    const share = () => owner.post('/0/devices/', { form: { auth: deviceId, user: 'friend@example.com' } });
    expect((await share()).body).toBe('share-ok');
    const claimed = await f.next((m) => m.events?.[deviceId], 'device-claimed');
    expect(claimed.type).toBe('device-claimed');
    expect(claimed.device!.meta.unique!.value).toBe(deviceId);

    // Its changes follow: from the device, and from REST (the owner's and the shared user's own).
    const local = await agent.client();
    await local.set('d', 'temp', '20');
    expect((await f.next((m) => m.delta?.[deviceId]?.d?.temp, 'temp from the device')).value).toBe('20');
    expect((await owner.post(`/0/devices/${deviceId}/s/note`, { form: { value: 'a' } })).body).toBe('device-ok');
    expect((await f.next((m) => m.delta?.[deviceId]?.s?.note, 'the owner note')).value).toBe('a');
    expect((await friend.post(`/0/devices/${deviceId}/s/reply`, { form: { value: 'b' } })).body).toBe('device-ok');
    await f.next((m) => m.delta?.[deviceId]?.s?.reply, 'the friend reply');
    await o.next((m) => m.delta?.[deviceId]?.s?.reply, 'the friend reply, to the owner');
    // The owner already saw the device: no claim for it.
    expect(o.messages.some((m) => m.events)).toBe(false);

    // Unshared: device-removed, then nothing more of it, while the owner still gets its changes.
    const unsharedAt = f.messages.length;
    expect((await owner.request('DELETE', `/0/devices/${deviceId}/users/friend@example.com`)).body).toBe('share-ok');
    expect(await f.next((m) => m.events?.[deviceId], 'device-removed', unsharedAt)).toEqual({
      type: 'device-removed',
    });
    await local.set('d', 'temp', '21');
    await o.next((m) => (m.delta?.[deviceId]?.d?.temp?.value === '21' ? true : undefined), 'temp 21 to the owner');
    expect((await owner.post(`/0/devices/${deviceId}/s/note`, { form: { value: 'c' } })).body).toBe('device-ok');
    await o.next((m) => (m.delta?.[deviceId]?.s?.note?.value === 'c' ? true : undefined), 'note c to the owner');
    expect(f.messages.slice(unsharedAt).filter((m) => !m.events)).toEqual([]);

    // Shared again, then unregistered by the owner: device-removed to both.
    const reshareAt = f.messages.length;
    expect((await share()).body).toBe('share-ok');
    await f.next(
      (m) => (m.events?.[deviceId]?.type === 'device-claimed' ? true : undefined),
      'claimed again',
      reshareAt,
    );
    const [ownerAt, friendAt] = [o.messages.length, f.messages.length];
    expect((await owner.request('DELETE', `/0/devices/${deviceId}`)).body).toBe('device-ok');
    expect(await o.next((m) => m.events?.[deviceId], 'removed (owner)', ownerAt)).toEqual({ type: 'device-removed' });
    expect(await f.next((m) => m.events?.[deviceId], 'removed (friend)', friendAt)).toEqual({
      type: 'device-removed',
    });
    await local.set('d', 'temp', '22');
    local.close();
    await until(
      async () => (await b.bridge.store.devices.getVar(deviceId, 'd', 'temp'))?.value?.toString() === '22',
      'the later change',
    );
    // A change of another kind after it reaches no one either: the friend's channel is still open, and empty of it.
    expect(f.ws.readyState).toBe(f.ws.OPEN);
    expect(o.messages.slice(ownerAt).filter((m) => !m.events)).toEqual([]);
    expect(f.messages.slice(friendAt).filter((m) => !m.events)).toEqual([]);
    // The third user saw nothing throughout.
    expect(x.messages).toEqual([{ devices: {} }]);
  });

  it('opens a WebSocket and an SSE stream with a bearer access token; a wrong one is 401; revoking it closes them (4001)', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'bearer@example.com');
    const id = await ownedDevice(b, 'bearer@example.com');
    const made = await u.post('/0/user/accesstoken');
    expect(made.status).toBe(201);
    const token = made.body;
    const other = (await u.post('/0/user/accesstoken')).body;
    const bearer = { authorization: `Bearer ${token}` };

    const ws = await open('', { headers: bearer });
    const sse = await SseStream.open(b.url, bearer);
    const byOther = await open('', { headers: { authorization: `bearer ${other}` } });
    const byCookie = await open(cookie);
    try {
      expect(sse.status).toBe(200);
      expect(Object.keys(await ws.next((m) => m.devices, 'the snapshot'))).toEqual([id]);
      await sse.next((e) => e.event === 'devices' || undefined, 'the SSE snapshot');
      await byOther.next((m) => m.devices, 'the other token snapshot');
      await byCookie.next((m) => m.devices, 'the cookie snapshot');
      expect((await u.post(`/0/devices/${id}/s/color`, { form: { value: 'red' } })).body).toBe('device-ok');
      expect((await ws.next((m) => m.delta?.[id]?.s?.color, 'the delta')).value).toBe('red');
      await sse.next((e) => (e.event === 'delta' && e.data.includes('"red"') ? true : undefined), 'the SSE delta');
      // Its last use is stamped.
      const listed = JSON.parse((await u.get('/0/user/accesstoken')).body) as Array<{ lastUsed: number | null }>;
      expect(listed.map((t) => t.lastUsed !== null)).toEqual([true, true]);

      // Refused before the upgrade: a wrong token, a malformed one, another scheme.
      const refused = (authorization: string) =>
        LiveSocket.open(b.url, { headers: { authorization } }).then(
          () => 'opened',
          (err: Error) => err.message,
        );
      expect(await refused(`Bearer ${'A'.repeat(43)}`)).toBe('status 401 no-session');
      expect(await refused('Bearer nonsense')).toBe('status 401 no-session');
      expect(await refused(`Basic ${token}`)).toBe('status 401 no-session');
      const wrong = await SseStream.open(b.url, { authorization: `Bearer ${'B'.repeat(43)}` });
      await wrong.ended;
      expect([wrong.status, wrong.body]).toEqual([401, 'no-session']);
      expect(b.sink.events('live.refused').map((e) => e.reason)).toEqual(['token', 'token', 'session', 'token']);

      // Revoked: its channels close as after a logout; the other token's and the cookie's stay.
      expect((await u.request('DELETE', `/0/user/accesstoken/${token}`)).body).toBe('accesstoken-ok');
      expect(await ws.closed).toEqual({ code: 4001, reason: 'session ended' });
      await sse.ended;
      expect(sse.events.at(-1)).toEqual({ event: 'close', data: '{"code":4001,"reason":"session ended"}' });
      expect(byOther.ws.readyState).toBe(byOther.ws.OPEN);
      expect(byCookie.ws.readyState).toBe(byCookie.ws.OPEN);
      expect(await refused(`Bearer ${token}`)).toBe('status 401 no-session');
      expect(b.sink.text()).not.toContain(token);
      expect(b.sink.text()).not.toContain(other);
    } finally {
      sse.close();
    }
  });

  it("a password reset closes the channels opened with the user's tokens", async () => {
    const b = await start();
    const u = b.client();
    await signup(u, 'reset@example.com');
    const token = (await u.post('/0/user/accesstoken')).body;
    const ws = await open('', { headers: { authorization: `Bearer ${token}` } });
    await ws.next((m) => m.devices, 'the snapshot');
    expect((await b.client().post('/0/session/recover', { form: { login: 'reset@example.com' } })).body).toBe(
      'recover-ok',
    );
    const link = await until(() => recoveryToken(b), 'the recovery mail');
    const form = { login: 'reset@example.com', token: link, password: 'a new password' };
    expect((await b.client().post('/0/session/recover', { form })).body).toBe('recover-ok');
    expect(await ws.closed).toEqual({ code: 4001, reason: 'session ended' });
  });

  /** A device owned by the user, as the bridge keeps it after a hello (no agent: its changes come from REST). */
  async function ownedDevice(b: LiveBridge, login: string): Promise<string> {
    const id = randomUUID();
    const now = Date.now();
    const user = (await b.bridge.store.userByLogin(b.bridge.defaultFrontend.id, login))!;
    await b.bridge.store.write(async ({ devices }) => {
      await devices.touch(id, now);
      await devices.setAuthcode(id, randomBytes(16).toString('hex'));
      await devices.setMeta(id, 'unique', id, now, 'device');
      await devices.setMeta(id, 'state', 'connected', now, 'server');
      await devices.claim(id, user.id, now);
    });
    return id;
  }

  (engine === 'postgres' ? it : it.skip)(
    'sends every channel a fresh snapshot after the bus may have missed events (its listener lost)',
    async () => {
      const b = await start();
      const u = b.client();
      const cookie = await signup(u, 'resync@example.com');
      const id = await ownedDevice(b, 'resync@example.com');
      const ws = await open(cookie);
      const sse = await SseStream.open(b.url, { cookie });
      try {
        await ws.next((m) => m.devices, 'snapshot');
        await sse.next((e) => e.event === 'devices' || undefined, 'SSE snapshot');
        const backend = await b.database!.pool.query<{ pid: number }>(
          "SELECT pid FROM pg_stat_activity WHERE application_name = 'devcloud-bridge-events' AND datname = current_database()",
        );
        expect(backend.rows).toHaveLength(1);
        await b.database!.pool.query('SELECT pg_terminate_backend($1)', [backend.rows[0]!.pid]);
        // Written while the listener is away: not announced to this bridge's channels, so only a snapshot has it.
        const now = Date.now();
        await b.bridge.store.write(({ devices }) =>
          devices.putVersion(
            id,
            { type: 's', name: 'missed', value: Buffer.from('1'), time: now, origin: 'cloud' },
            now,
            'user',
          ),
        );
        const again = await ws.next(
          (m) => (m.devices?.[id]?.s.missed ? m.devices : undefined),
          'the fresh snapshot',
          1,
        );
        expect(again[id]!.s.missed!.value).toBe('1');
        await sse.next(
          (e) => (e.event === 'devices' && e.data.includes('"missed"') ? true : undefined),
          'the fresh SSE snapshot',
        );
      } finally {
        sse.close();
      }
    },
  );

  // What follows depends on no engine: on SQLite only, to keep the file quick.
  const onSqlite = engine === 'sqlite' ? it : it.skip;

  onSqlite('closes every channel with 1001 when the bridge stops', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'stop@example.com');
    const ws = await open(cookie);
    const sse = await SseStream.open(b.url, { cookie });
    await ws.next((m) => m.devices, 'snapshot');
    await sse.next((e) => e.event === 'devices' || undefined, 'SSE snapshot');
    bridge = undefined;
    await b.close();
    expect(await ws.closed).toEqual({ code: 1001, reason: 'bridge shutting down' });
    await sse.ended;
    expect(sse.events.at(-1)).toEqual({ event: 'close', data: '{"code":1001,"reason":"bridge shutting down"}' });
  });

  onSqlite(
    'limits bearer attempts per address with POST /0/session/ (rateLimits.accessToken): 429, a valid one too',
    async () => {
      const b = await start({ rateLimits: { accessToken: { limit: 3, windowMs: 60_000 } } });
      const u = b.client();
      const cookie = await signup(u, 'guess@example.com');
      const token = (await u.post('/0/user/accesstoken')).body;
      const attempt = (t: string) =>
        LiveSocket.open(b.url, { headers: { authorization: `Bearer ${t}` } }).then(
          (s) => (sockets.push(s), 'opened'),
          (err: Error) => err.message,
        );
      expect(await attempt(token)).toBe('opened');
      expect(await attempt('G'.repeat(43))).toBe('status 401 no-session');
      // The session route's token attempts count in the same limit.
      expect((await b.client().post('/0/session/', { form: { token: 'H'.repeat(43) } })).status).toBe(401);
      expect(await attempt(token)).toBe('status 429 too-many-requests');
      const sse = await SseStream.open(b.url, { authorization: `Bearer ${token}` });
      await sse.ended;
      expect([sse.status, sse.body]).toEqual([429, 'too-many-requests']);
      // A cookie is not a token attempt.
      await (await open(cookie)).next((m) => m.devices, 'the cookie snapshot');
      expect(b.sink.events('live.refused').map((e) => e.reason)).toEqual(['token', 'token_rate', 'token_rate']);
    },
  );

  onSqlite('closes a channel whose session ended or token was revoked while its handshake was under way', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'handshake@example.com');
    const token = (await u.post('/0/user/accesstoken')).body;
    const [{ id: tokenId }] = JSON.parse((await u.get('/0/user/accesstoken')).body) as [{ id: number }];
    const userId = (await b.bridge.store.userByLogin(b.bridge.defaultFrontend.id, 'handshake@example.com'))!.id;
    // The events as they would come between the check of the credentials and the channel's opening: the session
    // and the token are still valid in the store, as they were when the handshake checked them.
    b.bridge.events.publish({ type: 'session.ended', userId, tokenId });
    b.bridge.events.publish({
      type: 'session.ended',
      userId,
      idHash: createHash('sha256').update(u.sid!).digest('hex'),
    });
    const byToken = await open('', { headers: { authorization: `Bearer ${token}` } });
    const byCookie = await open(cookie);
    expect(await byToken.closed).toEqual({ code: 4001, reason: 'session ended' });
    expect(await byCookie.closed).toEqual({ code: 4001, reason: 'session ended' });
    // Another token of the user is not concerned.
    const other = (await u.post('/0/user/accesstoken')).body;
    const fine = await open('', { headers: { authorization: `Bearer ${other}` } });
    await fine.next((m) => m.devices, 'the snapshot');
  });

  onSqlite('sends a change that reaches the channel twice once', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'twice@example.com');
    const id = await ownedDevice(b, 'twice@example.com');
    const s = await open(cookie);
    await s.next((m) => m.devices, 'snapshot');
    const now = Date.now();
    await b.bridge.store.write(({ devices }) =>
      devices.putVersion(
        id,
        { type: 's', name: 'once', value: Buffer.from('1'), time: now, origin: 'cloud' },
        now,
        'user',
      ),
    );
    // The same event twice in one turn (as a bridge that heard it from the bus and handled it too would).
    const event: BusEvent = {
      type: 'device.vars',
      deviceId: id,
      vars: [{ type: 's', name: 'once', change: 'version' }],
    };
    b.bridge.events.publish(event);
    b.bridge.events.publish(event);
    await u.post(`/0/devices/${id}/s/after`, { form: { value: 'x' } });
    await s.next((m) => m.delta?.[id]?.s?.after, 'the later change');
    expect(s.records(id, 's', 'once')).toHaveLength(1);
  });

  onSqlite('coalesces changes within a throttletime', async () => {
    const b = await start();
    const u = b.client();
    const cookie = await signup(u, 'throttle@example.com');
    const id = await ownedDevice(b, 'throttle@example.com');
    const s = await open(cookie, { throttletime: 300 });
    await s.next((m) => m.devices, 'snapshot');
    for (let i = 1; i <= 10; i++) await u.post(`/0/devices/${id}/s/n`, { form: { value: String(i) } });
    await s.next((m) => (m.delta?.[id]?.s?.n?.value === '10' ? true : undefined), 'the last value');
    const seen = s.records(id, 's', 'n').map((r) => Number(r.value));
    expect(seen.length).toBeLessThan(10);
    expect(seen).toEqual([...seen].sort((x, y) => x - y));
  });

  onSqlite(
    'stops sending to a client that does not read, keeps only what changed, and closes it (4008) when it falls too far behind',
    async () => {
      const b = await start({ live: { highWaterBytes: 1024, maxPendingKeys: 20 } });
      const u = b.client();
      const cookie = await signup(u, 'slow@example.com');
      const id = await ownedDevice(b, 'slow@example.com');
      const s = await open(cookie);
      await s.next((m) => m.devices, 'snapshot');
      s.ws.pause();
      // A burst of large values (as a device's up/vars would bring them): one frame of some 16 MB, more than the
      // socket buffers of both ends take.
      const names = Array.from({ length: 256 }, (_, i) => `big${i}`);
      const value = Buffer.alloc(64 * 1024, 'x');
      const now = Date.now();
      await b.bridge.store.write(async ({ devices }) => {
        for (const name of names) {
          await devices.putVersion(id, { type: 's', name, value, time: now, origin: 'cloud' }, now, 'user', false);
        }
      });
      b.bridge.events.publish({
        type: 'device.vars',
        deviceId: id,
        vars: names.map((name) => ({ type: 's', name, change: 'version' })),
      });
      // Then changes of other variables, through REST: they wait, coalesced, until there are too many.
      for (let i = 0; i < 25 && b.sink.events('live.closed').length === 0; i++) {
        await u.post(`/0/devices/${id}/s/small${i % 22}`, { form: { value: String(i) } });
      }
      await until(() => b.sink.events('live.closed').length === 1, 'the close');
      expect(b.sink.events('live.closed')[0]).toMatchObject({ reason: 'slow', code: 4008 });
      s.ws.resume();
      expect(await s.closed).toEqual({ code: 4008, reason: 'too far behind' });
      // The big frame, and none of the small changes: they were coalesced, never queued as frames.
      const deltas = s.messages.filter((m) => m.delta);
      expect(deltas.length).toBe(1);
      expect(Object.keys(deltas[0]!.delta![id]!.s!)).toHaveLength(256);
    },
  );

  onSqlite('closes a client that stays stalled for live.maxLagMs', async () => {
    // The check runs with the pings, every 300 ms; stalled for over 100 ms is too long.
    const b = await start({ live: { highWaterBytes: 1024, maxLagMs: 100, pingMs: 300 } });
    const u = b.client();
    const cookie = await signup(u, 'lag@example.com');
    const id = await ownedDevice(b, 'lag@example.com');
    const s = await open(cookie);
    await s.next((m) => m.devices, 'snapshot');
    s.ws.pause();
    const names = Array.from({ length: 256 }, (_, i) => `big${i}`);
    const value = Buffer.alloc(64 * 1024, 'y');
    const now = Date.now();
    await b.bridge.store.write(async ({ devices }) => {
      for (const name of names) {
        await devices.putVersion(id, { type: 's', name, value, time: now, origin: 'cloud' }, now, 'user', false);
      }
    });
    b.bridge.events.publish({
      type: 'device.vars',
      deviceId: id,
      vars: names.map((name) => ({ type: 's', name, change: 'version' })),
    });
    // One more change finds the socket full: the channel stalls, and the clock runs.
    await until(async () => {
      await u.post(`/0/devices/${id}/s/after`, { form: { value: '1' } });
      return b.sink.events('live.closed').length === 1;
    }, 'the close');
    expect(b.sink.events('live.closed')[0]).toMatchObject({ reason: 'slow', code: 4008 });
    s.ws.resume();
    expect((await s.closed).code).toBe(4008);
  });

  onSqlite('keeps 1,000 open channels on one bridge, and every one gets the change of its device', async () => {
    const b = await start({ live: { maxPerUser: 1000, maxPerAddress: 2000 } });
    const owners = await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const http = b.client();
        const login = `many${i}@example.com`;
        const cookie = await signup(http, login);
        return { http, cookie, id: await ownedDevice(b, login) };
      }),
    );
    const channels: Array<{ socket: LiveSocket; id: string }> = [];
    for (let batch = 0; batch < 4; batch++) {
      const opened = await Promise.all(
        owners.flatMap((o) => Array.from({ length: 25 }, async () => ({ socket: await open(o.cookie), id: o.id }))),
      );
      channels.push(...opened);
    }
    expect(channels).toHaveLength(1000);
    await until(() => channels.every((c) => c.socket.messages.length >= 1), 'every snapshot');
    await Promise.all(owners.map((o) => o.http.post(`/0/devices/${o.id}/s/wave`, { form: { value: 'hi' } })));
    await until(
      () => channels.every((c) => c.socket.messages.some((m) => m.delta?.[c.id]?.s?.wave?.value === 'hi')),
      'the change on every channel',
    );
    // Each saw its own device only.
    for (const c of channels) {
      for (const m of c.socket.messages) expect(Object.keys(m.delta ?? m.devices ?? {})).toEqual([c.id]);
    }
  });
});
