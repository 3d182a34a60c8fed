/**
 * Baselines with nothing but mqtt.js and the broker, measured in the same run and on the same broker as the
 * agent, so that a figure is judged against what the transport itself can do on this machine right now.
 */
import type { Socket } from 'node:net';
import mqtt, { type MqttClient } from 'mqtt';
import { messageId } from '../../protocol/index.js';

/** Outside `dc/v1/`, so that the cloud never sees the baseline's traffic. */
const BARE_ROOT = `bench/bare/${messageId().slice(0, 8)}`;

/**
 * A plain client that sends every packet at once. mqtt.js leaves Nagle's algorithm on, which holds a small
 * write back until the previous one is acknowledged: a PUBACK followed by a publish then waits for a delayed
 * ACK (about 40 ms on Linux).
 */
export async function connectClient(role: string, url: string): Promise<MqttClient> {
  const client = await mqtt.connectAsync(url, {
    clientId: `bench-${role}-${messageId().slice(0, 8)}`,
    clean: true,
    reconnectPeriod: 0,
  });
  (client.stream as Socket).setNoDelay(true);
  return client;
}

/**
 * Publishes every payload at QoS 1 with at most `window` unacknowledged, and resolves with the milliseconds
 * until the last PUBACK.
 */
export async function bareThroughput(url: string, payloads: readonly Buffer[], window: number): Promise<number> {
  const client = await connectClient('bare-pub', url);
  try {
    const topic = `${BARE_ROOT}/up/vars`;
    const started = performance.now();
    await new Promise<void>((resolve, reject) => {
      let next = 0;
      let acked = 0;
      const launch = () => {
        while (next < payloads.length && next - acked < window) {
          client.publish(topic, payloads[next++]!, { qos: 1 }, (err) => {
            if (err) return reject(err);
            if (++acked === payloads.length) resolve();
            else launch();
          });
        }
      };
      launch();
    });
    return performance.now() - started;
  } finally {
    await client.endAsync(true);
  }
}

/**
 * Two plain clients: A publishes at QoS 1, B (subscribed at QoS 1) publishes every message back at QoS 1, and
 * A measures until the echo arrives. The same hops as a cloud push and the device's ack, without the agent.
 */
export class BareEcho {
  private waiting: ((at: number) => void) | undefined;

  private constructor(
    private readonly a: MqttClient,
    private readonly b: MqttClient,
    private readonly topic: string,
  ) {}

  static async start(url: string): Promise<BareEcho> {
    const topic = `${BARE_ROOT}/rtt`;
    const a = await connectClient('rtt-a', url);
    const b = await connectClient('rtt-b', url);
    const echo = new BareEcho(a, b, topic);
    b.on('message', (_t, payload) => b.publish(`${topic}/back`, payload, { qos: 1 }));
    a.on('message', () => {
      const at = performance.now();
      const w = echo.waiting;
      echo.waiting = undefined;
      w?.(at);
    });
    await b.subscribeAsync(`${topic}/go`, { qos: 1 });
    await a.subscribeAsync(`${topic}/back`, { qos: 1 });
    return echo;
  }

  /** One round trip of `payload`, in milliseconds. */
  async once(payload: Buffer): Promise<number> {
    const back = new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no echo within 10 s')), 10_000);
      this.waiting = (at) => {
        clearTimeout(timer);
        resolve(at);
      };
    });
    const sentAt = performance.now();
    this.a.publish(`${this.topic}/go`, payload, { qos: 1 });
    return (await back) - sentAt;
  }

  async close(): Promise<void> {
    await Promise.all([this.a.endAsync(true), this.b.endAsync(true)]);
  }
}
