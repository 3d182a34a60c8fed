/**
 * Notification rules through a whole bridge (docs/notifications.md), for tests: users made over HTTP, devices on
 * plain MQTT connections (test/support/mqtt-device.ts) that report variables, meta entries and command outcomes as
 * an agent does, and the rule routes and event log read back as the official client reads them.
 *
 * A device's changes are evaluated one after another, each against the variable's value when its turn comes
 * ("Evaluation"): a test that wants every crossing seen waits for the rule's state (or its event) after each
 * change that moves it, as `report` and `until…` here let it.
 */
import { expect } from 'vitest';
import { type CmdMessage, type MetaMessage, decode, encode, messageId, topicFor } from '../../protocol/index.js';
import type { BridgeStore } from '../../bridge/store/types.js';
import type { HttpClient } from './bridge.js';
import { type MqttDeviceOptions, type MqttDevice, connectMqttDevice } from './mqtt-device.js';
import { until } from './wait.js';

/** An event as `GET /0/user/events/` and the live channel show it. */
export interface EventJson {
  id: number;
  type: 'user-event';
  rule: number | null;
  name: string;
  message: string;
  deviceid: string;
  trigger: string;
  variable: { type: 'd' | 's' | 'meta'; name: string } | null;
  value: string | null;
  value64?: string;
  time: number;
  test: boolean;
  email: 'pending' | 'sent' | 'failed' | 'skipped' | null;
  webhook: {
    url: string;
    state: 'pending' | 'delivered' | 'failed' | null;
    attempts: number;
    status: number | null;
    error: string | null;
    at: number | null;
  } | null;
}

/** A rule as `GET /0/user/event/<id>` shows it. */
export interface RuleJson {
  id: number;
  name: string;
  message: string;
  trigger: string;
  deviceid: string;
  email: boolean;
  webhook: string | null;
  webhookSecret: string | null;
  state: 'armed' | 'pending' | 'fired';
  created: number;
  updated: number;
  lastFired: number | null;
}

/** A user with a session, and the `Cookie` header of it for the live channel. */
export interface Person {
  http: HttpClient;
  login: string;
  cookie: string;
}

let people = 0;

/** Signs a new user up; the login is unique in the process (`<name>-<n>@example.com`). */
export async function signup(http: HttpClient, name: string): Promise<Person> {
  const login = `${name}-${++people}-${process.pid}@example.com`;
  const r = await http.post('/0/session/signup', { form: { login, password: 'correct horse battery' } });
  expect(r.status).toBe(201);
  return { http, login, cookie: `sid=${http.sid!}` };
}

/** Device stamps: later than any before, and never behind the real clock (a user's change is stamped with it). */
let lastStamp = 0;
function stamp(): number {
  lastStamp = Math.max(lastStamp + 1, Date.now());
  return lastStamp;
}

export interface SimDevice {
  readonly id: string;
  readonly authcode: string;
  readonly mqtt: MqttDevice;
  /** Every `down/cmd` the device got, in order. */
  readonly commands: CmdMessage[];
  /** Reports a `d` variable on `up/vars`, a new version; resolves once the bridge stored it. */
  report(name: string, value: string): Promise<void>;
  /** Reports a `d` variable without waiting for the bridge. */
  send(name: string, value: string): Promise<void>;
  /** Reports meta entries on `up/meta`; resolves once the bridge stored them. */
  meta(meta: MetaMessage['meta']): Promise<void>;
  /** Reports that a command failed (`up/cmd`), as an agent does when its program exits non-zero. */
  commandFailed(cmd: string, reason: string): Promise<void>;
  /** Ends the connection without a DISCONNECT: a gateway that lost power (its will, if it left one, follows). */
  vanish(): void;
}

/**
 * A device on its own MQTT connection, claimed by `owner` once its hello is in the store. `store` is where the
 * bridge (any bridge, with several on one database) keeps what the device reports.
 */
