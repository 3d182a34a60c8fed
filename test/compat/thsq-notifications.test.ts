/**
 * The official client's notification calls (npm `thsq` 1.2.15, unmodified; test/support/thsq.ts) end to end against
 * a real bridge (HTTP on a free port, its embedded broker) and a real agent connected to it (issue 17,
 * docs/notifications.md): a rule made with `addNotification`, listed, read, changed, fired as a test and then by a
 * change on the device itself, each event both on the client's live channel (`user-event`) and in `getEvents`, and
 * removed. The client sends `app` (its frontend) in every request, and the rule's `deviceid` from its own cache of
 * the claimed device.
 */
import { createSocket } from 'node:dgram';
import { beforeAll, describe, expect, it } from 'vitest';
import { type TestAgent, startAgent } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import {
  type FailedAnswer,
  type Rule,
  type Seen,
  type UserEvent,
  call,
  recordingRequest,
  thsq,
} from '../support/thsq.js';
import { until } from '../support/wait.js';

const PASSWORD = 'correct horse battery';
const LOGIN = 'carol@example.com';

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

describe('the official client’s notifications (thsq 1.2.15) against a real bridge and agent', () => {
  let bridge: LiveBridge;
  let agent: TestAgent;
  let frontend: string;
  let deviceId: string;
  const seen: Seen[] = [];
  /** Every `user-event` the client's live channel emitted. */
  const userEvents: UserEvent[] = [];
  const onUserEvent = (e: UserEvent) => userEvents.push(e);
  let ruleId: string;
  let testEventId: number;

  const lastRequest = (method: string, path: string) =>
    seen.filter((s) => s.method === method && s.path === path).at(-1);
  const rule = async (id: string) => (await call('getNotification', thsq.getNotification.bind(thsq), id)) as Rule;

  beforeAll(async () => {
    bridge = await startLiveBridge();
    agent = await startAgent({ mqttUrl: bridge.mqttUrl });
    deviceId = agent.agent.identity.deviceId;
    frontend = (await bridge.bridge.store.defaultFrontend())!.id;
    // A listener for the whole run: with none, the client ends itself once its queues are empty.
    thsq.on('user-event', onUserEvent);
    return async () => {
      thsq.destroy();
      await agent.stop();
      await bridge.close();
    };
  });

  it('signs up, logs in, opens its live channel and claims the agent’s device', async () => {
    const options = { server: bridge.url, frontend, throttletime: 50, request: recordingRequest(seen) };
    expect(await call('init', thsq.init.bind(thsq), options)).toEqual({});
    expect(await call('userSignup', thsq.userSignup.bind(thsq), LOGIN, PASSWORD)).toBe('signup-ok');
    expect(await call('login', thsq.login.bind(thsq), LOGIN, PASSWORD)).toBe('login-ok');
    await until(() => thsq.connected === true, 'the client connected its WebSocket', 12_000);
    // The claim needs the device to have heard the user nearby (decision 18).
    const user = await call('getUser', thsq.getUser.bind(thsq));
    await udpSend(agent.agent.nearby.port!, `${user!.authcode}\n`);
    await until(async () => {
      const devices = await call('getNetworkDevices', thsq.getNetworkDevices.bind(thsq));
      return devices?.[agent.agent.identity.authcode];
    }, 'the device in the nearby view');
    expect(await call('claimDevice', thsq.claimDevice.bind(thsq), deviceId)).toBe(deviceId);
    expect(await call('getNotifications', thsq.getNotifications.bind(thsq))).toEqual([]);
  });

  it('addNotification answers the new rule’s id; a bad trigger answers 400 with its position', async () => {
    const bad = (await call(
      'addNotification',
      thsq.addNotification.bind(thsq),
      deviceId,
      'Too hot',
      '',
      'd.temp => 30',
    )) as FailedAnswer;
    expect(bad.statusCode).toBe(400);
    expect(JSON.parse(bad.body)).toMatchObject({ error: 'event-fail-trigger', position: 7, line: 1, column: 8 });

    const made = await call(
      'addNotification',
      thsq.addNotification.bind(thsq),
      deviceId,
      'Warm',
      'The boiler room is warm',
      'd.temp > 40',
    );
    expect(made).toMatch(/^[1-9]\d*$/);
    ruleId = made as string;
    // The form the client sent: the rule's fields, its frontend as `app`, the device id from its cache.
    expect(lastRequest('POST', '/0/user/event/')).toMatchObject({
      status: 201,
      form: {
        name: 'Warm',
        message: 'The boiler room is warm',
        trigger: 'd.temp > 40',
        deviceid: deviceId,
        app: frontend,
      },
    });
  });

  it('getNotifications lists it; getNotification shows it armed', async () => {
    const list = await call('getNotifications', thsq.getNotifications.bind(thsq));
    expect(list?.map((r) => r.id)).toEqual([Number(ruleId)]);
    expect(await rule(ruleId)).toMatchObject({
      id: Number(ruleId),
      name: 'Warm',
      message: 'The boiler room is warm',
      trigger: 'd.temp > 40',
      deviceid: deviceId,
      email: false,
      webhook: null,
      state: 'armed',
      lastFired: null,
    });
    expect(lastRequest('GET', `/0/user/event/${ruleId}`)?.qs).toMatchObject({ app: frontend });
  });

  it('updateNotification changes the name, message and trigger (stored in its canonical text)', async () => {
    const answer = await call(
      'updateNotification',
      thsq.updateNotification.bind(thsq),
      ruleId,
      deviceId,
      'Too hot',
      'The boiler room is over 30 °C',
      'D.temp>30',
    );
    expect(answer).toBe('event-ok');
    expect(await rule(ruleId)).toMatchObject({
      name: 'Too hot',
      message: 'The boiler room is over 30 °C',
      trigger: 'd.temp > 30',
      deviceid: deviceId,
      state: 'armed',
    });
  });

  it('testNotification fires it once as a test: on the live channel as `user-event`, and in getEvents', async () => {
    const from = userEvents.length;
    const answer = await call('testNotification', thsq.testNotification.bind(thsq), ruleId);
    expect(answer).toMatch(/^[1-9]\d*$/);
    testEventId = Number(answer);
    // The request had no rule field, only the client's `app`: a test, not an update.
    expect(lastRequest('POST', `/0/user/event/${ruleId}`)).toMatchObject({ status: 201, form: { app: frontend } });
    const pushed = await until(
      () => userEvents.slice(from).find((e) => e.id === testEventId),
      'the test event on the live channel',
      8_000,
    );
    expect(pushed).toMatchObject({
      type: 'user-event',
      rule: Number(ruleId),
      name: 'Too hot',
      deviceid: deviceId,
      trigger: 'd.temp > 30',
      variable: { type: 'd', name: 'temp' },
      value: null,
      test: true,
    });
    const events = await call('getEvents', thsq.getEvents.bind(thsq), 10);
    expect(events).toEqual([pushed]);
    expect(lastRequest('GET', '/0/user/events/')?.qs).toMatchObject({ latest: 10, app: frontend });
    // A test moves no state.
    expect((await rule(ruleId)).state).toBe('armed');
  });

  it('a change on the device that makes the trigger hold fires it: on the live channel, and in getEvents', async () => {
    const from = userEvents.length;
    const local = await agent.client();
    try {
      // Below the threshold first, through to the client: no event (one would be the first found below).
      await local.set('d', 'temp', '21.5');
      const temp = () => call('getVariable', thsq.getVariable.bind(thsq), deviceId, 'd', 'temp');
      await until(async () => (await temp())?.value === '21.5', 'the device’s 21.5 through getVariable', 8_000);
      await local.set('d', 'temp', '31.5');
    } finally {
      local.close();
    }
    const pushed = await until(
      () => userEvents.slice(from).find((e) => e.rule === Number(ruleId) && !e.test),
      'the fired event on the live channel',
      10_000,
    );
    expect(pushed).toMatchObject({
      type: 'user-event',
      name: 'Too hot',
      message: 'The boiler room is over 30 °C',
      deviceid: deviceId,
      variable: { type: 'd', name: 'temp' },
      value: '31.5',
      test: false,
    });
    expect(pushed.id).toBeGreaterThan(testEventId);
    expect(userEvents.slice(from).filter((e) => !e.test)).toHaveLength(1);
    const events = await call('getEvents', thsq.getEvents.bind(thsq), 10);
    expect(events?.map((e) => e.id)).toEqual([pushed.id, testEventId]);
    expect(events?.[0]).toEqual(pushed);
    const fired = await rule(ruleId);
    expect(fired.state).toBe('fired');
    expect(fired.lastFired).toBe(pushed.time);
  });

  it('removeNotification: the rule is gone, its events stay', async () => {
    expect(await call('removeNotification', thsq.removeNotification.bind(thsq), ruleId)).toBe('event-ok');
    expect(lastRequest('DELETE', `/0/user/event/${ruleId}`)).toMatchObject({ status: 200, form: { app: frontend } });
    expect(await call('getNotifications', thsq.getNotifications.bind(thsq))).toEqual([]);
    const gone = (await call('getNotification', thsq.getNotification.bind(thsq), ruleId)) as FailedAnswer;
    expect(gone.statusCode).toBe(404);
    const events = await call('getEvents', thsq.getEvents.bind(thsq), 10);
    expect(events?.map((e) => e.rule)).toEqual([Number(ruleId), Number(ruleId)]);
    // The session ends here, so that the client's cookie jar (global to the module) holds no login of this file.
    expect(await call('logout', thsq.logout.bind(thsq))).toBe('user-ok');
  });
});
