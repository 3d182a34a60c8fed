/**
 * The evaluation of notification rules through real edges (docs/notifications.md, "Evaluation" and "Limits"): a
 * whole bridge with its embedded broker on real ports, users over HTTP, devices on their own MQTT connections that
 * report variables, firmware states and command outcomes and vanish without a goodbye. The bridge reads a clock the
 * test moves (`for` and the per-rule limit are waited out by moving it, not by sleeping).
 *
 * - A threshold fires once per crossing (hysteresis); `became`, `changed`, `firmware failed`, `command failed`,
 *   `offline`; `for` waits its time out and starts again when the condition breaks.
 * - One user's rules never see another's devices, nor does another user reach them; a share lets a rule see the
 *   device for as long as it lasts.
 * - The per-rule and per-user rate limits.
 * - Two bridges on one PostgreSQL database behind one Mosquitto: one event per crossing, whichever bridge handled
 *   each change.
 * - A change judged by the value committed with it; the retention of the event log.
 *
 * Delivery (live channel, e-mail, webhooks, tests) is in rules-delivery.test.ts.
 */
import { rmSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { LocalBus, withValues } from '../../bridge/events/bus.js';
import { RuleEngine } from '../../bridge/rules/engine.js';
import type { NewUserEvent } from '../../bridge/rules/store.js';
import { createLogger } from '../../lib/log.js';
import { LogSink } from '../support/agent.js';
import {
  type LiveBridge,
  TestClock,
  bridgeDatabase,
  engines,
  startLiveBridge,
  startTestBridge,
} from '../support/bridge.js';
import { startMosquitto } from '../support/brokers.js';
import { LiveSocket } from '../support/live.js';
import { missingPostgres } from '../support/postgres.js';
import {
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
import { missing } from '../support/system.js';
import { until } from '../support/wait.js';

/** Long enough for the bridge to check pending rules a few times (every 100 ms here) and to act on a change. */
const SETTLE_MS = 350;
const settle = () => new Promise((r) => setTimeout(r, SETTLE_MS));

describe.each(await engines())('rules on a live bridge (%s)', (engine) => {
  const clock = new TestClock(Date.now());
  let b: LiveBridge;
  const devices: SimDevice[] = [];
  const sockets: LiveSocket[] = [];

  beforeAll(async () => {
    b = await startLiveBridge({
      engine,
      now: clock.now,
      config: { notifications: { ruleMinIntervalMs: 0, pendingCheckMs: 100 } },
    });
  });
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.ws.terminate();
    for (const d of devices.splice(0)) await d.mqtt.close();
  });
  afterAll(async () => {
    await b?.close();
  });

  const person = (name: string) => signup(b.client(), name);
  const device = async (owner: Person, opts: { will?: boolean } = {}) => {
    const d = await claimedDevice(b.mqttUrl, b.bridge.store, owner, opts);
    devices.push(d);
    return d;
  };

  it('a threshold fires once per crossing: 25, 31, 32, 35, 29, 33 give the events of 31 and 33', async () => {
    const ann = await person('threshold');
    const dev = await device(ann);
    const id = await addRule(ann, {
      name: 'Too hot',
      message: 'The boiler room is over 30',
      trigger: 'D.temp>30',
      deviceid: dev.id,
    });
    expect((await ruleOf(ann, id)).state).toBe('armed');
    await dev.report('temp', '25');
    await dev.report('temp', '31');
    await untilState(ann, id, 'fired');
    const firedAt = clock.now();
    // Still over: nothing more.
    await dev.report('temp', '32');
    await dev.report('temp', '35');
    clock.advance(1000);
    await dev.report('temp', '29');
    await untilState(ann, id, 'armed');
    await dev.report('temp', '33');
    await untilState(ann, id, 'fired');

    const events = await untilEvents(ann, 2);
    expect(events).toHaveLength(2);
    const [newest, oldest] = events as [(typeof events)[0], (typeof events)[0]];
    expect(newest.id).toBeGreaterThan(oldest.id);
    const common = {
      type: 'user-event',
      rule: id,
      name: 'Too hot',
      message: 'The boiler room is over 30',
      deviceid: dev.id,
      trigger: 'd.temp > 30',
      variable: { type: 'd', name: 'temp' },
      test: false,
      email: null,
      webhook: null,
    };
    expect(oldest).toEqual({ ...common, id: oldest.id, value: '31', time: firedAt });
    expect(newest).toEqual({ ...common, id: newest.id, value: '33', time: clock.now() });
    const rule = await ruleOf(ann, id);
    expect(rule).toMatchObject({ state: 'fired', trigger: 'd.temp > 30', lastFired: clock.now() });
    // The log pages as history does.
    expect((await eventsOf(ann, '?latest=1')).map((e) => e.id)).toEqual([newest.id]);
    expect((await eventsOf(ann, `?from=${newest.id}`)).map((e) => e.id)).toEqual([oldest.id]);
    expect(b.sink.events('rules.fired').filter((e) => e.ruleId === id)).toHaveLength(2);
  });

  it('became, changed, firmware failed, command failed and offline fire on what the device reports', async () => {
    const bob = await person('kinds');
    const dev = await device(bob, { will: true });
    const rule = (name: string, trigger: string) => addRule(bob, { name, trigger, deviceid: dev.id });
    const became = await rule('Door open', 'd.door became "open"');
    const changed = await rule('Mode', 'd.mode changed');
    const firmware = await rule('Update failed', 'firmware failed');
    const command = await rule('Command failed', 'command failed');
    const offline = await rule('Gone', 'offline');
    const of = async (rule: number) => (await eventsOf(bob)).filter((e) => e.rule === rule);

    // became: a level, on "open"; a repeat of "open" is no new crossing.
    await dev.report('door', 'closed');
    await dev.report('door', 'open');
    await untilState(bob, became, 'fired');
    await dev.report('door', 'open');
    await dev.report('door', 'closed');
    await untilState(bob, became, 'armed');
    await dev.report('door', 'open');
    await untilState(bob, became, 'fired');
    expect((await untilEvents(bob, 2, became)).map((e) => e.value)).toEqual(['open', 'open']);

    // changed: every new value, not a new version of the same value.
    await dev.report('mode', 'eco');
    await untilEvents(bob, 1, changed);
    await dev.report('mode', 'eco');
    await dev.report('mode', 'boost');
    await until(async () => (await of(changed)).some((e) => e.value === 'boost'), 'the change to boost');
    expect((await of(changed)).map((e) => e.value)).toEqual(['boost', 'eco']);

    // firmware failed: the gateway reports its update's state in meta `fwstate`.
    await dev.meta({ fwstate: 'downloading' });
    await dev.meta({ fwstate: 'failed', fwerror: 'image did not verify' });
    const [fw] = await untilEvents(bob, 1, firmware);
    expect(fw).toMatchObject({
      variable: { type: 'meta', name: 'fwstate' },
      value: 'failed',
      trigger: 'firmware failed',
    });

    // command failed: a command sent through the API, which the device reports failed.
    const sent = await bob.http.post(`/0/devices/${dev.id}`, { form: { command: 'reboot now' } });
    expect(sent.status).toBe(200);
    const cmd = sent.body;
    await until(() => dev.commands.some((c) => c.cmd === cmd), 'the command on the device');
    await dev.commandFailed(cmd, 'exited with status 1');
    const [failed] = await untilEvents(bob, 1, command);
    expect(failed).toMatchObject({ variable: null, value: cmd, trigger: 'command failed' });

    // offline: the connection ends without a DISCONNECT; the broker publishes the device's will.
    dev.vanish();
    const [gone] = await untilEvents(bob, 1, offline);
    expect(gone).toMatchObject({ variable: { type: 'meta', name: 'state' }, value: 'disconnected' });
    expect(await ruleOf(bob, offline)).toMatchObject({ state: 'fired' });

    // Nothing else fired: two crossings of the door, two new modes, one of each of the others.
    const all = await eventsOf(bob);
    expect(all).toHaveLength(7);
    expect(all.every((e) => e.deviceid === dev.id && !e.test)).toBe(true);
  });

  it('for: pending while the time runs, fires once when it ran out; a break in between starts it again', async () => {
    const cid = await person('for');
    const dev = await device(cid);
    const id = await addRule(cid, { name: 'Hot for a while', trigger: 'd.temp > 30 for 2s', deviceid: dev.id });
    expect((await ruleOf(cid, id)).trigger).toBe('d.temp > 30 for 2s');
    await dev.report('temp', '31');
    await untilState(cid, id, 'pending');
    // The bridge checks pending rules every 100 ms; its clock has not moved: nothing fires.
    await settle();
    expect(await ruleOf(cid, id)).toMatchObject({ state: 'pending' });
    clock.advance(1500);
    // A value below the threshold ends the wait; the next crossing starts a new one.
    await dev.report('temp', '29');
    await untilState(cid, id, 'armed');
    await dev.report('temp', '31');
    await untilState(cid, id, 'pending');
    const since = clock.now();
    clock.advance(1500);
    // 3 s since the first crossing, 1.5 s since the second.
    await settle();
    expect(await eventsOf(cid)).toEqual([]);
    expect(await ruleOf(cid, id)).toMatchObject({ state: 'pending' });
    clock.advance(600);
    const [event] = await untilEvents(cid, 1);
    expect(event).toMatchObject({ rule: id, value: '31', time: clock.now() });
    expect(clock.now() - since).toBeGreaterThanOrEqual(2000);
    expect(await ruleOf(cid, id)).toMatchObject({ state: 'fired', lastFired: clock.now() });
    // Once: the next checks find nothing due.
    clock.advance(5000);
    await settle();
    expect(await eventsOf(cid)).toHaveLength(1);
  });

  it("one user's rules never see another's devices; a share lets them, until it is taken back", async () => {
    const alice = await person('alice');
    const eve = await person('eve');
    const devA = await device(alice);
    const devE = await device(eve);
    const ruleOn = (p: Person, deviceid: string) =>
      p.http.post('/0/user/event/', { form: { name: 'Hot', trigger: 'd.temp > 30', deviceid } });

    // Eve cannot watch Alice's device, nor a device nobody has.
    expect(await ruleOn(eve, devA.id)).toMatchObject({ status: 400, body: 'event-fail-device' });
    expect(await ruleOn(eve, '00000000-0000-4000-8000-000000000000')).toMatchObject({
      status: 400,
      body: 'event-fail-device',
    });
    const aliceRule = await addRule(alice, { name: 'Hot', trigger: 'd.temp > 30', deviceid: devA.id });
    const eveRule = await addRule(eve, { name: 'Mine', trigger: 'd.temp > 30', deviceid: devE.id });

    // Nor reach Alice's rule: it answers as no rule at all.
    expect(await eve.http.get(`/0/user/event/${aliceRule}`)).toMatchObject({ status: 404, body: 'event-fail' });
    expect(await eve.http.post(`/0/user/event/${aliceRule}`, { form: { name: 'Mine now' } })).toMatchObject({
      status: 400,
      body: 'event-fail',
    });
    expect(
      await eve.http.post(`/0/user/event/${aliceRule}`, { form: { app: b.bridge.defaultFrontend.id } }),
    ).toMatchObject({
      status: 400,
      body: 'event-fail',
    });
    expect(await eve.http.request('DELETE', `/0/user/event/${aliceRule}`)).toMatchObject({
      status: 400,
      body: 'event-fail',
    });
    expect(await ruleOf(alice, aliceRule)).toMatchObject({ name: 'Hot', state: 'armed' });
    expect((await eve.http.get('/0/user/event/')).body).toBe(JSON.stringify([await ruleOf(eve, eveRule)]));

    // Alice's device crosses: Alice's log has it, Eve's log and live channel do not.
    const eveLive = await LiveSocket.open(b.url, { cookie: eve.cookie, throttletime: 0 });
    sockets.push(eveLive);
    await eveLive.next((m) => m.devices, "Eve's snapshot");
    await devA.report('temp', '31');
    await untilEvents(alice, 1);
    // Eve's own event comes after it on the bus: once she has that, she would have had Alice's.
    await devE.report('temp', '40');
    const [mine] = await untilEvents(eve, 1);
    await eveLive.next((m) => (frameEvents([m]).length > 0 ? true : undefined), "Eve's event on her channel");
    expect(frameEvents(eveLive.messages).map((e) => e.id)).toEqual([mine!.id]);
    expect((await eventsOf(eve)).map((e) => e.rule)).toEqual([eveRule]);

    // Shared with Eve, the device fires her rule.
    expect(await alice.http.post('/0/devices/', { form: { auth: devA.id, user: eve.login } })).toMatchObject({
      status: 200,
      body: 'share-ok',
    });
    const shared = await addRule(eve, { name: 'Shared hot', trigger: 'd.temp > 30', deviceid: devA.id });
    await devA.report('temp', '20');
    await devA.report('temp', '32');
    const [viaShare] = await untilEvents(eve, 1, shared);
    expect(viaShare).toMatchObject({ deviceid: devA.id, value: '32' });
    await untilEvents(alice, 2, aliceRule);

    // Taken back: the rule stays, and the device no longer fires it.
    expect(await alice.http.request('DELETE', `/0/devices/${devA.id}/users/${eve.login}`)).toMatchObject({
      status: 200,
      body: 'share-ok',
    });
    await devA.report('temp', '20');
    await untilState(alice, aliceRule, 'armed');
    await devA.report('temp', '33');
    // Alice's rule fired at this crossing: the change was evaluated, Eve's rule with it.
    expect((await untilEvents(alice, 3, aliceRule))[0]!.value).toBe('33');
    expect((await eventsOf(eve)).filter((e) => e.rule === shared)).toHaveLength(1);
    expect((await ruleOf(eve, shared)).deviceid).toBe(devA.id);
    expect(frameEvents(eveLive.messages).every((e) => e.deviceid === devE.id || e.rule === shared)).toBe(true);
  });
});

