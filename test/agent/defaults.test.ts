import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import mqtt from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { loadAgentConfig, socketPath } from '../../agent/config.js';
import { topicFor } from '../../protocol/index.js';
import { startAedes, type TestBroker } from '../support/brokers.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';

describe('installed defaults', () => {
  it('reads <CONFIGURATION_DIRECTORY>/agent.yaml when no config file is named, so the CLI finds the service socket', () => {
    const etc = tempDir();
    writeFileSync(join(etc, 'agent.yaml'), 'stateDir: /var/lib/elsewhere\nsocket:\n  path: /run/devcloud/agent.sock\n');
    const config = loadAgentConfig({ flags: {}, env: { CONFIGURATION_DIRECTORY: etc } });
    expect(config.stateDir).toBe('/var/lib/elsewhere');
    expect(socketPath(config, {})).toBe('/run/devcloud/agent.sock');
    // A named file wins over the installed one.
    const other = join(etc, 'other.yaml');
    writeFileSync(other, 'stateDir: /tmp/other\n');
    expect(loadAgentConfig({ flags: { configFile: other }, env: { CONFIGURATION_DIRECTORY: etc } }).stateDir).toBe(
      '/tmp/other',
    );
  });

  it('runs on defaults when there is no installed config file', () => {
    const empty = tempDir();
    mkdirSync(join(empty, 'sub'));
    const config = loadAgentConfig({
      flags: {},
      env: { CONFIGURATION_DIRECTORY: empty, STATE_DIRECTORY: '/srv/state' },
    });
    expect(config.stateDir).toBe('/srv/state');
    expect(config.mqtt.url).toBe('mqtt://localhost:1883');
  });

  it('treats a section whose keys are all commented out as absent', () => {
    const dir = tempDir();
    const file = join(dir, 'agent.yaml');
    writeFileSync(file, 'identity:\n  # provisioningFile: /etc/devcloud/provision.json\nudp:\n  port: 5590\nhooks:\n');
    const config = loadAgentConfig({ flags: { configFile: file }, env: {} });
    expect(config.identity.provisioningFile).toBeUndefined();
    expect(config.udp.port).toBe(5590);
    expect(config.hooks.origins).toEqual(['cloud']);
  });
});

describe('retained state at QoS 0', () => {
  let broker: TestBroker;
  let agent: TestAgent;
  afterEach(async () => {
    await agent?.stop();
    await broker?.close();
  });

  it('publishes state retained at QoS 0, as docs/decisions.md §4 fixes, and every other topic at QoS 1', async () => {
    broker = await startAedes();
    const seen: Array<{ topic: string; qos: number; retain: boolean; payload: string }> = [];
    const watcher = await mqtt.connectAsync(broker.url, { reconnectPeriod: 0 });
    watcher.on('message', (topic, payload, packet) =>
      seen.push({ topic, qos: packet.qos, retain: packet.retain, payload: payload.toString() }),
    );
    await watcher.subscribeAsync('dc/v1/#', { qos: 1 });
    agent = await startAgent({ mqttUrl: broker.url });
    const id = agent.agent.identity.deviceId;
    const hello = topicFor(id, 'up/hello');
    const deadline = Date.now() + 20_000;
    while (!seen.some((m) => m.topic === hello)) {
      if (Date.now() > deadline) throw new Error('no hello');
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(seen.find((m) => m.topic === topicFor(id, 'state'))).toMatchObject({ qos: 0, payload: 'online' });
    expect(seen.find((m) => m.topic === hello)?.qos).toBe(1);
    await watcher.endAsync(true);

    // A late subscriber gets the retained state.
    const late = await mqtt.connectAsync(broker.url, { reconnectPeriod: 0 });
    const retained = new Promise<{ retain: boolean; payload: string }>((resolve) =>
      late.on('message', (_t, payload, packet) => resolve({ retain: packet.retain, payload: payload.toString() })),
    );
    await late.subscribeAsync(topicFor(id, 'state'), { qos: 1 });
    expect(await retained).toEqual({ retain: true, payload: 'online' });
    await late.endAsync(true);
  });
});
