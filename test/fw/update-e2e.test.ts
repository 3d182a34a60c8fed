/**
 * Firmware updates end to end: a listening bridge with its embedded broker, one user, real agents in this process
 * (claimed, in `d` mode `connected`), images downloaded over HTTP from the bridge and installed into A/B slots.
 * Everything goes through REST (`POST /0/devices/<id>/fw/<name>`, `DELETE …/fw`) and, for the gateway side,
 * `devcloud-agent fw status|commit|rollback` run in-process against the running agent or its state directory.
 *
 * Three gateways share the bridge: `main` (health check: the new slot holds `app.txt`), `verify` (restarted with
 * different keys for the verification failures) and `held` (its health check waits for a file the test creates,
 * so an update can be held in `committing`).
 */
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { importImage } from '../../bridge/firmware/catalog.js';
import { signFirmware } from '../../protocol/index.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type SigningKeys, addToCatalog, buildImage, fwStates, makeKeys, metaOf } from '../support/firmware.js';
import { until } from '../support/wait.js';

const FULL_RUN = ['downloading', 'verifying', 'installing', 'switching', 'restarting', 'committing', 'done'];

let live: LiveBridge;
let user: HttpClient;
let keys: SigningKeys;
/** A second key pair: a key the agents do not know, or the new key of a rotation. */
let keys2: SigningKeys;

const store = () => live.bridge.store;

interface Gateway {
  ta: TestAgent;
  id: string;
  stateDir: string;
  slots: string;
  flags: Record<string, unknown>;
}

/** Starts an agent on `stateDir` and waits until the bridge has its hello. */
async function startGateway(stateDir: string, flags: Record<string, unknown>): Promise<TestAgent> {
  const ta = await startAgent({ mqttUrl: live.mqttUrl, stateDir, flags, level: 'info' });
  const id = ta.agent.identity.deviceId;
  await until(async () => (await metaOf(store(), id, 'state')) === 'connected', 'the gateway connected');
  return ta;
}

/**
 * A fresh gateway, claimed by the user and in `d` mode `connected`, as the bridge requires for an update. `extra`
 * gets the slots folder, so that a health command can name it.
 */
async function newGateway(extra: (slots: string) => Record<string, unknown> = () => ({})): Promise<Gateway> {
  const stateDir = tempDir('devcloud-fw-e2e-');
  const slots = join(stateDir, 'slots');
  const flags = {
    platform: 'linux-x64',
    'firmware.publicKeys': [keys.publicFile],
    'firmware.slotsDir': slots,
    'firmware.health.retries': 0,
    'firmware.health.intervalMs': 10,
    ...extra(slots),
  };
  const ta = await startGateway(stateDir, flags);
  const id = ta.agent.identity.deviceId;
  await until(async () => (await store().devices.device(id))?.authcode, 'the hello');
  expect((await user.post('/0/devices/', { form: { auth: ta.agent.identity.authcode } })).status).toBe(201);
  await setMode(ta, 'connected');
  return { ta, id, stateDir, slots, flags };
}

async function setMode(ta: TestAgent, mode: string): Promise<void> {
  const id = ta.agent.identity.deviceId;
  await ta.agent.vars.set('d', 'mode', Buffer.from(mode));
  await until(async () => {
    const v = await store().devices.getVar(id, 'd', 'mode');
    return v?.value?.toString('utf8') === mode && v.acked > 0;
  }, `d mode ${mode} on the bridge`);
}

async function stopGateway(g: Gateway): Promise<void> {
  await g.ta.stop();
  await until(async () => (await metaOf(store(), g.id, 'state')) === 'disconnected', 'the gateway disconnected');
}

/** Stops the gateway's agent and starts it again on the same state directory, with new flags if given. */
async function restartGateway(g: Gateway, flags: Record<string, unknown> = g.flags): Promise<void> {
  await stopGateway(g);
  g.flags = flags;
  g.ta = await startGateway(g.stateDir, flags);
}

