/**
 * The Devices and Network sections of the specification, through HTTP against a listening bridge with its
 * embedded broker and real agents connected to it: claim (decisions 8 and 16), device objects and variable
 * shapes (decision 9), the six rules for variables and the four stamps of docs/decisions.md §3, history (decisions
 * 10 and 11), nearby and the network view (decisions 18 and 19), who may see what (decisions 3 and 14), and
 * presence in `meta` (decisions 21 and 22). All of it runs on each store engine (SQLite, and PostgreSQL when the
 * test server answers: test/support/bridge.ts, `engines`).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { rmSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type Frontend, ProductConfig } from '../../bridge/store/types.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import {
  type HttpClient,
  type HttpResult,
  type LiveBridge,
  type StoreEngine,
  engines,
  startLiveBridge,
} from '../support/bridge.js';
import { until } from '../support/wait.js';

// ---- shapes answered by the API ----

interface Rec {
  value?: string;
  value64?: string;
  time: number;
  acked?: number;
  synced?: number;
  syncacked?: number;
}
interface DeviceObject {
  d: Record<string, Rec>;
  s: Record<string, Rec>;
  meta: Record<string, Rec>;
}
interface HistoryEntry {
  key: string;
  value: string;
  value64?: string;
  deleted?: true;
  by: string;
  type: string;
  timestamp: number;
  id: number;
}

const D_KEYS = ['acked', 'syncacked', 'synced', 'time', 'value'];
const TEXT_KEYS = ['time', 'value'];
const PASSWORD = 'correct horse battery';

// ---- helpers ----

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

const randomHex = (bytes: number): string => randomBytes(bytes).toString('hex');

/** A user signed up in one frontend, talking to it through the Host header (decision 15). */
class User {
  id = 0;
  authcode = '';
  constructor(
    readonly http: HttpClient,
    readonly login: string,
    readonly host: string | undefined,
  ) {}

  request(
    method: string,
    path: string,
    form?: Record<string, string>,
    headers: Record<string, string> = {},
  ): Promise<HttpResult> {
    return this.http.request(method, path, {
      ...(form ? { form } : {}),
      headers: { ...(this.host ? { host: this.host } : {}), ...headers },
    });
  }
  get(path: string): Promise<HttpResult> {
    return this.request('GET', path);
  }
  post(path: string, form: Record<string, string> = {}, headers?: Record<string, string>): Promise<HttpResult> {
    return this.request('POST', path, form, headers);
  }
  del(path: string): Promise<HttpResult> {
    return this.request('DELETE', path);
  }
  /** A 200 JSON answer, parsed. */
  async json<T>(path: string): Promise<T> {
    const r = await this.get(path);
    expect(r.status, `GET ${path}: ${r.body}`).toBe(200);
    expect(r.contentType).toMatch(/^application\/json/);
    return JSON.parse(r.body) as T;
  }
  claim(auth: string, headers?: Record<string, string>): Promise<HttpResult> {
    return this.post('/0/devices/', { auth }, headers);
  }
  async network(): Promise<Record<string, DeviceObject>> {
    return this.json('/0/network/');
  }
}

/** A running agent and what the bridge knows it by. */
interface Device {
  agent: TestAgent;
  id: string;
  auth: string;
  stateDir: string;
}

/** One listening bridge with its embedded broker, and the agents and users of a test. */
class World {
  private agents: TestAgent[] = [];
  /** Agents shared by the tests of a group: stopped with the world, not after each test. */
  private kept: TestAgent[] = [];
  private readonly stateDirs = new Set<string>();
  private logins = 0;
  constructor(readonly live: LiveBridge) {}

  static async start(engine: StoreEngine, devices?: { nearbyWindowMs: number }): Promise<World> {
    return new World(await startLiveBridge({ engine, ...(devices ? { config: { devices } } : {}) }));
  }

  get store() {
    return this.live.bridge.store;
  }

  async frontend(config: Partial<ProductConfig>): Promise<Frontend> {
    const f: Frontend = {
      id: randomUUID(),
      name: 'product',
      config: ProductConfig.parse({ confirmationEmail: false, ...config }),
      isDefault: false,
      createdAt: Date.now(),
    };
    await this.store.createFrontend(f);
    return f;
  }

  async user(frontend?: Frontend): Promise<User> {
    const login = `u${++this.logins}-${randomHex(4)}@example.com`;
    const u = new User(this.live.client(), login, frontend ? `${frontend.id}.devcloud.test` : undefined);
    const r = await u.post('/0/session/signup', { login, password: PASSWORD });
    expect([r.status, r.body]).toEqual([201, 'signup-ok']);
    u.authcode = (await u.json<{ authcode: string }>('/0/user/')).authcode;
    u.id = (await this.store.userByLogin(frontend?.id ?? this.live.bridge.defaultFrontend.id, login))!.id;
    return u;
  }

  /** Starts an agent (on `stateDir` to restart one) and waits until the bridge has its hello. */
  async device(opts: { stateDir?: string; keep?: boolean } = {}): Promise<Device> {
    const stateDir = opts.stateDir ?? tempDir('devcloud-agent-');
    this.stateDirs.add(stateDir);
    const agent = await startAgent({ mqttUrl: this.live.mqttUrl, stateDir, level: 'info' });
    (opts.keep ? this.kept : this.agents).push(agent);
    const { deviceId: id, authcode: auth } = agent.agent.identity;
    const devices = this.store.devices;
    await until(
      async () =>
        (await devices.device(id))?.authcode === auth &&
        (await devices.getVar(id, 'meta', 'state'))?.value?.toString() === 'connected' &&
        (await devices.getVar(id, 'meta', 'agentversion')) !== undefined,
      'the hello of the agent',
    );
    return { agent, id, auth, stateDir };
  }

  /** Sends the user's authcode to the device over UDP, as a phone would, and waits until the bridge has it. */
  async hear(device: Device, user: User, payload = `${user.authcode}\n`): Promise<void> {
    await udpSend(device.agent.agent.nearby.port!, payload);
    await until(() => this.store.devices.heardBy(device.id, user.id, 0), 'the heard report');
  }

  /**
   * Sends the user's authcode to a device someone else owns, and waits until the bridge has dropped the report
   * (docs/api.md: a claimed device reports its owner only).
   */
  async hearDropped(device: Device, user: User): Promise<void> {
    const counters = this.live.bridge.devices.counters;
    const before = counters.heardForeign;
    await udpSend(device.agent.agent.nearby.port!, `${user.authcode}\n`);
    await until(() => counters.heardForeign > before, 'the heard report dropped');
  }

  /** A device claimed by `user`. */
  async owned(user: User, keep = false): Promise<Device> {
    const dev = await this.device({ keep });
    const r = await user.claim(dev.auth);
    expect([r.status, r.body]).toEqual([201, dev.id]);
    return dev;
  }

  async stopAgents(): Promise<void> {
    await Promise.all(this.agents.splice(0).map((a) => a.stop()));
  }

  async close(): Promise<void> {
    await this.stopAgents();
    await Promise.all(this.kept.splice(0).map((a) => a.stop()));
    await this.live.close();
    for (const dir of this.stateDirs) rmSync(dir, { recursive: true, force: true });
  }
}

/** The agent's own record of a variable, or `undefined` when it has none (or a tombstone). */
async function onAgent(dev: Device, type: 'd' | 's', name: string) {
  const local = await dev.agent.client();
  try {
    return await local.get(type, name);
  } catch (err) {
    if ((err as { code?: string }).code === 'not-found') return undefined;
    throw err;
  } finally {
    local.close();
  }
}

