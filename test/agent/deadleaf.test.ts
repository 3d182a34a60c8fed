/**
 * Decision 21, `deadleaf` mode: the agent wakes every `d` variable `deadleaf` seconds, syncs, and sleeps; while
 * asleep its retained `state` is `sleeping`. Timers are fake (the wake period, the settle check), and the agent's
 * monotonic clock (by which it judges a wake's time budget) and the fake cloud's clock move on with them; `Date`,
 * `setImmediate` and all I/O are real, so the broker, the socket and SQLite behave as in production.
 */
import mqtt, { type MqttClient } from 'mqtt';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { monotonicMs } from '../../agent/clock.js';
import type { LocalClient } from '../../agent/local/client.js';
import { type VarItem, decode, parseTopic } from '../../protocol/index.js';
import { type TestAgent, startAgent } from '../support/agent.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { missing } from '../support/system.js';

/** Captured before timers are faked: waiting on the real clock. */
const realSetTimeout = globalThis.setTimeout;
/** A device nobody listens for: the cloud's keepalive ticks go there. */
const NOBODY = '00000000-0000-4000-8000-000000000000';

describe.skipIf(missing('mosquitto'))('deadleaf mode', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let observer: MqttClient;
  let agent: TestAgent;
  let client: LocalClient;
  let id: string;
  /** Every `sync` item the agent sent, as the broker delivered it. */
  const syncsSeen: VarItem[] = [];
  /** The fake clock when the timers were faked, and how far it has moved since. */
  let fakeStart = 0;
  let moved = 0;
  const fakeNow = () => {
    const t = vi.getMockedSystemTime();
    if (t) moved = t.getTime() - fakeStart;
    return fakeStart + moved;
  };
  /** Roughly when the agent last decided to sleep, on the fake clock (at most a step after). */
  let sleptAt = 0;

  /** Polls a condition on the real clock. */
  async function waitFor(check: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!check()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => realSetTimeout(r, 10));
    }
  }

  /**
   * One real round trip through the broker. It lets the I/O of what the fake timers just fired happen, and the
   * cloud's acknowledged publish resets the cloud client's keepalive, which runs on the fake clock too.
   */
  const roundTrip = () =>
    brokerUp ? cloud.publishRaw(NOBODY, 'down/cmd', 'tick') : new Promise((r) => realSetTimeout(r, 5));
  /** False while a test has the broker down: then a step only yields to real I/O. */
  let brokerUp = true;

  /** Moves the fake clock forward by `ms`, a step at a time, with real I/O between steps. */
  async function advance(ms: number, step = 5000): Promise<void> {
    for (let done = 0; done < ms; done += step) {
      await vi.advanceTimersByTimeAsync(Math.min(step, ms - done));
      await roundTrip();
    }
  }

  /**
   * Moves the fake clock in steps of `step` ms until `check` holds. Before each step it gives real I/O up to
   * `patienceMs` to make the condition true, so that the fake clock does not run ahead of the network.
   */
  async function advanceUntil(
    check: () => boolean | Promise<boolean>,
    what: string,
    { step = 50, patienceMs = 0, maxMs = 10_000 } = {},
  ): Promise<void> {
    const deadline = Date.now() + 20_000;
    for (let done = 0; ; done += step) {
      const patient = Date.now() + patienceMs;
      for (;;) {
        if (await check()) return;
        if (Date.now() >= patient) break;
        await new Promise((r) => realSetTimeout(r, 5));
      }
      if (done > maxMs || Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await vi.advanceTimersByTimeAsync(step);
      await roundTrip();
    }
  }

  const state = async () => (await client.status<{ state: string }>()).state;
  const hellos = () => cloud.device(id).hellos.length;
  const local = () => new Map(agent.agent.vars.list('d').map((r) => [r.name, r]));

  /**
   * Lets the settle check run until the agent decides to sleep, then lets the sleep complete with the clock
   * (nearly) still: the uplink has gone down (the wake timer is armed right after), and the state is
   * `sleeping` locally and in the cloud. The period runs from there.
   */
  async function untilAsleep(): Promise<void> {
    const sleeps = agent.sink.events('mode.sleep').length;
    let down = false;
    agent.agent.uplink.once('down', () => (down = true));
    await advanceUntil(() => agent.sink.events('mode.sleep').length > sleeps, 'the decision to sleep');
    sleptAt = fakeNow();
    await advanceUntil(
      async () => down && (await state()) === 'sleeping' && cloud.device(id).state === 'sleeping',
      'the agent asleep',
      { step: 10, patienceMs: 200 },
    );
  }

  beforeEach(async () => {
    syncsSeen.length = 0;
    brokerUp = true;
    broker = await startBroker('mosquitto');
    cloud = await FakeCloud.start(broker.url);
    // No keepalive: this client only watches, and must not depend on the fake clock.
    observer = await mqtt.connectAsync(broker.url, { keepalive: 0, clean: true, reconnectPeriod: 0 });
    observer.on('message', (topic, payload) => {
      const parsed = parseTopic(topic);
      if (parsed?.name !== 'up/vars') return;
      const msg = decode('up/vars', payload);
      if (msg.ok) syncsSeen.push(...msg.value.items.filter((i) => i.kind === 'sync'));
    });
    await observer.subscribeAsync('dc/v1/+/up/vars', { qos: 1 });
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval'] });
    fakeStart = vi.getMockedSystemTime()!.getTime();
    moved = 0;
    // From here the cloud's clock is the real one plus what the fake clock has moved, as is the agent's.
    cloud.now = () => Date.now() + (fakeNow() - fakeStart);
  });

  const wakes = () => agent.sink.events('mode.wake').length;

  /**
   * The agent asleep since `sleptAt` for `periodMs`: moves the clock on to a second before the period ends, where
   * it must still be asleep, then on until the wake timer fires. The wake's work is then real I/O.
   */
  async function untilWake(periodMs: number): Promise<void> {
    const before = wakes();
    await advance(sleptAt + periodMs - 1000 - fakeNow());
    expect(wakes(), 'woke before the period ended').toBe(before);
    expect(await state()).toBe('sleeping');
    await advanceUntil(() => wakes() > before, 'the wake', { maxMs: 3000 });
  }

  /** Starts the agent (in master mode) under fake timers and waits until the cloud has its hello. */
  async function boot(flags: Record<string, unknown> = {}): Promise<void> {
    agent = await startAgent({
      mqttUrl: broker.url,
      // Settle as soon as everything is acknowledged; a keepalive longer than any fake advance here.
      flags: { 'sync.quietMs': 0, 'mqtt.keepaliveSec': 3600, ...flags },
      monotonic: () => monotonicMs() + (fakeNow() - fakeStart),
    });
    id = agent.agent.identity.deviceId;
    client = await agent.client();
    await waitFor(() => agent.agent.uplink.connected && cloud.device(id).hellos.length === 1, 'agent online');
  }

  afterEach(async () => {
    vi.useRealTimers();
    client?.close();
    await agent?.stop();
    await observer?.endAsync(true);
    await cloud?.close();
    await broker?.close();
  });

  /** The cloud switches the agent to deadleaf with the given period; the agent acknowledges and sleeps. */
  async function enterDeadleaf(period: string): Promise<void> {
    const p = cloud.set(id, 'deadleaf', period);
    await waitFor(() => (cloud.get(id, 'deadleaf')?.acked ?? 0) >= p.time, 'deadleaf acknowledged');
    const m = cloud.set(id, 'mode', 'deadleaf');
    await waitFor(() => agent.agent.status().mode === 'deadleaf', 'mode applied');
    await untilAsleep();
    // Acknowledged before the uplink closed.
    expect(cloud.get(id, 'mode')!.acked).toBeGreaterThanOrEqual(m.time);
    expect(agent.agent.vars.get('d', 'mode')!.acked).toBeGreaterThanOrEqual(m.time);
  }

  it('wakes every period, syncs both ways, sleeps again, and stops sleeping in master mode', async () => {
    await boot();
    await enterDeadleaf('60');
    expect(agent.sink.events('mode.sleep').at(-1)).toMatchObject({ forMs: 60_000 });
    expect(await state()).toBe('sleeping');
    expect(hellos()).toBe(1);

    // While asleep: a change on the gateway, and one from the cloud that cannot be delivered yet.
    const temp = await client.set('d', 'temp', '21.5');
    const led = cloud.set(id, 'led', 'on');
    const before = local();

    // Not a moment before the period ends.
    await untilWake(60_000);
    expect(hellos()).toBe(1);
    expect(cloud.value(id, 'temp')).toBeUndefined();
    await waitFor(() => hellos() === 2, 'the hello of the wake');

    // The wake's work: the local change pushed, the cloud's change received, every d variable synced.
    await waitFor(() => (cloud.get(id, 'temp')?.acked ?? 0) >= temp.time, 'temp in the cloud');
    await waitFor(() => agent.agent.vars.get('d', 'led')?.value?.toString() === 'on', 'led on the agent');
    await waitFor(() => (cloud.get(id, 'led')?.acked ?? 0) >= led.time, 'led acknowledged to the cloud');
    for (const [name, rec] of before) {
      await waitFor(() => {
        const now = local().get(name)!;
        return now.synced > rec.synced && now.syncacked >= now.synced;
      }, `${name} synced and acknowledged`);
      const synced = local().get(name)!.synced;
      expect(
        syncsSeen.some((s) => s.name === name && s.synced === synced),
        `cloud saw sync of ${name}`,
      ).toBe(true);
    }
    expect(local().get('temp')!.acked).toBeGreaterThanOrEqual(temp.time);

    // Then back to sleep.
    await untilAsleep();
    expect(cloud.device(id).state).toBe('sleeping');
    expect(agent.agent.vars.pending()).toEqual({ pushes: 0, syncs: 0 });

    // Master mode set while asleep takes effect on the next wake: the agent stays up.
    const master = cloud.set(id, 'mode', 'master');
    await untilWake(60_000);
    expect(hellos()).toBe(2);
    await waitFor(() => hellos() === 3, 'the hello of the next wake');
    await waitFor(() => agent.agent.status().mode === 'master', 'master mode applied');
    await waitFor(() => (cloud.get(id, 'mode')?.acked ?? 0) >= master.time, 'mode acknowledged');
    const sleeps = agent.sink.events('mode.sleep').length;
    await advance(180_000);
    expect(agent.sink.events('mode.sleep').length).toBe(sleeps);
    expect(agent.agent.uplink.connected).toBe(true);
    expect(hellos()).toBe(3);
    expect(cloud.device(id).state).toBe('online');
    expect(await client.status()).toMatchObject({ state: 'connected', mode: 'master' });
  });

  it('sleeps again after awakeMaxMs when a wake cannot reach the broker, and syncs on the next one', async () => {
    // A wake's time budget, short here; a wake that reaches the broker is done long before it.
    await boot({ 'sync.awakeMaxMs': 5000 });
    await enterDeadleaf('60');
    const events = (name: string) => agent.sink.events(name);
    const temp = await client.set('d', 'temp', '7');

    brokerUp = false;
    await broker.stop();
    const sleeps = events('mode.sleep').length;
    await untilWake(60_000);
    // No broker: the wake gives up once its budget is spent, and sleeps for another period.
    await advanceUntil(() => events('mode.sleep').length > sleeps, 'sleep after a failed wake', { step: 100 });
    sleptAt = fakeNow();
    expect(events('mode.sleep').at(-1)).toMatchObject({ forMs: 60_000, overdue: true, pending: { pushes: 1 } });
    expect(agent.agent.uplink.connected).toBe(false);
    expect(await state()).toBe('sleeping');

    // The broker returns; once the cloud has reconnected, the next wake pushes what waited and sleeps again.
    // Its start polls the port on the (fake) timers: move them along until it is up.
    let started = false;
    void broker.start().then(() => (started = true));
    await advanceUntil(() => started, 'the broker back', { step: 25, patienceMs: 20 });
    const tick = cloud.publishRaw(NOBODY, 'down/cmd', 'tick');
    let ticked = false;
    void tick.then(() => (ticked = true));
    await advanceUntil(() => ticked, 'the cloud reconnected', { step: 100, patienceMs: 20 });
    brokerUp = true;
    await untilWake(60_000);
    await waitFor(() => hellos() >= 2, 'the hello of the next wake');
    await waitFor(() => (cloud.get(id, 'temp')?.acked ?? 0) >= temp.time, 'temp in the cloud');
    await untilAsleep();
    expect(agent.sink.events('mode.sleep').at(-1)).toMatchObject({ overdue: false });
    expect(agent.agent.vars.pending()).toEqual({ pushes: 0, syncs: 0 });
  });

  it('falls back to 300 s on an invalid period, with a warning', async () => {
    await boot();
    await enterDeadleaf('soon');
    expect(agent.sink.events('mode.deadleaf_invalid').at(-1)).toMatchObject({ value: 'soon', using: 300 });
    expect(agent.sink.events('mode.sleep').at(-1)).toMatchObject({ forMs: 300_000 });
    await untilWake(300_000);
    expect(hellos()).toBe(1);
    await waitFor(() => hellos() === 2, 'the hello of the wake');
    expect(cloud.device(id).state).toBe('online');
  });
});
