/**
 * Commands through a private Mosquitto with per-device credentials (the bridge on `mqtt.url`, the agent logged
 * in with its provisioned uuid and secret): the run order, binary commands, a lifetime that ends while the
 * device is offline, and a broker outage while status reports are pending.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { missing } from '../support/system.js';
import { type Rig, startRig, until } from './support.js';

describe.skipIf(missing('mosquitto', 'mosquitto_passwd'))('commands through a private Mosquitto', () => {
  let rig: Rig | undefined;
  afterEach(async () => {
    await rig?.close();
    rig = undefined;
  });

  it('runs by priority, then in arrival order, and carries binary bytes', async () => {
    const r = (rig = await startRig({ broker: 'mosquitto' }));
    const blocker = await r.send('block A');
    await until(async () => (await r.get(blocker)).state === 'running', 'the blocker running');
    const bytes = Buffer.concat([Buffer.from('bin '), Buffer.from(Array.from({ length: 255 }, (_, i) => i + 1))]);
    const arrivals: Array<Record<string, string>> = [
      { command: 'rec a0' },
      { command: 'rec b1', priority: '1' },
      { command64: bytes.toString('base64'), priority: '1' },
      { command: 'rec c2', priority: '2' },
      { command: 'rec d0' },
    ];
    const ids: string[] = [];
    for (const form of arrivals) {
      const res = await r.post(form);
      expect(res.status).toBe(200);
      ids.push(res.body);
    }
    await until(() => r.agent!.agent.queue.queued().length === arrivals.length, 'every command queued on the agent');
    r.release('A');
    const done = await Promise.all(ids.map((id) => r.finished(id)));
    expect(done.map((c) => c.state)).toEqual(['done', 'done', 'done', 'done', 'done']);
    // The run order is c2, b1, bin, a0, d0 (bin writes no line); the `started` stamps follow it.
    expect(r.runs()).toEqual(['A', 'c2', 'b1', 'a0', 'd0']);
    const started = [3, 1, 2, 0, 4].map((i) => done[i]!.started!);
    expect(started.every((t) => t > 0)).toBe(true);
    expect([...started].sort((x, y) => x - y)).toEqual(started);
    expect(done[2]!.command64).toBe(bytes.toString('base64'));
    expect(readFileSync(join(r.work, 'stdin.bin')).equals(bytes)).toBe(true);
    expect(Buffer.from(readFileSync(join(r.work, 'env64'), 'utf8'), 'base64').equals(bytes)).toBe(true);
  });

  it('a device offline past the lifetime: expired on the bridge, never sent', async () => {
    const r = (rig = await startRig({ broker: 'mosquitto' }));
    await r.stopAgent();
    await until(async () => (await r.metaState()) === 'disconnected', 'the device disconnected');
    const gone = await r.send('rec gone', { lifetime: '200' });
    const kept = await r.send('rec kept', { lifetime: '600000' });
    const expired = await r.finished(gone);
    expect(expired).toMatchObject({ state: 'expired', sent: null, delivered: null });

    const agent = await r.startAgent();
    expect((await r.finished(kept)).state).toBe('done');
    expect((await r.finished(await r.send('ping'))).state).toBe('done');
    expect(agent.agent.queue.get(gone)).toBeUndefined();
    expect(r.runs()).toEqual(['kept']);
  });

  it('a broker outage while status reports are pending loses none of them', async () => {
    const r = (rig = await startRig({ broker: 'mosquitto' }));
    const broker = r.mosquitto!;
    const first = await r.send('block first');
    await until(async () => (await r.get(first)).state === 'running', 'first running');
    const a = await r.send('rec a');
    const b = await r.send('rec b', { priority: '2' });
    const ping = await r.send('ping during', { priority: '1' });
    for (const id of [a, b, ping]) await r.delivered(id);

    await broker.stop();
    const agent = r.agent!.agent;
    await until(() => !agent.uplink.connected, 'the agent disconnected');
    // Posted while the broker is away: stored, handed over once the bridge is back on the broker.
    const late = await r.send('rec late');
    r.release('first');
    const all = [first, a, b, ping];
    await until(
      () => all.every((id) => ['done', 'failed'].includes(agent.queue.get(id)?.state ?? '')),
      'every command finished on the agent',
    );
    // Their outcomes are reported nowhere yet.
    expect(all.map((id) => agent.queue.get(id)!.reported)).toEqual([false, false, false, false]);
    for (const id of all) expect(['sent', 'running']).toContain((await r.get(id)).state);

    await broker.start();
    const outcomes = await Promise.all([...all, late].map((id) => r.finished(id, 20_000)));
    expect(outcomes.map((c) => c.state)).toEqual(['done', 'done', 'done', 'done', 'done']);
    expect(outcomes[0]!.output).toBe('released first\n');
    expect(outcomes[3]!.output).toBe('pong during');
    expect(r.runs()).toEqual(['first', 'b', 'a', 'late']);
    await until(() => all.every((id) => agent.queue.get(id)!.reported), 'every report acknowledged by the broker');
  });
});
