/**
 * Sharing a device (decision 23; docs/api.md, "Sharing a device"), on each store engine, against a whole bridge
 * with a real agent: the owner shares with `POST /0/devices/` (`auth` and `user`, as the official client's
 * `shareDevice`), idempotently; the shared user sees the device in the list, reads it and its history, sets its
 * variables (the agent acknowledges them) and sends it commands, but cannot unregister it (their DELETE drops only
 * their share), share it further or update its firmware; nobody else sees it; the owner lists and revokes shares;
 * unregistering ends them all. Grants and revocations are announced as `device.shared` on the event bus.
 */
import { randomUUID } from 'node:crypto';
import { rmSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { BusEvent } from '../../bridge/events/bus.js';
import { ProductConfig } from '../../bridge/store/types.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type HttpResult, type LiveBridge, engines, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

const PASSWORD = 'correct horse battery';

function expectToken(res: HttpResult, status: number, token: string): void {
  expect({ status: res.status, body: res.body }).toEqual({ status, body: token });
}

interface Person {
  c: HttpClient;
  login: string;
  id: number;
}

describe.each(await engines())('sharing a device on %s', (engine) => {
  let live: LiveBridge;
  let agent: TestAgent;
  let stateDir: string;
  let device: { id: string; auth: string };
  let owner: Person, bob: Person, carol: Person;
  const events: BusEvent[] = [];
  let people = 0;

  async function person(host?: string): Promise<Person> {
    const login = `p${++people}-${engine}@example.com`;
    const c = live.client();
    const headers: Record<string, string> = host ? { host } : {};
    expectToken(await c.post('/0/session/signup', { form: { login, password: PASSWORD }, headers }), 201, 'signup-ok');
    const frontendId = host ? host.split('.')[0]! : live.bridge.defaultFrontend.id;
    return { c, login, id: (await live.bridge.store.userByLogin(frontendId, login))!.id };
  }

  const share = (by: Person, auth: string, user: string) => by.c.post('/0/devices/', { form: { auth, user } });
  const ids = async (p: Person) => Object.keys(JSON.parse((await p.c.get('/0/devices/')).body) as object);
  const shared = () => events.filter((e) => e.type === 'device.shared');

  beforeAll(async () => {
    live = await startLiveBridge({ engine });
    live.bridge.events.subscribe((e) => {
      if (e.type !== 'bus.resync') events.push(e);
    });
    stateDir = tempDir('devcloud-agent-');
    agent = await startAgent({ mqttUrl: live.mqttUrl, stateDir, level: 'info' });
    const { deviceId: id, authcode: auth } = agent.agent.identity;
    await until(async () => (await live.bridge.store.devices.device(id))?.authcode === auth, 'the hello of the agent');
    device = { id, auth };
  });

  afterAll(async () => {
    await agent.stop();
    await live.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  beforeEach(async () => {
    [owner, bob, carol] = [await person(), await person(), await person()];
    const r = await owner.c.post('/0/devices/', { form: { auth: device.auth } });
    expect([r.status, r.body]).toEqual([201, device.id]);
    events.length = 0;
  });

  afterEach(async () => {
    // The next test's owner claims it again.
    await owner.c.request('DELETE', `/0/devices/${device.id}`);
  });

  it('the owner shares by uuid or auth code, idempotently; device.shared is published once; the owner lists it', async () => {
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    expect(shared()).toEqual([{ type: 'device.shared', deviceId: device.id, userId: bob.id, shared: true }]);
    // Again, by its auth code in upper case and the login in another case: nothing changes, nothing is published.
    expectToken(await share(owner, device.auth.toUpperCase(), bob.login.toUpperCase()), 200, 'share-ok');
    expect(shared()).toHaveLength(1);
    expectToken(await share(owner, device.id, carol.login), 200, 'share-ok');

    const list = await owner.c.get(`/0/devices/${device.id}/users/`);
    expect(list.status).toBe(200);
    const shares = JSON.parse(list.body) as Array<{ login: string; granted: number }>;
    expect(shares.map((s) => s.login)).toEqual([bob.login, carol.login]);
    expect(shares[0]!.granted).toBeGreaterThan(0);
    // Only the owner lists them.
    expectToken(await bob.c.get(`/0/devices/${device.id}/users/`), 403, 'share-fail');
    expect(live.sink.events('device.shared')).toEqual([
      expect.objectContaining({ deviceId: device.id, userId: bob.id, by: owner.id }),
      expect.objectContaining({ deviceId: device.id, userId: carol.id, by: owner.id }),
    ]);
  });

  it('the shared user lists, reads, sets (acknowledged by the device), reads history and sends commands', async () => {
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    expect(await ids(bob)).toEqual([device.id]);
    expect(await ids(owner)).toEqual([device.id]);
    expect((await bob.c.get(`/0/devices/${device.auth}`)).status).toBe(200);

    expectToken(await bob.c.post(`/0/devices/${device.id}/d/led`, { form: { value: 'on' } }), 200, 'device-ok');
    expectToken(await bob.c.post(`/0/devices/${device.id}/s/note`, { form: { value: 'hi' } }), 200, 'device-ok');
    // The agent got it and acknowledged it; the owner sees the shared user's change.
    await until(async () => {
      const r = JSON.parse((await owner.c.get(`/0/devices/${device.id}/d/led`)).body) as {
        acked: number;
        time: number;
      };
      return r.acked >= r.time;
    }, 'the acknowledgement of led');
    const history = JSON.parse((await bob.c.get(`/0/devices/${device.id}/d/led?latest=5`)).body) as Array<{
      value: string;
      by: string;
    }>;
    expect(history[0]).toMatchObject({ value: 'on', by: 'user' });

    const cmd = await bob.c.post(`/0/devices/${device.id}`, { form: { command: 'ping' } });
    expect(cmd.status, cmd.body).toBe(200);
    expect((await bob.c.get(`/0/devices/${device.id}/commands/${cmd.body}`)).status).toBe(200);
    expect((await owner.c.get(`/0/devices/${device.id}/commands/${cmd.body}`)).status).toBe(200);
  });

  it('the shared user cannot unregister (DELETE drops only their share), share further or update firmware', async () => {
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    expectToken(await share(bob, device.id, carol.login), 400, 'share-fail');
    expectToken(await bob.c.post(`/0/devices/${device.id}/fw/any/image`), 400, 'device-fwup-start-fail');
    expectToken(await bob.c.post(`/0/devices/${device.id}/firmware/any/image`), 400, 'device-fwup-start-fail');
    expectToken(await bob.c.request('DELETE', `/0/devices/${device.id}/fw`), 400, 'firmware-fail');
    expectToken(await bob.c.request('DELETE', `/0/devices/${device.id}/users/${carol.login}`), 400, 'share-fail');
    // The owner may (an unknown image, so nothing starts).
    expectToken(await owner.c.post(`/0/devices/${device.id}/fw/any/image`), 400, 'device-fwup-name-fail');

    events.length = 0;
    expectToken(await bob.c.request('DELETE', `/0/devices/${device.id}`), 200, 'device-ok');
    expect(events).toEqual([{ type: 'device.shared', deviceId: device.id, userId: bob.id, shared: false }]);
    expect(await ids(bob)).toEqual([]);
    expect(await ids(owner)).toEqual([device.id]);
    expect((await live.bridge.store.devices.device(device.id))?.ownerId).toBe(owner.id);
    expectToken(await bob.c.request('DELETE', `/0/devices/${device.id}`), 400, 'device-fail');

    // A shared user may also drop their share by their own login.
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    expectToken(await bob.c.request('DELETE', `/0/devices/${device.id}/users/${bob.login}`), 200, 'share-ok');
    expect(await ids(bob)).toEqual([]);
  });

  it('nobody else sees it; unknown logins, the owner, a non-owner and another frontend are refused share-fail', async () => {
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    expectToken(await carol.c.get(`/0/devices/${device.id}`), 404, 'device-fail');
    expectToken(await carol.c.get(`/0/devices/${device.id}/users/`), 404, 'device-fail');
    expectToken(await carol.c.post(`/0/devices/${device.id}/d/led`, { form: { value: 'x' } }), 400, 'device-fail');
    expect(await ids(carol)).toEqual([]);

    expectToken(await share(owner, device.id, 'nobody@example.com'), 400, 'share-fail');
    expectToken(await share(owner, device.id, owner.login), 400, 'share-fail');
    expectToken(await share(owner, device.id, 'not a login'), 400, 'share-fail');
    expectToken(await share(owner, 'nonsense', carol.login), 400, 'share-fail');
    expectToken(await share(carol, device.id, carol.login), 400, 'share-fail');
    // The login of a user in another frontend is no user here.
    const frontendId = randomUUID();
    const config = ProductConfig.parse({ confirmationEmail: false });
    await live.bridge.store.createFrontend({ id: frontendId, name: 'other', config, isDefault: false, createdAt: 1 });
    const far = await person(`${frontendId}.devcloud.test`);
    expectToken(await share(owner, device.id, far.login), 400, 'share-fail');
    expect(shared()).toHaveLength(1);
    // `users` under a device is its shares, not a command of the older clients' spelling.
    expectToken(await owner.c.post(`/0/devices/${device.id}/users`), 400, 'device-fail');
  });

  it('the owner revokes: device.shared false, the user no longer sees it; again is 400 share-fail', async () => {
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    events.length = 0;
    expectToken(await owner.c.request('DELETE', `/0/devices/${device.id}/users/${bob.login}`), 200, 'share-ok');
    expect(events).toEqual([{ type: 'device.shared', deviceId: device.id, userId: bob.id, shared: false }]);
    expectToken(await bob.c.get(`/0/devices/${device.id}`), 404, 'device-fail');
    expect(await ids(bob)).toEqual([]);
    expectToken(await owner.c.request('DELETE', `/0/devices/${device.id}/users/${bob.login}`), 400, 'share-fail');
    expectToken(await owner.c.request('DELETE', `/0/devices/${device.id}/users/nobody@example.com`), 400, 'share-fail');
    expect(live.sink.events('device.unshared')).toContainEqual(
      expect.objectContaining({ deviceId: device.id, userId: bob.id, by: owner.id }),
    );
  });

  it('unregistering ends every share (one device.registration event); a new claim starts with none', async () => {
    expectToken(await share(owner, device.id, bob.login), 200, 'share-ok');
    expectToken(await share(owner, device.id, carol.login), 200, 'share-ok');
    events.length = 0;
    expectToken(await owner.c.request('DELETE', `/0/devices/${device.id}`), 200, 'device-ok');
    expect(events.filter((e) => e.type === 'device.registration' || e.type === 'device.shared')).toEqual([
      { type: 'device.registration', deviceId: device.id, owned: false, userId: owner.id },
    ]);
    expect(await live.bridge.store.devices.sharesOf(device.id)).toEqual([]);
    for (const p of [bob, carol]) {
      expectToken(await p.c.get(`/0/devices/${device.id}`), 404, 'device-fail');
      expect(await ids(p)).toEqual([]);
    }
    // Claimed again (by the owner, as the next test does): bob is not let back in.
    const r = await owner.c.post('/0/devices/', { form: { auth: device.auth } });
    expect(r.status).toBe(201);
    expectToken(await bob.c.get(`/0/devices/${device.id}`), 404, 'device-fail');
  });
});
