import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedBroker, MemoryCredentials, hashSecret } from '../../bridge/broker.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, type TestAgent, startAgent, tempDir } from '../support/agent.js';

describe('agent credentials against the embedded broker', () => {
  let broker: EmbeddedBroker;
  const agents: TestAgent[] = [];

  afterEach(async () => {
    for (const a of agents.splice(0)) await a.stop();
    await broker?.close();
  });

  async function startBroker(openEnrolment = true) {
    const credentials = new MemoryCredentials();
    const log = createLogger({ level: 'warn', pretty: 'never', base: {}, destination: new LogSink() });
    broker = await EmbeddedBroker.start({ host: '127.0.0.1', port: 0, openEnrolment, credentials, log, now: Date.now });
    return credentials;
  }

  it('enrols on first connect with its generated identity and is accepted again after a restart', async () => {
    const credentials = await startBroker();
    const stateDir = tempDir();
    const first = await startAgent({ mqttUrl: broker.url, stateDir });
    agents.push(first);
    const id = first.agent.identity.deviceId;
    await until(() => first.agent.uplink.connected);
    expect(await credentials.secretHash(id)).toBe(hashSecret(first.agent.identity.secret));
    await agents.pop()!.stop();

    const second = await startAgent({ mqttUrl: broker.url, stateDir });
    agents.push(second);
    expect(second.agent.identity.deviceId).toBe(id);
    await until(() => second.agent.uplink.connected);
    expect(broker.refusals['bad-secret']).toBe(0);
  });

  it('is refused, and keeps retrying without crashing, when its secret does not match the enrolled one', async () => {
    await startBroker();
    const stateDir = tempDir();
    const first = await startAgent({ mqttUrl: broker.url, stateDir });
    agents.push(first);
    await until(() => first.agent.uplink.connected);
    await agents.pop()!.stop();

    // Someone copied the device id but not the secret.
    const path = join(stateDir, 'identity.json');
    const identity = JSON.parse(readFileSync(path, 'utf8')) as { secret: string };
    identity.secret = 'f'.repeat(64);
    writeFileSync(path, JSON.stringify(identity));
    const impostor = await startAgent({ mqttUrl: broker.url, stateDir });
    agents.push(impostor);
    await until(() => broker.refusals['bad-secret'] >= 2);
    expect(impostor.agent.uplink.connected).toBe(false);
    expect(impostor.sink.events('mqtt.error').length).toBeGreaterThan(0);
    // The local interface keeps serving while the uplink is refused.
    const c = await impostor.client();
    await c.set('d', 'still', 'works');
    expect((await c.get('d', 'still')).value).toBe('works');
    c.close();
  });
});

async function until(check: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 10));
  }
}
