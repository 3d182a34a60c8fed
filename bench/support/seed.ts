/**
 * The default frontend and one user, written through the bridge's own store before the bridge starts, with one
 * password hash at the production cost: what a benchmark that logs in as one user needs.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { PasswordHasher } from '../../bridge/accounts/password.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { hashSecret } from '../../bridge/broker.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import type { DeviceRepo } from '../../bridge/store/types.js';
import type { SimDevice } from './fleet-sim.js';

/** What the simulator's hello reports (fleet-sim-main.ts), and so what a known device's `meta` already holds. */
export const HELLO_META = { platform: 'linux-arm64', fwversion: '2.4.1', agentversion: '0.1.0' };

/**
 * One simulated device as the bridge knows it after its first hello, written inside a store transaction: enrolled
 * with its secret's hash and auth code, claimed by `ownerId` when given, the `meta` a hello leaves (the firmware
 * state idle), and marked disconnected as of `t`: the fleet reconnects, as after an outage or a restart of the bridge.
 */
export async function provisionDevice(
  devices: DeviceRepo,
  d: SimDevice,
  t: number,
  ownerId?: number,
  claimedAt = t,
): Promise<void> {
  await devices.enroll(d.id, hashSecret(d.secret), t);
  await devices.setAuthcode(d.id, d.authcode);
  if (ownerId !== undefined) await devices.claim(d.id, ownerId, claimedAt);
  await devices.setMeta(d.id, 'unique', d.id, t, 'device');
  await devices.setMeta(d.id, 'platform', HELLO_META.platform, t, 'device');
  await devices.setMeta(d.id, 'fwversion', HELLO_META.fwversion, t, 'device');
  await devices.setMeta(d.id, 'agentversion', HELLO_META.agentversion, t, 'device');
  for (const [name, value] of [
    ['fwstate', 'idle'],
    ['fwprogress', '0'],
    ['fwname', ''],
    ['fwerror', ''],
    ['fwerrorcode', ''],
  ] as const) {
    await devices.setMeta(d.id, name, value, t, 'server');
  }
  await devices.setMeta(d.id, 'state', 'disconnected', t + 1, 'server');
  await devices.setMeta(d.id, 'lastactivity', String(t), t, 'server', false);
}

export async function seedUser(dataDir: string, login: string, password: string): Promise<void> {
  const config = BridgeConfigSchema.parse({ dataDir });
  const a = config.accounts;
  const hasher = new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: 1,
    maxQueued: 0,
  });
  const passwordHash = await hasher.hash(password);
  mkdirSync(dataDir, { recursive: true });
  const store = new SqliteStore(dataDir);
  try {
    const now = Date.now();
    const frontend = await ensureDefaultFrontend(store, now);
    await store.write((tx) =>
      tx.createUser({
        frontendId: frontend.id,
        login,
        passwordHash,
        authcode: randomBytes(16).toString('hex'),
        now,
      }),
    );
  } finally {
    await store.close();
  }
}
