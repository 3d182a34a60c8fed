/**
 * Firmware jobs on a test bridge without a broker: a second app on the test bridge's store, config and clock whose
 * device side has a link, as `devcloud-bridge run` attaches one (the test bridge's own app has none, so it could
 * start no update). What goes down is encoded and decoded as on the wire and recorded, and refused while `link.up`
 * is false; `report` hands the device side a message a device published, as the link does. The catalog holds one
 * image under three records, signed with a key of its own; devices are made as their hello leaves them.
 */
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { expect } from 'vitest';
import { PasswordHasher } from '../../bridge/accounts/password.js';
import { buildApp } from '../../bridge/app.js';
import type { UpMessage } from '../../bridge/devices/link.js';
import { DeviceService } from '../../bridge/devices/service.js';
import { importImage } from '../../bridge/firmware/catalog.js';
import type { FirmwareJob } from '../../bridge/firmware/jobs.js';
import { createLogger } from '../../lib/log.js';
import {
  type DownTopic,
  type FwMessage,
  type Payloads,
  decode,
  encode,
  messageId,
  signFirmware,
} from '../../protocol/index.js';
import { LogSink, tempDir } from './agent.js';
import type { TestBridge } from './bridge.js';

/** A message the bridge hands its link for a device, as the device decodes it. */
export type DownMessage = { [K in DownTopic]: { deviceId: string; name: K; payload: Payloads[K] } }[DownTopic];
export type FwStart = Extract<FwMessage, { action: 'start' }>;

export interface FwUser {
  sid: string;
  id: number;
}

export interface FirmwareWorld {
  /** The app with the link. */
  app: FastifyInstance;
  sent: DownMessage[];
  link: { up: boolean };
  /** Owns the devices `device()` claims. */
  owner: FwUser;
  /** Owns nothing. */
  stranger: FwUser;
  /** The image for linux-x64, its name with slashes. */
  NAME: string;
  /** The same image for devices that run linux-arm64. */
  ARM: string;
  /** A name `devcloud-bridge firmware add` refuses, recorded here anyway: only the name check can refuse it. */
  DOTTED: string;
  IMAGE: Buffer;
  sha256: string;
  /** The key the catalog's images are signed with, as a device holds it (PEM). */
  publicKey: string;
  report(msg: UpMessage): Promise<void>;
  reportMeta(deviceId: string, meta: Record<string, string>): Promise<void>;
  reportState(deviceId: string, state: 'online' | 'offline'): Promise<void>;
  /** A `d` `mode` newer than any before. */
  reportMode(deviceId: string, mode: 'connected' | 'master'): Promise<void>;
  /** A device on linux-x64 as its hello leaves it, online, in mode connected, claimed by `owner` unless not. */
  device(opts?: { claim?: boolean }): Promise<{ id: string; authcode: string }>;
  /** Starts an update of `NAME` on a device; the start message it sent. */
  startJob(deviceId: string): Promise<FwStart>;
  /** The `down/fw` messages sent to a device, oldest first. */
  fwSent(deviceId: string): FwMessage[];
  lastStart(deviceId: string): FwStart;
  openJob(deviceId: string): Promise<FirmwareJob | undefined>;
  /** Past the token lifetime of every job started so far. */
  expireTokens(): void;
  close(): Promise<void>;
}

