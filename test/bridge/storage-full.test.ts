/**
 * A full disk under a real bridge process: its data directory is a small tmpfs, filled up with one file. A change
 * answers `507 storage-full` (not `500 internal-error`), reads go on, `/healthz` says why, and once the file is
 * removed changes work again, and reach the device, without a restart. A device that connects while the disk is
 * full is sent what waits for it although its hello cannot be stored, and a bridge killed while the disk is full
 * starts again and serves reads. The tests run in order on one bridge and one device.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type TestAgent, startAgent } from '../support/agent.js';
import type { HttpClient } from '../support/bridge.js';
import { type BridgeProcess, spawnBridge } from '../support/bridge-process.js';
import { freePort } from '../support/brokers.js';
import { type SmallDisk, smallDiskOrSkip } from '../support/tmpfs.js';
import { until } from '../support/wait.js';

const mounted = smallDiskOrSkip(16 * 1024 * 1024, 'the full-disk tests of the bridge');

interface Health {
  status: string;
  storage: { status: string; freeBytes: number | null; fullSince: number | null };
}

async function health(http: HttpClient): Promise<{ code: number; body: Health }> {
  const r = await http.get('/healthz');
  return { code: r.status, body: JSON.parse(r.body) as Health };
}

describe.skipIf(mounted === undefined)('a full disk under the bridge', () => {
  let bridge: BridgeProcess;
  let agent: TestAgent;
  let http: HttpClient;
  const d = mounted!;

  beforeAll(async () => {
    bridge = await spawnBridge({
      dataDir: d.dir,
      httpPort: await freePort(),
      mqttPort: await freePort(),
      config: { health: { minFreeBytes: 64 * 1024 } },
    });
    agent = await startAgent({ mqttUrl: bridge.mqttUrl, level: 'info' });
    http = bridge.client();
  });
  afterAll(async () => {
    await agent?.stop();
    await bridge?.stop();
    (d as SmallDisk | undefined)?.unmount();
  });

  it('answers 507 storage-full, keeps serving reads, fails /healthz, and recovers by itself', async () => {
    const { deviceId, authcode } = agent.agent.identity;
    expect(
      (await http.post('/0/session/signup', { form: { login: 'full@example.com', password: 'pw-full-1234' } })).status,
    ).toBe(201);
    await until(async () => (await http.post('/0/devices/', { form: { auth: authcode } })).status === 201, 'the claim');
    expect((await http.post(`/0/devices/${deviceId}/d/before`, { form: { value: 'kept' } })).body).toBe('device-ok');
    expect((await health(http)).body.storage.status).toBe('ok');

    d.fill();
    // SQLite reuses the space its log file already holds: changes go on until that is used up too.
    const value = randomBytes(24 * 1024).toString('hex');
    let last = { status: 200, body: '' };
    for (let i = 0; i < 500 && last.status === 200; i++) {
      last = await http.post(`/0/devices/${deviceId}/s/big${i}`, { form: { value } });
    }
    expect(last).toMatchObject({ status: 507, body: 'storage-full' });
    const refused = await http.post(`/0/devices/${deviceId}/d/after`, { form: { value: 'written' } });
    expect(refused.status).toBe(507);
    expect(refused.body).toBe('storage-full');

    // Reads are served.
    const device = await http.get(`/0/devices/${deviceId}`);
    expect(device.status).toBe(200);
    expect((JSON.parse(device.body) as { d: Record<string, { value: string }> }).d.before?.value).toBe('kept');
    expect((await http.get('/0/user/')).status).toBe(200);

    const failing = await health(http);
    expect(failing.code).toBe(503);
    expect(failing.body.status).toBe('failing');
    expect(failing.body.storage.status).toBe('full');
    expect(failing.body.storage.fullSince).toBeGreaterThan(0);

    d.free();
    const again = await http.post(`/0/devices/${deviceId}/d/after`, { form: { value: 'written' } });
    expect(again.body).toBe('device-ok');
    const local = await agent.client();
    try {
      await until(
        async () => (await local.list('d')).find((v) => v.name === 'after' && v.value === 'written'),
        'the change at the device',
      );
    } finally {
      local.close();
    }
    const healthy = await health(http);
    expect(healthy.code).toBe(200);
    expect(healthy.body.storage).toMatchObject({ status: 'ok', fullSince: null });

    const events = bridge
      .output()
      .split('\n')
      .filter((l) => l.includes('"event":"storage.'))
      .map((l) => (JSON.parse(l) as { event: string }).event);
    expect(events).toEqual(['storage.full', 'storage.recovered']);
    expect(bridge.output()).not.toContain('"event":"http.failed"');
  });
  it('sends a device that connects while the disk is full what waits for it, though its hello cannot be stored', async () => {
    // Run after the test above: the device is claimed and connected, and the disk has room again.
    const { deviceId } = agent.agent.identity;
    const stateDir = agent.config.stateDir;
    await agent.stop();
    await until(async () => (await http.get(`/0/devices/${deviceId}/meta/state`)).body === '"disconnected"', 'offline');
    expect((await http.post(`/0/devices/${deviceId}/d/away`, { form: { value: 'while away' } })).body).toBe(
      'device-ok',
    );

    d.fill();
    // Until not even a small change fits in what SQLite's log file still holds.
    const value = randomBytes(24 * 1024).toString('hex');
    for (const v of [value, 'x']) {
      let status = 200;
      for (let i = 0; i < 500 && status === 200; i++) {
        status = (await http.post(`/0/devices/${deviceId}/s/fill${i}`, { form: { value: v } })).status;
      }
      expect(status).toBe(507);
    }
    const failedBefore = bridge.output().split('"event":"device.message_failed"').length;

    agent = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir, level: 'info' });
    const local = await agent.client();
    try {
      await until(
        async () => (await local.list('d')).find((v) => v.name === 'away' && v.value === 'while away'),
        'the change made while the device was away, at the device',
      );
      // The hello itself could not be stored: the path above is the one taken.
      expect(bridge.output().split('"event":"device.message_failed"').length).toBeGreaterThan(failedBefore);
      expect(bridge.output()).toMatch(/"event":"device\.message_failed"[^\n]*"topic":"up\/hello"/);
    } finally {
      local.close();
      d.free();
    }
  });
  it('starts again on a full disk after kill -9 and serves reads', async () => {
    const { deviceId } = agent.agent.identity;
    // Connected again with room on the disk, so that the bridge holds it as connected.
    await agent.stop();
    agent = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir: agent.config.stateDir, level: 'info' });
    await until(async () => (await http.get(`/0/devices/${deviceId}/meta/state`)).body === '"connected"', 'online');
    d.fill();
    const value = randomBytes(24 * 1024).toString('hex');
    for (const v of [value, 'x']) {
      let status = 200;
      for (let i = 0; i < 500 && status === 200; i++) {
        status = (await http.post(`/0/devices/${deviceId}/s/again${i}`, { form: { value: v } })).status;
      }
      expect(status).toBe(507);
    }
    const ports = {
      dataDir: d.dir,
      httpPort: Number(new URL(bridge.url).port),
      mqttPort: Number(new URL(bridge.mqttUrl).port),
    };
    await bridge.kill9();
    try {
      // Marking the devices of the old broker disconnected is a write, refused: the bridge starts all the same.
      bridge = await spawnBridge({ ...ports, config: { health: { minFreeBytes: 64 * 1024 } } });
      expect(bridge.output()).toContain('"event":"devices.mark_failed"');
      const device = await http.get(`/0/devices/${deviceId}`);
      expect(device.status).toBe(200);
      expect((JSON.parse(device.body) as { d: Record<string, { value: string }> }).d.away?.value).toBe('while away');
      expect((await http.post(`/0/devices/${deviceId}/d/later`, { form: { value: 'x' } })).status).toBe(507);
    } finally {
      d.free();
    }
    expect((await http.post(`/0/devices/${deviceId}/d/later`, { form: { value: 'written' } })).body).toBe('device-ok');
  });
});