describe.each(await engines())('the rate limits of rules (%s)', (engine) => {
  const clock = new TestClock(Date.now());
  let b: LiveBridge;
  const devices: SimDevice[] = [];

  beforeAll(async () => {
    b = await startLiveBridge({
      engine,
      now: clock.now,
      config: {
        notifications: { ruleMinIntervalMs: 60_000, userEventsLimit: 2, webhook: { allowHttp: true } },
      },
    });
  });
  afterEach(async () => {
    for (const d of devices.splice(0)) await d.mqtt.close();
  });
  afterAll(async () => {
    await b?.close();
  });

  const device = async (owner: Person) => {
    const d = await claimedDevice(b.mqttUrl, b.bridge.store, owner);
    devices.push(d);
    return d;
  };
  const suppressed = (ruleId: number, limit: string) =>
    until(
      () => b.sink.events('rules.suppressed').find((e) => e.ruleId === ruleId && e.limit === limit),
      `rule ${ruleId} held back by the ${limit} limit`,
    );

  it('per rule: a second crossing within ruleMinIntervalMs gives no event; one after it does', async () => {
    const dan = await signup(b.client(), 'per-rule');
    const dev = await device(dan);
    const id = await addRule(dan, { name: 'Hot', trigger: 'd.temp > 30', deviceid: dev.id });
    await dev.report('temp', '31');
    await untilEvents(dan, 1);
    await dev.report('temp', '29');
    await untilState(dan, id, 'armed');
    clock.advance(30_000);
    await dev.report('temp', '32');
    await suppressed(id, 'rule');
    // Held back, the rule still moved: it waits for the next crossing.
    expect(await ruleOf(dan, id)).toMatchObject({ state: 'fired', lastFired: clock.now() - 30_000 });
    expect(await eventsOf(dan)).toHaveLength(1);
    clock.advance(31_000);
    await dev.report('temp', '28');
    await untilState(dan, id, 'armed');
    await dev.report('temp', '33');
    const events = await untilEvents(dan, 2);
    expect(events.map((e) => e.value)).toEqual(['33', '31']);
    expect(b.sink.events('rules.suppressed').filter((e) => e.ruleId === id)).toHaveLength(1);
  });

  it('per user: past userEventsLimit no rule of the user fires, and a test answers 429', async () => {
    const fay = await signup(b.client(), 'per-user');
    const dev = await device(fay);
    const temp = await addRule(fay, { name: 'Hot', trigger: 'd.temp > 30', deviceid: dev.id });
    const hum = await addRule(fay, { name: 'Damp', trigger: 'd.hum > 50', deviceid: dev.id });
    const co2 = await addRule(fay, { name: 'Stuffy', trigger: 'd.co2 >= 1000', deviceid: dev.id });
    await dev.report('temp', '31');
    await untilEvents(fay, 1);
    await dev.report('hum', '60');
    await untilEvents(fay, 2);
    await dev.report('co2', '1200');
    await suppressed(co2, 'user');
    expect(await ruleOf(fay, co2)).toMatchObject({ state: 'fired', lastFired: null });
    const test = await fay.http.post(`/0/user/event/${temp}`, { form: { app: b.bridge.defaultFrontend.id } });
    expect({ status: test.status, body: test.body }).toEqual({ status: 429, body: 'too-many-requests' });
    expect((await eventsOf(fay)).map((e) => e.rule)).toEqual([hum, temp]);
    // Another user is not held back by Fay's count.
    const gus = await signup(b.client(), 'other-user');
    const other = await device(gus);
    const gusRule = await addRule(gus, { name: 'Hot', trigger: 'd.temp > 30', deviceid: other.id });
    await other.report('temp', '31');
    expect((await untilEvents(gus, 1))[0]!.rule).toBe(gusRule);
  });

  it('a plain http:// webhook is taken where notifications.webhook.allowHttp is set', async () => {
    const hal = await signup(b.client(), 'allow-http');
    const dev = await device(hal);
    const id = await addRule(hal, {
      name: 'Hook',
      trigger: 'd.temp > 30',
      deviceid: dev.id,
      webhook: 'http://127.0.0.1:9/hook',
    });
    expect(await ruleOf(hal, id)).toMatchObject({ webhook: 'http://127.0.0.1:9/hook' });
  });
});

