/**
 * The live channel across bridges (docs/scaling.md, "The live channel"): two bridge processes on one PostgreSQL
 * database and one Mosquitto, their links in one share group, a real agent behind the broker. A WebSocket and an SSE
 * stream held by bridge B see what bridge A handled: a REST change, a claim, an unregister, and the device's own
 * changes whichever bridge took its message; a channel opened on B with an access token closes when A revokes it.
 */
import { randomUUID } from 'node:crypto';
import { rmSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type BridgeProcess, spawnBridge } from '../support/bridge-process.js';
import { freePort, startMosquitto } from '../support/brokers.js';
import { LiveSocket, SseStream } from '../support/live.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';
import { missing } from '../support/system.js';
import { until } from '../support/wait.js';

describe.skipIf(missing('mosquitto') || (await missingPostgres()))('the live channel across two bridges', () => {
  const db = usePostgres();
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  it('a change handled by bridge A reaches a WebSocket and an SSE stream held by bridge B', async () => {
    await db.reset();
    const broker = await startMosquitto();
    cleanups.push(() => broker.close());
    const bridges: BridgeProcess[] = [];
    for (let i = 0; i < 2; i++) {
      const dataDir = tempDir(`devcloud-live-multi-${i}-`);
      const b = await spawnBridge({
        dataDir,
        httpPort: await freePort(),
        config: {
          database: { url: db.url },
          mqtt: { url: broker.url, shareGroup: 'bridges', clientId: `live-bridge-${i}`, sessionExpirySec: 2 },
        },
      });
      cleanups.push(async () => {
        await b.stop();
        rmSync(dataDir, { recursive: true, force: true });
      });
      bridges.push(b);
    }
    const [a, b] = bridges as [BridgeProcess, BridgeProcess];
    const agent: TestAgent = await startAgent({ mqttUrl: broker.url, level: 'info' });
    cleanups.push(async () => {
      await agent.stop();
      rmSync(agent.config.stateDir, { recursive: true, force: true });
    });
    const deviceId = agent.agent.identity.deviceId;

    // The session is made on A; the channels are opened on B.
    const http = a.client();
    const signup = await http.post('/0/session/signup', {
      form: { login: `${randomUUID()}@example.com`, password: 'correct horse battery' },
    });
    expect(signup.status).toBe(201);
    const cookie = `sid=${http.sid!}`;
    const ws = await LiveSocket.open(b.url, { cookie, throttletime: 0 });
    cleanups.push(() => ws.ws.terminate());
    const sse = await SseStream.open(b.url, { cookie });
    cleanups.push(() => sse.close());
    expect(await ws.next((m) => m.devices, 'the snapshot on B')).toEqual({});

    // A claim through A.
    await until(
      async () => (await http.post('/0/devices/', { form: { auth: agent.agent.identity.authcode } })).status === 201,
      'the claim',
    );
    const claimed = await ws.next((m) => m.events?.[deviceId], 'device-claimed on B');
    expect(claimed.type).toBe('device-claimed');

    // A change through A, with its acknowledgement from the device (handled by either bridge).
    expect((await http.post(`/0/devices/${deviceId}/d/colour`, { form: { value: 'teal' } })).body).toBe('device-ok');
    await ws.next((m) => {
      const r = m.delta?.[deviceId]?.d?.colour;
      return r?.value === 'teal' && r.acked! >= r.time ? true : undefined;
    }, 'the change and its acknowledgement on B');
    await sse.next((e) => (e.event === 'delta' && e.data.includes('"teal"') ? true : undefined), 'the change on SSE');

    // A change on the device.
    await agent.agent.vars.set('d', 'temp', Buffer.from('19'));
    await ws.next((m) => (m.delta?.[deviceId]?.d?.temp?.value === '19' ? true : undefined), 'the device change on B');

    // The unregister through A.
    const before = ws.messages.length;
    expect((await http.request('DELETE', `/0/devices/${deviceId}`)).body).toBe('device-ok');
    expect(await ws.next((m) => m.events?.[deviceId], 'device-removed on B', before)).toEqual({
      type: 'device-removed',
    });

    // A channel opened on B with an access token made on A closes when A revokes the token.
    const token = (await http.post('/0/user/accesstoken')).body;
    const byToken = await LiveSocket.open(b.url, { headers: { authorization: `Bearer ${token}` } });
    cleanups.push(() => byToken.ws.terminate());
    await byToken.next((m) => m.devices, 'the bearer snapshot on B');
    expect((await http.request('DELETE', `/0/user/accesstoken/${token}`)).body).toBe('accesstoken-ok');
    expect(await byToken.closed).toEqual({ code: 4001, reason: 'session ended' });
    expect(ws.ws.readyState).toBe(ws.ws.OPEN);
  });
});
