/**
 * What one change costs the agent's database (docs/operations.md, "Flash wear"): the database has 1 KiB pages, and
 * a change set on the gateway and acknowledged by the cloud appends three pages to the log: the variable's page
 * and a history page in the change's commit, the variable's page again in the acknowledgement's. A change that
 * wrote another row, touched an index or took another commit would show here.
 */
import Database from 'better-sqlite3';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { LocalClient } from '../../agent/local/client.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { type TestAgent, startAgent } from '../support/agent.js';

/** A log frame: a 24-byte header and the page. */
const FRAME = 24 + 1024;

describe('the write pattern of a change', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent;
  let client: LocalClient;

  beforeEach(async () => {
    broker = await startBroker('aedes');
    cloud = await FakeCloud.start(broker.url);
    agent = await startAgent({ mqttUrl: broker.url, level: 'warn' });
    const id = agent.agent.identity.deviceId;
    await cloud.until(() => agent.agent.uplink.connected && cloud.device(id).hellos.length > 0, 'agent connected');
    client = await agent.client();
  });

  afterEach(async () => {
    client?.close();
    await agent?.stop();
    await cloud?.close();
    await broker?.close();
  });

  it('has 1 KiB pages and appends three pages to the log per acknowledged change', async () => {
    const path = join(agent.config.stateDir, 'agent.db');
    const reader = new Database(path, { readonly: true });
    expect(reader.pragma('page_size', { simple: true })).toBe(1024);
    reader.close();

    const acked: string[] = [];
    let onAck: (() => void) | undefined;
    await client.watch((ev) => {
      if (ev.event !== 'acked') return;
      acked.push(ev.var.name);
      onAck?.();
    });
    const setAndAck = async (value: string) => {
      const done = new Promise<void>((resolve) => (onAck = resolve));
      await client.set('d', 'temp', value);
      await done;
    };
    const walBytes = () => statSync(`${path}-wal`).size;

    await setAndAck('20.0');
    await setAndAck('20.5');
    const before = walBytes();
    for (let i = 0; i < 5; i++) await setAndAck(`21.${i}`);
    expect((walBytes() - before) / FRAME).toBe(15);
    expect(acked).toHaveLength(7);
  });
});
