import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { type BrokerKind, type TestBroker, brokerKinds, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { type TestAgent, startAgent } from '../support/agent.js';

describe.each<BrokerKind>(brokerKinds())('variable sync basics through %s', (kind) => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent;

  beforeEach(async () => {
    broker = await startBroker(kind);
    cloud = await FakeCloud.start(broker.url);
    agent = await startAgent({ mqttUrl: broker.url });
    await cloud.until(() => agent.agent.uplink.connected, 'agent connected');
  });

  afterEach(async () => {
    await agent?.stop();
    await cloud?.close();
    await broker?.close();
  });

  it('commits a cloud push, acknowledges it, and the cloud records acked', async () => {
    const id = agent.agent.identity.deviceId;
    await cloud.until(() => cloud.device(id).hellos.length > 0, 'hello');
    const sent = cloud.set(id, 'led', 'on');
    await cloud.until(() => (cloud.get(id, 'led')?.acked ?? 0) >= sent.time, 'cloud acked');
    const c = await agent.client();
    const local = await c.get('d', 'led');
    c.close();
    expect(local).toMatchObject({ value: 'on', time: sent.time, origin: 'cloud' });
    expect(local.acked).toBeGreaterThanOrEqual(local.time);
  });

  it('pushes a gateway change and stamps acked when the cloud acknowledges', async () => {
    const id = agent.agent.identity.deviceId;
    const c = await agent.client();
    const set = await c.set('d', 'temp', '21.5');
    expect(set.acked).toBeLessThan(set.time);
    await cloud.until(() => cloud.value(id, 'temp') === '21.5', 'cloud has the value');
    await cloud.until(() => agent.agent.vars.get('d', 'temp')!.acked >= set.time, 'agent acked');
    c.close();
  });
});