/** Stops the gateway's agent for good and removes its state directory (slots included). */
async function dropGateway(g: Gateway | undefined): Promise<void> {
  if (!g) return;
  await g.ta.stop();
  rmSync(g.stateDir, { recursive: true, force: true });
}

const startUpdate = (g: Gateway, name: string) => user.post(`/0/devices/${g.id}/fw/${name}`);

/** The `fwstate` values the bridge recorded for the gateway from index `from` on. */
const statesSince = async (g: Gateway, from: number) => (await fwStates(store(), g.id)).slice(from);

/** Runs an update to the final state the gateway reports; returns the states it reported on the way. */
async function update(g: Gateway, name: string, final: string): Promise<string[]> {
  const before = (await fwStates(store(), g.id)).length;
  const r = await startUpdate(g, name);
  expect([r.status, r.body]).toEqual([200, 'device-ok']);
  await until(
    async () => (await statesSince(g, before)).includes(final) && (await store().fwJobs.openOf(g.id)) === undefined,
    final,
  );
  return await statesSince(g, before);
}

function link(slots: string, name: 'current' | 'previous'): string | undefined {
  try {
    return readlinkSync(join(slots, name));
  } catch {
    return undefined;
  }
}

/** The slot links and every file of both slots with its content: what "the slot is unchanged" compares. */
function slotSnapshot(slots: string): Record<string, unknown> {
  const files = (slot: string): Record<string, string> => {
    const dir = join(slots, slot);
    if (!existsSync(dir)) return {};
    const out: Record<string, string> = {};
    for (const f of readdirSync(dir, { recursive: true, encoding: 'utf8' })) {
      if (statSync(join(dir, f)).isFile()) out[f] = readFileSync(join(dir, f), 'utf8');
    }
    return out;
  };
  return { current: link(slots, 'current'), previous: link(slots, 'previous'), a: files('a'), b: files('b') };
}

function lastJobId(g: Gateway): string | undefined {
  return g.ta.agent.firmware.store.latest()?.id;
}

/** A request whose path goes out byte for byte: `fetch` would resolve `..` and `%2e%2e` segments first. */
function rawPost(path: string): Promise<{ status: number; body: string }> {
  const url = new URL(live.url);
  const cookie = [...user.jar].map(([k, v]) => `${k}=${v}`).join('; ');
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: url.hostname, port: url.port, method: 'POST', path, headers: { cookie } },
      (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (s: string) => (body += s));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** `devcloud-agent fw …` in this process, with the gateway's own flags. */
function fwCli(g: Gateway, ...args: string[]): Promise<{ code: number; out: string; err: string }> {
  return agentCli(g, 'fw', ...args);
}

/** `devcloud-agent …` in this process, with the gateway's own flags. */
async function agentCli(g: Gateway, ...args: string[]): Promise<{ code: number; out: string; err: string }> {
  const health = g.flags['firmware.health.command'] as string[] | undefined;
  const argv = [
    ...args,
    '--state-dir',
    g.stateDir,
    '--mqtt-url',
    live.mqttUrl,
    '--platform',
    'linux-x64',
    '--fw-slots',
    g.slots,
    // The offline path logs to the process's stderr; the test reads its answer instead.
    '--log-level',
    'silent',
    ...(g.flags['firmware.publicKeys'] as string[]).flatMap((k) => ['--fw-public-key', k]),
    ...(health ? ['--fw-health-cmd', health.join(' ')] : []),
  ];
  let out = '';
  let err = '';
  const code = await runCli(argv, { out: (s) => (out += `${s}\n`), err: (s) => (err += `${s}\n`) }, {});
  return { code, out, err };
}

interface FwStatus {
  state: string;
  version: string;
  activeSlot: string | null;
  job: {
    name: string;
    version: number;
    error: string;
    errorCode: string;
    steps: Array<{ state: string; error: string; errorCode: string }>;
  } | null;
}

