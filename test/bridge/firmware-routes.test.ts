/**
 * The firmware job routes, request by request (docs/decisions.md §7, decision 7): starting an update, with each reason
 * a start is refused and what a refusal leaves behind; cancelling one before and after the switch; and the image a
 * device downloads, with its token and HTTP ranges. The devices report through the bridge's device side, with a link
 * that records what goes down to them (`test/support/fw-bridge.ts`). The answer checker is on: every answer here is
 * also held to the API document. All of it runs on each store engine (SQLite, and PostgreSQL when the test server
 * answers: test/support/bridge.ts, `engines`).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyFirmware } from '../../protocol/index.js';
import { type TestBridge, engines, startTestBridge } from '../support/bridge.js';
import { type FirmwareWorld, startFirmwareWorld } from '../support/fw-bridge.js';

interface Answer {
  status: number;
  body: string;
  bytes: Buffer;
  headers: Record<string, unknown>;
}

describe.each(await engines())('the firmware job routes (%s)', (engine) => {
  let main: TestBridge;
  let fw: FirmwareWorld;

  beforeAll(async () => {
    main = await startTestBridge({ engine });
    fw = await startFirmwareWorld(main);
  });

  afterAll(async () => {
    await fw?.close();
    await main?.close();
  });

  async function request(
    method: 'GET' | 'POST' | 'DELETE',
    url: string,
    opts: { sid?: string | null; headers?: Record<string, string>; body?: string } = {},
  ): Promise<Answer> {
    const sid = opts.sid === undefined ? fw.owner.sid : opts.sid;
    const res = await fw.app.inject({
      method,
      url,
      headers: {
        ...(sid ? { cookie: `sid=${sid}` } : {}),
        ...(opts.body === undefined ? {} : { 'content-type': 'application/json' }),
        ...opts.headers,
      },
      ...(opts.body === undefined ? {} : { payload: opts.body }),
    });
    return { status: res.statusCode, body: res.body, bytes: res.rawPayload, headers: res.headers };
  }

  const expectAnswer = (a: Answer, status: number, body?: string) =>
    expect(body === undefined ? a.status : [a.status, a.body], a.body.slice(0, 80)).toEqual(
      body === undefined ? status : [status, body],
    );

  describe.each(['fw', 'firmware'])('POST /0/devices/<id>/%s/<image>', (prefix) => {
    it('starts an update, and refuses one for each reason the document gives, leaving nothing behind', async () => {
      const { NAME, ARM, DOTTED, IMAGE } = fw;
      const dev = await fw.device();
      const nearby = await fw.device({ claim: false });
      await main.store.write((tx) => tx.devices.heard(nearby.id, fw.owner.id, main.clock.now()));
      const base = `/0/devices/${dev.id}/${prefix}`;
      const start = (url = `${base}/${NAME}`, sid?: string | null) => request('POST', url, { sid });
      /**
       * A start refused for one reason: nothing went to the device and no job is open; once `undo` takes the reason
       * away, the start (or `retry`, the same but for the reason) answers 200, and that job is ended.
       */
      const refusedFor = async (refused: () => Promise<Answer>, undo: () => unknown, retry = () => start()) => {
        const sent = fw.fwSent(dev.id).length;
        expectAnswer(await refused(), 400, 'device-fwup-start-fail');
        expect(fw.fwSent(dev.id), 'nothing went to the device').toHaveLength(sent);
        expect(await fw.openJob(dev.id), 'no job is open').toBeUndefined();
        await undo();
        expect((await retry()).body, 'the start once the reason is gone').toBe('device-ok');
        await fw.reportMeta(dev.id, { fwstate: 'failed' });
        expect(await fw.openJob(dev.id)).toBeUndefined();
      };

      // An image in the catalog, its name with slashes.
      expectAnswer(await start(), 200, 'device-ok');
      const first = fw.lastStart(dev.id);
      expect(first).toMatchObject({
        name: NAME,
        version: 7,
        platform: 'linux-x64',
        size: IMAGE.length,
        sha256: fw.sha256,
      });
      // What the agent checks before it downloads: the signature over the fields the start names.
      expect(verifyFirmware(first, first.signature, [fw.publicKey])).toBe(0);
      expect(new URL(first.url).pathname).toBe(`/0/firmware/jobs/${first.job}/image`);
      expect(await fw.openJob(dev.id)).toMatchObject({ id: first.job, name: NAME, cancelled: false });

      // An update running: the open job.
      const sent = fw.fwSent(dev.id).length;
      expectAnswer(await start(), 400, 'device-fwup-start-fail');
      expect(fw.fwSent(dev.id)).toHaveLength(sent);
      // An update running: the device reports one, with no job open.
      await fw.reportMeta(dev.id, { fwstate: 'cancelled' });
      expect(await fw.openJob(dev.id)).toBeUndefined();
      await fw.reportMeta(dev.id, { fwstate: 'downloading' });
      await refusedFor(start, () => fw.reportMeta(dev.id, { fwstate: 'failed' }));
      // The job cannot be handed to the link: it ends at once, nothing is running.
      fw.link.up = false;
      await refusedFor(start, () => (fw.link.up = true));
      // Not connected in d mode.
      await fw.reportMode(dev.id, 'master');
      await refusedFor(start, () => fw.reportMode(dev.id, 'connected'));
      // Not connected in meta state.
      await fw.reportState(dev.id, 'offline');
      expect((await main.store.devices.getVar(dev.id, 'meta', 'state'))?.value?.toString()).toBe('disconnected');
      await refusedFor(start, () => fw.reportState(dev.id, 'online'));
      // A platform the image does not update from.
      await refusedFor(
        () => start(`${base}/${ARM}`),
        () => undefined,
      );

      // A nearby device with no owner, by auth code.
      expectAnswer(await start(`/0/devices/${nearby.authcode}/${prefix}/${NAME}`), 200, 'device-ok');
      expect(fw.lastStart(nearby.id).name).toBe(NAME);

      expectAnswer(await start(`${base}/gateways/linux-x64/rootfs-8`), 400, 'device-fwup-name-fail');
      // Its slashes encoded, so that no client resolves the `..` away before the route reads it.
      expectAnswer(await start(`${base}/${DOTTED.replaceAll('/', '%2F')}`), 400, 'device-fwup-name-fail');
      // A path with a `..` segment, which the client resolves: an unknown name.
      expectAnswer(await start(`${base}/${DOTTED}`), 400, 'device-fwup-name-fail');

      // A job whose token expired while the device reports nothing running is over: a new one starts.
      expectAnswer(await start(), 200, 'device-ok');
      const expired = fw.lastStart(dev.id).job;
      fw.expireTokens();
      expectAnswer(await start(), 200, 'device-ok');
      expect(await main.store.fwJobs.get(expired)).toMatchObject({ open: false, outcome: 'abandoned' });
      expect((await fw.openJob(dev.id))?.id).toBe(fw.lastStart(dev.id).job);

      expectAnswer(await start(`${base}/${NAME}`, fw.stranger.sid), 400, 'device-fail');
      expectAnswer(await start(`/0/devices/${randomUUID()}/${prefix}/${NAME}`), 400, 'device-fail');
      expectAnswer(await request('POST', `${base}/${NAME}`, { body: '{"login":' }), 400, 'device-fwup-start-fail');
      expectAnswer(await start(`${base}/${NAME}`, null), 401, 'no-session');
    });
  });

  describe.each(['fw', 'firmware'])('DELETE /0/devices/<id>/%s', (prefix) => {
    it('cancels before the switch only, and only what is running', async () => {
      const before = await fw.device();
      const after = await fw.device();
      const idle = await fw.device();
      const job = (await fw.startJob(before.id)).job;
      await fw.startJob(after.id);
      await fw.reportMeta(before.id, { fwstate: 'downloading', fwprogress: '40' });
      const cancel = (id: string, sid?: string | null) => request('DELETE', `/0/devices/${id}/${prefix}`, { sid });

      // The cancel cannot be handed to the link.
      fw.link.up = false;
      expectAnswer(await cancel(before.id), 400, 'firmware-fail');
      fw.link.up = true;
      expect(await main.store.fwJobs.get(job)).toMatchObject({ open: true, cancelled: false });
      // Before the switch.
      expectAnswer(await cancel(before.id), 200, 'firmware-ok');
      expect(fw.fwSent(before.id).at(-1)).toMatchObject({ action: 'cancel', job });
      expect(await main.store.fwJobs.get(job)).toMatchObject({ open: true, cancelled: true });
      // After the switch: nothing goes down.
      for (const fwstate of ['switching', 'restarting', 'committing', 'rollingback']) {
        await fw.reportMeta(after.id, { fwstate });
        const sent = fw.fwSent(after.id).length;
        expectAnswer(await cancel(after.id), 400, 'firmware-fail');
        expect(fw.fwSent(after.id), fwstate).toHaveLength(sent);
      }
      expectAnswer(await cancel(idle.id), 400, 'firmware-fail');
      // The device confirmed the cancel: nothing running.
      await fw.reportMeta(before.id, { fwstate: 'cancelled' });
      expect(await main.store.fwJobs.get(job)).toMatchObject({ open: false, outcome: 'cancelled' });
      expectAnswer(await cancel(before.id), 400, 'firmware-fail');
      expectAnswer(await cancel(after.id, fw.stranger.sid), 400, 'firmware-fail');
      const broken = await request('DELETE', `/0/devices/${before.id}/${prefix}`, { body: '{"login":' });
      expectAnswer(broken, 400, 'firmware-fail');
      expectAnswer(await cancel(before.id, null), 401, 'no-session');
    });
  });

  describe('GET /0/firmware/jobs/<job>/image', () => {
    it('serves the image, whole or one range, to its job token only', async () => {
      const { IMAGE } = fw;
      const dev = await fw.device();
      const other = await fw.device();
      const ended = await fw.device();
      const start = await fw.startJob(dev.id);
      const otherStart = await fw.startJob(other.id);
      const endedStart = await fw.startJob(ended.id);
      await fw.reportMeta(ended.id, { fwstate: 'failed' });
      const path = new URL(start.url).pathname;
      const auth = `Bearer ${start.token}`;
      const get = (headers: Record<string, string>, url = path) => request('GET', url, { sid: null, headers });
      const size = IMAGE.length;
      /** A 200 or 206 with these bytes of the image. */
      const bytes = async (status: number, from: number, to: number, answer: Promise<Answer>) => {
        const r = await answer;
        expectAnswer(r, status);
        expect(r.bytes.equals(IMAGE.subarray(from, to + 1)), 'the bytes of the image').toBe(true);
        expect(r.headers['accept-ranges']).toBe('bytes');
        expect(r.headers['cache-control']).toBe('no-store');
        expect(Number(r.headers['content-length'])).toBe(to - from + 1);
        if (status === 206) expect(r.headers['content-range']).toBe(`bytes ${from}-${to}/${size}`);
      };

      await bytes(200, 0, size - 1, get({ authorization: auth }));
      // The job uuid in upper case, and an app that names no frontend: the route reads none.
      await bytes(
        200,
        0,
        size - 1,
        get({ authorization: auth }, `${path.replace(start.job, start.job.toUpperCase())}?app=${randomUUID()}`),
      );
      await bytes(206, 1000, size - 1, get({ authorization: auth, range: 'bytes=1000-' }));
      await bytes(206, 10, 19, get({ authorization: auth, range: 'bytes=10-19' }));
      // A range past the end, cut at it.
      await bytes(206, size - 5, size - 1, get({ authorization: auth, range: `bytes=${size - 5}-${size + 100}` }));
      await bytes(206, size - 100, size - 1, get({ authorization: auth, range: 'bytes=-100' }));
      // A Range in another unit is ignored: the whole image.
      await bytes(200, 0, size - 1, get({ authorization: auth, range: 'items=0-1' }));
      for (const range of ['bytes=-0', `bytes=${size}-`, 'bytes=20-10', 'bytes=0-1,5-6']) {
        const r = await get({ authorization: auth, range });
        expectAnswer(r, 416, '');
        expect(r.headers['content-range'], range).toBe(`bytes */${size}`);
      }
      for (const [why, headers, url] of [
        ['a wrong token', { authorization: `Bearer ${randomBytes(32).toString('base64url')}` }, path],
        ['no token', {}, path],
        ['another scheme', { authorization: `Basic ${start.token}` }, path],
        ["another open job's token", { authorization: `Bearer ${otherStart.token}` }, path],
        ['an unknown job', { authorization: auth }, `/0/firmware/jobs/${randomUUID()}/image`],
        ['a job that is not a uuid', { authorization: auth }, '/0/firmware/jobs/latest/image'],
        ['a job that ended', { authorization: `Bearer ${endedStart.token}` }, new URL(endedStart.url).pathname],
      ] as const) {
        const r = await get(headers, url);
        expect([r.status, r.body, why]).toEqual([401, 'unauthorized', why]);
      }
      fw.expireTokens();
      expectAnswer(await get({ authorization: auth }), 401, 'unauthorized');
    });
  });
});
