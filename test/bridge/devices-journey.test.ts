/**
 * One full user journey through the real edges: a listening bridge with its embedded broker, a real agent
 * connected to it, HTTP from the test, and the user's authcode sent to the agent over UDP. On each store engine
 * (SQLite, and PostgreSQL when the test server answers: test/support/bridge.ts, `engines`).
 */
import { createSocket } from 'node:dgram';
import { afterEach, describe, expect, it } from 'vitest';
import { type TestAgent, startAgent } from '../support/agent.js';
import { type HttpClient, type LiveBridge, engines, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

function udpSend(port: number, payload: string): Promise<void> {
  const s = createSocket('udp4');
  return new Promise((resolve, reject) =>
    s.send(payload, port, '127.0.0.1', (err) => {
      s.close();
      if (err) reject(err);
      else resolve();
    }),
  );
}

async function signup(http: HttpClient, login: string): Promise<string> {
  const r = await http.post('/0/session/signup', { form: { login, password: 'correct horse battery' } });
  expect(r.status).toBe(201);
  const user = await http.get('/0/user/');
  expect(user.status).toBe(200);
  return (JSON.parse(user.body) as { authcode: string }).authcode;
}

describe.each(await engines())('a user journey with a real agent (embedded broker, %s)', (engine) => {
  let bridge: LiveBridge | undefined;
  let agent: TestAgent | undefined;
  afterEach(async () => {
    await agent?.stop();
    await bridge?.close();
    agent = undefined;
    bridge = undefined;
  });

  it('signup, authcode over UDP, network, claim, d set and acked, sync and syncacked, device change, history, unregister', async () => {
    bridge = await startLiveBridge({ engine });
    agent = await startAgent({ mqttUrl: bridge.mqttUrl });
    const deviceId = agent.agent.identity.deviceId;
    const deviceAuth = agent.agent.identity.authcode;
    const http = bridge.client();
    const authcode = await signup(http, 'journey@example.com');

    // The phone broadcasts the authcode; the agent hears it and reports it; the device becomes nearby.
    await udpSend(agent.agent.nearby.port!, `${authcode}\n`);
    const network = await until(async () => {
      const r = await http.get('/0/network/');
      const body = JSON.parse(r.body) as Record<string, { meta: Record<string, { value: string }> }>;
      return body[deviceAuth] ? body : undefined;
    }, 'the device in the network view');
    expect(network[deviceAuth]!.meta.unique!.value).toBe(deviceId);
    expect(network[deviceAuth]!.meta.state!.value).toBe('connected');

    // Claim it: 201 and the uuid; again: idempotent.
    const claim = await http.post('/0/devices/', { form: { auth: deviceAuth } });
    expect(claim.status).toBe(201);
    expect(claim.body).toBe(deviceId);
    const again = await http.post('/0/devices/', {
      form: { auth: deviceAuth },
      headers: { accept: 'application/json' },
    });
    expect(again.status).toBe(201);
    expect(JSON.parse(again.body)).toEqual({ id: deviceId });
    const list = JSON.parse((await http.get('/0/devices/')).body) as Record<string, unknown>;
    expect(Object.keys(list)).toEqual([deviceId]);

    // A d variable set through the API reaches the agent and is acknowledged.
    expect((await http.post(`/0/devices/${deviceId}/d/led`, { form: { value: 'on' } })).body).toBe('device-ok');
    const local = await agent.client();
    await until(async () => (await local.get('d', 'led').catch(() => undefined))?.value === 'on', 'led on the agent');
    const acked = await until(async () => {
      const r = JSON.parse((await http.get(`/0/devices/${deviceId}/d/led`)).body) as Record<string, number>;
      return r.acked! >= r.time! ? r : undefined;
    }, 'led acked');
    expect(acked).toMatchObject({ value: 'on' });

    // A sync (no value) is acknowledged separately.
    expect((await http.post(`/0/devices/${deviceId}/d/led`, { form: {} })).body).toBe('device-ok');
    const synced = await until(async () => {
      const r = JSON.parse((await http.get(`/0/devices/${deviceId}/d/led`)).body) as Record<string, number>;
      return r.synced! > 0 && r.syncacked! >= r.synced! ? r : undefined;
    }, 'led syncacked');
    expect(synced.synced).toBeGreaterThan(0);

    // A change made on the gateway shows through the API.
    await local.set('d', 'temp', '21.5');
    await until(async () => {
      const r = await http.get(`/0/devices/${deviceId}/d/temp`);
      return r.status === 200 && (JSON.parse(r.body) as { value: string }).value === '21.5' ? true : undefined;
    }, 'temp through the API');

    // History, newest first.
    await http.post(`/0/devices/${deviceId}/d/led`, { form: { value: 'off' } });
    const history = JSON.parse((await http.get(`/0/devices/${deviceId}/d/led?latest=10`)).body) as Array<{
      value: string;
      by: string;
      id: number;
    }>;
    expect(history.map((h) => h.value)).toEqual(['off', 'on']);
    expect(history[0]!.by).toBe('user');
    const older = JSON.parse((await http.get(`/0/devices/${deviceId}/d/led?latest=10&from=${history[0]!.id}`)).body);
    expect(older).toHaveLength(1);

    // meta reads as the bare value.
    const state = await http.get(`/0/devices/${deviceId}/meta/state`);
    expect(JSON.parse(state.body)).toBe('connected');

    // Unregister: gone from the list; DELETE again is device-fail.
    expect((await http.request('DELETE', `/0/devices/${deviceId}`)).body).toBe('device-ok');
    expect(JSON.parse((await http.get('/0/devices/')).body)).toEqual({});
    const gone = await http.request('DELETE', `/0/devices/${deviceId}`);
    expect([gone.status, gone.body]).toEqual([400, 'device-fail']);
    local.close();
  });
});