async function record(user: User, dev: Device, type: 'd' | 's', name: string): Promise<Rec> {
  return user.json<Rec>(`/0/devices/${dev.id}/${type}/${name}`);
}

async function history(user: User, path: string): Promise<HistoryEntry[]> {
  return user.json<HistoryEntry[]>(path);
}

const sorted = (o: object): string[] => Object.keys(o).sort();

/** The device's `d` and `s` once the agent acknowledged every version and sync (`meta` moves on its own). */
async function settled(user: User, dev: Device): Promise<Pick<DeviceObject, 'd' | 's'>> {
  return until(async () => {
    const { d, s } = await user.json<DeviceObject>(`/0/devices/${dev.id}`);
    const done = Object.values(d).every((r) => r.acked! >= r.time && r.syncacked! >= r.synced!);
    return done ? { d, s } : undefined;
  }, 'every d variable acknowledged');
}

async function varsOf(user: User, dev: Device): Promise<Pick<DeviceObject, 'd' | 's'>> {
  const { d, s } = await user.json<DeviceObject>(`/0/devices/${dev.id}`);
  return { d, s };
}

// ---- tests ----

describe.each(await engines())('the devices on %s', (engine) => {
  describe('devices and variables with real agents (embedded broker)', () => {
    let world: World;
    beforeAll(async () => {
      world = await World.start(engine);
    });
    afterEach(async () => {
      await world.stopAgents();
    });
    afterAll(async () => {
      await world.close();
    });

    describe('claim (decisions 8 and 16)', () => {
      it('201 with the uuid as text, {"id"} with Accept: application/json, idempotent for the owner, refused to another user', async () => {
        const [alice, bob] = [await world.user(), await world.user()];
        const dev = await world.device();

        const first = await alice.claim(dev.auth);
        expect([first.status, first.body]).toEqual([201, dev.id]);
        expect(first.contentType).toMatch(/^text\/plain/);

        const again = await alice.claim(dev.auth.toUpperCase(), { accept: 'application/json' });
        expect(again.status).toBe(201);
        expect(again.contentType).toMatch(/^application\/json/);
        expect(JSON.parse(again.body)).toEqual({ id: dev.id });
        const plainAgain = await alice.claim(dev.auth);
        expect([plainAgain.status, plainAgain.body]).toEqual([201, dev.id]);

        const stolen = await bob.claim(dev.auth);
        expect([stolen.status, stolen.body]).toEqual([400, 'claim-fail']);
        expect((await world.store.devices.device(dev.id))?.ownerId).toBe(alice.id);
      });

      const badAuth: Array<[string, Record<string, string>]> = [
        ['no auth field', {}],
        ['an empty auth', { auth: '' }],
        ['not hex', { auth: 'zz'.repeat(16) }],
        ['too short', { auth: 'abcd' }],
        ['too long', { auth: 'a'.repeat(129) }],
        ['a device uuid instead of its auth code', { auth: randomUUID() }],
        ['an auth code no device has', { auth: randomHex(16) }],
      ];
      it.each(badAuth)('%s: 400 claim-fail', async (_what, form) => {
        const u = await world.user();
        const r = await u.post('/0/devices/', form);
        expect([r.status, r.body]).toEqual([400, 'claim-fail']);
        expect(await u.json('/0/devices/')).toEqual({});
      });

      it('a product with registration off refuses every claim, even of a device that heard the user', async () => {
        const closed = await world.frontend({ registration: false });
        const u = await world.user(closed);
        const dev = await world.device();
        await world.hear(dev, u);
        const r = await u.claim(dev.auth);
        expect([r.status, r.body]).toEqual([400, 'claim-fail']);
        expect((await world.store.devices.device(dev.id))?.ownerId).toBeNull();
        expect(await u.json('/0/devices/')).toEqual({});
      });

      it('claimRequiresProximity: refused until the device heard the user over UDP, then 201', async () => {
        const near = await world.frontend({ claimRequiresProximity: true });
        const [u, other] = [await world.user(near), await world.user(near)];
        const dev = await world.device();

        const before = await u.claim(dev.auth);
        expect([before.status, before.body]).toEqual([400, 'claim-fail']);

        // Another user being heard does not help this one.
        await world.hear(dev, other);
        const stillBefore = await u.claim(dev.auth);
        expect([stillBefore.status, stillBefore.body]).toEqual([400, 'claim-fail']);

        await world.hear(dev, u);
        const after = await u.claim(dev.auth);
        expect([after.status, after.body]).toEqual([201, dev.id]);
        // One owner: the other user, heard too, cannot take it now.
        const late = await other.claim(dev.auth);
        expect([late.status, late.body]).toEqual([400, 'claim-fail']);
      });

      it('a product without proximity needs no UDP: a connected device is claimed by its auth code alone', async () => {
        const open = await world.frontend({ claimRequiresProximity: false, nearby: false });
        const u = await world.user(open);
        const dev = await world.device();
        const r = await u.claim(dev.auth);
        expect([r.status, r.body]).toEqual([201, dev.id]);
      });
    });

    describe('device collections and device objects (decision 9)', () => {
      it("GET /0/devices/ lists only the caller's devices, keyed by uuid, in claim order", async () => {
        const [alice, bob] = [await world.user(), await world.user()];
        const a1 = await world.owned(alice);
        const a2 = await world.owned(alice);
        const b1 = await world.owned(bob);

        const mine = await alice.json<Record<string, DeviceObject>>('/0/devices/');
        expect(Object.keys(mine)).toEqual([a1.id, a2.id]);
        expect(mine[a1.id]).toEqual(await alice.json(`/0/devices/${a1.id}`));
        const theirs = await bob.json<Record<string, DeviceObject>>('/0/devices/');
        expect(Object.keys(theirs)).toEqual([b1.id]);
        expect(await (await world.user()).json('/0/devices/')).toEqual({});
      });

      it('a device by uuid and by auth code (nearby id): d records with four stamps, s and meta with value and time', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        expect((await u.post(`/0/devices/${dev.id}/d/led`, { value: 'on' })).body).toBe('device-ok');
        expect((await u.post(`/0/devices/${dev.id}/s/note`, { value: 'kept here' })).body).toBe('device-ok');
        await until(async () => ((await record(u, dev, 'd', 'led')).acked ?? 0) > 0, 'led acked');

        const byId = await u.json<DeviceObject>(`/0/devices/${dev.id}`);
        expect(sorted(byId)).toEqual(['d', 'meta', 's']);
        // The same object by every id; `lastactivity` may move between two reads, so it is left out of the match.
        const steady = ({ meta: { lastactivity: _moves, ...meta }, ...rest }: DeviceObject) => ({ ...rest, meta });
        expect(steady(await u.json<DeviceObject>(`/0/devices/${dev.auth}`))).toEqual(steady(byId));
        expect(steady(await u.json<DeviceObject>(`/0/devices/${dev.auth.toUpperCase()}`))).toEqual(steady(byId));

        expect(sorted(byId.d.led!)).toEqual(D_KEYS);
        expect(byId.d.led!.value).toBe('on');
        expect(sorted(byId.s.note!)).toEqual(TEXT_KEYS);
        expect(byId.s.note!.value).toBe('kept here');
        // Decision 22: the bridge's own meta variables, every one a record of value and time.
        const decision22 = ['state', 'lastactivity', 'unique', 'platform', 'fwversion', 'agentversion'];
        for (const name of [...decision22, 'fwstate', 'fwprogress', 'fwname', 'fwerror', 'fwerrorcode']) {
          expect(sorted(byId.meta[name] ?? {}), name).toEqual(TEXT_KEYS);
          expect(typeof byId.meta[name]!.value, name).toBe('string');
          expect(Number.isInteger(byId.meta[name]!.time), name).toBe(true);
        }
        // The official client reads meta.unique.value.
        expect(byId.meta.unique!.value).toBe(dev.id);
        expect(byId.meta.state!.value).toBe('connected');
        // A device that has not updated its firmware: idle, no progress, no image, no error.
        expect([byId.meta.fwstate!.value, byId.meta.fwprogress!.value, byId.meta.fwname!.value]).toEqual([
          'idle',
          '0',
          '',
        ]);
        expect(byId.meta.fwerror!.value).toBe('');
        expect(byId.meta.fwerrorcode!.value).toBe('');

        // Rule 6 and decision 9: a meta variable alone is its bare value, a JSON string.
        const unique = await u.get(`/0/devices/${dev.id}/meta/unique`);
        expect(unique.status).toBe(200);
        expect(unique.body).toBe(JSON.stringify(dev.id));
        expect(await u.json(`/0/devices/${dev.auth}/meta/state`)).toBe('connected');
        // d and s variables alone are records.
        expect(await record(u, dev, 'd', 'led')).toEqual(byId.d.led);
        expect(await record(u, dev, 's', 'note')).toEqual(byId.s.note);
      });

      it('rule 5: /d, /s and /meta list the variables of their type only', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        await u.post(`/0/devices/${dev.id}/d/a`, { value: '1' });
        await u.post(`/0/devices/${dev.id}/d/b`, { value: '2' });
        await u.post(`/0/devices/${dev.id}/s/c`, { value: '3' });
        const both = await settled(u, dev);

        const d = await u.json<Record<string, Rec>>(`/0/devices/${dev.id}/d`);
        expect(Object.keys(d).sort()).toEqual(['a', 'b']);
        for (const rec of Object.values(d)) expect(sorted(rec)).toEqual(D_KEYS);
        const s = await u.json<Record<string, Rec>>(`/0/devices/${dev.id}/s`);
        expect(Object.keys(s)).toEqual(['c']);
        expect(sorted(s.c!)).toEqual(TEXT_KEYS);
        const meta = await u.json<Record<string, Rec>>(`/0/devices/${dev.auth}/meta`);
        expect(meta.unique?.value).toBe(dev.id);
        expect({ d, s }).toEqual(both);
      });

      it('binary values: value64 in, value64 out, the same bytes on the agent and back from it', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const bytes = Buffer.from([0xff, 0xfe, 0x00, 0x80, 0x41, 0xc3]);
        const b64 = bytes.toString('base64');
        expect((await u.post(`/0/devices/${dev.id}/d/blob`, { value64: b64 })).body).toBe('device-ok');

        const rec = await record(u, dev, 'd', 'blob');
        expect(rec.value64).toBe(b64);
        expect(rec).not.toHaveProperty('value');
        const onDevice = await until(() => onAgent(dev, 'd', 'blob'), 'blob on the agent');
        expect(onDevice.value64).toBe(b64);
        expect((await u.json<DeviceObject>(`/0/devices/${dev.id}`)).d.blob?.value64).toBe(b64);
        const [entry] = await history(u, `/0/devices/${dev.id}/d/blob?latest=1`);
        // Decision 28: `value` is always there; for bytes that are not UTF-8 it is for display, `value64` exact.
        expect(entry).toMatchObject({ key: 'blob', value64: b64, value: bytes.toString('utf8') });
        expect(entry!.value).toBe('\ufffd\ufffd\u0000\ufffdA\ufffd');

        // value64 wins over value; valid UTF-8 sent as value64 reads back as value.
        await u.post(`/0/devices/${dev.id}/s/both`, { value: 'text', value64: b64 });
        expect((await record(u, dev, 's', 'both')).value64).toBe(b64);
        await u.post(`/0/devices/${dev.id}/s/utf8`, { value64: Buffer.from('héllo ✓').toString('base64') });
        expect((await record(u, dev, 's', 'utf8')).value).toBe('héllo ✓');

        // A binary value set on the gateway comes through the API as value64.
        const local = await dev.agent.client();
        await local.set('d', 'raw', Buffer.from([0x00, 0xff, 0x10]));
        local.close();
        const raw = await until(async () => {
          const r = await u.get(`/0/devices/${dev.id}/d/raw`);
          return r.status === 200 ? (JSON.parse(r.body) as Rec) : undefined;
        }, 'raw through the API');
        expect(raw.value64).toBe(Buffer.from([0x00, 0xff, 0x10]).toString('base64'));
      });

      it('an unknown or malformed device id: GET 404 device-fail, POST and DELETE 400 device-fail (decision 14)', async () => {
        const u = await world.user();
        for (const id of [randomUUID(), randomHex(16), 'not-a-device', '12345']) {
          for (const path of [
            `/0/devices/${id}`,
            `/0/devices/${id}/d`,
            `/0/devices/${id}/d/x`,
            `/0/devices/${id}/d/x?latest=3`,
          ]) {
            const r = await u.get(path);
            expect([path, r.status, r.body]).toEqual([path, 404, 'device-fail']);
          }
          for (const [method, path] of [
            ['POST', `/0/devices/${id}/d/x`],
            ['DELETE', `/0/devices/${id}/d/x`],
            ['DELETE', `/0/devices/${id}`],
          ] as const) {
            const r = await u.request(method, path, method === 'POST' ? { value: 'v' } : undefined);
            expect([method, path, r.status, r.body]).toEqual([method, path, 400, 'device-fail']);
          }
        }
      });

      it('DELETE /0/devices/<id> unregisters: device-ok, then gone; its server data goes; another user may claim it', async () => {
        const [alice, bob] = [await world.user(), await world.user()];
        const dev = await world.owned(alice);
        await alice.post(`/0/devices/${dev.id}/s/secret`, { value: 'alice only' });

        const r = await alice.del(`/0/devices/${dev.auth}`);
        expect([r.status, r.body]).toEqual([200, 'device-ok']);
        expect(await alice.json('/0/devices/')).toEqual({});
        const gone = await alice.get(`/0/devices/${dev.id}`);
        expect([gone.status, gone.body]).toEqual([404, 'device-fail']);
        const twice = await alice.del(`/0/devices/${dev.id}`);
        expect([twice.status, twice.body]).toEqual([400, 'device-fail']);

        expect((await bob.claim(dev.auth)).status).toBe(201);
        const seen = await bob.json<DeviceObject>(`/0/devices/${dev.id}`);
        expect(seen.s).toEqual({});
        expect(seen.meta.unique?.value).toBe(dev.id);
      });
    });

    describe('variables: the six rules', () => {
      it('POST d creates and pushes: the agent has it, acked only after it committed it', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const t0 = Date.now();
        const r = await u.post(`/0/devices/${dev.id}/d/led`, { value: 'on' });
        const t1 = Date.now();
        expect([r.status, r.body]).toEqual([200, 'device-ok']);
        expect(r.contentType).toMatch(/^text\/plain/);

        const now = await record(u, dev, 'd', 'led');
        expect(now.value).toBe('on');
        expect(now.time).toBeGreaterThanOrEqual(t0);
        expect(now.time).toBeLessThanOrEqual(t1);
        // Acked is 0 or, once the agent answered, at least the time: never in between.
        expect(now.acked === 0 || now.acked! >= now.time).toBe(true);

        const acked = await until(async () => {
          const rec = await record(u, dev, 'd', 'led');
          return rec.acked! >= rec.time ? rec : undefined;
        }, 'led acked');
        const local = await onAgent(dev, 'd', 'led');
        expect(local).toMatchObject({ value: 'on', time: now.time, origin: 'cloud' });
        // The agent committed (its own stamp) before it acknowledged (the bridge's stamp).
        expect(acked.acked).toBeGreaterThanOrEqual(local!.acked);
        expect(acked.time).toBe(now.time);
      });

      it('an empty value is a value, not a sync: stored as "" and pushed to the agent', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        await u.post(`/0/devices/${dev.id}/d/label`, { value: 'x' });
        expect((await u.post(`/0/devices/${dev.id}/d/label`, { value: '' })).body).toBe('device-ok');
        const rec = await record(u, dev, 'd', 'label');
        expect(rec.value).toBe('');
        expect(rec.synced).toBe(0);
        await until(async () => (await onAgent(dev, 'd', 'label'))?.value === '', 'the empty label on the agent');
        await until(async () => {
          const r = await record(u, dev, 'd', 'label');
          return r.acked! >= r.time;
        }, 'the empty label acked');
      });

      it('POST s stays on the server: created, updated, never reaches the agent', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        expect((await u.post(`/0/devices/${dev.id}/s/note`, { value: 'one' })).body).toBe('device-ok');
        expect((await u.post(`/0/devices/${dev.id}/s/note`, { value: 'two' })).body).toBe('device-ok');
        // A d variable set afterwards reaches the agent: by then the s one would have too, had it been sent.
        await u.post(`/0/devices/${dev.id}/d/marker`, { value: 'x' });
        await until(() => onAgent(dev, 'd', 'marker'), 'marker on the agent');
        expect(await onAgent(dev, 's', 'note')).toBeUndefined();
        expect(await onAgent(dev, 'd', 'note')).toBeUndefined();
        const rec = await record(u, dev, 's', 'note');
        expect(rec.value).toBe('two');
        expect(sorted(rec)).toEqual(TEXT_KEYS);
      });

      it('DELETE d is a tombstone synchronised to the agent; DELETE s; deleting what is not there is device-fail', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        await u.post(`/0/devices/${dev.id}/d/led`, { value: 'on' });
        await until(() => onAgent(dev, 'd', 'led'), 'led on the agent');

        const del = await u.del(`/0/devices/${dev.id}/d/led`);
        expect([del.status, del.body]).toEqual([200, 'device-ok']);
        await until(async () => (await onAgent(dev, 'd', 'led')) === undefined, 'led removed on the agent');
        const local = await dev.agent.client();
        expect((await local.list('d')).map((v) => v.name)).not.toContain('led');
        local.close();
        const gone = await u.get(`/0/devices/${dev.id}/d/led`);
        expect([gone.status, gone.body]).toEqual([404, 'device-fail']);
        expect((await u.json<DeviceObject>(`/0/devices/${dev.id}`)).d).not.toHaveProperty('led');
        expect(await u.json(`/0/devices/${dev.id}/d`)).not.toHaveProperty('led');
        // The tombstone is acknowledged like any version.
        await until(async () => {
          const v = await world.store.devices.getVar(dev.id, 'd', 'led');
          return v !== undefined && v.value === null && v.acked >= v.time;
        }, 'the tombstone acked');
        const [entry] = await history(u, `/0/devices/${dev.id}/d/led?latest=1`);
        // Decision 28: a deletion has `value` "" beside `deleted`.
        expect(entry).toMatchObject({ key: 'led', value: '', deleted: true, by: 'user', type: 'd' });
        expect(entry).not.toHaveProperty('value64');

        await u.post(`/0/devices/${dev.id}/s/note`, { value: 'x' });
        expect((await u.del(`/0/devices/${dev.id}/s/note`)).body).toBe('device-ok');
        expect((await u.get(`/0/devices/${dev.id}/s/note`)).status).toBe(404);

        for (const path of [`d/led`, `s/note`, `d/never`, `s/never`]) {
          const r = await u.del(`/0/devices/${dev.id}/${path}`);
          expect([path, r.status, r.body]).toEqual([path, 400, 'device-fail']);
        }
        // A deleted variable can be set again.
        expect((await u.post(`/0/devices/${dev.id}/d/led`, { value: 'back' })).body).toBe('device-ok');
        await until(async () => (await onAgent(dev, 'd', 'led'))?.value === 'back', 'led back on the agent');
      });

      const refused: Array<[string, 'POST' | 'DELETE', string, Record<string, string> | undefined]> = [
        ['POST a meta variable (decision 22)', 'POST', 'meta/state', { value: 'disconnected' }],
        ['POST a new meta variable', 'POST', 'meta/custom', { value: 'x' }],
        ['DELETE a meta variable', 'DELETE', 'meta/unique', undefined],
        ['POST an unknown type', 'POST', 'x/led', { value: 'x' }],
        ['POST a malformed name', 'POST', 'd/-bad', { value: 'x' }],
        ['POST a name too long', 'POST', `d/${'n'.repeat(65)}`, { value: 'x' }],
        ['POST a value over 64 KiB', 'POST', 'd/big', { value: 'v'.repeat(64 * 1024 + 1) }],
        ['POST value64 that is not base64', 'POST', 'd/bin', { value64: '!!!!' }],
        ['POST a sync of a d variable that does not exist', 'POST', 'd/nothing', {}],
        ['POST an s variable with no value', 'POST', 's/empty', {}],
      ];
      describe('refused changes', () => {
        let u: User;
        let dev: Device;
        let before: Pick<DeviceObject, 'd' | 's'>;
        beforeAll(async () => {
          u = await world.user();
          dev = await world.owned(u, true);
          await u.post(`/0/devices/${dev.id}/d/led`, { value: 'on' });
          await u.post(`/0/devices/${dev.id}/s/note`, { value: 'n' });
          before = await settled(u, dev);
        });
        it.each(refused)('%s: 400 device-fail', async (_what, method, path, form) => {
          const r = await u.request(method, `/0/devices/${dev.id}/${path}`, form);
          expect([r.status, r.body]).toEqual([400, 'device-fail']);
          expect(await varsOf(u, dev)).toEqual(before);
          expect((await u.json<DeviceObject>(`/0/devices/${dev.id}`)).meta.state?.value).toBe('connected');
        });
      });

      it('GET of a variable that does not exist: 404 device-fail, for every type', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        for (const path of ['d/none', 's/none', 'meta/none', 'x/none', 'd/-bad', 'nope']) {
          const r = await u.get(`/0/devices/${dev.id}/${path}`);
          expect([path, r.status, r.body]).toEqual([path, 404, 'device-fail']);
        }
      });

      it('a change made on the gateway shows through the API, acked by the bridge, and in history by device', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const local = await dev.agent.client();
        const set = await local.set('d', 'temp', '21.5');
        const rec = await until(async () => {
          const r = await u.get(`/0/devices/${dev.id}/d/temp`);
          return r.status === 200 ? (JSON.parse(r.body) as Rec) : undefined;
        }, 'temp through the API');
        expect(rec.value).toBe('21.5');
        expect(rec.time).toBe(set.time);
        expect(rec.acked).toBeGreaterThanOrEqual(rec.time);
        // The agent records the bridge's acknowledgement in its own acked stamp.
        const acked = await until(async () => {
          const v = await local.get('d', 'temp');
          return v.acked >= v.time ? v : undefined;
        }, 'temp acked on the agent');
        expect(acked.origin).toBe('device');
        local.close();
        const [entry] = await history(u, `/0/devices/${dev.id}/d/temp?latest=5`);
        expect(entry).toMatchObject({ key: 'temp', value: '21.5', by: 'device', type: 'd', timestamp: set.time });
      });
    });

    describe('the four stamps (docs/decisions.md §3)', () => {
      it('a sync: synced grows strictly on every sync, syncacked reaches it after the ack, time and value unchanged', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        await u.post(`/0/devices/${dev.id}/d/mode`, { value: 'master' });
        const set = await until(async () => {
          const r = await record(u, dev, 'd', 'mode');
          return r.acked! >= r.time ? r : undefined;
        }, 'mode acked');
        expect([set.synced, set.syncacked]).toEqual([0, 0]);

        let last = 0;
        for (let i = 0; i < 3; i++) {
          const r = await u.post(`/0/devices/${dev.id}/d/mode`);
          expect([r.status, r.body]).toEqual([200, 'device-ok']);
          const now = await record(u, dev, 'd', 'mode');
          expect(now.synced).toBeGreaterThan(last);
          last = now.synced!;
          expect({ value: now.value, time: now.time }).toEqual({ value: 'master', time: set.time });
          expect(now.acked).toBe(set.acked);
        }
        const done = await until(async () => {
          const r = await record(u, dev, 'd', 'mode');
          return r.syncacked! >= r.synced! ? r : undefined;
        }, 'mode syncacked');
        expect(done.synced).toBe(last);
        expect(done.syncacked).toBeGreaterThanOrEqual(last);
        // The agent kept the version it had: a sync changes nothing on the device.
        expect(await onAgent(dev, 'd', 'mode')).toMatchObject({ value: 'master', time: set.time, origin: 'cloud' });
      });

      it('while the agent is away: time set, acked and syncacked stay behind; its return catches up and they advance', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        await u.post(`/0/devices/${dev.id}/d/fan`, { value: 'low' });
        await u.post(`/0/devices/${dev.id}/d/old`, { value: 'to be deleted' });
        await settled(u, dev);
        await dev.agent.stop();
        await until(
          async () => (await u.json<string>(`/0/devices/${dev.id}/meta/state`)) === 'disconnected',
          'offline',
        );

        const t0 = Date.now();
        await u.post(`/0/devices/${dev.id}/d/fan`, { value: 'high' });
        await u.post(`/0/devices/${dev.id}/d/fan`);
        await u.post(`/0/devices/${dev.id}/d/new`, { value: 'made while away' });
        expect((await u.del(`/0/devices/${dev.id}/d/old`)).body).toBe('device-ok');
        const away = await record(u, dev, 'd', 'fan');
        expect(away.value).toBe('high');
        expect(away.time).toBeGreaterThanOrEqual(t0);
        expect(away.acked).toBe(0);
        expect(away.synced).toBeGreaterThanOrEqual(away.time);
        expect(away.syncacked).toBeLessThan(away.synced!);

        const again = await world.device({ stateDir: dev.stateDir });
        expect(again.id).toBe(dev.id);
        const back = await until(async () => {
          const r = await record(u, dev, 'd', 'fan');
          return r.acked! >= r.time && r.syncacked! >= r.synced! ? r : undefined;
        }, 'fan acked and syncacked after the return');
        expect({ value: back.value, time: back.time, synced: back.synced }).toEqual({
          value: 'high',
          time: away.time,
          synced: away.synced,
        });
        const local = await onAgent(again, 'd', 'fan');
        expect(local).toMatchObject({ value: 'high', time: away.time, origin: 'cloud' });
        expect(back.acked).toBeGreaterThanOrEqual(local!.acked);
        // What else changed while it was away reached it too: a new variable, and a deletion.
        await until(async () => (await onAgent(again, 'd', 'new'))?.value === 'made while away', 'new on the agent');
        await until(async () => (await onAgent(again, 'd', 'old')) === undefined, 'old deleted on the agent');
        const after = await settled(u, dev);
        expect(Object.keys(after.d).sort()).toEqual(['fan', 'new']);
      });

      it('every POST of a value gets a time newer than the one before, and the agent ends with the last', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const times: number[] = [];
        for (const v of ['1', '2', '3', '4']) {
          await u.post(`/0/devices/${dev.id}/d/n`, { value: v });
          times.push((await record(u, dev, 'd', 'n')).time);
        }
        for (let i = 1; i < times.length; i++) expect(times[i]).toBeGreaterThan(times[i - 1]!);
        const final = await until(async () => {
          const r = await record(u, dev, 'd', 'n');
          return r.acked! >= r.time ? r : undefined;
        }, 'the last version acked');
        expect(final.time).toBe(times[3]);
        expect(await onAgent(dev, 'd', 'n')).toMatchObject({ value: '4', time: times[3] });
      });
    });

    describe('timestamp on a POST (decision 26)', () => {
      it('stamps the version: the device gets that time; an older stamp than the held one is 409, outside the window 400', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const path = `/0/devices/${dev.id}/d/reading`;
        const stamp = Date.now() - 10 * 60_000;
        const set = await u.post(path, { value: 'ten minutes ago', timestamp: String(stamp) });
        expect([set.status, set.body]).toEqual([200, 'device-ok']);
        expect(await record(u, dev, 'd', 'reading')).toMatchObject({ value: 'ten minutes ago', time: stamp });
        // The stamp reaches the device as the version's time, and is acknowledged.
        const onDevice = await until(async () => {
          const v = await onAgent(dev, 'd', 'reading');
          return v?.value === 'ten minutes ago' ? v : undefined;
        }, 'the stamped value on the agent');
        expect(onDevice).toMatchObject({ time: stamp, origin: 'cloud' });
        await until(async () => (await record(u, dev, 'd', 'reading')).acked! >= stamp, 'the stamped value acked');
        const [entry] = await history(u, `${path}?latest=1`);
        expect(entry).toMatchObject({ value: 'ten minutes ago', timestamp: stamp, by: 'user' });

        // At or before the held version's time: it would lose at once, so nothing changes (not an ok).
        for (const older of [stamp, stamp - 1]) {
          const r = await u.post(path, { value: 'older', timestamp: String(older) });
          expect([r.status, r.body]).toEqual([409, 'device-fail-older']);
        }
        // Outside the window, malformed, or with no value to stamp: 400, nothing changes.
        const bad = [String(Date.now() - 2 * 3_600_000), String(Date.now() + 5 * 60_000), 'soon', '-5', '1.5', ''];
        for (const timestamp of bad) {
          const r = await u.post(path, { value: 'bad', timestamp });
          expect([timestamp, r.status, r.body]).toEqual([timestamp, 400, 'device-fail']);
        }
        const sync = await u.post(path, { timestamp: String(Date.now()) });
        expect([sync.status, sync.body]).toEqual([400, 'device-fail']);
        expect(await record(u, dev, 'd', 'reading')).toMatchObject({ value: 'ten minutes ago', time: stamp });

        // A later stamp wins, and a change without a stamp follows it.
        expect((await u.post(path, { value: 'newer', timestamp: String(stamp + 1) })).body).toBe('device-ok');
        expect((await u.post(path, { value: 'now' })).body).toBe('device-ok');
        const now = await record(u, dev, 'd', 'reading');
        expect(now.value).toBe('now');
        expect(now.time).toBeGreaterThan(stamp + 1);
        await until(async () => (await onAgent(dev, 'd', 'reading'))?.value === 'now', 'the last value on the agent');
        // An s variable takes a stamp too (acknowledged by being on the server).
        expect((await u.post(`/0/devices/${dev.id}/s/note`, { value: 'n', timestamp: String(stamp) })).body).toBe(
          'device-ok',
        );
        expect(await record(u, dev, 's', 'note')).toEqual({ value: 'n', time: stamp });
      });
    });

    describe('history (decisions 10 and 11)', () => {
      it('latest=N newest first; by user, device and server; meta changes too', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        for (const v of ['a', 'b', 'c', 'd', 'e']) await u.post(`/0/devices/${dev.id}/d/x`, { value: v });
        const three = await history(u, `/0/devices/${dev.id}/d/x?latest=3`);
        expect(three.map((h) => h.value)).toEqual(['e', 'd', 'c']);
        for (const h of three) {
          expect(sorted(h)).toEqual(['by', 'id', 'key', 'timestamp', 'type', 'value']);
          expect(h).toMatchObject({ key: 'x', by: 'user', type: 'd' });
        }
        expect(three[0]!.timestamp).toBe((await record(u, dev, 'd', 'x')).time);
        expect(three[0]!.id).toBeGreaterThan(three[1]!.id);
        expect(three[1]!.timestamp).toBeGreaterThan(three[2]!.timestamp);
        expect(await history(u, `/0/devices/${dev.id}/d/x?latest=100`)).toHaveLength(5);

        await u.post(`/0/devices/${dev.id}/s/y`, { value: 'server side' });
        expect(await history(u, `/0/devices/${dev.id}/s/y?latest=1`)).toMatchObject([
          { key: 'y', type: 's', by: 'user' },
        ]);
        // A sync is not a new value: no entry.
        await u.post(`/0/devices/${dev.id}/d/x`);
        expect(await history(u, `/0/devices/${dev.id}/d/x?latest=100`)).toHaveLength(5);

        const state = await history(u, `/0/devices/${dev.id}/meta/state?latest=10`);
        expect(state[0]).toMatchObject({ key: 'state', value: 'connected', by: 'server', type: 'meta' });
        const unique = await history(u, `/0/devices/${dev.id}/meta/unique?latest=10`);
        expect(unique).toMatchObject([{ key: 'unique', value: dev.id, type: 'meta', by: 'device' }]);
        const never = await history(u, `/0/devices/${dev.id}/d/never?latest=10`);
        expect(never).toEqual([]);
      });

      it('latest=0 and latest above 1000 give 1000; from=<id> pages backwards without overlap', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const base = Date.now() - 10_000_000;
        await world.store.write(async (tx) => {
          for (let i = 0; i < 1500; i++) {
            await tx.devices.putVersion(
              dev.id,
              { type: 's', name: 'bulk', value: Buffer.from(`v${i}`), time: base + i, origin: 'cloud' },
              base + i,
              'user',
            );
          }
        });
        const path = `/0/devices/${dev.id}/s/bulk`;
        const expectNewest = (h: HistoryEntry[], from: number, n: number) =>
          expect(h.map((e) => e.value)).toEqual(Array.from({ length: n }, (_, i) => `v${from - i}`));

        const zero = await history(u, `${path}?latest=0`);
        expect(zero).toHaveLength(1000);
        expectNewest(zero, 1499, 1000);
        for (const latest of ['1000', '1001', '5000', '999999999999999']) {
          expect(await history(u, `${path}?latest=${latest}`), latest).toEqual(zero);
        }
        expectNewest(await history(u, `${path}?latest=1`), 1499, 1);
        expectNewest(await history(u, `${path}?latest=999`), 1499, 999);

        const ids = zero.map((e) => e.id);
        for (let i = 1; i < ids.length; i++) expect(ids[i]).toBeLessThan(ids[i - 1]!);
        const page2 = await history(u, `${path}?latest=1000&from=${ids[999]}`);
        expectNewest(page2, 499, 500);
        expect(Math.max(...page2.map((e) => e.id))).toBeLessThan(ids[999]!);
        expect(new Set([...ids, ...page2.map((e) => e.id)]).size).toBe(1500);
        // from alone pages too (latest defaults to the most); small pages walk the same entries.
        expect(await history(u, `${path}?from=${ids[999]}`)).toEqual(page2);
        const walked: string[] = [];
        let from = '';
        for (;;) {
          const page = await history(u, `${path}?latest=400${from}`);
          if (page.length === 0) break;
          walked.push(...page.map((e) => e.value));
          from = `&from=${page[page.length - 1]!.id}`;
        }
        expect(walked).toEqual(Array.from({ length: 1500 }, (_, i) => `v${1499 - i}`));
        // Without latest or from: the single variable.
        expect((await record(u, dev, 's', 'bulk')).value).toBe('v1499');
      });

      it('startid=<id> pages forwards as the official client does: the oldest entries at or above it, newest first', async () => {
        const u = await world.user();
        const dev = await world.owned(u);
        const base = Date.now() - 10_000_000;
        const put = (from: number, to: number) =>
          world.store.write(async (tx) => {
            for (let i = from; i < to; i++) {
              const v = { type: 's' as const, name: 'fwd', value: Buffer.from(`v${i}`), time: base + i };
              await tx.devices.putVersion(dev.id, { ...v, origin: 'cloud' }, base + i, 'user');
            }
          });
        await put(0, 250);
        const path = `/0/devices/${dev.id}/s/fwd`;
        const all = await history(u, `${path}?latest=0`);
        const first = all.at(-1)!.id;

        // The oldest `latest` at or above startid, answered newest first like every history answer.
        const page = await history(u, `${path}?latest=100&startid=${first}`);
        expect(page.map((e) => e.value)).toEqual(Array.from({ length: 100 }, (_, i) => `v${99 - i}`));
        // startid itself is included; below it nothing.
        const at = await history(u, `${path}?latest=1&startid=${all[10]!.id}`);
        expect(at.map((e) => e.id)).toEqual([all[10]!.id]);

        // The client's loop: `startid` one more than the highest id seen; entries arriving meanwhile are not
        // missed, and nothing comes twice.
        const seen: string[] = [];
        let startid = first;
        for (let round = 0; round < 10; round++) {
          const got = await history(u, `${path}?latest=100&startid=${startid}`);
          if (round === 1) await put(250, 320);
          if (got.length === 0) break;
          for (const e of got) expect(e.id).toBeGreaterThanOrEqual(startid);
          seen.push(...got.map((e) => e.value).reverse());
          startid = got[0]!.id + 1;
        }
        expect(seen).toEqual(Array.from({ length: 320 }, (_, i) => `v${i}`));
        expect(await history(u, `${path}?latest=100&startid=${startid}`)).toEqual([]);
        // startid without latest: up to 1000; with from: refused, one direction at a time.
        expect(await history(u, `${path}?startid=${first}`)).toHaveLength(320);
        const both = await u.get(`${path}?latest=5&from=${startid}&startid=${first}`);
        expect([both.status, both.body]).toEqual([400, 'device-fail']);
      });

      describe('malformed history queries', () => {
        let u: User;
        let dev: Device;
        beforeAll(async () => {
          u = await world.user();
          dev = await world.owned(u, true);
          await u.post(`/0/devices/${dev.id}/s/v`, { value: '1' });
        });
        it.each(['abc', '-1', '1.5', '', '1e3', '0x10', ' 5', '10abc'])(
          'latest=%j: 400 device-fail',
          async (latest) => {
            const r = await u.get(`/0/devices/${dev.id}/s/v?latest=${encodeURIComponent(latest)}`);
            expect([r.status, r.body]).toEqual([400, 'device-fail']);
            const f = await u.get(`/0/devices/${dev.id}/s/v?latest=5&from=${encodeURIComponent(latest)}`);
            expect([f.status, f.body]).toEqual([400, 'device-fail']);
            const alone = await u.get(`/0/devices/${dev.id}/s/v?from=${encodeURIComponent(latest)}`);
            expect([alone.status, alone.body]).toEqual([400, 'device-fail']);
            const start = await u.get(`/0/devices/${dev.id}/s/v?latest=5&startid=${encodeURIComponent(latest)}`);
            expect([start.status, start.body]).toEqual([400, 'device-fail']);
          },
        );
      });
    });

    describe('nearby and the network view (decisions 18 and 19)', () => {
      it('an authcode heard over UDP puts the device in GET /0/network/, keyed by its auth code, visible by both ids', async () => {
        const u = await world.user();
        const dev = await world.device();
        expect(await u.network()).toEqual({});
        const hidden = await u.get(`/0/devices/${dev.auth}`);
        expect([hidden.status, hidden.body]).toEqual([404, 'device-fail']);

        await world.hear(dev, u, `${u.authcode}\r\n`);
        const net = await u.network();
        expect(Object.keys(net)).toEqual([dev.auth]);
        expect(net[dev.auth]!.meta.unique!.value).toBe(dev.id);
        expect(net[dev.auth]).toEqual(await u.json(`/0/devices/${dev.auth}`));
        expect(net[dev.auth]).toEqual(await u.json(`/0/devices/${dev.id}`));
        // Nearby, not registered: not among the user's devices, and only the owner may unregister.
        expect(await u.json('/0/devices/')).toEqual({});
        const unregister = await u.del(`/0/devices/${dev.auth}`);
        expect([unregister.status, unregister.body]).toEqual([400, 'device-fail']);
        // A nearby user may set its variables, which reach the device.
        expect((await u.post(`/0/devices/${dev.auth}/d/hello`, { value: 'near' })).body).toBe('device-ok');
        await until(async () => (await onAgent(dev, 'd', 'hello'))?.value === 'near', 'hello on the agent');

        // Claimed: still in the owner's network, now in the owner's devices too.
        expect((await u.claim(dev.auth)).status).toBe(201);
        expect(Object.keys(await u.network())).toEqual([dev.auth]);
        expect(Object.keys(await u.json('/0/devices/'))).toEqual([dev.id]);
      });

      it('decision 19: only an authcode in hex, with at most one trailing newline, makes the device nearby', async () => {
        const u = await world.user();
        const dev = await world.device();
        const port = dev.agent.agent.nearby.port!;
        const garbage = [
          `${u.authcode} x`,
          `${u.authcode}\n\n`,
          ` ${u.authcode}`,
          'g'.repeat(32),
          'abc',
          `${u.authcode}${'0'.repeat(130)}`,
        ];
        for (const payload of garbage) await udpSend(port, payload);
        await until(() => dev.agent.agent.nearby.counters.ignored >= garbage.length, 'the garbage ignored');
        expect(await world.store.devices.heardBy(dev.id, u.id, 0)).toBe(false);
        expect(await u.network()).toEqual({});
        // Upper case and no newline is still the authcode.
        await world.hear(dev, u, u.authcode.toUpperCase());
        expect(Object.keys(await u.network())).toEqual([dev.auth]);
      });

      it('a device heard by two users is in both networks until one claims it', async () => {
        const [alice, bob] = [await world.user(), await world.user()];
        const dev = await world.device();
        await world.hear(dev, alice);
        await world.hear(dev, bob);
        expect(Object.keys(await alice.network())).toEqual([dev.auth]);
        expect(Object.keys(await bob.network())).toEqual([dev.auth]);
        expect((await alice.claim(dev.auth)).status).toBe(201);
        expect(Object.keys(await alice.network())).toEqual([dev.auth]);
        expect(await bob.network()).toEqual({});
        expect((await bob.get(`/0/devices/${dev.auth}`)).status).toBe(404);
      });

      it('a device another user owns is not in my network even when it heard me', async () => {
        const [owner, me] = [await world.user(), await world.user()];
        const dev = await world.owned(owner);
        // What it says it heard of its owner counts.
        await world.hear(dev, owner);
        await world.hearDropped(dev, me);
        expect(await world.store.devices.heardBy(dev.id, me.id, 0)).toBe(false);
        expect(world.live.sink.events('nearby.foreign_heard')).toContainEqual(
          expect.objectContaining({ level: 'debug', deviceId: dev.id, count: 1 }),
        );
        expect(await me.network()).toEqual({});
        for (const id of [dev.auth, dev.id]) {
          const r = await me.get(`/0/devices/${id}`);
          expect([r.status, r.body]).toEqual([404, 'device-fail']);
        }
        // Unregistered, it has no owner: what it claimed to have heard of me while owned still does not count.
        expect((await owner.del(`/0/devices/${dev.id}`)).status).toBe(200);
        expect(await me.network()).toEqual({});
        expect((await me.get(`/0/devices/${dev.auth}`)).status).toBe(404);
      });

      it('a product with nearby off: GET /0/network/ is {} and the nearby id is 404, though the device heard the user', async () => {
        const product = await world.frontend({ nearby: false });
        const u = await world.user(product);
        const dev = await world.device();
        await world.hear(dev, u);
        const r = await u.get('/0/network/');
        expect([r.status, r.body]).toEqual([200, '{}']);
        for (const id of [dev.auth, dev.id]) {
          const g = await u.get(`/0/devices/${id}`);
          expect([g.status, g.body]).toEqual([404, 'device-fail']);
        }
        // Registration is on: claiming still works, and then the device is the user's.
        expect((await u.claim(dev.auth)).status).toBe(201);
        expect((await u.json<DeviceObject>(`/0/devices/${dev.auth}`)).meta.unique?.value).toBe(dev.id);
      });

      it('a rotated authcode: the previous one still matches within its hour, not after', async () => {
        const u = await world.user();
        const old = u.authcode;
        // The authcode is a day old: the next GET /0/user/ rotates it (decision 17).
        await world.store.write((tx) => tx.updateUser(u.id, { authcodeRotatedAt: Date.now() - 25 * 3_600_000 }));
        const fresh = (await u.json<{ authcode: string }>('/0/user/')).authcode;
        expect(fresh).not.toBe(old);

        const a = await world.device();
        await udpSend(a.agent.agent.nearby.port!, `${old}\n`);
        await until(async () => Object.keys(await u.network()).includes(a.auth), 'heard through the previous authcode');

        // Two hours after the rotation the previous authcode no longer matches; the current one does.
        await world.store.write((tx) => tx.updateUser(u.id, { authcodeRotatedAt: Date.now() - 2 * 3_600_000 }));
        const b = await world.device();
        const unknown = world.live.bridge.devices.counters.heardUnknown;
        await udpSend(b.agent.agent.nearby.port!, `${old}\n`);
        await until(() => world.live.bridge.devices.counters.heardUnknown > unknown, 'the stale authcode reported');
        expect(Object.keys(await u.network())).toEqual([a.auth]);
        await udpSend(b.agent.agent.nearby.port!, `${fresh}\n`);
        await until(async () => Object.keys(await u.network()).includes(b.auth), 'heard through the current authcode');
      });
    });

    describe('authorization (decisions 3 and 14)', () => {
      /** Every device route, as a user who may not see the device would call it. */
      const routes = (id: string): Array<[string, string, Record<string, string> | undefined]> => [
        ['GET', `/0/devices/${id}`, undefined],
        ['GET', `/0/devices/${id}/d`, undefined],
        ['GET', `/0/devices/${id}/s`, undefined],
        ['GET', `/0/devices/${id}/meta`, undefined],
        ['GET', `/0/devices/${id}/d/led`, undefined],
        ['GET', `/0/devices/${id}/s/note`, undefined],
        ['GET', `/0/devices/${id}/meta/state`, undefined],
        ['GET', `/0/devices/${id}/d/led?latest=10`, undefined],
        ['POST', `/0/devices/${id}/d/led`, { value: 'stolen' }],
        ['POST', `/0/devices/${id}/d/led`, {}],
        ['POST', `/0/devices/${id}/s/note`, { value: 'stolen' }],
        ['POST', `/0/devices/${id}/d/fresh`, { value: 'x' }],
        ['DELETE', `/0/devices/${id}/d/led`, undefined],
        ['DELETE', `/0/devices/${id}/s/note`, undefined],
        ['DELETE', `/0/devices/${id}`, undefined],
      ];

      it('another user can neither see, change, delete nor claim my device, by uuid or auth code, even when nearby', async () => {
        const [alice, mallory] = [await world.user(), await world.user()];
        const dev = await world.owned(alice);
        await alice.post(`/0/devices/${dev.id}/d/led`, { value: 'on' });
        await alice.post(`/0/devices/${dev.id}/s/note`, { value: 'mine' });
        await world.hearDropped(dev, mallory);
        const before = await settled(alice, dev);
        const historyBefore = await history(alice, `/0/devices/${dev.id}/d/led?latest=0`);

        const noSuchUuid = randomUUID();
        const noSuchAuth = randomHex(16);
        for (const [ref, none] of [
          [dev.id, noSuchUuid],
          [dev.auth, noSuchAuth],
          [dev.auth.toUpperCase(), noSuchAuth],
        ] as const) {
          const theirs = routes(ref);
          const nothing = routes(none);
          for (let i = 0; i < theirs.length; i++) {
            const [method, path, form] = theirs[i]!;
            const r = await mallory.request(method, path, form);
            const expected = method === 'GET' ? [404, 'device-fail'] : [400, 'device-fail'];
            expect([method, path, r.status, r.body]).toEqual([method, path, ...expected]);
            // Indistinguishable from a device that does not exist.
            const [m2, p2, f2] = nothing[i]!;
            const n = await mallory.request(m2, p2, f2);
            expect([n.status, n.body]).toEqual([r.status, r.body]);
          }
        }
        for (const auth of [dev.auth, dev.auth.toUpperCase()]) {
          const claim = await mallory.claim(auth);
          expect([claim.status, claim.body]).toEqual([400, 'claim-fail']);
        }
        expect(await mallory.json('/0/devices/')).toEqual({});
        expect(await mallory.network()).toEqual({});

        // Nothing changed for the owner.
        expect((await world.store.devices.device(dev.id))?.ownerId).toBe(alice.id);
        expect(await varsOf(alice, dev)).toEqual(before);
        expect(await history(alice, `/0/devices/${dev.id}/d/led?latest=0`)).toEqual(historyBefore);
        expect(await onAgent(dev, 'd', 'fresh')).toBeUndefined();
      });

      it('no session, an anonymous one, an unknown cookie or a logged-out one: 401 no-session on every device route', async () => {
        const owner = await world.user();
        const dev = await world.owned(owner);
        await owner.post(`/0/devices/${dev.id}/d/led`, { value: 'on' });
        const before = await settled(owner, dev);

        const anon = world.live.client();
        expect((await anon.post('/0/session/')).status).toBe(201);
        const leaver = await world.user();
        const oldSid = leaver.http.sid!;
        expect((await leaver.post('/0/session/logout')).body).toBe('logout-ok');
        const callers: Array<[string, HttpClient, string | null | undefined]> = [
          ['no cookie', world.live.client(), null],
          ['an anonymous session', anon, undefined],
          ['an unknown cookie', world.live.client(), `sid=${randomHex(32)}`],
          ['a logged-out session', world.live.client(), `sid=${oldSid}`],
        ];
        const all: Array<[string, string, Record<string, string> | undefined]> = [
          ['GET', '/0/devices/', undefined],
          ['POST', '/0/devices/', { auth: dev.auth }],
          ['POST', '/0/devices/', {}],
          ['GET', '/0/network/', undefined],
          ...routes(dev.id),
          ...routes(dev.auth),
          ...routes(randomUUID()),
        ];
        for (const [who, http, cookie] of callers) {
          for (const [method, path, form] of all) {
            const r = await http.request(method, path, { ...(form ? { form } : {}), cookie });
            expect([who, method, path, r.status, r.body]).toEqual([who, method, path, 401, 'no-session']);
          }
          // The specification's one exception: GET /0/user/ without a user session is 404.
          const user = await http.request('GET', '/0/user/', { cookie });
          expect([who, user.status, user.body]).toEqual([who, 404, 'not found']);
        }
        expect((await world.store.devices.device(dev.id))?.ownerId).toBe(owner.id);
        expect(await varsOf(owner, dev)).toEqual(before);
      });
    });

    describe('presence in meta (decisions 21 and 22)', () => {
      it('state connected while the agent runs, disconnected after it stops, connected again; lastactivity numeric', async () => {
        const u = await world.user();
        const t0 = Date.now();
        const dev = await world.owned(u);
        const meta = (await u.json<DeviceObject>(`/0/devices/${dev.id}`)).meta;
        expect(meta.state!.value).toBe('connected');
        const activity = Number(meta.lastactivity!.value);
        expect(meta.lastactivity!.value).toMatch(/^\d+$/);
        expect(activity).toBeGreaterThanOrEqual(t0 - 1000);
        expect(activity).toBeLessThanOrEqual(Date.now());
        expect(meta.platform!.value).toBe(dev.agent.config.platform);
        expect(meta.fwversion!.value).toBe(dev.agent.config.fwVersion);
        expect(meta.agentversion?.value).toMatch(/./);

        await dev.agent.stop();
        await until(
          async () => (await u.json<string>(`/0/devices/${dev.id}/meta/state`)) === 'disconnected',
          'disconnected',
        );
        expect((await world.device({ stateDir: dev.stateDir })).id).toBe(dev.id);
        await until(
          async () => (await u.json<string>(`/0/devices/${dev.id}/meta/state`)) === 'connected',
          'connected again',
        );
        const states = await history(u, `/0/devices/${dev.id}/meta/state?latest=3`);
        expect(states.map((h) => [h.value, h.by])).toEqual([
          ['connected', 'server'],
          ['disconnected', 'server'],
          ['connected', 'server'],
        ]);
        // The same device, by the identity kept in its state directory; still its owner's.
        expect(Object.keys(await u.json('/0/devices/'))).toEqual([dev.id]);
      });
    });
  });

  describe('the nearby window (decision 18) with devices.nearbyWindowMs = 1000', () => {
    let world: World;
    beforeAll(async () => {
      world = await World.start(engine, { nearbyWindowMs: 1000 });
    });
    afterAll(async () => {
      await world.close();
    });

    it('a device leaves the network once the window has passed; then a proximity claim fails', async () => {
      const product = await world.frontend({ claimRequiresProximity: true });
      const u = await world.user(product);
      const dev = await world.device();
      await udpSend(dev.agent.agent.nearby.port!, `${u.authcode}\n`);
      await until(async () => Object.keys(await u.network()).includes(dev.auth), 'the device in the network', 5000);
      await until(
        async () => !Object.keys(await u.network()).includes(dev.auth),
        'the device gone from the network',
        10_000,
      );
      const g = await u.get(`/0/devices/${dev.auth}`);
      expect([g.status, g.body]).toEqual([404, 'device-fail']);
      const claim = await u.claim(dev.auth);
      expect([claim.status, claim.body]).toEqual([400, 'claim-fail']);
    });
  });
});
