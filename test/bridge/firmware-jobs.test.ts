/**
 * Starting and cancelling a firmware update on the bridge, through HTTP on a listening bridge and a device that
 * speaks MQTT to its embedded broker: the checks of the start (name, connected in mode and state, platform, one
 * update at a time), the job on `down/fw`, the image behind its token with Range requests, and cancel before and
 * after the switch.
 */
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import mqtt, { type MqttClient } from 'mqtt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { importImage } from '../../bridge/firmware/catalog.js';
import { type FwMessage, encode, messageId, signFirmware, topicFor } from '../../protocol/index.js';
import { tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

const NAME = 'gateways/linux-x64/rootfs-7';
const IMAGE = randomBytes(300_000);

describe('firmware jobs on the bridge', () => {
  let live: LiveBridge;
  let http: HttpClient;
  let device: MqttClient;
  const id = randomUUID();
  const fw: FwMessage[] = [];

  const publish = (name: 'state' | 'up/hello' | 'up/vars' | 'up/meta', payload: unknown) =>
    device.publishAsync(topicFor(id, name), encode(name, payload as never), {
      qos: name === 'state' ? 0 : 1,
      retain: name === 'state',
    });
  let modeTime = Date.now();
  const setMode = async (mode: string) => {
    modeTime += 1;
    await publish('up/vars', {
      id: messageId(),
      items: [{ kind: 'push', type: 'd', name: 'mode', value: mode, time: modeTime, origin: 'device' }],
    });
    await until(
      async () => (await live.bridge.store.devices.getVar(id, 'd', 'mode'))?.value?.toString() === mode,
      `mode ${mode}`,
    );
  };
  const hello = () =>
    publish('up/hello', {
      id: messageId(),
      protocol: 1,
      deviceId: id,
      authcode: 'ab'.repeat(16),
      platform: 'linux-x64',
      agentVersion: '0.1.0',
      fwVersion: '6',
      mode: 'connected',
      bootTime: Date.now(),
      ts: Date.now(),
    });
  const fwstate = async (state: string) => {
    await publish('up/meta', { id: messageId(), ts: Date.now(), meta: { fwstate: state } });
    await until(
      async () => (await live.bridge.store.devices.getVar(id, 'meta', 'fwstate'))?.value?.toString() === state,
      state,
    );
  };

  beforeAll(async () => {
    live = await startLiveBridge();
    const store = live.bridge.store;
    // The catalog: one image for linux-x64, signed.
    const { privateKey } = generateKeyPairSync('ed25519');
    const file = join(tempDir(), 'image.tar.gz');
    writeFileSync(file, IMAGE);
    const { size, sha256 } = await importImage(store.firmware.imageDir, file);
    const meta = { name: NAME, platform: 'linux-x64', version: 7, size, sha256 };
    const signature = signFirmware(meta, privateKey.export({ type: 'pkcs8', format: 'pem' }));
    for (const [name, from] of [
      [NAME, ['linux-x64']],
      ['other/arm', ['linux-arm64']],
    ] as const) {
      await store.firmware.add({
        ...meta,
        name,
        from: [...from],
        toPlatform: 'linux-x64',
        signature,
        addedAt: Date.now(),
      });
    }

    // A device: its own credentials, online, hello, in mode connected.
    const secret = randomBytes(32).toString('hex');
    device = await mqtt.connectAsync(live.mqttUrl, { clientId: id, username: id, password: secret, clean: true });
    device.on('message', (topic, payload) => {
      if (topic === topicFor(id, 'down/fw')) fw.push(JSON.parse(payload.toString()) as FwMessage);
    });
    await device.subscribeAsync(`dc/v1/${id}/down/#`, { qos: 1 });
    await publish('state', 'online');
    await hello();
    await until(async () => (await store.devices.device(id))?.authcode, 'the hello');
    await setMode('connected');

    http = live.client();
    await http.post('/0/session/signup', { form: { login: 'fw@example.com', password: 'correct horse battery' } });
    expect((await http.post('/0/devices/', { form: { auth: 'ab'.repeat(16) } })).status).toBe(201);
  });

  afterAll(async () => {
    await device?.endAsync(true);
    await live?.close();
  });

  it('starts a job, serves its image with Range behind the token, cancels it before the switch', async () => {
    const r = await http.post(`/0/devices/${id}/fw/${NAME}`);
    expect([r.status, r.body]).toEqual([200, 'device-ok']);
    const start = await until(() => fw.find((m) => m.action === 'start'), 'down/fw start');
    if (start.action !== 'start') throw new Error('not a start');
    expect(start).toMatchObject({ name: NAME, version: 7, platform: 'linux-x64', size: IMAGE.length });

    // The image: whole, a range, and refused without the token or past its end.
    const auth = { authorization: `Bearer ${start.token}` };
    const whole = await fetch(start.url, { headers: auth });
    expect(whole.status).toBe(200);
    expect(Buffer.from(await whole.arrayBuffer()).equals(IMAGE)).toBe(true);
    const part = await fetch(start.url, { headers: { ...auth, range: 'bytes=1000-' } });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe(`bytes 1000-${IMAGE.length - 1}/${IMAGE.length}`);
    expect(Buffer.from(await part.arrayBuffer()).equals(IMAGE.subarray(1000))).toBe(true);
    expect((await fetch(start.url)).status).toBe(401);
    expect((await fetch(start.url, { headers: { authorization: 'Bearer nope' } })).status).toBe(401);
    expect((await fetch(start.url, { headers: { ...auth, range: `bytes=${IMAGE.length}-` } })).status).toBe(416);

    // One update at a time.
    expect((await http.post(`/0/devices/${id}/fw/${NAME}`)).body).toBe('device-fwup-start-fail');

    // Cancel while downloading: firmware-ok and a cancel on down/fw; the device's cancelled ends the job.
    await fwstate('downloading');
    const cancel = await http.request('DELETE', `/0/devices/${id}/fw`);
    expect([cancel.status, cancel.body]).toEqual([200, 'firmware-ok']);
    await until(() => fw.find((m) => m.action === 'cancel' && m.job === start.job), 'down/fw cancel');
    await fwstate('cancelled');
    expect(await live.bridge.store.fwJobs.openOf(id)).toBeUndefined();
    // The job's token no longer opens the image.
    expect((await fetch(start.url, { headers: auth })).status).toBe(401);
  });

  it('refuses to cancel after the switch, or with nothing running; the alias spelling works', async () => {
    const r = await http.post(`/0/devices/${id}/firmware/${NAME}`);
    expect(r.body).toBe('device-ok');
    await fwstate('switching');
    const refused = await http.request('DELETE', `/0/devices/${id}/firmware`);
    expect([refused.status, refused.body]).toEqual([400, 'firmware-fail']);
    await fwstate('done');
    expect((await http.request('DELETE', `/0/devices/${id}/fw`)).body).toBe('firmware-fail');
  });

  it('answers the start checks with the tokens of the specification', async () => {
    const start = (name: string) => http.post(`/0/devices/${id}/fw/${name}`);
    expect((await start('no/such/image')).body).toBe('device-fwup-name-fail');
    expect((await start('gateways%2F..%2Frootfs-7')).body).toBe('device-fwup-name-fail');
    // Not an image for this platform.
    expect((await start('other/arm')).body).toBe('device-fwup-start-fail');
    // Not in mode connected.
    await setMode('master');
    expect((await start(NAME)).body).toBe('device-fwup-start-fail');
    await setMode('connected');
    // Not connected.
    await publish('state', 'offline');
    await until(
      async () => (await live.bridge.store.devices.getVar(id, 'meta', 'state'))?.value?.toString() === 'disconnected',
      'offline',
    );
    expect((await start(NAME)).body).toBe('device-fwup-start-fail');
    await publish('state', 'online');
    await until(
      async () => (await live.bridge.store.devices.getVar(id, 'meta', 'state'))?.value?.toString() === 'connected',
      'online',
    );
    // Another user's device does not exist for them.
    const other = live.client();
    await other.post('/0/session/signup', { form: { login: 'other@example.com', password: 'correct horse battery' } });
    expect((await other.post(`/0/devices/${id}/fw/${NAME}`)).body).toBe('device-fail');
    expect((await other.request('DELETE', `/0/devices/${id}/fw`)).body).toBe('firmware-fail');
    // And with all in order, it starts.
    expect((await start(NAME)).body).toBe('device-ok');
  });

  it('sends an open job again on every hello, with a new token; a cancelled one as a cancel', async () => {
    const open = await live.bridge.store.fwJobs.openOf(id);
    if (!open) throw new Error('the previous test leaves a job open');
    const first = await until(() => {
      const starts = fw.filter((m) => m.action === 'start' && m.job === open.id);
      return starts.length > 0 ? starts : undefined;
    }, 'the start');
    expect(first).toHaveLength(1);
    await hello();
    const again = await until(() => {
      const starts = fw.filter((m) => m.action === 'start' && m.job === open.id);
      return starts.length === 2 ? starts[1] : undefined;
    }, 'the job sent again');
    if (again.action !== 'start' || first[0]!.action !== 'start') throw new Error('not a start');
    expect(again).toMatchObject({ name: NAME, url: first[0]!.url, sha256: first[0]!.sha256 });
    expect(again.token).not.toBe(first[0]!.token);
    // The new token opens the image, and so does the one it replaced (a download under way goes on); after one
    // more resend, the first one stops working.
    const opens = async (token: string) =>
      (await fetch(again.url, { headers: { authorization: `Bearer ${token}` } })).status;
    expect(await opens(again.token)).toBe(200);
    expect(await opens(first[0]!.token)).toBe(200);
    await hello();
    const third = await until(() => {
      const starts = fw.filter((m) => m.action === 'start' && m.job === open.id);
      return starts.length === 3 ? starts[2] : undefined;
    }, 'the job sent a third time');
    if (third.action !== 'start') throw new Error('not a start');
    expect(await opens(first[0]!.token)).toBe(401);
    expect(await opens(again.token)).toBe(200);
    expect(await opens(third.token)).toBe(200);

    // Cancelled while the device does not answer: the next hello carries the cancel, not the start.
    await fwstate('downloading');
    expect((await http.request('DELETE', `/0/devices/${id}/fw`)).body).toBe('firmware-ok');
    const cancels = () => fw.filter((m) => m.action === 'cancel' && m.job === open.id).length;
    await until(() => cancels() === 1, 'the cancel');
    await hello();
    await until(() => cancels() === 2, 'the cancel sent again');
    expect(fw.filter((m) => m.action === 'start' && m.job === open.id)).toHaveLength(3);
    await fwstate('cancelled');
    expect(await live.bridge.store.fwJobs.openOf(id)).toBeUndefined();
    // With no open job, a hello sends nothing.
    const before = fw.length;
    await hello();
    await until(
      async () => (await live.bridge.store.devices.getVar(id, 'meta', 'state'))?.value?.toString() === 'connected',
      'hello',
    );
    await fwstate('idle');
    expect(fw.length).toBe(before);
  });

  it('keeps the code of a failure as meta fwerrorcode; an agent without codes leaves it empty', async () => {
    const store = live.bridge.store;
    const metaOf = async (name: string) => (await store.devices.getVar(id, 'meta', name))?.value?.toString();
    const report = (meta: Record<string, string>) => publish('up/meta', { id: messageId(), ts: Date.now(), meta });
    // From the first hello, empty (decision 22).
    expect(await metaOf('fwerrorcode')).toBe('');
    expect((await http.post(`/0/devices/${id}/fw/${NAME}`)).body).toBe('device-ok');
    const job = (await store.fwJobs.openOf(id))!;
    await report({ fwstate: 'failed', fwerror: 'verify (signature): no key verifies it', fwerrorcode: 'signature' });
    await until(async () => (await metaOf('fwstate')) === 'failed', 'failed');
    expect([await metaOf('fwerror'), await metaOf('fwerrorcode')]).toEqual([
      'verify (signature): no key verifies it',
      'signature',
    ]);
    // Through the API like the other firmware variables, with a history.
    const shown = await http.get(`/0/devices/${id}/meta/fwerrorcode`);
    expect([shown.status, shown.body]).toEqual([200, JSON.stringify('signature')]);
    expect(await store.fwJobs.get(job.id)).toMatchObject({ open: false, outcome: 'failed' });

    // A malformed code drops the whole report: nothing of it is kept.
    await report({ fwstate: 'rolledback', fwerror: 'x', fwerrorcode: 'Not A Code!' });
    await report({ fwname: 'after the bad report' });
    await until(async () => (await metaOf('fwname')) === 'after the bad report', 'the next report');
    expect([await metaOf('fwstate'), await metaOf('fwerrorcode')]).toEqual(['failed', 'signature']);
    // A code from a newer agent that this bridge does not know is kept with its state.
    await report({ fwstate: 'failed', fwerror: 'brownout', fwerrorcode: 'brownout-during-flash' });
    await until(async () => (await metaOf('fwerrorcode')) === 'brownout-during-flash', 'the newer code');
    expect(await metaOf('fwstate')).toBe('failed');

    // An agent from before the codes reports the text alone: the code of the earlier failure does not stay.
    await report({ fwstate: 'downloading', fwerror: '' });
    await until(async () => (await metaOf('fwstate')) === 'downloading', 'downloading');
    expect([await metaOf('fwerror'), await metaOf('fwerrorcode')]).toEqual(['', '']);
    await report({ fwstate: 'failed', fwerror: 'download: the server answered 401' });
    await until(async () => (await metaOf('fwstate')) === 'failed', 'failed again');
    expect(await metaOf('fwerrorcode')).toBe('');
    // A report without fwerror (progress alone) leaves both as they are.
    await report({ fwstate: 'failed', fwerror: 'health check failed', fwerrorcode: 'health' });
    await until(async () => (await metaOf('fwerrorcode')) === 'health', 'health');
    await report({ fwprogress: '100' });
    await until(async () => (await metaOf('fwprogress')) === '100', 'progress');
    expect(await metaOf('fwerrorcode')).toBe('health');
  });
});
