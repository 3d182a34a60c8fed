/**
 * The command routes request by request, on a bridge without a broker (commands stay `queued` until a device takes
 * them): what a command is stored as before it is answered, with its priority, lifetime and bytes; the older clients'
 * spelling; the list, newest first, and its `latest`; one command as the device's reports leave it; and a full
 * queue staying full. The answer checker is on: every answer here is also held to the API document. All of it runs
 * on each store engine (SQLite, and PostgreSQL when the test server answers: test/support/bridge.ts, `engines`).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type HttpClient, type TestBridge, engines, startTestBridge } from '../support/bridge.js';

describe.each(await engines())('the command routes (%s)', (engine) => {
  let b: TestBridge;
  let owner: HttpClient;
  let ownerId: number;
  /** Owned by `owner`; heard `owner` and has no owner; owned by `owner`, with `commands.maxOpen` commands open. */
  const own = { id: randomUUID(), authcode: randomBytes(16).toString('hex') };
  const nearby = { id: randomUUID(), authcode: randomBytes(16).toString('hex') };
  const full = { id: randomUUID(), authcode: randomBytes(16).toString('hex') };
  /** A command `own` ran, as the device's reports leave it, and one of bytes that are not printable ASCII. */
  const ran = randomUUID();
  const binary = randomUUID();
  const output = 'hello, the team\n';
  let t = 0;

  beforeAll(async () => {
    b = await startTestBridge({ engine });
    owner = b.client();
    const login = 'owner@example.com';
    expect((await owner.post('/0/session/signup', { form: { login, password: 'correct horse' } })).status).toBe(201);
    ownerId = (await b.store.userByLogin(b.defaultFrontend.id, login))!.id;
    t = b.clock.now();
    await b.store.write(async ({ devices, commands }) => {
      const add = (id: string, deviceId: string, command: Buffer) =>
        commands.add({ id, deviceId, userId: ownerId, command, priority: 1, createdAt: t, expiresAt: t + 60_000 });
      for (const d of [own, nearby, full]) {
        await devices.touch(d.id, t);
        await devices.setAuthcode(d.id, d.authcode);
      }
      await devices.claim(own.id, ownerId, t);
      await devices.claim(full.id, ownerId, t);
      await devices.heard(nearby.id, ownerId, t);
      await add(ran, own.id, Buffer.from('greet the team'));
      await commands.markSent(ran, t);
      await commands.report(own.id, { id: 'r1', cmd: ran, state: 'queued', at: t + 1 });
      await commands.report(own.id, { id: 'r2', cmd: ran, state: 'running', at: t + 2 });
      await commands.report(own.id, {
        id: 'r3',
        cmd: ran,
        state: 'done',
        at: t + 3,
        exitCode: 0,
        signal: null,
        output,
      });
      await add(binary, own.id, Buffer.from([0x62, 0x00, 0xff]));
      for (let i = 0; i < b.config.commands.maxOpen; i++) await add(randomUUID(), full.id, Buffer.from(`ping ${i}`));
    });
  });

  afterAll(async () => {
    await b?.close();
  });

  const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

  /** The command a 200 answered, as the bridge stored it before the answer. */
  async function stored(answer: { status: number; body: string }) {
    expect(answer.status, answer.body).toBe(200);
    expect(answer.body).toMatch(UUID_V4);
    const c = await b.store.commands.get(answer.body);
    expect(c, 'stored before the answer').toBeDefined();
    return { ...c!, lifetime: c!.expiresAt - c!.createdAt };
  }

  describe('POST /0/devices/<id>/', () => {
    it('stores the command with its priority, lifetime and bytes before it answers its uuid', async () => {
      const limits = b.config.commands;
      const url = `/0/devices/${own.id}`;
      const plain = await stored(await owner.post(url, { form: { command: 'ping' } }));
      expect(plain).toMatchObject({
        deviceId: own.id,
        priority: 0,
        state: 'queued',
        lifetime: limits.defaultLifetimeMs,
      });
      expect(plain.command.toString()).toBe('ping');
      // command64, priority and lifetime as JSON numbers, by auth code with a trailing slash.
      const json = { command64: 'YgD/', priority: 2, lifetime: 5000 };
      const numbers = await stored(await owner.post(`/0/devices/${own.authcode}/`, { json }));
      expect([numbers.command, numbers.priority, numbers.lifetime]).toEqual([Buffer.from([0x62, 0x00, 0xff]), 2, 5000]);
      // command64 wins over command.
      const both = await stored(
        await owner.post(url, { form: { command: 'ignored', command64: 'cGluZw==', priority: '1' } }),
      );
      expect([both.command.toString(), both.priority]).toEqual(['ping', 1]);
      expect(
        (await stored(await owner.post(`/0/devices/${nearby.authcode}`, { form: { command: 'ping' } }))).deviceId,
      ).toBe(nearby.id);
    });

    it('refuses a command past the open-command limit, and the queue stays as it was', async () => {
      const max = b.config.commands.maxOpen;
      expect(await b.store.commands.openCount(full.id)).toBe(max);
      for (const url of [`/0/devices/${full.id}`, `/0/devices/${full.id}/ping`]) {
        const r = await owner.post(url, url.endsWith('ping') ? {} : { form: { command: 'ping' } });
        expect([r.status, r.body]).toEqual([400, 'device-fail']);
      }
      expect(await b.store.commands.openCount(full.id)).toBe(max);
    });
  });

  describe("POST /0/devices/<id>/<command>, the older clients' spelling", () => {
    it('takes the decoded segment as the command, with the default priority and lifetime', async () => {
      const ping = await stored(await owner.post(`/0/devices/${own.id}/ping`));
      expect([ping.command.toString(), ping.priority, ping.lifetime]).toEqual([
        'ping',
        0,
        b.config.commands.defaultLifetimeMs,
      ]);
      const spaces = await stored(await owner.post(`/0/devices/${own.id}/greet%20the%20team`));
      expect(spaces.command.toString()).toBe('greet the team');
    });
  });

  describe('GET /0/devices/<id>/commands/ and /commands/<uuid>', () => {
    type Listed = { id: string; command?: string; command64?: string };
    const list = async (url: string) => JSON.parse((await owner.get(url)).body) as Listed[];

    it('lists newest first, bytes as command64, at most latest (0: up to 1000)', async () => {
      const all = await list(`/0/devices/${own.id}/commands/`);
      const ids = all.map((c) => c.id);
      expect(ids.indexOf(binary)).toBeLessThan(ids.indexOf(ran));
      expect(all.find((c) => c.id === binary)).toMatchObject({ command64: 'YgD/' });
      expect(all.find((c) => c.id === binary)).not.toHaveProperty('command');
      expect(await list(`/0/devices/${own.id}/commands/?latest=1`)).toHaveLength(1);
      const max = b.config.commands.maxOpen;
      expect(await list(`/0/devices/${full.id}/commands/?latest=0`)).toHaveLength(Math.min(max, 1000));
    });

    it('answers one command as its reports left it, by its uuid in either case', async () => {
      const expected = {
        ...{ id: ran, command: 'greet the team', priority: 1, state: 'done', created: t, expires: t + 60_000 },
        ...{ sent: t, delivered: t + 1, started: t + 2, finished: t + 3, exitCode: 0, signal: null, output },
        ...{ truncated: false, reason: null },
      };
      for (const id of [ran, ran.toUpperCase()]) {
        const r = await owner.get(`/0/devices/${own.id}/commands/${id}`);
        expect([r.status, JSON.parse(r.body)]).toEqual([200, expected]);
      }
      const queued = JSON.parse((await owner.get(`/0/devices/${own.id}/commands/${binary}`)).body) as object;
      expect(queued).toMatchObject({ command64: 'YgD/', state: 'queued', sent: null });
      // A command of another device is not found through this one.
      const other = await owner.get(`/0/devices/${nearby.authcode}/commands/${ran}`);
      expect([other.status, other.body]).toEqual([404, 'device-fail']);
    });
  });
});
