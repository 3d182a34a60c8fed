/**
 * `GET /0/frontend` (docs/api.md): the frontend of the request and its `nearby` and `registration` switches
 * (decisions 15 and 16), without a session, over HTTP. The switches it reports are the ones the routes obey: a
 * frontend with them off shows no nearby device and refuses a claim.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type TestBridge, startTestBridge } from '../support/bridge.js';

let b: TestBridge;
beforeAll(async () => {
  b = await startTestBridge({ transport: 'http' });
});
afterAll(async () => {
  await b.close();
});

describe('GET /0/frontend', () => {
  it('answers the default frontend with both switches on, without a session and without setting one', async () => {
    const r = await b.client().get('/0/frontend');
    expect(r.status).toBe(200);
    expect(r.contentType).toMatch(/^application\/json/);
    expect(r.setCookies).toEqual([]);
    expect(JSON.parse(r.body)).toEqual({
      id: b.defaultFrontend.id,
      name: b.defaultFrontend.name,
      nearby: true,
      registration: true,
    });
    // The spelling with the trailing slash is the same route.
    expect(JSON.parse((await b.client().get('/0/frontend/')).body)).toEqual(JSON.parse(r.body));
  });

  it('answers the frontend named by `app` or by the Host header, with its own switches', async () => {
    const off = await b.addFrontend({ nearby: false, registration: false });
    const half = await b.addFrontend({ nearby: false });
    const c = b.client();
    const byApp = await c.get(`/0/frontend?app=${off.id}`);
    expect(byApp.status).toBe(200);
    expect(JSON.parse(byApp.body)).toEqual({ id: off.id, name: off.name, nearby: false, registration: false });
    const byHost = await c.get('/0/frontend', { headers: { host: `${half.id}.devcloud.example.com` } });
    expect(JSON.parse(byHost.body)).toMatchObject({ id: half.id, nearby: false, registration: true });
  });

  it('tells what the routes of that frontend then do: no nearby view, no claim', async () => {
    const off = await b.addFrontend({ nearby: false, registration: false });
    const c = b.client();
    const signup = await c.post(`/0/session/signup?app=${off.id}`, {
      form: { login: 'kiosk@example.com', password: 'correct horse battery' },
    });
    expect(signup.status).toBe(201);
    const info = JSON.parse((await c.get(`/0/frontend?app=${off.id}`)).body) as { nearby: boolean };
    expect(info).toMatchObject({ nearby: false, registration: false });
    expect((await c.get(`/0/network/?app=${off.id}`)).body).toBe('{}');
    const claim = await c.post(`/0/devices/?app=${off.id}`, { form: { auth: '00112233445566778899aabbccddeeff' } });
    expect([claim.status, claim.body]).toEqual([400, 'claim-fail']);
  });

  it('follows a change of the switches at once', async () => {
    const f = await b.addFrontend();
    const c = b.client();
    expect(JSON.parse((await c.get(`/0/frontend?app=${f.id}`)).body)).toMatchObject({ nearby: true });
    await b.store.setFrontendConfig(f.id, { ...f.config, nearby: false, registration: false });
    expect(JSON.parse((await c.get(`/0/frontend?app=${f.id}`)).body)).toMatchObject({
      nearby: false,
      registration: false,
    });
  });

  it('answers 404 `not found` for a frontend the bridge does not know', async () => {
    const r = await b.client().get(`/0/frontend?app=${randomUUID()}`);
    expect([r.status, r.body]).toEqual([404, 'not found']);
  });
});