export async function startFirmwareWorld(main: TestBridge): Promise<FirmwareWorld> {
  const { store, config, clock } = main;
  const log = createLogger({ level: 'silent', pretty: 'never', base: {}, destination: new LogSink() });
  const devices = new DeviceService({
    store,
    log,
    now: clock.now,
    nearbyWindowMs: config.devices.nearbyWindowMs,
    lastActivityMs: config.devices.lastActivityMs,
  });
  const sent: DownMessage[] = [];
  const link = { up: true };
  devices.attach((deviceId, name, payload) => {
    if (!link.up) return false;
    const decoded = decode(name, encode(name, payload));
    if (!decoded.ok) throw new Error(`${name} to ${deviceId} is not what the topic carries: ${decoded.reason}`);
    sent.push({ deviceId, name, payload: decoded.value } as DownMessage);
    return true;
  });
  const hasher = new PasswordHasher({ params: { logN: 10, r: 8, p: 1 }, maxConcurrent: 1, maxQueued: 1 });
  const app = buildApp({
    config,
    store,
    hasher,
    mailer: main.mailer,
    log,
    now: clock.now,
    devices,
    checkAnswers: true,
  });
  await app.ready();

  const user = async (): Promise<FwUser> => {
    const login = `fw-${randomUUID()}@example.com`;
    const c = main.client();
    expect((await c.post('/0/session/signup', { form: { login, password: 'correct horse battery' } })).status).toBe(
      201,
    );
    return { sid: c.sid!, id: (await store.userByLogin(main.defaultFrontend.id, login))!.id };
  };
  const owner = await user();
  const stranger = await user();

  // The catalog: the image's file as `devcloud-bridge firmware add` imports it, under three records.
  const NAME = 'gateways/linux-x64/rootfs-7';
  const ARM = 'gateways/linux-arm64/rootfs-7';
  const DOTTED = 'gateways/../rootfs-7';
  const IMAGE = randomBytes(64 * 1024);
  const dir = tempDir('devcloud-fw-world-');
  const file = join(dir, 'image.bin');
  writeFileSync(file, IMAGE);
  const imported = await importImage(store.firmware.imageDir, file);
  rmSync(dir, { recursive: true, force: true });
  const keys = generateKeyPairSync('ed25519');
  const key = keys.privateKey.export({ type: 'pkcs8', format: 'pem' });
  for (const [name, platform] of [
    [NAME, 'linux-x64'],
    [DOTTED, 'linux-x64'],
    [ARM, 'linux-arm64'],
  ] as const) {
    const identity = { name, platform, version: 7, size: imported.size, sha256: imported.sha256 };
    await store.firmware.add({
      ...identity,
      from: [platform],
      // Another platform afterwards: the one the image is built for is what its signature covers.
      toPlatform: `${platform}-r7`,
      signature: signFirmware(identity, key),
      addedAt: clock.now(),
    });
  }

  const report = async (msg: UpMessage): Promise<void> => {
    await devices.handle(msg);
    // `handle` never throws: a failure shows as a count.
    expect(devices.counters.failed, `${msg.name} from ${msg.deviceId} was handled`).toBe(0);
  };
  let modeTime = clock.now();
  const reportMeta = (deviceId: string, meta: Record<string, string>) =>
    report({ deviceId, name: 'up/meta', payload: { id: messageId(), ts: clock.now(), meta } });
  const reportState = (deviceId: string, state: 'online' | 'offline') =>
    report({ deviceId, name: 'state', payload: state });
  const reportMode = (deviceId: string, mode: 'connected' | 'master') =>
    report({
      deviceId,
      name: 'up/vars',
      payload: {
        id: messageId(),
        items: [{ kind: 'push', type: 'd', name: 'mode', value: mode, time: ++modeTime, origin: 'device' }],
      },
    });
  const fwSent = (deviceId: string): FwMessage[] =>
    sent.flatMap((m) => (m.deviceId === deviceId && m.name === 'down/fw' ? [m.payload] : []));
  const lastStart = (deviceId: string): FwStart => {
    const m = fwSent(deviceId).at(-1);
    if (m?.action !== 'start') throw new Error(`no start went to ${deviceId}`);
    return m;
  };

  return {
    app,
    sent,
    link,
    owner,
    stranger,
    NAME,
    ARM,
    DOTTED,
    IMAGE,
    sha256: imported.sha256,
    publicKey: keys.publicKey.export({ type: 'spki', format: 'pem' }).toString(),
    report,
    reportMeta,
    reportState,
    reportMode,
    async device(opts = {}) {
      const id = randomUUID();
      const authcode = randomBytes(16).toString('hex');
      const t = clock.now();
      await reportState(id, 'online');
      await report({
        deviceId: id,
        name: 'up/hello',
        payload: {
          ...{ id: messageId(), protocol: 1, deviceId: id, authcode, platform: 'linux-x64', agentVersion: '0.1.0' },
          ...{ fwVersion: '6', mode: 'connected', bootTime: t, ts: t },
        },
      });
      await reportMode(id, 'connected');
      if (opts.claim !== false) {
        const r = await app.inject({
          method: 'POST',
          url: '/0/devices/',
          headers: { cookie: `sid=${owner.sid}`, 'content-type': 'application/x-www-form-urlencoded' },
          payload: `auth=${authcode}`,
        });
        expect(r.statusCode).toBe(201);
      }
      return { id, authcode };
    },
    async startJob(deviceId) {
      const r = await app.inject({
        method: 'POST',
        url: `/0/devices/${deviceId}/fw/${NAME}`,
        headers: { cookie: `sid=${owner.sid}` },
      });
      expect([r.statusCode, r.body]).toEqual([200, 'device-ok']);
      return lastStart(deviceId);
    },
    fwSent,
    lastStart,
    openJob: (deviceId) => store.fwJobs.openOf(deviceId),
    expireTokens: () => clock.advance(config.firmware.tokenHours * 3_600_000 + 1),
    close: () => app.close(),
  };
}
