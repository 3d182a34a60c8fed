/**
 * The WebSocket live channel (docs/api.md, "Live channel") through real sockets: a whole bridge with its embedded
 * broker, a real agent, users made over HTTP, and `ws` clients as the official client opens them (subprotocol
 * `thsq-user`, the session cookie, `{"delta":true,"throttletime":N}` on open).
 *
 * Sharing is not here: the second user simply does not see the device.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { type TestAgent, agentCli, startAgent } from '../support/agent.js';
import { type ConfigOverrides, type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type LiveMessage, LiveSocket } from '../support/live.js';
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

/** The values a variable's deltas carried, each run of one value (its later stamps: acks) counted once. */
function values(socket: LiveSocket, deviceId: string, name: string): string[] {
  const out: string[] = [];
  for (const r of socket.records(deviceId, 'd', name)) {
    const v = r.deleted ? '<deleted>' : r.value!;
    if (out[out.length - 1] !== v) out.push(v);
  }
  return out;
}

describe('the WebSocket live channel', () => {
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
    bridge = await startLiveBridge(config ? { config } : {});
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
});