beforeAll(async () => {
  live = await startLiveBridge();
  keys = makeKeys();
  keys2 = makeKeys();
  user = live.client();
  const r = await user.post('/0/session/signup', {
    form: { login: 'fw-e2e@example.com', password: 'correct horse battery' },
  });
  expect(r.status).toBe(201);
});

afterAll(async () => {
  await live?.close();
});

describe('an update through REST with a real agent (main gateway)', () => {
  let g: Gateway;
  const NAME = 'acme/gw/rootfs-4';

  beforeAll(async () => {
    // The health check passes only where `current` leads to a slot holding app.txt: the old slot has none.
    g = await newGateway((slots) => ({ 'firmware.health.command': ['test', '-f', join(slots, 'current', 'app.txt')] }));
    mkdirSync(join(g.slots, 'a'), { recursive: true });
    writeFileSync(join(g.slots, 'a', 'old.txt'), 'the image that ran before');
    await addToCatalog(
      store(),
      buildImage({ name: NAME, version: 4, files: { 'app.txt': 'v4' } }),
      { name: NAME, version: 4 },
      keys,
    );
  });

  afterAll(async () => {
    await dropGateway(g);
  });

  it('installs an image named with slashes into the other slot, commits it after the health check, and says so', async () => {
    expect(link(g.slots, 'current')).toBeUndefined();
    await update(g, NAME, 'done');
    expect(await fwStates(store(), g.id)).toEqual(['idle', ...FULL_RUN]);

    // The new slot is active; the old one is untouched and recorded as `previous`.
    expect(link(g.slots, 'current')).toBe('b');
    expect(link(g.slots, 'previous')).toBe('a');
    expect(readFileSync(join(g.slots, 'b', 'app.txt'), 'utf8')).toBe('v4');
    expect(readFileSync(join(g.slots, 'a', 'old.txt'), 'utf8')).toBe('the image that ran before');
    expect(g.ta.sink.events('fw.healthy')).toHaveLength(1);

    expect(await metaOf(store(), g.id, 'fwversion')).toBe('4');
    expect(await metaOf(store(), g.id, 'fwprogress')).toBe('100');
    expect(await metaOf(store(), g.id, 'fwname')).toBe(NAME);
    const dev = await user.get(`/0/devices/${g.id}`);
    expect(dev.status).toBe(200);
    const meta = (JSON.parse(dev.body) as { meta: Record<string, { value: string }> }).meta;
    expect(meta.fwstate?.value).toBe('done');
    expect(meta.fwversion?.value).toBe('4');
    expect(meta.fwprogress?.value).toBe('100');
    expect(meta.fwname?.value).toBe(NAME);

    const list = await user.get('/0/firmware/');
    expect(list.status).toBe(200);
    expect(JSON.parse(list.body)).toContainEqual({
      name: NAME,
      platform: 'linux-x64',
      version: 4,
      info: { platforms: { from: ['linux-x64'], to: { platform: 'linux-x64', name: NAME } } },
    });
  });

  it('reports the new version in the hello after a restart', async () => {
    await stopGateway(g);
    // Overwritten while the agent is away, so only its next hello can bring the version back.
    await store().write((tx) => tx.devices.setMeta(g.id, 'fwversion', 'stale', Date.now(), 'server'));
    g.ta = await startGateway(g.stateDir, g.flags);
    await until(async () => (await metaOf(store(), g.id, 'fwversion')) === '4', 'fwversion 4 from the hello');
    expect(g.ta.agent.status().fwVersion).toBe('4');
    expect(link(g.slots, 'current')).toBe('b');
  });

  it('puts a second update into the other slot, and rolls back one whose new slot fails the health check', async () => {
    const name5 = 'acme/gw/rootfs-5';
    await addToCatalog(
      store(),
      buildImage({ name: name5, version: 5, files: { 'app.txt': 'v5' } }),
      { name: name5, version: 5 },
      keys,
    );
    expect(await update(g, name5, 'done')).toEqual(FULL_RUN);
    expect(link(g.slots, 'current')).toBe('a');
    expect(link(g.slots, 'previous')).toBe('b');
    expect(readFileSync(join(g.slots, 'a', 'app.txt'), 'utf8')).toBe('v5');
    // The slot it replaced still holds the previous image, ready for a rollback.
    expect(readFileSync(join(g.slots, 'b', 'app.txt'), 'utf8')).toBe('v4');
    expect(existsSync(join(g.slots, 'a', 'old.txt'))).toBe(false);
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('5');

    // An image without app.txt: the running slot has one, so only a check of the new slot can fail.
    const name6 = 'acme/gw/rootfs-6-broken';
    await addToCatalog(
      store(),
      buildImage({ name: name6, version: 6, files: { 'other.txt': 'x' } }),
      { name: name6, version: 6 },
      keys,
    );
    expect(await update(g, name6, 'rolledback')).toEqual([...FULL_RUN.slice(0, -1), 'rollingback', 'rolledback']);
    expect(link(g.slots, 'current')).toBe('a');
    expect(readFileSync(join(g.slots, 'a', 'app.txt'), 'utf8')).toBe('v5');
    expect(await metaOf(store(), g.id, 'fwerror')).toMatch(/health check/);
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('5');
  });

  it('refuses an image for another platform without sending anything', async () => {
    const name = 'acme/arm/rootfs-1';
    await addToCatalog(
      store(),
      buildImage({ name, version: 1, files: { 'app.txt': 'arm' } }),
      { name, version: 1, platform: 'linux-arm64' },
      keys,
    );
    const before = { states: await fwStates(store(), g.id), job: lastJobId(g), slots: slotSnapshot(g.slots) };
    const r = await startUpdate(g, name);
    expect([r.status, r.body]).toEqual([400, 'device-fwup-start-fail']);
    expect(live.sink.events('fw.start_refused').at(-1)).toMatchObject({ deviceId: g.id, reason: 'platform' });
    // Refused before a job exists: no job on the bridge, none on down/fw.
    expect(await store().fwJobs.openOf(g.id)).toBeUndefined();
    expect(live.sink.events('fw.started').filter((e) => e.name === name)).toEqual([]);
    expect(await fwStates(store(), g.id)).toEqual(before.states);
    expect(await metaOf(store(), g.id, 'fwstate')).toBe('rolledback');
    expect(lastJobId(g)).toBe(before.job);
    expect(slotSnapshot(g.slots)).toEqual(before.slots);
  });

  it('refuses a device that is not in mode connected, or not connected at all', async () => {
    const name = 'acme/gw/rootfs-4';
    await setMode(g.ta, 'master');
    const r1 = await startUpdate(g, name);
    expect([r1.status, r1.body]).toEqual([400, 'device-fwup-start-fail']);
    expect(live.sink.events('fw.start_refused').at(-1)).toMatchObject({ deviceId: g.id, reason: 'not-connected-mode' });
    await setMode(g.ta, 'connected');

    await stopGateway(g);
    const r2 = await startUpdate(g, name);
    expect([r2.status, r2.body]).toEqual([400, 'device-fwup-start-fail']);
    expect(live.sink.events('fw.start_refused').at(-1)).toMatchObject({ deviceId: g.id, reason: 'not-connected' });
    expect(await store().fwJobs.openOf(g.id)).toBeUndefined();
    g.ta = await startGateway(g.stateDir, g.flags);
    expect(await metaOf(store(), g.id, 'fwstate')).toBe('rolledback');
  });

  it('refuses image names with .. in them (plain or encoded) and unknown names', async () => {
    const before = { states: await fwStates(store(), g.id), job: lastJobId(g) };
    // Each would name the catalog's acme/gw/rootfs-4 if the `..` were resolved.
    for (const path of [
      `/0/devices/${g.id}/fw/acme/x/../gw/rootfs-4`,
      `/0/devices/${g.id}/fw/acme/x/%2e%2e/gw/rootfs-4`,
      `/0/devices/${g.id}/fw/acme/x/%2E%2E/gw/rootfs-4`,
      `/0/devices/${g.id}/fw/acme/x/..%2fgw/rootfs-4`,
      `/0/devices/${g.id}/firmware/acme/x/../gw/rootfs-4`,
      `/0/devices/${g.id}/fw/acme/gw/no-such-image`,
    ]) {
      expect([path, await rawPost(path)]).toEqual([path, { status: 400, body: 'device-fwup-name-fail' }]);
    }
    expect((await startUpdate(g, 'acme/gw/unknown')).body).toBe('device-fwup-name-fail');
    expect(await store().fwJobs.openOf(g.id)).toBeUndefined();
    expect(await fwStates(store(), g.id)).toEqual(before.states);
    expect(lastJobId(g)).toBe(before.job);
    // The same connection and session start the real name: the refusals above were about the names.
    const ok = await rawPost(`/0/devices/${g.id}/fw/acme/gw/rootfs-4`);
    expect(ok).toEqual({ status: 200, body: 'device-ok' });
    await until(async () => (await metaOf(store(), g.id, 'fwstate')) === 'done', 'the update to acme/gw/rootfs-4');
  });
});

