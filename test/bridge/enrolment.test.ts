/**
 * Enrolment by the embedded broker is kept in the bridge's database: after a restart a device is still known by
 * the secret it enrolled with, so nobody else can take its id. `devcloud-bridge run` enrols nobody by default;
 * enrolment is by provisioning or through the enrolment credential, and capped per address and in all. All of it
 * runs on each store engine (SQLite in the data directory, and PostgreSQL when the test server answers:
 * test/support/bridge.ts, `engines`).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import mqtt from 'mqtt';
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedBroker, hashSecret } from '../../bridge/broker.js';
import { runCli } from '../../bridge/cli.js';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, type TestAgent, startAgent, tempDir } from '../support/agent.js';
import {
  type LiveBridge,
  type StoreEngine,
  type TestStore,
  bridgeDatabase,
  engines,
  openTestStore,
  startLiveBridge,
} from '../support/bridge.js';
import { spawnBridge } from '../support/bridge-process.js';
import { freePort } from '../support/brokers.js';
import type { FreshDatabase } from '../support/postgres.js';
import { rawConnect } from '../support/raw-mqtt.js';
import { until } from '../support/wait.js';

async function connects(url: string, id: string, secret: string): Promise<boolean> {
  try {
    const c = await mqtt.connectAsync(url, { clientId: id, username: id, password: secret, reconnectPeriod: 0 });
    await c.endAsync(true);
    return true;
  } catch {
    return false;
  }
}

const ENGINES = await engines();

/** PostgreSQL: a database for a test's bridges to share (across a restart, or with a command), else undefined. */
async function databaseFor(engine: StoreEngine, cleanups: Array<() => Promise<void> | void>) {
  if (engine !== 'postgres') return undefined;
  const db = await bridgeDatabase();
  cleanups.push(() => db.drop());
  return db;
}

describe.each(ENGINES)('enrolment kept across bridge restarts (%s)', (engine) => {
  const open: Array<{ broker: EmbeddedBroker; store: TestStore }> = [];
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const o of open.splice(0)) {
      await o.broker.close();
      await o.store.close();
    }
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  /** A broker on the store in `dataDir` (PostgreSQL: on `database`, which outlives it). */
  async function start(dataDir: string, database: FreshDatabase | undefined, openEnrolment = true) {
    const opened = await openTestStore(engine, dataDir, database ? { database } : {});
    const { store } = opened;
    const log = createLogger({ level: 'warn', pretty: 'never', base: {}, destination: new LogSink() });
    const broker = await EmbeddedBroker.start({
      host: '127.0.0.1',
      port: 0,
      openEnrolment,
      credentials: store.credentials,
      log,
      now: Date.now,
    });
    open.push({ broker, store: opened });
    return { broker, store };
  }

  it('refuses another secret for an enrolled device after a restart, and accepts the enrolled one', async () => {
    const dataDir = tempDir();
    cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const database = await databaseFor(engine, cleanups);
    const id = randomUUID();
    const secret = randomBytes(32).toString('hex');
    const first = await start(dataDir, database);
    expect(await connects(first.broker.url, id, secret)).toBe(true);
    expect(await first.store.credentials.secretHash(id)).toBe(hashSecret(secret));
    const o = open.pop()!;
    await o.broker.close();
    await o.store.close();

    // Open enrolment is switched off now: only devices already known may connect.
    const second = await start(dataDir, database, false);
    expect(await connects(second.broker.url, id, 'f'.repeat(64))).toBe(false);
    expect(second.broker.refusals['bad-secret']).toBe(1);
    expect(await connects(second.broker.url, id, secret)).toBe(true);
    expect(await connects(second.broker.url, randomUUID(), secret)).toBe(false);
    expect(second.broker.refusals['not-enrolled']).toBe(1);
  });

  it('keeps the first secret a device enrolled with', async () => {
    const dataDir = tempDir();
    cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const { broker, store } = await start(dataDir, await databaseFor(engine, cleanups));
    const id = randomUUID();
    const secret = randomBytes(32).toString('hex');
    expect(await connects(broker.url, id, secret)).toBe(true);
    // A second enrolment of the same id (as a race would make) does not replace the secret.
    await store.credentials.enroll(id, hashSecret('other'), Date.now());
    expect(await store.credentials.secretHash(id)).toBe(hashSecret(secret));
  });
});

