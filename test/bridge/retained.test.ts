import { randomBytes, randomUUID } from 'node:crypto';
import mqtt from 'mqtt';
import { describe, expect, it } from 'vitest';
import { EmbeddedBroker, MemoryCredentials } from '../../bridge/broker.js';
import { RetainedTree } from '../../bridge/retained.js';
import { createLogger } from '../../lib/log.js';
import { encode, topicFor } from '../../protocol/index.js';
import { LogSink } from '../support/agent.js';
import { until } from '../support/wait.js';

function tree(...topics: string[]): RetainedTree {
  const t = new RetainedTree();
  for (const topic of topics) t.store({ topic, payload: Buffer.from(topic) });
  return t;
}

const topics = (t: RetainedTree, filter: string) => [...t.match(filter)].map((p) => p.topic).sort();

describe('retained messages by topic level', () => {
  it('matches filters as MQTT does: exact, + for one level, # for any number including none', () => {
    const t = tree('a', 'a/b', 'a/b/c', 'a/x/c', 'b/b', '/lead', 'a//c');
    expect(topics(t, 'a/b')).toEqual(['a/b']);
    // An empty level is a level.
    expect(topics(t, 'a/+/c')).toEqual(['a//c', 'a/b/c', 'a/x/c']);
    expect(topics(t, 'a/#')).toEqual(['a', 'a//c', 'a/b', 'a/b/c', 'a/x/c']);
    expect(topics(t, '+/b')).toEqual(['a/b', 'b/b']);
    expect(topics(t, '+/+')).toEqual(['/lead', 'a/b', 'b/b']);
    expect(topics(t, 'a/+')).toEqual(['a/b']);
    expect(topics(t, 'a//c')).toEqual(['a//c']);
    expect(topics(t, '#')).toHaveLength(7);
    expect(topics(t, 'a/b/c/d')).toEqual([]);
    expect(topics(t, 'c/#')).toEqual([]);
  });

  it('does not match a $ topic with a wildcard in the first level', () => {
    const t = tree('$SYS/x', 'a/$b');
    expect(topics(t, '#')).toEqual(['a/$b']);
    expect(topics(t, '+/x')).toEqual([]);
    expect(topics(t, '$SYS/#')).toEqual(['$SYS/x']);
    expect(topics(t, 'a/+')).toEqual(['a/$b']);
  });

  it('keeps the latest message of a topic, and forgets it at an empty payload, branch and all', () => {
    const t = tree('a/b/c', 'a/d');
    t.store({ topic: 'a/b/c', payload: Buffer.from('new') });
    expect([...t.match('a/b/c')].map((p) => p.payload.toString())).toEqual(['new']);
    expect(t.size).toBe(2);
    t.store({ topic: 'a/b/c', payload: Buffer.alloc(0) });
    t.store({ topic: 'never/stored', payload: '' });
    expect(t.size).toBe(1);
    expect(topics(t, '#')).toEqual(['a/d']);
    t.store({ topic: 'a/d', payload: '' });
    expect(t.size).toBe(0);
    expect(topics(t, '#')).toEqual([]);
  });
});

describe('the embedded broker keeps retained messages in the tree', () => {
  it("gives a subscriber the devices' retained state, and nothing once it is cleared", async () => {
    const log = createLogger({ level: 'warn', pretty: 'never', base: {}, destination: new LogSink() });
    const broker = await EmbeddedBroker.start({
      host: '127.0.0.1',
      port: 0,
      openEnrolment: true,
      credentials: new MemoryCredentials(),
      log,
      now: Date.now,
    });
    const clients: mqtt.MqttClient[] = [];
    try {
      const ids = [randomUUID(), randomUUID()];
      for (const id of ids) {
        const c = await mqtt.connectAsync(broker.url, {
          clientId: id,
          username: id,
          password: randomBytes(32).toString('hex'),
          reconnectPeriod: 0,
        });
        clients.push(c);
        await c.publishAsync(topicFor(id, 'state'), encode('state', 'online'), { qos: 1, retain: true });
      }
      // What an operator's tool with the bridge credential sees when it subscribes (bridge/broker.ts).
      const watch = async (expected: number) => {
        const w = await mqtt.connectAsync(broker.url, {
          clientId: `${broker.bridgeClientId}-watch`,
          username: broker.bridgeUsername,
          password: broker.bridgePassword,
          reconnectPeriod: 0,
        });
        const seen: string[] = [];
        w.on('message', (topic, payload, packet) => packet.retain && seen.push(`${topic} ${payload.toString()}`));
        await w.subscribeAsync('dc/v1/+/state', { qos: 1 });
        // The retained messages a subscription finds come together, after its SUBACK.
        await until(() => seen.length >= expected, 'the retained messages');
        await w.endAsync(true);
        return seen.sort();
      };
      expect(await watch(2)).toEqual(ids.map((id) => `${topicFor(id, 'state')} online`).sort());
      await clients[0]!.publishAsync(topicFor(ids[0]!, 'state'), Buffer.alloc(0), { qos: 1, retain: true });
      expect(await watch(1)).toEqual([`${topicFor(ids[1]!, 'state')} online`]);
    } finally {
      for (const c of clients) await c.endAsync(true);
      await broker.close();
    }
  });
});
