/**
 * The bridge's controller (bridge/bridge.ts): its parts in order, started in order and stopped in reverse order; a
 * part that fails to start stops those started before it and is named; a part that fails to stop is logged and
 * the others still stop; the clock it is given is the one its parts read.
 */
import { rmSync, writeFileSync } from 'node:fs';
import { type Server, createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { Bridge } from '../../bridge/bridge.js';
import { PartError } from '../../bridge/part.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';
import { type ConfigOverrides, liveBridgeConfig } from '../support/bridge.js';

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const T = Date.UTC(2030, 0, 1);

/** A bridge composed, not started, on a fresh data directory, with a clock that stands at `T`. */
function compose(over: ConfigOverrides = {}): { bridge: Bridge<SqliteStore>; sink: LogSink; dataDir: string } {
  const dataDir = tempDir('devcloud-bridge-');
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const store = new SqliteStore(dataDir, log);
  cleanups.push(async () => {
    await store.close();
    rmSync(dataDir, { recursive: true, force: true });
  });
  const bridge = new Bridge({ config: liveBridgeConfig(dataDir, over), store, log, now: () => T });
  cleanups.push(() => bridge.stop().catch(() => undefined));
  return { bridge, sink, dataDir };
}

/** Records, in `calls`, each part's start and stop as it happens. */
function record(bridge: Bridge): string[] {
  const calls: string[] = [];
  for (const part of bridge.parts) {
    const start = part.start.bind(part);
    const stop = part.stop.bind(part);
    part.start = () => {
      calls.push(`start ${part.name}`);
      return start();
    };
    part.stop = () => {
      calls.push(`stop ${part.name}`);
      return stop();
    };
  }
  return calls;
}

/** A TCP port on 127.0.0.1 that nothing listens on now. */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Whether something listens on a port of 127.0.0.1: a listen there fails with EADDRINUSE. */
async function listening(port: number): Promise<boolean> {
  const server: Server = createServer();
  return new Promise((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => (err.code === 'EADDRINUSE' ? resolve(true) : reject(err)));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(false)));
  });
}

describe('the bridge controller', () => {
  it('has its parts in start order, with the broker or the dynamic security manager its config asks for', () => {
    const names = (b: Bridge) => b.parts.map((p) => p.name);
    expect(names(compose().bridge)).toEqual([
      'events',
      'mailer',
      'devices',
      'http',
      'broker',
      'link',
      'prune',
      'retention',
      'sweep',
    ]);
    const passwordFile = join(tempDir('devcloud-bridge-pw-'), 'password');
    writeFileSync(passwordFile, 'secret\n');
    cleanups.push(() => rmSync(join(passwordFile, '..'), { recursive: true, force: true }));
    const external = { url: 'mqtt://127.0.0.1:1', username: 'bridge', passwordFile };
    expect(names(compose({ mqtt: external }).bridge)).toEqual([
      'events',
      'mailer',
      'devices',
      'http',
      'link',
      'prune',
      'retention',
      'sweep',
    ]);
    expect(names(compose({ mqtt: { ...external, dynsec: true } }).bridge)).toEqual([
      'events',
      'mailer',
      'devices',
      'http',
      'dynsec',
      'link',
      'prune',
      'retention',
      'sweep',
    ]);
  });

  it('starts its parts in order and stops them in reverse order; its parts read the clock it is given', async () => {
    const httpPort = await freePort();
    const { bridge } = compose({ http: { port: httpPort } });
    const calls = record(bridge);
    await bridge.start();
    const names = bridge.parts.map((p) => p.name);
    expect(calls).toEqual(names.map((n) => `start ${n}`));
    expect(bridge.url).toBe(`http://127.0.0.1:${httpPort}`);
    expect((await fetch(`${bridge.url}/healthz`)).status).toBe(200);
    expect(bridge.link.connected).toBe(true);
    const brokerPort = bridge.broker!.port;
    // The default frontend is made at the first start, at the bridge's time.
    expect(bridge.defaultFrontend.createdAt).toBe(T);

    calls.length = 0;
    await bridge.stop();
    expect(calls).toEqual(names.map((n) => `stop ${n}`).reverse());
    expect(await listening(httpPort)).toBe(false);
    expect(await listening(brokerPort)).toBe(false);
    // A second stop is the same stop: nothing runs twice.
    await bridge.stop();
    expect(calls).toHaveLength(names.length);
  });

  it('a part that fails to start stops the parts started before it, in reverse order, and the start names it', async () => {
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise<void>((resolve) => taken.close(() => resolve())));
    const mqttPort = (taken.address() as { port: number }).port;
    const httpPort = await freePort();
    const { bridge } = compose({ http: { port: httpPort }, mqtt: { port: mqttPort } });
    const calls = record(bridge);

    const err = await bridge.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(PartError);
    expect((err as PartError).part).toBe('broker');
    expect((err as PartError).message).toBe(`port ${mqttPort} is already in use; choose another with --mqtt-port N`);
    expect(calls).toEqual([
      'start events',
      'start mailer',
      'start devices',
      'start http',
      'start broker',
      'stop http',
      'stop devices',
      'stop mailer',
      'stop events',
    ]);
    expect(await listening(httpPort)).toBe(false);
    await expect(
      bridge.mailer.send({ kind: 'confirm', to: 'a@example.com', subject: 's', text: 't', link: 'l' }),
    ).rejects.toEqual(expect.objectContaining({ name: 'MailError', code: 'closed' }));
  });

  it('a part that fails to stop is logged with its name, and the others still stop', async () => {
    const { bridge, sink } = compose();
    await bridge.start();
    const calls = record(bridge);
    const prune = bridge.parts.find((p) => p.name === 'prune')!;
    prune.stop = () => {
      calls.push('stop prune');
      return Promise.reject(new Error('the timer would not stop'));
    };
    const httpPort = Number(new URL(bridge.url).port);

    await expect(bridge.stop()).rejects.toThrow('could not stop: prune');
    expect(calls).toEqual(bridge.parts.map((p) => `stop ${p.name}`).reverse());
    expect(sink.events('bridge.part_failed')).toEqual([
      expect.objectContaining({ level: 'error', part: 'prune', err: 'the timer would not stop' }),
    ]);
    expect(await listening(httpPort)).toBe(false);
  });
});