describe.each(ENGINES)('secure enrolment by default (%s)', (engine) => {
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  interface Login {
    clientId: string;
    username: string;
    password: string;
  }
  const login = (id: string = randomUUID()): Login => ({
    clientId: id,
    username: id,
    password: randomBytes(32).toString('hex'),
  });

  /** Whether the broker at `port` lets `who` in, from `localAddress`. */
  async function admitted(port: number, who: Login = login(), localAddress?: string): Promise<boolean> {
    try {
      const c = await rawConnect(port, who, localAddress);
      c.close();
      return true;
    } catch {
      return false;
    }
  }

  it('devcloud-bridge run enrols nobody by default; a provisioned device connects', async () => {
    expect(BridgeConfigSchema.parse({ dataDir: '/x' }).mqtt.openEnrolment).toBe(false);
    const dataDir = tempDir('devcloud-bridge-');
    cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const database = await databaseFor(engine, cleanups);
    // No mqtt settings at all: the defaults of `run`.
    const bridge = await spawnBridge({
      dataDir,
      httpPort: await freePort(),
      mqttPort: await freePort(),
      config: { mqtt: {}, ...(database ? { database: { url: database.url } } : {}) },
    });
    cleanups.push(() => bridge.kill9());
    const port = Number(new URL(bridge.mqttUrl).port);
    for (let i = 0; i < 20; i++) expect(await admitted(port)).toBe(false);
    expect(bridge.output()).toContain('"reason":"not-enrolled"');
    expect(bridge.output()).not.toContain('"event":"broker.enrolled"');

    // `devcloud-bridge device provision` registers a secret the running bridge accepts.
    const outDir = tempDir('devcloud-provision-');
    cleanups.push(() => rmSync(outDir, { recursive: true, force: true }));
    const out: string[] = [];
    const code = await runCli(
      [
        'device',
        'provision',
        '--data-dir',
        dataDir,
        ...(database ? ['--database-url', database.url] : []),
        '--out',
        outDir,
      ],
      { out: (s) => out.push(s), err: () => undefined },
      { CONFIGURATION_DIRECTORY: dataDir },
    );
    expect(code).toBe(0);
    const identity = JSON.parse(readFileSync(out[0]!, 'utf8')) as { deviceId: string; secret: string };
    const { store, close } = await openTestStore(engine, dataDir, database ? { database } : {});
    try {
      // 20 strangers left no trace; the provisioned device is the only one known.
      expect(await store.credentials.secretHash(identity.deviceId)).toBe(hashSecret(identity.secret));
    } finally {
      await close();
    }
    expect(
      await admitted(port, { clientId: identity.deviceId, username: identity.deviceId, password: identity.secret }),
    ).toBe(true);
  });

  it('with an enrolment credential, an agent without a provisioning file enrols through it; nobody else does', async () => {
    const dir = tempDir('devcloud-enrol-');
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const enrolPassword = randomBytes(16).toString('hex');
    writeFileSync(join(dir, 'enrol-password'), `${enrolPassword}\n`);
    const live: LiveBridge = await startLiveBridge({
      engine,
      config: { mqtt: { openEnrolment: true, enrolPasswordFile: join(dir, 'enrol-password') } },
    });
    cleanups.push(() => live.close());
    const port = live.bridge.broker!.port;
    // Trust on first use is off when a credential is set.
    expect(await admitted(port)).toBe(false);
    // A wrong enrolment password is refused.
    expect(
      await admitted(port, { clientId: 'devcloud-enrol', username: 'devcloud-enrol', password: 'wrong-password' }),
    ).toBe(false);

    const agent: TestAgent = await startAgent({
      mqttUrl: live.mqttUrl,
      flags: { 'mqtt.enrolPassword': enrolPassword },
    });
    cleanups.push(() => agent.stop());
    await until(() => agent.agent.uplink.connected, 'the agent to enrol and connect');
    const id = agent.agent.identity.deviceId;
    expect(await live.bridge.store.credentials.secretHash(id)).toBe(hashSecret(agent.agent.identity.secret));
    expect(live.sink.events('broker.enrolled')).toEqual([expect.objectContaining({ deviceId: id, via: 'credential' })]);
    // The request carried the secret: it went to nobody, and no log line holds it.
    expect(live.sink.text()).not.toContain(agent.agent.identity.secret);
  });

  it('caps enrolments per client address and in all, per window', async () => {
    const live: LiveBridge = await startLiveBridge({
      engine,
      config: { mqtt: { openEnrolment: true, enrolLimits: { perAddress: 3, total: 5, windowMs: 60_000 } } },
    });
    cleanups.push(() => live.close());
    const port = live.bridge.broker!.port;
    const results: boolean[] = [];
    for (let i = 0; i < 4; i++) results.push(await admitted(port, login(), '127.0.0.1'));
    expect(results).toEqual([true, true, true, false]);
    // Another address has its own allowance, up to the total.
    const other: boolean[] = [];
    for (let i = 0; i < 3; i++) other.push(await admitted(port, login(), '127.0.0.2'));
    expect(other).toEqual([true, true, false]);
    expect(live.bridge.broker!.refusals['enrol-limited']).toBe(2);
    expect(live.sink.events('broker.enrol_limited')).toHaveLength(2);
    expect(live.sink.events('broker.enrolled')).toHaveLength(5);
    // A device enrolled before the limit was reached still connects.
    const known = login();
    await live.bridge.store.credentials.enroll(known.username, hashSecret(known.password), Date.now());
    expect(await admitted(port, known)).toBe(true);
  });
});