export async function claimedDevice(
  mqttUrl: string,
  store: BridgeStore,
  owner: Person,
  opts: MqttDeviceOptions = {},
): Promise<SimDevice> {
  const mqtt = await connectMqttDevice(mqttUrl, () => undefined, opts);
  const id = mqtt.id;
  const commands: CmdMessage[] = [];
  mqtt.client.on('message', (topic, payload) => {
    if (topic !== topicFor(id, 'down/cmd')) return;
    const msg = decode('down/cmd', payload);
    if (msg.ok) commands.push(msg.value);
  });
  await until(() => store.devices.deviceByAuthcode(mqtt.authcode), 'the device saying hello');
  expect((await owner.http.post('/0/devices/', { form: { auth: mqtt.authcode } })).status).toBe(201);
  const publishVar = async (name: string, value: string): Promise<number> => {
    const time = stamp();
    const payload = encode('up/vars', {
      id: messageId(),
      items: [{ kind: 'push', type: 'd', name, value, time, origin: 'device' }],
    });
    await mqtt.client.publishAsync(topicFor(id, 'up/vars'), payload, { qos: 1 });
    return time;
  };
  return {
    id,
    authcode: mqtt.authcode,
    mqtt,
    commands,
    async report(name, value) {
      const time = await publishVar(name, value);
      await until(async () => {
        const v = await store.devices.getVar(id, 'd', name);
        return v !== undefined && v.time >= time;
      }, `d.${name} = ${value} stored`);
    },
    async send(name, value) {
      await publishVar(name, value);
    },
    async meta(meta) {
      const payload = encode('up/meta', { id: messageId(), ts: stamp(), meta });
      await mqtt.client.publishAsync(topicFor(id, 'up/meta'), payload, { qos: 1 });
      await until(
        async () => {
          for (const [name, value] of Object.entries(meta)) {
            if ((await store.devices.getVar(id, 'meta', name))?.value?.toString('utf8') !== value) return false;
          }
          return true;
        },
        `meta ${JSON.stringify(meta)} stored`,
      );
    },
    async commandFailed(cmd, reason) {
      const payload = encode('up/cmd', { id: messageId(), cmd, state: 'failed', at: stamp(), exitCode: 1, reason });
      await mqtt.client.publishAsync(topicFor(id, 'up/cmd'), payload, { qos: 1 });
    },
    vanish() {
      mqtt.client.stream.destroy();
    },
  };
}

/** Makes a rule (`POST /0/user/event/`); answers its number. */
export async function addRule(p: Person, fields: Record<string, string>): Promise<number> {
  const r = await p.http.post('/0/user/event/', { form: fields });
  expect({ status: r.status, body: r.body }).toEqual({ status: 201, body: expect.stringMatching(/^\d+$/) as string });
  return Number(r.body);
}

export async function ruleOf(p: Person, id: number): Promise<RuleJson> {
  const r = await p.http.get(`/0/user/event/${id}`);
  expect(r.status).toBe(200);
  return JSON.parse(r.body) as RuleJson;
}

/** The user's event log, newest first; `query` as `?latest=…&from=…`. */
export async function eventsOf(p: Person, query = ''): Promise<EventJson[]> {
  const r = await p.http.get(`/0/user/events/${query}`);
  expect(r.status).toBe(200);
  return JSON.parse(r.body) as EventJson[];
}

/** Waits for the rule's state. */
export function untilState(p: Person, id: number, state: RuleJson['state']): Promise<RuleJson> {
  return until(async () => {
    const r = await ruleOf(p, id);
    return r.state === state ? r : undefined;
  }, `rule ${id} ${state}`);
}

/**
 * Waits until the user's log holds at least `n` events (of the rule, when given); answers them all, newest first,
 * for the test to count.
 */
export function untilEvents(p: Person, n: number, rule?: number): Promise<EventJson[]> {
  return until(
    async () => {
      const list = (await eventsOf(p)).filter((e) => rule === undefined || e.rule === rule);
      return list.length >= n ? list : undefined;
    },
    `${n} events${rule === undefined ? '' : ` of rule ${rule}`}`,
  );
}

/** The events of `user-event` frames the live channel carried, in order. */
export function frameEvents(frames: ReadonlyArray<{ events?: Record<string, unknown> }>): EventJson[] {
  const out: EventJson[] = [];
  for (const f of frames) {
    for (const e of Object.values(f.events ?? {})) {
      if ((e as { type?: string }).type === 'user-event') out.push(e as EventJson);
    }
  }
  return out;
}
