/**
 * A device on a plain mqtt.js connection, for tests that need to see or withhold exactly what a device receives:
 * it connects with a fresh identity (the bridge must enrol on first connect), subscribes to its `down/` topics,
 * says hello, and hands every `down/vars` message to the test, raw and decoded. `ack` acknowledges items as an
 * agent does after its commit.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import mqtt, { type MqttClient } from 'mqtt';
import {
  type Decoded,
  type HelloMessage,
  type VarItem,
  ackFor,
  decode,
  downFilter,
  encode,
  messageId,
  topicFor,
} from '../../protocol/index.js';

/** A device's hello as a test device sends it: a fresh authcode unless one is given. */
export function helloMessage(deviceId: string, authcode = randomBytes(16).toString('hex')): HelloMessage {
  return {
    id: messageId(),
    protocol: 1,
    deviceId,
    authcode,
    platform: 'test-board',
    agentVersion: '0.0.1',
    fwVersion: '1.0',
    mode: 'master',
    bootTime: Date.now(),
    ts: Date.now(),
  };
}

export interface MqttDevice {
  readonly id: string;
  readonly authcode: string;
  readonly client: MqttClient;
  /** Acknowledges these items on `up/acks`. */
  ack(items: readonly VarItem[]): Promise<void>;
  close(): Promise<void>;
}

export interface MqttDeviceOptions {
  /**
   * Leave the last will an agent leaves (`offline` on its retained `state`), which the broker publishes when the
   * connection ends without a DISCONNECT: a device that vanished (docs/notifications.md, "Offline").
   */
  will?: boolean;
}

export async function connectMqttDevice(
  mqttUrl: string,
  onVars: (msg: Decoded<'down/vars'>, payload: Buffer) => void,
  opts: MqttDeviceOptions = {},
): Promise<MqttDevice> {
  const id = randomUUID();
  const authcode = randomBytes(16).toString('hex');
  const client = await mqtt.connectAsync(mqttUrl, {
    clientId: id,
    username: id,
    password: randomBytes(32).toString('hex'),
    reconnectPeriod: 0,
    connectTimeout: 5000,
    ...(opts.will
      ? { will: { topic: topicFor(id, 'state'), payload: encode('state', 'offline'), qos: 0 as const, retain: true } }
      : {}),
  });
  client.on('message', (topic, payload) => {
    if (topic === topicFor(id, 'down/vars')) onVars(decode('down/vars', payload), payload);
  });
  await client.subscribeAsync(downFilter(id), { qos: 1 });
  await client.publishAsync(topicFor(id, 'up/hello'), encode('up/hello', helloMessage(id, authcode)), { qos: 1 });
  // An acknowledgement still in flight when the test closes the device fails with the connection; that is the
  // close the test asked for, not an error of the test.
  let closed = false;
  return {
    id,
    authcode,
    client,
    ack: async (items) => {
      try {
        await client.publishAsync(
          topicFor(id, 'up/acks'),
          encode('up/acks', { id: messageId(), acks: items.map(ackFor) }),
          {
            qos: 1,
          },
        );
      } catch (err) {
        if (!closed) throw err;
      }
    },
    close: () => {
      closed = true;
      return client.endAsync(true);
    },
  };
}
