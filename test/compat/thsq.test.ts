/**
 * The platform's official JavaScript client (npm `thsq` 1.2.15, a development dependency), unmodified, against a
 * real bridge (HTTP on a free port, its embedded broker) and a real agent connected to it: what an app built on the
 * client does, step by step, from an anonymous session to logout (issue 16, docs/api.md).
 *
 * The client is a CommonJS singleton with a module-global cookie jar, so the steps share one client and run in
 * order (test/support/thsq.ts: its API, and the recording `request` given to its `init`, so that the test can tell
 * a value that arrived over the WebSocket from one it fetched). The second user's view goes through plain HTTP
 * (test/support/bridge.ts, `HttpClient`).
 */
import { createSocket } from 'node:dgram';
import { rmSync } from 'node:fs';
import { beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { addToCatalog, buildImage, makeKeys } from '../support/firmware.js';
import {
  type Device,
  type HistoryEntry,
  type Seen,
  type VarRecord,
  call,
  recordingRequest,
  thsq,
} from '../support/thsq.js';
import { until } from '../support/wait.js';

const PASSWORD = 'correct horse battery';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';

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

describe('the official client (thsq 1.2.15) against a real bridge and agent', () => {
  let bridge: LiveBridge;
  let agent: TestAgent;
  let frontend: string;
  let options: Record<string, unknown>;
  const seen: Seen[] = [];
  const updates: Array<{ unique: string; diff: Partial<Device> }> = [];
  const removed: string[] = [];
  let deviceId: string;
  let deviceAuth: string;
  let alice: HttpClient;
  let bob: HttpClient;
  let accessToken: string;

  /** The `request` the client calls (its `init` option): the real one, each call and its answer recorded. */
  const recording = recordingRequest(seen);
  const onUpdate = (_device: Device, unique: string, diff: Partial<Device>) => updates.push({ unique, diff });
  const onRemoved = (unique: string) => removed.push(unique);
  const claimed: string[] = [];
  const onClaimed = (_device: Device, unique: string) => claimed.push(unique);
  let disconnects = 0;
  const onDisconnected = () => (disconnects += 1);

  /** The requests made since `from`, for a failure message. */
  const since = (from: number) => seen.slice(from).map((s) => `${s.method} ${s.path} ${s.status}`);

  beforeAll(async () => {
    bridge = await startLiveBridge();
    agent = await startAgent({ mqttUrl: bridge.mqttUrl });
    deviceId = agent.agent.identity.deviceId;
    deviceAuth = agent.agent.identity.authcode;
    frontend = (await bridge.bridge.store.defaultFrontend())!.id;
    options = { server: bridge.url, frontend, throttletime: 50, request: recording };
    // A listener for the whole run: with none, the client ends itself once its queues are empty.
    thsq.on('device-updated', onUpdate);
    thsq.on('device-removed', onRemoved);
    thsq.on('device-claimed', onClaimed);
    thsq.on('server-disconnected', onDisconnected);
    alice = bridge.client();
    bob = bridge.client();
    expect((await bob.post('/0/session/signup', { form: { login: BOB, password: PASSWORD } })).status).toBe(201);
    const keysDir = tempDir('devcloud-keys-');
    const imageDir = tempDir('devcloud-image-');
    const image = buildImage({ name: 'gateway', version: 3 }, imageDir);
    await addToCatalog(bridge.bridge.store, image, { name: 'gateway', version: 3 }, makeKeys(keysDir));
    return async () => {
      // Its listeners, timers (scan, reconnect, ping) and WebSocket end here, so that the worker can go on.
      thsq.destroy();
      rmSync(keysDir, { recursive: true, force: true });
      rmSync(imageDir, { recursive: true, force: true });
      await agent.stop();
      await bridge.close();
    };
  });

  it('init: an anonymous session, no devices', async () => {
    const devices = await call('init', thsq.init.bind(thsq), options);
    expect(devices).toEqual({});
    expect(seen[0]).toMatchObject({ method: 'POST', path: '/0/session/', status: 201, body: 'user-ok' });
  });

  it('userSignup', async () => {
    expect(await call('userSignup', thsq.userSignup.bind(thsq), ALICE, PASSWORD)).toBe('signup-ok');
  });

  it('login: a wrong password fails, the right one logs in', async () => {
    // On a failure the client hands its callback the response (node_modules/thsq/lib/thsq.js, `fetch`).
    const failed = await call('login', thsq.login.bind(thsq), ALICE, 'wrong password!');
    expect(failed).toMatchObject({ statusCode: 403, body: 'login-fail' });
    expect((await call('getUser', thsq.getUser.bind(thsq)))?.login).toBe(ALICE);
    expect(await call('login', thsq.login.bind(thsq), ALICE, PASSWORD)).toBe('login-ok');
    const user = await call('getUser', thsq.getUser.bind(thsq));
    expect(user?.login).toBe(ALICE);
    // The same user through plain HTTP, for what the client cannot show.
    expect((await alice.post('/0/session/login', { form: { login: ALICE, password: PASSWORD } })).status).toBe(201);
  });

  it('storeUserData and getUser', async () => {
    await call('storeUserData', thsq.storeUserData.bind(thsq), { nickname: 'Al', theme: 'dark' });
    expect(seen.at(-1)).toMatchObject({ path: '/0/user/', method: 'POST', status: 200, body: 'user-data-ok' });
    const user = await call('getUser', thsq.getUser.bind(thsq));
    // The client adds `app` (its frontend) to every form it posts, and every field of this route is data
    // (docs/api.md, POST /0/user/; decision 25).
    expect(user?.data).toEqual({ nickname: 'Al', theme: 'dark', app: frontend });
  });

  it('the nearby view: the agent heard the user’s authcode', async () => {
    const user = await call('getUser', thsq.getUser.bind(thsq));
    await udpSend(agent.agent.nearby.port!, `${user!.authcode}\n`);
    const nearby = await until(async () => {
      const devices = await call('getNetworkDevices', thsq.getNetworkDevices.bind(thsq));
      return devices?.[deviceAuth];
    }, 'the device in the nearby view');
    expect(nearby.meta.unique!.value).toBe(deviceId);
  });

  it('the WebSocket channel is open', async () => {
    await until(() => thsq.connected === true, 'the client connected its WebSocket', 12_000);
    // What the client sends when its app comes back to the foreground: a bare `ping` text frame, not JSON. The
    // channel stays open (checked at the end of the step that sets a variable, which takes a while).
    thsq.sendPing();
  });

  it('claimDevice, getDevicelist, getDevice', async () => {
    expect(await call('claimDevice', thsq.claimDevice.bind(thsq), deviceId)).toBe(deviceId);
    // The live channel says so too, with the device (the client reads its `meta.unique`).
    await until(() => claimed.includes(deviceId), 'device-claimed over the WebSocket', 8_000);
    const list = await call('getDevicelist', thsq.getDevicelist.bind(thsq));
    expect(Object.keys(list)).toEqual([deviceId]);
    expect(list[deviceId]!.meta.state!.value).toBe('connected');
    const device = await call('getDevice', thsq.getDevice.bind(thsq), deviceId);
    expect(device?.meta.unique!.value).toBe(deviceId);
  });

  it('setVariable, then the acknowledgement pushed over the WebSocket, with no request of the client', async () => {
    // The device goes away first, so that the acknowledgement can only come after the client's own requests.
    let mark = seen.length;
    let pushed = updates.length;
    const dropped = disconnects;
    const stateDir = agent.config.stateDir;
    await agent.stop();
    let restarted = false;
    const restart = async () => {
      restarted = true;
      agent = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir });
    };
    // A failure before the restart below must not leave the next steps without their device.
    onTestFinished(async () => {
      if (!restarted) await restart();
    });
    const state = () => call('getVariable', thsq.getVariable.bind(thsq), deviceId, 'meta', 'state');
    await until(async () => (await state())?.value === 'disconnected', 'meta state disconnected', 8_000);
    expect(since(mark), 'the state came over the WebSocket').toEqual([]);
    expect(updates.slice(pushed).some((u) => u.diff.meta?.state?.value === 'disconnected')).toBe(true);

    expect(await call('setVariable', thsq.setVariable.bind(thsq), deviceId, 'd', 'led', 'on')).toBe('device-ok');
    const set = await call('getVariable', thsq.getVariable.bind(thsq), deviceId, 'd', 'led');
    expect(set).toMatchObject({ value: 'on' });
    expect(set!.time).toBeGreaterThan(0);
    expect(set!.acked ?? 0).toBeLessThan(set!.time!);

    // The device comes back and acknowledges: the record changes in the client's cache by itself.
    mark = seen.length;
    pushed = updates.length;
    await restart();
    const acked = await until(
      async () => {
        const r = await call('getVariable', thsq.getVariable.bind(thsq), deviceId, 'd', 'led');
        return r?.acked !== undefined && r.acked >= r.time! ? r : undefined;
      },
      'the acknowledged led through getVariable',
      8_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; requests since: ${JSON.stringify(since(mark))}`);
    });
    expect(acked).toMatchObject({ value: 'on', time: set!.time });
    expect(since(mark), 'nothing was fetched').toEqual([]);
    const ack = updates.slice(pushed).find((u) => u.unique === deviceId && u.diff.d?.led?.acked !== undefined);
    expect(ack?.diff.d?.led?.acked).toBe(acked.acked);
    expect((await state())?.value).toBe('connected');
    const local = await agent.client();
    try {
      expect((await local.get('d', 'led')).value).toBe('on');
      // A change on the device arrives the same way.
      await local.set('d', 'temp', '21.5');
      const temp = await until(
        async () => (await call('getVariable', thsq.getVariable.bind(thsq), deviceId, 'd', 'temp'))?.value,
        'the device’s temp through getVariable',
        8_000,
      );
      expect(temp).toBe('21.5');
      expect(since(mark)).toEqual([]);
      expect(disconnects, 'the WebSocket stayed open').toBe(dropped);
    } finally {
      local.close();
    }
  });

  it('getVariableHistory pages with `from` past the chunk size, and reads from a `startid`', async () => {
    for (const v of ['1', '2', '3', '4', '5', '6', '7']) {
      expect((await alice.post(`/0/devices/${deviceId}/d/led`, { form: { value: v } })).body).toBe('device-ok');
    }
    const mark = seen.length;
    const all = await call('getVariableHistory', thsq.getVariableHistory.bind(thsq), deviceId, 'd', 'led', {
      num: 7,
      chunksize: 3,
    });
    expect(all?.map((e) => e.value)).toEqual(['7', '6', '5', '4', '3', '2', '1']);
    for (const e of all!) expect(typeof e.value).toBe('string');
    // Three pages: 3, 3 and 1 entries, each after the last id of the one before.
    const pages = seen.slice(mark).filter((s) => s.path === `/0/devices/${deviceId}/d/led`);
    expect(pages).toHaveLength(3);
    expect(pages.every((p) => p.status === 200)).toBe(true);

    // `startid`: the entries from that id on, newest first, as the client's partial history reads them
    // (node_modules/thsq/lib/thsq.js, `fetchpartialhistory`: it asks from the last id it saw plus one).
    const from = all![3]!; // '4'
    const mark2 = seen.length;
    const page = await call('getVariableHistory', thsq.getVariableHistory.bind(thsq), deviceId, 'd', 'led', {
      startid: from.id,
    });
    expect(seen.slice(mark2).map((s) => s.status)).toEqual([200]);
    expect(page?.map((e) => e.value)).toEqual(['7', '6', '5', '4']);
  });

  it('history pushed: after a change arrives, the client reads the new entries from a `startid`', async () => {
    const entries: HistoryEntry[] = [];
    const onHistory = (_d: Device, unique: string, type: string, name: string, entry: HistoryEntry) => {
      if (unique === deviceId && type === 'd' && name === 'led') entries.push(entry);
    };
    thsq.on('device-variable-history', onHistory);
    thsq.setDeviceHistoryFilter((_d, _u, type, name) => type === 'd' && name === 'led');
    try {
      expect((await alice.post(`/0/devices/${deviceId}/d/led`, { form: { value: '8' } })).body).toBe('device-ok');
      await until(() => entries.some((e) => e.value === '8'), 'the history of led, after the pushed 8', 8_000);
      const first = entries.length;
      const mark = seen.length;
      expect((await alice.post(`/0/devices/${deviceId}/d/led`, { form: { value: '9' } })).body).toBe('device-ok');
      await until(() => entries.slice(first).some((e) => e.value === '9'), 'the history entry 9', 8_000);
      // Only the new entry: the client asked from the id after the last one it had.
      expect(entries.slice(first).map((e) => e.value)).toEqual(['9']);
      const asked = seen.slice(mark).find((r) => r.path === `/0/devices/${deviceId}/d/led`);
      expect(asked?.qs?.startid).toBe(entries[first - 1]!.id + 1);
    } finally {
      thsq.setDeviceHistoryFilter(undefined);
      thsq.removeListener('device-variable-history', onHistory);
    }
  });

  it('setVariable with the `timestamp` option: the version carries the stamp', async () => {
    const stamp = Date.now() - 5_000;
    const answer = await new Promise<string | undefined>((resolve) =>
      thsq.setVariable(deviceId, 's', 'label', 'porch', { timestamp: stamp }, resolve),
    );
    expect(answer).toBe('device-ok');
    expect(seen.filter((r) => r.method === 'POST').at(-1)).toMatchObject({ status: 200 });
    const r = JSON.parse((await alice.get(`/0/devices/${deviceId}/s/label`)).body) as VarRecord;
    expect(r).toMatchObject({ value: 'porch', time: stamp });
  });

  it('sendCommand, and the agent runs it', async () => {
    const cmd = await call('sendCommand', thsq.sendCommand.bind(thsq), deviceId, 'ping');
    expect(cmd).toMatch(/^[0-9a-f-]{36}$/);
    const done = await until(async () => {
      const r = await alice.get(`/0/devices/${deviceId}/commands/${cmd}`);
      const c = JSON.parse(r.body) as { state: string; output: string | null };
      return r.status === 200 && c.state === 'done' ? c : undefined;
    }, 'the ping done');
    // The agent took it and answered it (`ping` is a built-in that answers in the transaction that takes it).
    expect(agent.sink.events('cmd.queued').map((e) => e.cmd)).toContain(cmd);
    expect(done.output).toBe('pong');
  });

  it('getFirmwarelist', async () => {
    const list = await call('getFirmwarelist', thsq.getFirmwarelist.bind(thsq));
    expect(Array.isArray(list)).toBe(true);
    expect((list as Array<{ name: string }>).map((f) => f.name)).toEqual(['gateway']);
  });

  it('createAccessToken, then a fresh init logs in with `token`', async () => {
    const token = await call('createAccessToken', thsq.createAccessToken.bind(thsq));
    expect(seen.at(-1)).toMatchObject({ method: 'POST', path: '/0/user/accesstoken' });
    expect(typeof token).toBe('string');
    expect(token!.length).toBeGreaterThan(16);
    accessToken = token!;
    // An anonymous session first, so that only the token can make it Alice's.
    await call('logout', thsq.logout.bind(thsq));
    expect(await call('getUser', thsq.getUser.bind(thsq))).toBeUndefined();
    const devices = await call('init', thsq.init.bind(thsq), { ...options, token: accessToken });
    expect(Object.keys(devices ?? {})).toEqual([deviceId]);
    expect((await call('getUser', thsq.getUser.bind(thsq)))?.login).toBe(ALICE);
    await until(() => thsq.connected === true, 'the WebSocket again', 12_000);
  });

  it('shareDevice with a second user, who then sees it; unshare', async () => {
    const shared = await call('shareDevice', thsq.shareDevice.bind(thsq), deviceId, BOB);
    expect(seen.at(-1)).toMatchObject({ method: 'POST', path: '/0/devices/' });
    expect(seen.at(-1)!.status).toBeLessThan(300);
    expect(shared).toBeDefined();
    const list = JSON.parse((await bob.get('/0/devices/')).body) as Record<string, unknown>;
    expect(Object.keys(list)).toEqual([deviceId]);
    const led = await bob.get(`/0/devices/${deviceId}/d/led`);
    expect(led.status).toBe(200);
    // Unshare: the owner revokes (docs/api.md).
    const revoked = await alice.request('DELETE', `/0/devices/${deviceId}/users/${encodeURIComponent(BOB)}`);
    expect(revoked.status).toBeLessThan(300);
    expect(JSON.parse((await bob.get('/0/devices/')).body)).toEqual({});
  });

  it('deleteAccessToken: the token no longer logs in', async () => {
    // Back to a password session: revoking a token ends the sessions it started (docs/api.md).
    expect(await call('login', thsq.login.bind(thsq), ALICE, PASSWORD)).toBe('login-ok');
    expect(await call('deleteAccessToken', thsq.deleteAccessToken.bind(thsq), accessToken)).toBeDefined();
    expect(seen.at(-1)).toMatchObject({ method: 'DELETE', path: `/0/user/accesstoken/${accessToken}` });
    expect(seen.at(-1)!.status).toBeLessThan(300);
    const stranger = bridge.client();
    await stranger.post('/0/session/', { form: { token: accessToken } });
    expect((await stranger.get('/0/user/')).status).toBe(404);
  });

  it('removeDevice: gone, and the WebSocket says so', async () => {
    expect(await call('removeDevice', thsq.removeDevice.bind(thsq), deviceId)).toBe('device-ok');
    await until(() => removed.includes(deviceId), 'device-removed over the WebSocket', 8_000);
    expect(await call('getDevicelist', thsq.getDevicelist.bind(thsq))).toEqual({});
  });

  it('logout', async () => {
    expect(await call('logout', thsq.logout.bind(thsq))).toBe('user-ok');
    expect(await call('getUser', thsq.getUser.bind(thsq))).toBeUndefined();
    expect((await alice.get('/0/user/')).status).toBe(200);
  });
});