describe.skipIf(missing('mosquitto') || (await missingPostgres()))(
  'rules on two bridges on one PostgreSQL database',
  () => {
    const cleanups: Array<() => unknown> = [];
    afterAll(async () => {
      for (const c of cleanups.splice(0).reverse()) await c();
    });

    it('one event per crossing, whichever bridge handled each change', async () => {
      const broker = await startMosquitto();
      cleanups.push(() => broker.close());
      const database = await bridgeDatabase();
      cleanups.push(() => database.drop());
      const bridges: LiveBridge[] = [];
      for (let i = 0; i < 2; i++) {
        const live = await startLiveBridge({
          engine: 'postgres',
          database,
          config: {
            mqtt: { url: broker.url, shareGroup: 'bridges', clientId: `rules-bridge-${i}`, sessionExpirySec: 2 },
            notifications: { ruleMinIntervalMs: 0 },
          },
        });
        cleanups.push(async () => {
          await live.close(false);
          rmSync(live.dataDir, { recursive: true, force: true });
        });
        bridges.push(live);
      }
      const [one, two] = bridges as [LiveBridge, LiveBridge];
      // One session, its requests sent to either bridge.
      const ivy = await signup(one.client(), 'two-bridges');
      const onTwo = two.client();
      onTwo.jar.set('sid', ivy.http.sid!);
      const dev = await claimedDevice(broker.url, one.bridge.store, ivy);
      cleanups.push(() => dev.mqtt.close());
      const id = await addRule({ ...ivy, http: onTwo }, { name: 'Hot', trigger: 'd.temp > 30', deviceid: dev.id });

      const crossings = 6;
      for (let k = 1; k <= crossings; k++) {
        await dev.report('temp', '20');
        await untilState(ivy, id, 'armed');
        // Three changes over the threshold at once: from the device (to whichever bridge the broker hands it),
        // and from the user on each bridge.
        await Promise.all([
          dev.send('temp', String(40 + k)),
          ivy.http.post(`/0/devices/${dev.id}/d/temp`, { form: { value: String(50 + k) } }),
          onTwo.post(`/0/devices/${dev.id}/d/temp`, { form: { value: String(60 + k) } }),
        ]);
        await untilState(ivy, id, 'fired');
        await untilEvents(ivy, k);
      }
      await settle();
      expect(await eventsOf(ivy)).toHaveLength(crossings);
      const firedOf = (rule: number) =>
        bridges.map((live) => live.sink.events('rules.fired').filter((e) => e.ruleId === rule).length);
      expect(firedOf(id).reduce((x, y) => x + y)).toBe(crossings);

      // The device's changes alone, each handled by one bridge (the broker shares them out): every crossing, and
      // every new value of a `changed` rule, fires once, whichever bridge moved the rule before.
      const mode = await addRule(ivy, { name: 'Mode', trigger: 'd.mode changed', deviceid: dev.id });
      for (let k = 1; k <= crossings; k++) {
        await dev.report('temp', '20');
        await untilState(ivy, id, 'armed');
        await dev.report('temp', String(30 + k));
        await untilState(ivy, id, 'fired');
        await untilEvents(ivy, crossings + k, id);
        await dev.report('mode', `mode-${k}`);
        await untilEvents(ivy, k, mode);
      }
      await settle();
      const events = await eventsOf(ivy);
      expect(events.filter((e) => e.rule === id)).toHaveLength(2 * crossings);
      expect(events.filter((e) => e.rule === mode).map((e) => e.value)).toEqual(
        Array.from({ length: crossings }, (_, i) => `mode-${crossings - i}`),
      );
      // Both bridges fired some of them: the changes were handled on both.
      const fired = [firedOf(id), firedOf(mode)];
      expect(fired.flat().reduce((x, y) => x + y)).toBe(3 * crossings);
      expect(fired[0]![0]! + fired[1]![0]!).toBeGreaterThan(0);
      expect(fired[0]![1]! + fired[1]![1]!).toBeGreaterThan(0);
    });
  },
);