describe('verification failures (verify gateway)', () => {
  let g: Gateway;
  const GOOD = 'acme/verify/good';

  beforeAll(async () => {
    g = await newGateway();
    await addToCatalog(
      store(),
      buildImage({ name: GOOD, version: 2, files: { 'app.txt': 'good' } }),
      { name: GOOD, version: 2 },
      keys,
    );
  });

  afterAll(async () => {
    await dropGateway(g);
  });

  /** Runs an update that must fail in verifying: the slots stay as they were. */
  async function failsVerify(name: string): Promise<string> {
    const slots = slotSnapshot(g.slots);
    expect(await update(g, name, 'failed')).toEqual(['downloading', 'verifying', 'failed']);
    expect(slotSnapshot(g.slots)).toEqual(slots);
    expect(link(g.slots, 'current')).toBeUndefined();
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('0');
    return (await metaOf(store(), g.id, 'fwerror')) ?? '';
  }

  it('fails an image whose bytes do not match the signed sha256', async () => {
    const name = 'acme/verify/bad-sha';
    const file = buildImage({ name, version: 3, files: { 'app.txt': 'bad sha' } });
    const lie = 'ab'.repeat(32);
    const real = await addToCatalog(store(), file, { name, version: 3, sha256: lie }, keys);
    // The bridge serves the file named by the catalog's sha256: put the real bytes there.
    copyFileSync(join(store().firmware.imageDir, real.sha256), join(store().firmware.imageDir, lie));
    expect(await failsVerify(name)).toMatch(/sha256/);
  });

  it('fails a signature by another key, and one over another version', async () => {
    const byOther = 'acme/verify/other-key';
    await addToCatalog(
      store(),
      buildImage({ name: byOther, version: 3, files: { 'app.txt': 'x' } }),
      { name: byOther, version: 3, signWith: keys2.privatePem },
      keys,
    );
    expect(await failsVerify(byOther)).toMatch(/signature/);

    // Signed by the right key, but the statement names version 99 while the job says 3.
    const otherVersion = 'acme/verify/other-version';
    const file = buildImage({ name: otherVersion, version: 3, files: { 'app.txt': 'y' } });
    const { size, sha256 } = await importImage(store().firmware.imageDir, file);
    const identity = { name: otherVersion, platform: 'linux-x64', version: 3, size, sha256 };
    await store().firmware.add({
      ...identity,
      from: ['linux-x64'],
      toPlatform: 'linux-x64',
      signature: signFirmware({ ...identity, version: 99 }, keys.privatePem),
      addedAt: Date.now(),
    });
    expect(await failsVerify(otherVersion)).toMatch(/signature/);
  });

  it('fails with an unknown key or no key at all; with two keys, an image signed by the second goes through', async () => {
    await restartGateway(g, { ...g.flags, 'firmware.publicKeys': [keys2.publicFile] });
    expect(await failsVerify(GOOD)).toMatch(/signature/);

    await restartGateway(g, { ...g.flags, 'firmware.publicKeys': [] });
    expect(await failsVerify(GOOD)).toMatch(/no firmware public key/);

    const rotated = 'acme/verify/rotated';
    await addToCatalog(
      store(),
      buildImage({ name: rotated, version: 5, files: { 'app.txt': 'rotated' } }),
      { name: rotated, version: 5, signWith: keys2.privatePem },
      keys,
    );
    await restartGateway(g, { ...g.flags, 'firmware.publicKeys': [keys.publicFile, keys2.publicFile] });
    expect(await update(g, rotated, 'done')).toEqual(FULL_RUN);
    expect(link(g.slots, 'current')).toBe('b');
    expect(readFileSync(join(g.slots, 'b', 'app.txt'), 'utf8')).toBe('rotated');
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('5');
    expect(g.ta.sink.events('fw.verified').at(-1)).toMatchObject({ key: keys2.publicFile });
  });
});

