/**
 * MQTT topics of the devcloud wire contract (docs/decisions.md §4).
 *
 * Every topic lives under `dc/v1/<deviceId>/`. Neither the agent nor the bridge spells a topic by hand:
 * they build topics with {@link topicFor} and read them with {@link parseTopic}.
 */

export const TOPIC_ROOT = 'dc/v1';

/** Topics a device publishes. `state` is retained and carries the last will. */
export const UP_TOPICS = ['state', 'up/hello', 'up/vars', 'up/acks', 'up/meta', 'up/heard', 'up/cmd'] as const;
/** Topics the cloud publishes to one device. */
export const DOWN_TOPICS = ['down/vars', 'down/acks', 'down/cmd', 'down/fw'] as const;

export type UpTopic = (typeof UP_TOPICS)[number];
export type DownTopic = (typeof DOWN_TOPICS)[number];
export type TopicName = UpTopic | DownTopic;

const TOPIC_NAMES: ReadonlySet<string> = new Set<string>([...UP_TOPICS, ...DOWN_TOPICS]);

/**
 * A device id is the uuid of the device. MQTT forbids `+`, `#` and `/` inside a topic level, and the id is
 * also the broker username, so only the uuid form is accepted.
 */
export const DEVICE_ID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export function isDeviceId(value: string): boolean {
  return DEVICE_ID_RE.test(value);
}

/** The full topic of `name` for one device. */
export function topicFor(deviceId: string, name: TopicName): string {
  if (!isDeviceId(deviceId)) throw new TypeError(`not a device id: ${JSON.stringify(deviceId)}`);
  return `${TOPIC_ROOT}/${deviceId}/${name}`;
}

/** Subscription filter for every `down/` topic of one device (what an agent subscribes to). */
export function downFilter(deviceId: string): string {
  if (!isDeviceId(deviceId)) throw new TypeError(`not a device id: ${JSON.stringify(deviceId)}`);
  return `${TOPIC_ROOT}/${deviceId}/down/#`;
}

/**
 * Where a device without credentials at the broker asks to be enrolled, with the enrolment credential (Mosquitto
 * with dynamic security; bridge/mqtt/dynsec.ts). Outside every device's topics: only the bridge reads it.
 */
export const ENROL_TOPIC = `${TOPIC_ROOT}/enrol`;

/** Subscription filter for every device's `up/` topics. */
export const DEVICES_UP_FILTER = `${TOPIC_ROOT}/+/up/#`;
/** Subscription filter for every device's `state`. */
export const DEVICES_STATE_FILTER = `${TOPIC_ROOT}/+/state`;
/** Subscription filters for what every device publishes (what the cloud subscribes to). */
export const ALL_DEVICES_UP_FILTERS: readonly string[] = [DEVICES_UP_FILTER, DEVICES_STATE_FILTER];

export interface ParsedTopic {
  deviceId: string;
  name: TopicName;
}

/** Splits a topic into device id and topic name; `undefined` for anything outside the contract. */
export function parseTopic(topic: string): ParsedTopic | undefined {
  const prefix = `${TOPIC_ROOT}/`;
  if (!topic.startsWith(prefix)) return undefined;
  const rest = topic.slice(prefix.length);
  const slash = rest.indexOf('/');
  if (slash < 0) return undefined;
  const deviceId = rest.slice(0, slash);
  const name = rest.slice(slash + 1);
  if (!isDeviceId(deviceId) || !TOPIC_NAMES.has(name)) return undefined;
  return { deviceId, name: name as TopicName };
}

export function isUpTopic(name: TopicName): name is UpTopic {
  return (UP_TOPICS as readonly string[]).includes(name);
}

export function isDownTopic(name: TopicName): name is DownTopic {
  return (DOWN_TOPICS as readonly string[]).includes(name);
}
