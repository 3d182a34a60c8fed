/**
 * Enrolment by the embedded broker is kept in the bridge's database: after a restart a device is still known by
 * the secret it enrolled with, so nobody else can take its id.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import mqtt from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedBroker, hashSecret } from '../../bridge/broker.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';

async function connects(url: string, id: string, secret: string): Promise<boolean> {
  try {
    const c = await mqtt.connectAsync(url, { clientId: id, username: id, password: secret, reconnectPeriod: 0 });
    await c.endAsync(true);
    return true;
  } catch {
    return false;
  }
}

describe('enrolment kept across bridge restarts', () => {
  const open: Array<{ broker: EmbeddedBroker; store: SqliteStore }> = [];
  afterEach(async () => {
    for (const o of open.splice(0)) {
      await o.broker.close();
      o.store.close();
    }
  });

  async function start(dataDir: string, openEnrolment = true) {
    const store = new SqliteStore(dataDir);
    const log = createLogger({ level: 'warn', pretty: 'never', base: {}, destination: new LogSink() });
    const broker = await EmbeddedBroker.start({ host: '127.0.0.1', port: 0, openEnrolment, credentials: store, log });
    open.push({ broker, store });
    return { broker, store };
  }

  it('refuses another secret for an enrolled device after a restart, and accepts the enrolled one', async () => {
    const dataDir = tempDir();
    const id = randomUUID();
    const secret = randomBytes(32).toString('hex');
    const first = await start(dataDir);
    expect(await connects(first.broker.url, id, secret)).toBe(true);
    expect(first.store.secretHash(id)).toBe(hashSecret(secret));
    const o = open.pop()!;
    await o.broker.close();
    o.store.close();

    // Open enrolment is switched off now: only devices already known may connect.
    const second = await start(dataDir, false);
    expect(await connects(second.broker.url, id, 'f'.repeat(64))).toBe(false);
    expect(second.broker.refusals['bad-secret']).toBe(1);
    expect(await connects(second.broker.url, id, secret)).toBe(true);
    expect(await connects(second.broker.url, randomUUID(), secret)).toBe(false);
    expect(second.broker.refusals['not-enrolled']).toBe(1);
  });

  it('keeps the first secret a device enrolled with', async () => {
    const { broker, store } = await start(tempDir());
    const id = randomUUID();
    const secret = randomBytes(32).toString('hex');
    expect(await connects(broker.url, id, secret)).toBe(true);
    // A second enrolment of the same id (as a race would make) does not replace the secret.
    store.enroll(id, hashSecret('other'));
    expect(store.secretHash(id)).toBe(hashSecret(secret));
  });
});