describe('an update held in committing, and fw status, commit, rollback (held gateway)', () => {
  let g: Gateway;
  let work: string;
  const names = ['acme/held/rootfs-1', 'acme/held/rootfs-2', 'acme/held/rootfs-3'];
  const release = () => writeFileSync(join(work, 'release'), '');
  const hold = () => rmSync(join(work, 'release'), { force: true });
  const status = (out: string) => JSON.parse(out) as FwStatus;

  beforeAll(async () => {
    work = tempDir('devcloud-fw-held-');
    // Healthy once the new slot holds app.txt and the test has created `release`.
    const check = join(work, 'health');
    writeFileSync(
      check,
      `#!/bin/sh\ntest -f "$1/current/app.txt" || exit 1\nwhile [ ! -e "${work}/release" ]; do sleep 0.02; done\n`,
    );
    chmodSync(check, 0o755);
    g = await newGateway((slots) => ({ 'firmware.health.command': [check, slots] }));
    for (const [i, name] of names.entries()) {
      const version = i + 1;
      await addToCatalog(
        store(),
        buildImage({ name, version, files: { 'app.txt': `held ${version}` } }),
        { name, version },
        keys,
      );
    }
  });

  afterAll(async () => {
    release();
    await dropGateway(g);
    rmSync(work, { recursive: true, force: true });
  });

  it('refuses a second update and a cancel while one is committing; fw status shows the job; the update completes', async () => {
    const before = (await fwStates(store(), g.id)).length;
    expect((await startUpdate(g, names[0]!)).body).toBe('device-ok');
    await until(async () => (await metaOf(store(), g.id, 'fwstate')) === 'committing', 'committing');
    const job = lastJobId(g);

    const second = await startUpdate(g, names[1]!);
    expect([second.status, second.body]).toEqual([400, 'device-fwup-start-fail']);
    expect(live.sink.events('fw.start_refused').at(-1)).toMatchObject({ deviceId: g.id, reason: 'running' });

    const cancel = await user.request('DELETE', `/0/devices/${g.id}/fw`);
    expect([cancel.status, cancel.body]).toEqual([400, 'firmware-fail']);

    const st = await fwCli(g, 'status', '--json');
    expect(st.code).toBe(0);
    const s = status(st.out);
    expect(s).toMatchObject({ state: 'committing', activeSlot: 'b', job: { name: names[0], version: 1 } });
    expect(s.job!.steps.map((x) => x.state)).toEqual(FULL_RUN.slice(0, -1));
    const plain = await fwCli(g, 'status');
    expect(plain.code).toBe(0);
    expect(plain.out).toMatch(/state +committing/);
    expect(plain.out).toContain(names[0]);

    release();
    await until(async () => (await metaOf(store(), g.id, 'fwstate')) === 'done', 'done');
    expect(await statesSince(g, before)).toEqual(FULL_RUN);
    expect(lastJobId(g)).toBe(job);
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('1');
    expect(await store().fwJobs.openOf(g.id)).toBeUndefined();
    // Nothing runs now: a cancel has nothing to act on.
    expect((await user.request('DELETE', `/0/devices/${g.id}/fw`)).body).toBe('firmware-fail');
  });

  it('fw commit accepts a held update at once; fw rollback returns to the slot before; a second rollback is refused', async () => {
    hold();
    const before = (await fwStates(store(), g.id)).length;
    expect((await startUpdate(g, names[1]!)).body).toBe('device-ok');
    await until(async () => (await metaOf(store(), g.id, 'fwstate')) === 'committing', 'committing');

    const commit = await fwCli(g, 'commit', '--json');
    expect(commit.code).toBe(0);
    expect(status(commit.out)).toMatchObject({ state: 'done', version: '2', activeSlot: 'a' });
    await until(async () => (await metaOf(store(), g.id, 'fwstate')) === 'done', 'done');
    expect(await statesSince(g, before)).toEqual(FULL_RUN);
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('2');
    expect(g.ta.sink.events('fw.healthy')).toHaveLength(1);

    const rollback = await fwCli(g, 'rollback', '--json');
    expect(rollback.code).toBe(0);
    await until(async () => (await metaOf(store(), g.id, 'fwstate')) === 'rolledback', 'rolledback');
    expect(await statesSince(g, before)).toEqual([...FULL_RUN, 'rollingback', 'rolledback']);
    expect(link(g.slots, 'current')).toBe('b');
    expect(readFileSync(join(g.slots, 'b', 'app.txt'), 'utf8')).toBe('held 1');
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('1');
    expect(await metaOf(store(), g.id, 'fwerror')).toMatch(/by hand/);
    expect(await metaOf(store(), g.id, 'fwerrorcode')).toBe('by-hand');
    const after = status((await fwCli(g, 'status', '--json')).out);
    expect(after).toMatchObject({ state: 'rolledback', version: '1', activeSlot: 'b' });
    expect(after.job).toMatchObject({ error: expect.stringMatching(/by hand/), errorCode: 'by-hand' });
    expect(after.job!.steps.at(-2)).toMatchObject({ state: 'rollingback', errorCode: 'by-hand' });
    // The engineer's view: the code before the text, on the error line and on the step that set it.
    const plain = (await fwCli(g, 'status')).out;
    expect(plain).toMatch(/^error +\[by-hand\] rolled back by hand/m);
    expect(plain).toMatch(/ rollingback +\[by-hand\] rolled back by hand/);
    const agentStatus = await agentCli(g, 'status');
    expect(agentStatus.code).toBe(0);
    expect(agentStatus.out).toMatch(/^firmware\n(.*\n)* {2}error +\[by-hand\] rolled back by hand/m);

    const again = await fwCli(g, 'rollback', '--json');
    expect(again.code).toBe(1);
    expect(again.err).toMatch(/nothing to roll back/);
    expect(link(g.slots, 'current')).toBe('b');
  });

  it('fw rollback works on the state directory while the agent is stopped; the agent reports it when it starts', async () => {
    release();
    expect(await update(g, names[2]!, 'done')).toEqual(FULL_RUN);
    expect(link(g.slots, 'current')).toBe('a');
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('3');

    await stopGateway(g);
    const r = await fwCli(g, 'rollback', '--json');
    expect(r.code).toBe(0);
    expect(r.err).toMatch(/not running/);
    expect(status(r.out)).toMatchObject({ state: 'rolledback', version: '1', activeSlot: 'b' });
    expect(link(g.slots, 'current')).toBe('b');
    expect(readFileSync(join(g.slots, 'b', 'app.txt'), 'utf8')).toBe('held 1');
    // The bridge has not heard of it yet.
    expect(await metaOf(store(), g.id, 'fwstate')).toBe('done');

    g.ta = await startGateway(g.stateDir, g.flags);
    await until(
      async () => (await metaOf(store(), g.id, 'fwstate')) === 'rolledback',
      'rolledback from the restarted agent',
    );
    expect(await metaOf(store(), g.id, 'fwversion')).toBe('1');
    expect(link(g.slots, 'current')).toBe('b');
  });
});