describe.each(await engines())(
  'the engine against its store: committed values, and the retention of the event log (%s)',
  (engine) => {
    it('judges a change by the value committed with it, and by the store when none came with it', async () => {
      const clock = new TestClock(Date.UTC(2031, 5, 1));
      const t = await startTestBridge({ engine, clock, config: { notifications: { ruleMinIntervalMs: 0 } } });
      const sink = new LogSink();
      const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
      const bus = new LocalBus(log);
      const rules = new RuleEngine({
        config: t.config,
        store: t.store,
        events: bus,
        mailer: t.mailer,
        log,
        now: clock.now,
      });
      try {
        const user = await signup(t.client(), 'values');
        const userId = (await t.store.userByLogin(t.defaultFrontend.id, user.login))!.id;
        const deviceId = '00000000-0000-4000-8000-0000000000aa';
        const temp = (value: string) => ({
          type: 'd' as const,
          name: 'temp',
          value: Buffer.from(value),
          time: clock.now(),
          origin: 'device' as const,
        });
        const ruleId = await t.store.write(async (tx) => {
          await tx.devices.touch(deviceId, clock.now());
          await tx.devices.claim(deviceId, userId, clock.now());
          await tx.devices.putVersion(deviceId, temp('25'), clock.now(), 'device');
          const r = await tx.rules.create({
            userId,
            deviceId,
            name: 'Hot',
            message: '',
            trigger: 'd.temp > 30',
            forMs: 0,
            email: false,
            webhookUrl: null,
            webhookSecret: null,
            createdAt: clock.now(),
            lastValue: null,
          });
          return r.id;
        });
        rules.start();
        const change = () => ({
          type: 'device.vars' as const,
          deviceId,
          vars: [{ type: 'd' as const, name: 'temp', change: 'version' as const }],
        });
        const logged = async (n: number) => {
          await until(async () => (await t.store.rules.events(userId, 10)).length === n, `${n} events`);
          return t.store.rules.events(userId, 10);
        };
        // The store holds 25; the change says it committed 31 (a later change may have been stored since): it fires.
        bus.publish(withValues(change(), new Map([['d:temp', Buffer.from('31')]])));
        expect((await logged(1)).map((e) => e.value?.toString())).toEqual(['31']);
        // No value with it: judged by the store's 25, the condition ended.
        bus.publish(change());
        await until(async () => !(await t.store.rules.byId(ruleId))!.active, 'the rule armed again');
        bus.publish(withValues(change(), new Map([['d:temp', Buffer.from('35')]])));
        expect((await logged(2)).map((e) => e.value?.toString())).toEqual(['35', '31']);
        // A change from another bridge is its own to evaluate.
        expect(sink.events('rules.fired')).toHaveLength(2);
      } finally {
        await rules.stop();
        await t.close();
      }
    });

    it("removes the events older than eventRetentionDays, and only those, with the engine's pruning", async () => {
      const clock = new TestClock(Date.UTC(2031, 5, 1));
      const t = await startTestBridge({ engine, clock, config: { notifications: { eventRetentionDays: 7 } } });
      try {
        const user = await signup(t.client(), 'retention');
        const userId = (await t.store.userByLogin(t.defaultFrontend.id, user.login))!.id;
        const day = 86_400_000;
        const event = (ageDays: number): NewUserEvent => ({
          userId,
          ruleId: 1,
          deviceId: '00000000-0000-4000-8000-000000000001',
          name: `${ageDays} days old`,
          message: '',
          trigger: 'd.temp > 30',
          varType: 'd',
          varName: 'temp',
          value: Buffer.from('31'),
          test: false,
          at: clock.now() - ageDays * day,
          emailState: null,
          webhookUrl: null,
        });
        // Written oldest first, as they would have fired.
        for (const age of [30, 8, 7.5, 6.9, 1, 0]) await t.store.write((tx) => tx.rules.addEvent(event(age)));
        const sink = new LogSink();
        const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
        const rules = new RuleEngine({
          config: t.config,
          store: t.store,
          events: new LocalBus(log),
          mailer: t.mailer,
          log,
          now: clock.now,
        });
        expect(await rules.prune()).toBe(3);
        expect(sink.events('rules.events_pruned')).toEqual([expect.objectContaining({ count: 3 })]);
        const left = await t.store.rules.events(userId, 100);
        expect(left.map((e) => e.name)).toEqual(['0 days old', '1 days old', '6.9 days old']);
        // Through the route too.
        expect((await eventsOf(user)).map((e) => e.name)).toEqual(['0 days old', '1 days old', '6.9 days old']);
        // A day later the next one is past the limit.
        clock.advance(day);
        expect(await rules.prune()).toBe(1);
        expect(await rules.prune()).toBe(0);
      } finally {
        await t.close();
      }
    });
  },
);
