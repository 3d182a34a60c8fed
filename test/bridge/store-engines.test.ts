/**
 * One behaviour suite for the bridge store's interface (`BridgeStore`, bridge/store/types.ts), run against both
 * engines: SQLite in a temporary data directory, and PostgreSQL in a database of this file's own
 * (test/support/postgres.ts; skipped with one line when no server answers, failing under `CI=true`). What only a
 * shared database has to show (two bridges at once, a full disk reported by the server, a broken connection) is
 * checked for PostgreSQL after the shared suite. Times are plain numbers: nothing here waits on a clock.
 */
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { inspect } from 'node:util';
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { NewBridgeCommand } from '../../bridge/commands/store.js';
import type { NewVersion, VarKey, VarType } from '../../bridge/devices/store.js';
import type { FirmwareImage } from '../../bridge/firmware/catalog.js';
import type { NewJob } from '../../bridge/firmware/jobs.js';
import { type PostgresStore, openPostgresStore } from '../../bridge/store/postgres/store.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { type BridgeStore, type Frontend, ProductConfig, type StoreTx, type User } from '../../bridge/store/types.js';
import { createLogger } from '../../lib/log.js';
import { StorageFullError } from '../../lib/sqlite.js';
import type { CmdStatusMessage } from '../../protocol/index.js';
import { LogSink, tempDir } from '../support/agent.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';
import { until } from '../support/wait.js';

const T = 1_700_000_000_000;
const HOUR = 3_600_000;

const frontendOf = (id: string, isDefault: boolean, createdAt = T): Frontend => ({
  id,
  name: `Frontend ${id}`,
  config: ProductConfig.parse({}),
  isDefault,
  createdAt,
});

const version = (
  type: VarType,
  name: string,
  value: string | null,
  time: number,
  origin: 'device' | 'cloud' = 'device',
): NewVersion => ({ type, name, value: value === null ? null : Buffer.from(value), time, origin });

const text = (b: Buffer | null | undefined) => (b === null || b === undefined ? b : b.toString('utf8'));

/** A device id that is a uuid, as the bridge's are. */
const dev = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;
const cmdId = (n: number) => `10000000-0000-4000-8000-${String(n).padStart(12, '0')}`;

const command = (n: number, deviceId: string, createdAt = T, expiresAt = T + HOUR): NewBridgeCommand => ({
  id: cmdId(n),
  deviceId,
  userId: null,
  command: Buffer.from(`echo ${n}`),
  priority: 1,
  createdAt,
  expiresAt,
});

const status = (
  n: number,
  state: CmdStatusMessage['state'],
  at: number,
  extra: Partial<CmdStatusMessage> = {},
): CmdStatusMessage => ({ id: `m${n}-${state}-${at}`, cmd: cmdId(n), state, at, ...extra });

const image = (name: string, over: Partial<FirmwareImage> = {}): FirmwareImage => ({
  name,
  platform: 'linux-x64',
  version: 7,
  from: ['linux-x64'],
  toPlatform: 'linux-x64',
  size: 1000,
  sha256: 'a'.repeat(64),
  signature: 'c2ln',
  addedAt: T,
  ...over,
});

const job = (id: string, deviceId: string, token: string, over: Partial<NewJob> = {}): NewJob => ({
  id,
  deviceId,
  name: 'gw/rootfs-7',
  sha256: 'a'.repeat(64),
  size: 1000,
  token,
  tokenExpires: T + HOUR,
  createdAt: T,
  url: `https://bridge.example/fw/${id}`,
  ...over,
});

/** The behaviour both engines share; `open` makes an empty store for each test. */
function behaviour(open: () => Promise<BridgeStore>) {
  let s: BridgeStore;
  beforeEach(async () => {
    s = await open();
  });
  afterEach(async () => {
    await s.close();
  });

  /** A frontend and a user in it. */
  const seedUser = async (login = 'ann', authcode = `code-${login}`): Promise<User> => {
    if (!(await s.frontend('f1'))) await s.createFrontend(frontendOf('f1', true));
    const u = await s.createUser({ frontendId: 'f1', login, passwordHash: `hash-${login}`, authcode, now: T });
    if (!u) throw new Error('user not made');
    return u;
  };

  describe('frontends', () => {
    it('are created, listed in creation order, found by id and as the default', async () => {
      expect(await s.defaultFrontend()).toBeUndefined();
      expect(await s.frontend('f1')).toBeUndefined();
      await s.createFrontend(frontendOf('f2', false, T + 1));
      await s.createFrontend(frontendOf('f1', true, T));
      expect(await s.frontend('f1')).toEqual(frontendOf('f1', true, T));
      expect((await s.defaultFrontend())?.id).toBe('f1');
      expect((await s.frontends()).map((f) => f.id)).toEqual(['f1', 'f2']);
    });

    it('take a new configuration and name, and a new default (only one)', async () => {
      await s.createFrontend(frontendOf('f1', true));
      await s.createFrontend(frontendOf('f2', false));
      const config = ProductConfig.parse({ nearby: false, claimRequiresProximity: true });
      expect(await s.setFrontendConfig('f2', config, 'Renamed')).toBe(true);
      expect(await s.frontend('f2')).toMatchObject({ name: 'Renamed', config });
      expect(await s.setFrontendConfig('f2', ProductConfig.parse({}))).toBe(true);
      expect(await s.frontend('f2')).toMatchObject({ name: 'Renamed', config: ProductConfig.parse({}) });
      expect(await s.setFrontendConfig('nope', config)).toBe(false);

      expect(await s.setDefaultFrontend('f2')).toBe(true);
      expect((await s.defaultFrontend())?.id).toBe('f2');
      expect((await s.frontends()).map((f) => [f.id, f.isDefault])).toEqual([
        ['f1', false],
        ['f2', true],
      ]);
      expect(await s.setDefaultFrontend('nope')).toBe(false);
      expect((await s.defaultFrontend())?.id).toBe('f2');
    });
  });

  describe('users', () => {
    it('are created with their defaults; a login taken in the frontend answers undefined', async () => {
      const u = await seedUser('ann');
      expect(u).toEqual({
        id: expect.any(Number) as number,
        frontendId: 'f1',
        login: 'ann',
        passwordHash: 'hash-ann',
        confirmed: false,
        data: '{}',
        authcode: 'code-ann',
        authcodePrev: null,
        authcodeRotatedAt: T,
        createdAt: T,
      });
      const again = await s.createUser({ frontendId: 'f1', login: 'ann', passwordHash: 'x', authcode: 'y', now: T });
      expect(again).toBeUndefined();
      await s.createFrontend(frontendOf('f2', false));
      const other = await s.createUser({ frontendId: 'f2', login: 'ann', passwordHash: 'x', authcode: 'z', now: T });
      expect(other?.id).not.toBe(u.id);
    });

    it('a refused write names no value it held: an authcode taken, a token of no kind', async () => {
      await seedUser('ann', 'authcode-of-ann-0123');
      const taken = await s
        .createUser({ frontendId: 'f1', login: 'bob', passwordHash: 'h', authcode: 'authcode-of-ann-0123', now: T })
        .catch((e: unknown) => e);
      expect(taken).toBeInstanceOf(Error);
      expect(inspect(taken, { depth: 5 })).not.toContain('authcode-of-ann-0123');
      const ann = (await s.userByLogin('f1', 'ann'))!;
      const badKind = await s
        .createToken({ hash: 'token-hash-4567', kind: 'bogus' as 'confirm', userId: ann.id, expiresAt: T })
        .catch((e: unknown) => e);
      expect(badKind).toBeInstanceOf(Error);
      expect(inspect(badKind, { depth: 5 })).not.toContain('token-hash-4567');
    });

    it('are found by login, id and authcode (the previous one too), and updated', async () => {
      const u = await seedUser('ann');
      expect(await s.userByLogin('f1', 'ann')).toEqual(u);
      expect(await s.userByLogin('f1', 'bob')).toBeUndefined();
      expect(await s.userById(u.id)).toEqual(u);
      expect(await s.userById(u.id + 1000)).toBeUndefined();
      expect(await s.userByAuthcode('code-ann')).toEqual(u);

      await s.updateUser(u.id, {
        authcode: 'code-new',
        authcodePrev: 'code-ann',
        authcodeRotatedAt: T + 5,
        confirmed: true,
        data: '{"a":1}',
        passwordHash: 'hash-2',
      });
      const changed = {
        ...u,
        authcode: 'code-new',
        authcodePrev: 'code-ann',
        authcodeRotatedAt: T + 5,
        confirmed: true,
        data: '{"a":1}',
        passwordHash: 'hash-2',
      };
      expect(await s.userById(u.id)).toEqual(changed);
      expect(await s.userByAuthcode('code-new')).toEqual(changed);
      expect(await s.userByAuthcode('code-ann')).toEqual(changed);
      expect(await s.userByAuthcode('code-none')).toBeUndefined();

      // Another user's current code goes before a previous one.
      const bob = await seedUser('bob', 'code-bob');
      await s.updateUser(u.id, { authcodePrev: 'code-bob' });
      expect((await s.userByAuthcode('code-bob'))?.id).toBe(bob.id);

      await s.updateUser(u.id, {});
      await s.updateUser(u.id, { authcodePrev: null });
      expect((await s.userById(u.id))?.authcodePrev).toBeNull();
    });
  });

  describe('sessions', () => {
    it('are created, read with their user, touched and deleted', async () => {
      const u = await seedUser();
      await s.createSession({ idHash: 'h1', frontendId: 'f1', userId: u.id, createdAt: T, lastSeenAt: T });
      await s.createSession({ idHash: 'h2', frontendId: 'f1', userId: null, createdAt: T, lastSeenAt: T });
      expect(await s.session('h1')).toEqual({
        idHash: 'h1',
        frontendId: 'f1',
        userId: u.id,
        createdAt: T,
        lastSeenAt: T,
        accessTokenId: null,
      });
      expect(await s.sessionWithUser('h1')).toEqual({ session: await s.session('h1'), user: u });
      expect(await s.sessionWithUser('h2')).toEqual({ session: await s.session('h2'), user: undefined });
      expect(await s.sessionWithUser('nope')).toBeUndefined();

      await s.touchSession('h1', T + 10);
      expect((await s.sessionWithUser('h1'))?.session.lastSeenAt).toBe(T + 10);
      await s.updateUser(u.id, { confirmed: true });
      expect((await s.sessionWithUser('h1'))?.user?.confirmed).toBe(true);

      expect(await s.deleteSession('h2')).toBe(true);
      expect(await s.deleteSession('h2')).toBe(false);
      expect(await s.sessionWithUser('h2')).toBeUndefined();
    });

    it('are deleted by user, and pruned when idle or old', async () => {
      const ann = await seedUser('ann');
      const bob = await seedUser('bob');
      const mk = (idHash: string, userId: number | null, createdAt: number, lastSeenAt: number) =>
        s.createSession({ idHash, frontendId: 'f1', userId, createdAt, lastSeenAt });
      await mk('a1', ann.id, T, T);
      await mk('a2', ann.id, T, T);
      await mk('b1', bob.id, T, T);
      expect(await s.sessionWithUser('a1')).toBeDefined();
      expect(await s.deleteSessionsOfUser(ann.id)).toBe(2);
      expect(await s.sessionWithUser('a1')).toBeUndefined();
      expect(await s.session('b1')).toBeDefined();

      await mk('idle', null, T + 100, T + 100);
      await mk('old', null, T, T + 1000);
      await mk('fresh', null, T + 500, T + 1000);
      // b1 is idle (last seen T < T + 200) too.
      expect(await s.pruneSessions(T + 200, T + 50)).toBe(3);
      expect(await s.session('fresh')).toBeDefined();
      expect(await s.session('old')).toBeUndefined();
      expect(await s.session('idle')).toBeUndefined();
    });
  });

  describe('tokens', () => {
    it('are taken once, of their kind, before they expire, by their user', async () => {
      const ann = await seedUser('ann');
      const bob = await seedUser('bob');
      await s.createToken({ hash: 't1', kind: 'confirm', userId: ann.id, expiresAt: T + 100 });
      expect(await s.takeToken('t1', 'recover', T)).toBeUndefined();
      expect(await s.takeToken('t1', 'confirm', T + 100)).toBeUndefined();
      expect(await s.takeToken('t1', 'confirm', T, bob.id)).toBeUndefined();
      expect(await s.takeToken('t1', 'confirm', T, ann.id)).toEqual({
        hash: 't1',
        kind: 'confirm',
        userId: ann.id,
        expiresAt: T + 100,
      });
      expect(await s.takeToken('t1', 'confirm', T, ann.id)).toBeUndefined();

      await s.createToken({ hash: 't2', kind: 'recover', userId: ann.id, expiresAt: T + 100 });
      expect((await s.takeToken('t2', 'recover', T))?.userId).toBe(ann.id);

      await s.createToken({ hash: 't3', kind: 'recover', userId: ann.id, expiresAt: T + 100 });
      await s.createToken({ hash: 't4', kind: 'confirm', userId: ann.id, expiresAt: T + 100 });
      await s.deleteTokensOfUser(ann.id, 'recover');
      expect(await s.takeToken('t3', 'recover', T)).toBeUndefined();
      expect(await s.takeToken('t4', 'confirm', T)).toBeDefined();
    });
  });

  describe('devices', () => {
    it('enroll on first use: the first secret stays; a device met through a broker gets its first one', async () => {
      await s.devices.enroll(dev(1), 'secret-1', T);
      await s.devices.enroll(dev(1), 'secret-2', T + 1);
      expect(await s.devices.secretHash(dev(1))).toBe('secret-1');
      expect(await s.credentials.secretHash(dev(1))).toBe('secret-1');
      expect(await s.devices.device(dev(1))).toEqual({
        id: dev(1),
        authcode: null,
        ownerId: null,
        claimedAt: null,
        enrolledAt: T,
      });

      await s.devices.touch(dev(2), T + 5);
      await s.devices.touch(dev(2), T + 6);
      expect(await s.devices.device(dev(2))).toMatchObject({ enrolledAt: T + 5 });
      expect(await s.devices.secretHash(dev(2))).toBeUndefined();
      await s.credentials.enroll(dev(2), 'secret-3', T + 7);
      expect(await s.credentials.secretHash(dev(2))).toBe('secret-3');
      expect(await s.devices.device(dev(2))).toMatchObject({ enrolledAt: T + 5 });

      expect(await s.devices.secretHash(dev(3))).toBeUndefined();
      expect(await s.devices.device(dev(3))).toBeUndefined();
      expect(await s.devices.count()).toBe(2);
    });

    it('keep an auth code only one device may have', async () => {
      await s.devices.touch(dev(1), T);
      await s.devices.touch(dev(2), T);
      expect(await s.devices.setAuthcode(dev(1), 'aa11')).toBe(true);
      expect(await s.devices.setAuthcode(dev(1), 'aa11')).toBe(true);
      expect(await s.devices.setAuthcode(dev(2), 'aa11')).toBe(false);
      expect((await s.devices.device(dev(2)))?.authcode).toBeNull();
      expect((await s.devices.deviceByAuthcode('aa11'))?.id).toBe(dev(1));
      expect(await s.devices.setAuthcode(dev(1), 'bb22')).toBe(true);
      expect(await s.devices.deviceByAuthcode('aa11')).toBeUndefined();
      expect(await s.devices.setAuthcode(dev(2), 'aa11')).toBe(true);
      expect((await s.devices.deviceByAuthcode('aa11'))?.id).toBe(dev(2));
    });

    it('are claimed once: claimed, already yours, taken', async () => {
      const ann = await seedUser('ann');
      const bob = await seedUser('bob');
      await s.devices.touch(dev(1), T);
      await s.devices.touch(dev(2), T);
      expect(await s.devices.claim(dev(9), ann.id, T)).toBe('taken');
      expect(await s.devices.claim(dev(2), ann.id, T + 1)).toBe('claimed');
      expect(await s.devices.claim(dev(1), ann.id, T + 2)).toBe('claimed');
      expect(await s.devices.claim(dev(1), ann.id, T + 3)).toBe('already-yours');
      expect(await s.devices.claim(dev(1), bob.id, T + 3)).toBe('taken');
      expect(await s.devices.device(dev(1))).toMatchObject({ ownerId: ann.id, claimedAt: T + 2 });
      expect(await s.devices.deviceIdsOf(ann.id)).toEqual([dev(2), dev(1)]);
      expect(await s.devices.deviceIdsOf(bob.id)).toEqual([]);
    });

    it('unregister: the s variables, history and nearby rows go, d and meta stay', async () => {
      const ann = await seedUser('ann');
      const bob = await seedUser('bob');
      await s.devices.touch(dev(1), T);
      await s.devices.claim(dev(1), ann.id, T);
      await s.devices.putVersion(dev(1), version('d', 'mode', 'on', T), 0, 'user');
      await s.devices.putVersion(dev(1), version('s', 'note', 'hi', T, 'cloud'), T, 'user');
      await s.devices.setMeta(dev(1), 'state', 'connected', T, 'server');
      await s.devices.heard(dev(1), ann.id, T);

      expect(await s.devices.unregister(dev(1), bob.id)).toBe(false);
      expect(await s.devices.getVar(dev(1), 's', 'note')).toBeDefined();
      expect(await s.devices.unregister(dev(1), ann.id)).toBe(true);
      expect(await s.devices.unregister(dev(1), ann.id)).toBe(false);

      expect(await s.devices.device(dev(1))).toMatchObject({ ownerId: null, claimedAt: null });
      expect(await s.devices.deviceIdsOf(ann.id)).toEqual([]);
      expect((await s.devices.vars(dev(1))).map((v) => `${v.type}/${v.name}`)).toEqual(['d/mode', 'meta/state']);
      expect(await s.devices.history(dev(1), 'd', 'mode', 10)).toEqual([]);
      expect(await s.devices.history(dev(1), 'meta', 'state', 10)).toEqual([]);
      expect(await s.devices.heardBy(dev(1), ann.id, 0)).toBe(false);
      expect(await s.devices.claim(dev(1), bob.id, T + 1)).toBe('claimed');
    });

    it('shares (decision 23): by the owner only, idempotent, listed, after owned devices in deviceIdsOf, ended', async () => {
      const [ann, bob, cy] = [await seedUser('ann'), await seedUser('bob'), await seedUser('cy')];
      for (const i of [1, 2, 3]) await s.devices.touch(dev(i), T);
      await s.devices.claim(dev(1), ann.id, T);
      await s.devices.claim(dev(2), ann.id, T + 1);
      await s.devices.claim(dev(3), bob.id, T + 2);
      // Read (and, on SQLite, kept) before the shares: each share must drop what was kept.
      expect(await s.devices.deviceIdsOf(bob.id)).toEqual([dev(3)]);

      expect(await s.devices.share(dev(2), ann.id, bob.id, T + 10)).toBe('shared');
      expect(await s.devices.share(dev(2), ann.id, bob.id, T + 11)).toBe('already');
      expect(await s.devices.share(dev(1), ann.id, bob.id, T + 12)).toBe('shared');
      expect(await s.devices.share(dev(2), bob.id, cy.id, T + 13)).toBe('not-owner');
      expect(await s.devices.share(dev(9), ann.id, cy.id, T + 13)).toBe('not-owner');
      expect(await s.devices.share(dev(2), ann.id, cy.id, T + 14)).toBe('shared');
      // Owned first, in claim order; then shared, in share order.
      expect(await s.devices.deviceIdsOf(bob.id)).toEqual([dev(3), dev(2), dev(1)]);
      expect(await s.devices.deviceIdsOf(ann.id)).toEqual([dev(1), dev(2)]);
      expect(await s.devices.isSharedWith(dev(2), bob.id)).toBe(true);
      expect(await s.devices.isSharedWith(dev(3), ann.id)).toBe(false);
      expect(await s.devices.sharesOf(dev(2))).toEqual([
        { userId: bob.id, login: 'bob', grantedAt: T + 10 },
        { userId: cy.id, login: 'cy', grantedAt: T + 14 },
      ]);

      expect(await s.devices.unshare(dev(1), bob.id)).toBe(true);
      expect(await s.devices.unshare(dev(1), bob.id)).toBe(false);
      expect(await s.devices.deviceIdsOf(bob.id)).toEqual([dev(3), dev(2)]);
      expect(await s.write((tx) => tx.devices.unregister(dev(2), ann.id))).toBe(true);
      expect(await s.devices.sharesOf(dev(2))).toEqual([]);
      expect(await s.devices.deviceIdsOf(bob.id)).toEqual([dev(3)]);
      expect(await s.devices.deviceIdsOf(cy.id)).toEqual([]);
      expect(await s.devices.claim(dev(2), cy.id, T + 20)).toBe('claimed');
      expect(await s.devices.isSharedWith(dev(2), bob.id)).toBe(false);
    });
  });

  describe('variables', () => {
    beforeEach(async () => {
      await s.devices.touch(dev(1), T);
    });

    it('putVersion writes a version with the acked stamp given, and its history unless told not to', async () => {
      await s.devices.putVersion(dev(1), version('d', 'mode', 'on', T + 10, 'cloud'), 0, 'user');
      expect(await s.devices.getVar(dev(1), 'd', 'mode')).toEqual({
        type: 'd',
        name: 'mode',
        value: Buffer.from('on'),
        time: T + 10,
        origin: 'cloud',
        acked: 0,
        synced: 0,
        syncacked: 0,
      });
      await s.devices.putVersion(dev(1), version('d', 'mode', null, T + 20, 'cloud'), 0, 'user', false);
      const v = await s.devices.getVar(dev(1), 'd', 'mode');
      expect(v).toMatchObject({ value: null, time: T + 20 });
      const h = await s.devices.history(dev(1), 'd', 'mode', 10);
      expect(h).toEqual([
        {
          id: expect.any(Number) as number,
          type: 'd',
          name: 'mode',
          value: Buffer.from('on'),
          by: 'user',
          timestamp: T + 10,
        },
      ]);
      expect(await s.devices.getVar(dev(1), 'd', 'other')).toBeUndefined();
    });

    it('applyFromDevice applies newer versions only: applied, same, older with the version held', async () => {
      const now = T + 1000;
      expect(await s.devices.applyFromDevice(dev(1), version('d', 'temp', '20', T + 10), now)).toEqual({
        outcome: 'applied',
      });
      expect(await s.devices.getVar(dev(1), 'd', 'temp')).toMatchObject({ time: T + 10, acked: now });
      expect(await s.devices.applyFromDevice(dev(1), version('d', 'temp', '20', T + 10), now)).toEqual({
        outcome: 'same',
      });
      const older = await s.devices.applyFromDevice(dev(1), version('d', 'temp', '19', T + 5), now);
      expect(older).toEqual({
        outcome: 'older',
        held: expect.objectContaining({ value: Buffer.from('20'), time: T + 10, origin: 'device' }) as unknown,
      });
      // At one time, the cloud's version wins over the device's.
      await s.devices.putVersion(dev(1), version('d', 'temp', '30', T + 20, 'cloud'), 0, 'user');
      expect((await s.devices.applyFromDevice(dev(1), version('d', 'temp', '21', T + 20), now)).outcome).toBe('older');
      // A newer one, whose time is past now: acked = max(now, time).
      expect((await s.devices.applyFromDevice(dev(1), version('d', 'temp', '22', now + 5), now)).outcome).toBe(
        'applied',
      );
      expect(await s.devices.getVar(dev(1), 'd', 'temp')).toMatchObject({
        value: Buffer.from('22'),
        origin: 'device',
        acked: now + 5,
      });
      expect((await s.devices.history(dev(1), 'd', 'temp', 10)).map((h) => [text(h.value), h.by])).toEqual([
        ['22', 'device'],
        ['30', 'user'],
        ['20', 'device'],
      ]);
    });

    it('acks versions and syncs, unacks, and pages what is pending', async () => {
      await s.devices.putVersion(dev(1), version('d', 'a', '1', T, 'cloud'), 0, 'user');
      await s.devices.putVersion(dev(1), version('d', 'b', '1', T, 'cloud'), 0, 'user');
      await s.devices.putVersion(dev(1), version('d', 'c', '1', T, 'cloud'), 0, 'user');
      await s.devices.putVersion(dev(1), version('s', 'x', '1', T, 'cloud'), 0, 'user');
      const names = async (after: string, limit: number) =>
        (await s.devices.pending(dev(1), after, limit)).map((v) => v.name);
      expect(await names('', 2)).toEqual(['a', 'b']);
      expect(await names('b', 2)).toEqual(['c']);

      expect(await s.devices.ackVersion(dev(1), 'd', 'a', { time: T, origin: 'device' }, T + 5)).toBe(false);
      expect(await s.devices.ackVersion(dev(1), 'd', 'a', { time: T + 1, origin: 'cloud' }, T + 5)).toBe(false);
      expect(await s.devices.ackVersion(dev(1), 'd', 'a', { time: T, origin: 'cloud' }, T + 5)).toBe(true);
      expect(await s.devices.ackVersion(dev(1), 'd', 'a', { time: T, origin: 'cloud' }, T + 6)).toBe(false);
      expect((await s.devices.getVar(dev(1), 'd', 'a'))?.acked).toBe(T + 5);
      expect(await names('', 10)).toEqual(['b', 'c']);

      await s.devices.unack(dev(1), 'd', 'a');
      expect((await s.devices.getVar(dev(1), 'd', 'a'))?.acked).toBe(0);
      expect(await names('', 10)).toEqual(['a', 'b', 'c']);
      expect(await s.devices.ackVersion(dev(1), 'd', 'a', { time: T, origin: 'cloud' }, T - 5)).toBe(true);
      // acked = max(now, time)
      expect((await s.devices.getVar(dev(1), 'd', 'a'))?.acked).toBe(T);
      await s.devices.ackVersion(dev(1), 'd', 'b', { time: T, origin: 'cloud' }, T + 1);
      await s.devices.ackVersion(dev(1), 'd', 'c', { time: T, origin: 'cloud' }, T + 1);
      expect(await names('', 10)).toEqual([]);

      expect(await s.devices.markSynced(dev(1), 'd', 'b', T + 100)).toBe(T + 100);
      expect(await s.devices.markSynced(dev(1), 'd', 'b', T + 50)).toBe(T + 101);
      expect(await s.devices.markSynced(dev(1), 'd', 'nope', T)).toBeUndefined();
      expect(await names('', 10)).toEqual(['b']);
      expect(await s.devices.ackSync(dev(1), 'd', 'b', T + 100, T + 200)).toBe(false);
      expect(await s.devices.ackSync(dev(1), 'd', 'b', T + 101, T + 50)).toBe(true);
      expect(await s.devices.ackSync(dev(1), 'd', 'b', T + 101, T + 300)).toBe(false);
      expect(await s.devices.getVar(dev(1), 'd', 'b')).toMatchObject({ synced: T + 101, syncacked: T + 101 });
      expect(await names('', 10)).toEqual([]);
    });

    it('setMeta writes only a value that differs; vars lists by type and name', async () => {
      await s.devices.setMeta(dev(1), 'platform', 'linux-x64', T, 'device');
      await s.devices.setMeta(dev(1), 'platform', 'linux-x64', T + 10, 'device');
      expect(await s.devices.getVar(dev(1), 'meta', 'platform')).toMatchObject({ time: T, acked: T });
      expect(await s.devices.history(dev(1), 'meta', 'platform', 10)).toHaveLength(1);
      await s.devices.setMeta(dev(1), 'platform', 'linux-arm64', T + 20, 'device');
      await s.devices.setMeta(dev(1), 'fwstate', 'idle', T + 20, 'server', false);
      expect(await s.devices.getVar(dev(1), 'meta', 'platform')).toMatchObject({
        value: Buffer.from('linux-arm64'),
        time: T + 20,
        origin: 'device',
      });
      expect((await s.devices.history(dev(1), 'meta', 'platform', 10)).map((h) => text(h.value))).toEqual([
        'linux-arm64',
        'linux-x64',
      ]);
      expect(await s.devices.history(dev(1), 'meta', 'fwstate', 10)).toEqual([]);

      await s.devices.putVersion(dev(1), version('s', 'note', 'x', T, 'cloud'), T, 'user');
      await s.devices.putVersion(dev(1), version('d', 'B', 'x', T, 'cloud'), 0, 'user');
      await s.devices.putVersion(dev(1), version('d', 'a', 'x', T, 'cloud'), 0, 'user');
      expect((await s.devices.vars(dev(1))).map((v) => `${v.type}/${v.name}`)).toEqual([
        'd/B',
        'd/a',
        'meta/fwstate',
        'meta/platform',
        's/note',
      ]);
      expect((await s.devices.vars(dev(1), 'd')).map((v) => v.name)).toEqual(['B', 'a']);
    });

    it('deviceJson follows every change', async () => {
      expect(JSON.parse(await s.devices.deviceJson(dev(1)))).toEqual({ d: {}, s: {}, meta: {} });
      await s.devices.putVersion(dev(1), version('d', 'mode', 'on', T, 'cloud'), 0, 'user');
      expect(JSON.parse(await s.devices.deviceJson(dev(1)))).toEqual({
        d: { mode: { value: 'on', time: T, acked: 0, synced: 0, syncacked: 0 } },
        s: {},
        meta: {},
      });
      await s.devices.ackVersion(dev(1), 'd', 'mode', { time: T, origin: 'cloud' }, T + 3);
      await s.devices.setMeta(dev(1), 'state', 'connected', T + 4, 'server');
      expect(JSON.parse(await s.devices.deviceJson(dev(1)))).toEqual({
        d: { mode: { value: 'on', time: T, acked: T + 3, synced: 0, syncacked: 0 } },
        s: {},
        meta: { state: { value: 'connected', time: T + 4 } },
      });
      await s.devices.putVersion(dev(1), version('d', 'mode', null, T + 5, 'cloud'), 0, 'user');
      expect(JSON.parse(await s.devices.deviceJson(dev(1)))).toMatchObject({ d: {} });
    });

    it('knows the connected devices, and marks them all disconnected', async () => {
      await s.devices.touch(dev(2), T);
      await s.devices.touch(dev(3), T);
      await s.devices.setMeta(dev(1), 'state', 'connected', T, 'server');
      await s.devices.setMeta(dev(2), 'state', 'connected', T, 'server');
      await s.devices.setMeta(dev(3), 'state', 'disconnected', T, 'server');
      expect((await s.devices.connectedIds()).sort()).toEqual([dev(1), dev(2)]);
      expect(await s.devices.markAllDisconnected(T + 10)).toBe(2);
      expect(await s.devices.connectedIds()).toEqual([]);
      expect(await s.devices.getVar(dev(1), 'meta', 'state')).toMatchObject({
        value: Buffer.from('disconnected'),
        time: T + 10,
      });
      const h = await s.devices.history(dev(2), 'meta', 'state', 10);
      expect(h.map((e) => [text(e.value), e.by, e.timestamp])).toEqual([
        ['disconnected', 'server', T + 10],
        ['connected', 'server', T],
      ]);
      expect(await s.devices.history(dev(3), 'meta', 'state', 10)).toHaveLength(1);
      expect(await s.devices.markAllDisconnected(T + 20)).toBe(0);
    });
  });

  describe('history', () => {
    beforeEach(async () => {
      await s.devices.touch(dev(1), T);
      await s.devices.touch(dev(2), T);
      for (let i = 0; i < 5; i++) {
        await s.devices.putVersion(dev(1), version('d', 'temp', String(i), T + i), T + i, 'device');
      }
      await s.devices.putVersion(dev(2), version('d', 'temp', 'x', T + 2), T, 'device');
    });

    it('pages newest first, before an entry', async () => {
      const first = await s.devices.history(dev(1), 'd', 'temp', 2);
      expect(first.map((h) => text(h.value))).toEqual(['4', '3']);
      const next = await s.devices.history(dev(1), 'd', 'temp', 2, first[1]!.id);
      expect(next.map((h) => text(h.value))).toEqual(['2', '1']);
      const last = await s.devices.history(dev(1), 'd', 'temp', 2, next[1]!.id);
      expect(last.map((h) => text(h.value))).toEqual(['0']);
      expect(first[0]!.id).toBeGreaterThan(first[1]!.id);
    });

    it('prunes by age, and each variable beyond a count', async () => {
      expect(await s.devices.pruneHistory(T + 2, 1)).toBe(1);
      expect(await s.devices.pruneHistory(T + 2, 10)).toBe(1);
      expect((await s.devices.history(dev(1), 'd', 'temp', 10)).map((h) => text(h.value))).toEqual(['4', '3', '2']);
      expect(await s.devices.history(dev(2), 'd', 'temp', 10)).toHaveLength(1);

      const key = { deviceId: dev(1), type: 'd' as const, name: 'temp' };
      expect(await s.devices.pruneVariableHistory(key, 1, 1)).toBe(1);
      expect(await s.devices.pruneVariableHistory(key, 1, 10)).toBe(1);
      expect(await s.devices.pruneVariableHistory(key, 1, 10)).toBe(0);
      expect((await s.devices.history(dev(1), 'd', 'temp', 10)).map((h) => text(h.value))).toEqual(['4']);
      expect(await s.devices.pruneVariableHistory({ ...key, name: 'none' }, 0, 10)).toBe(0);
      expect(await s.devices.history(dev(2), 'd', 'temp', 10)).toHaveLength(1);
    });

    it('walks every variable in key order', async () => {
      await s.devices.putVersion(dev(1), version('s', 'a', 'x', T, 'cloud'), T, 'user');
      await s.devices.putVersion(dev(1), version('d', 'B', 'x', T, 'cloud'), T, 'user');
      const all: string[] = [];
      let after: VarKey | undefined;
      for (;;) {
        const page = await s.devices.varKeys(after, 2);
        all.push(...page.map((k) => `${k.deviceId.slice(-1)}/${k.type}/${k.name}`));
        if (page.length < 2) break;
        after = page[page.length - 1];
      }
      expect(all).toEqual(['1/d/B', '1/d/temp', '1/s/a', '2/d/temp']);
      const grown = await s.devices.takeGrown();
      if (s.engine === 'postgres') expect(grown).toBeUndefined();
    });
  });

  describe('nearby', () => {
    it('records who heard which device, keeps the latest time, and prunes', async () => {
      const ann = await seedUser('ann');
      const bob = await seedUser('bob');
      await s.devices.touch(dev(1), T);
      await s.devices.touch(dev(2), T);
      await s.devices.touch(dev(3), T);
      await s.devices.setAuthcode(dev(1), 'bb');
      await s.devices.setAuthcode(dev(2), 'aa');
      await s.devices.heard(dev(1), ann.id, T + 10);
      await s.devices.heard(dev(1), ann.id, T + 5);
      await s.devices.heard(dev(2), ann.id, T + 20);
      await s.devices.heard(dev(3), ann.id, T + 20);
      await s.devices.heard(dev(2), bob.id, T + 1);

      expect(await s.devices.heardBy(dev(1), ann.id, T + 10)).toBe(true);
      expect(await s.devices.heardBy(dev(1), ann.id, T + 11)).toBe(false);
      expect(await s.devices.heardBy(dev(1), bob.id, 0)).toBe(false);
      // By authcode; one without comes first, as SQLite orders NULL.
      expect((await s.devices.nearbyOf(ann.id, T)).map((d) => d.id)).toEqual([dev(3), dev(2), dev(1)]);
      expect((await s.devices.nearbyOf(ann.id, T + 15)).map((d) => d.id)).toEqual([dev(3), dev(2)]);
      expect(await s.devices.nearbyOf(bob.id, T + 2)).toEqual([]);

      expect(await s.devices.pruneNearby(T + 11)).toBe(2);
      expect(await s.devices.heardBy(dev(2), bob.id, 0)).toBe(false);
      expect(await s.devices.heardBy(dev(2), ann.id, 0)).toBe(true);
    });
  });

  describe('commands', () => {
    beforeEach(async () => {
      await s.devices.touch(dev(1), T);
      await s.devices.touch(dev(2), T);
    });

    it('are added queued or sent, read, listed open and by device, and counted', async () => {
      await s.commands.add(command(1, dev(1)));
      await s.commands.add(command(2, dev(1)), T + 1);
      await s.commands.add(command(3, dev(1)));
      await s.commands.add(command(4, dev(2)));
      const c1 = await s.commands.get(cmdId(1));
      expect(c1).toEqual({
        seq: expect.any(Number) as number,
        id: cmdId(1),
        deviceId: dev(1),
        command: Buffer.from('echo 1'),
        priority: 1,
        createdAt: T,
        expiresAt: T + HOUR,
        state: 'queued',
        stateAt: T,
        sentAt: null,
        deliveredAt: null,
        startedAt: null,
        finishedAt: null,
        exitCode: null,
        signal: null,
        output: null,
        truncated: false,
        reason: null,
      });
      expect(await s.commands.get(cmdId(2))).toMatchObject({ state: 'sent', sentAt: T + 1, stateAt: T });
      expect(await s.commands.get(cmdId(9))).toBeUndefined();

      expect(await s.commands.openCount(dev(1))).toBe(3);
      const open = await s.commands.open(dev(1), 0, 2);
      expect(open.map((c) => c.id)).toEqual([cmdId(1), cmdId(2)]);
      expect((await s.commands.open(dev(1), open[1]!.seq, 2)).map((c) => c.id)).toEqual([cmdId(3)]);
      const newest = await s.commands.ofDevice(dev(1), 2);
      expect(newest.map((c) => c.id)).toEqual([cmdId(3), cmdId(2)]);
      expect((await s.commands.ofDevice(dev(1), 2, newest[1]!.seq)).map((c) => c.id)).toEqual([cmdId(1)]);
      expect(await s.commands.countByState()).toEqual({ queued: 3, sent: 1 });

      await s.commands.deleteOfDevice(dev(1));
      expect(await s.commands.openCount(dev(1))).toBe(0);
      expect(await s.commands.countByState()).toEqual({ queued: 1 });
    });

    it('move forward only: sent, delivered, running, done; a late or foreign report changes nothing', async () => {
      await s.commands.add(command(1, dev(1)));
      await s.commands.markSent(cmdId(1), T + 1);
      expect(await s.commands.get(cmdId(1))).toMatchObject({ state: 'sent', stateAt: T + 1, sentAt: T + 1 });
      expect(await s.commands.report(dev(2), status(1, 'running', T + 2))).toBe(false);
      expect(await s.commands.report(dev(1), status(1, 'queued', T + 2))).toBe(true);
      expect(await s.commands.report(dev(1), status(1, 'queued', T + 3))).toBe(false);
      expect(await s.commands.get(cmdId(1))).toMatchObject({ state: 'sent', deliveredAt: T + 2 });

      expect(await s.commands.report(dev(1), status(1, 'running', T + 4))).toBe(true);
      expect(await s.commands.report(dev(1), status(1, 'running', T + 5))).toBe(false);
      await s.commands.markSent(cmdId(1), T + 6);
      expect(await s.commands.get(cmdId(1))).toMatchObject({
        state: 'running',
        stateAt: T + 4,
        startedAt: T + 4,
        sentAt: T + 6,
      });
      const done = status(1, 'done', T + 7, { exitCode: 0, output: 'ok\n', truncated: true });
      expect(await s.commands.report(dev(1), done)).toBe(true);
      expect(await s.commands.report(dev(1), status(1, 'failed', T + 8, { reason: 'late' }))).toBe(false);
      expect(await s.commands.report(dev(1), status(1, 'running', T + 9))).toBe(false);
      expect(await s.commands.get(cmdId(1))).toMatchObject({
        state: 'done',
        stateAt: T + 7,
        deliveredAt: T + 2,
        startedAt: T + 4,
        finishedAt: T + 7,
        exitCode: 0,
        signal: null,
        output: 'ok\n',
        truncated: true,
        reason: null,
      });
      expect(await s.commands.openCount(dev(1))).toBe(0);

      // Delivered while still queued: it becomes sent; a first report of a final state sets delivered too.
      await s.commands.add(command(2, dev(1)));
      expect(await s.commands.report(dev(1), status(2, 'queued', T + 10))).toBe(true);
      expect(await s.commands.get(cmdId(2))).toMatchObject({ state: 'sent', stateAt: T + 10, sentAt: T + 10 });
      await s.commands.add(command(3, dev(1)));
      const failed = status(3, 'failed', T + 11, { exitCode: null, signal: 'SIGKILL', reason: 'killed' });
      expect(await s.commands.report(dev(1), failed)).toBe(true);
      expect(await s.commands.get(cmdId(3))).toMatchObject({
        state: 'failed',
        deliveredAt: T + 11,
        startedAt: null,
        signal: 'SIGKILL',
        reason: 'killed',
        truncated: false,
      });
    });

    it('expire when never delivered, and finished ones are pruned', async () => {
      await s.commands.add(command(1, dev(1), T, T + 10));
      await s.commands.add(command(2, dev(1), T, T + 10), T);
      await s.commands.add(command(3, dev(1), T, T + 10));
      await s.commands.add(command(4, dev(1), T, T + 100));
      await s.commands.report(dev(1), status(3, 'queued', T + 1));
      expect(await s.commands.expire(T + 9)).toBe(0);
      expect(await s.commands.expire(T + 10)).toBe(2);
      expect(await s.commands.get(cmdId(1))).toMatchObject({
        state: 'expired',
        stateAt: T + 10,
        finishedAt: T + 10,
        reason: 'its lifetime ended before the device received it',
      });
      expect((await s.commands.get(cmdId(3)))?.state).toBe('sent');
      expect(await s.commands.countByState()).toEqual({ expired: 2, sent: 1, queued: 1 });

      await s.commands.report(dev(1), status(3, 'done', T + 20, { exitCode: 0 }));
      expect(await s.commands.prune(T + 11, 1)).toBe(1);
      expect(await s.commands.prune(T + 11, 10)).toBe(1);
      expect(await s.commands.prune(T + 21, 10)).toBe(1);
      expect((await s.commands.ofDevice(dev(1), 10)).map((c) => c.id)).toEqual([cmdId(4)]);
    });
  });

  describe('firmware', () => {
    it('adds an image once per name: added, exists, conflict; lists by name and version', async () => {
      expect(s.firmware.imageDir.endsWith('firmware')).toBe(true);
      expect(s.firmware.imagePath({ sha256: 'ab' })).toBe(join(s.firmware.imageDir, 'ab'));
      const a = image('gw/b', { version: 2 });
      expect(await s.firmware.add(a)).toEqual({ outcome: 'added', image: a });
      expect(await s.firmware.add({ ...a, signature: 'other', addedAt: T + 5 })).toEqual({
        outcome: 'exists',
        image: a,
      });
      expect(await s.firmware.add({ ...a, version: 3 })).toEqual({ outcome: 'conflict', image: a });
      expect(await s.firmware.add({ ...a, from: ['linux-x64', 'linux-arm64'] })).toMatchObject({
        outcome: 'conflict',
      });
      await s.firmware.add(image('gw/a', { version: 9, sha256: 'b'.repeat(64), from: ['x', 'y'] }));
      await s.firmware.add(image('gw/B', { version: 1 }));
      expect((await s.firmware.list()).map((i) => i.name)).toEqual(['gw/B', 'gw/a', 'gw/b']);
      expect(await s.firmware.byName('gw/a')).toMatchObject({ from: ['x', 'y'], version: 9 });
      expect(await s.firmware.byName('gw/none')).toBeUndefined();
      expect(await s.firmware.isUsed('a'.repeat(64))).toBe(true);
      expect(await s.firmware.isUsed('c'.repeat(64))).toBe(false);
    });
  });

  describe('firmware jobs', () => {
    beforeEach(async () => {
      await s.devices.touch(dev(1), T);
      await s.devices.touch(dev(2), T);
    });

    it('at most one open per device; ended, cancelled, counted', async () => {
      await s.fwJobs.add(job('j1', dev(1), 'tok-1'));
      expect(await s.fwJobs.get('j1')).toEqual({
        id: 'j1',
        deviceId: dev(1),
        name: 'gw/rootfs-7',
        sha256: 'a'.repeat(64),
        size: 1000,
        tokenExpires: T + HOUR,
        open: true,
        cancelled: false,
        createdAt: T,
        endedAt: null,
        outcome: null,
        url: 'https://bridge.example/fw/j1',
      });
      await expect(s.fwJobs.add(job('j2', dev(1), 'tok-2'))).rejects.toThrow();
      expect(await s.fwJobs.get('j2')).toBeUndefined();
      await s.fwJobs.add(job('j3', dev(2), 'tok-3'));
      expect((await s.fwJobs.openOf(dev(1)))?.id).toBe('j1');
      expect(await s.fwJobs.openCount()).toBe(2);

      await s.fwJobs.markCancelled('j1');
      expect((await s.fwJobs.get('j1'))?.cancelled).toBe(true);
      expect(await s.fwJobs.end('j1', 'done', T + 5)).toBe(true);
      expect(await s.fwJobs.end('j1', 'failed', T + 6)).toBe(false);
      expect(await s.fwJobs.get('j1')).toMatchObject({ open: false, endedAt: T + 5, outcome: 'done' });
      expect(await s.fwJobs.openOf(dev(1))).toBeUndefined();
      expect(await s.fwJobs.openCount()).toBe(1);
      await s.fwJobs.markCancelled('j1');
      await s.fwJobs.add(job('j2', dev(1), 'tok-2'));
      expect((await s.fwJobs.openOf(dev(1)))?.id).toBe('j2');
      expect(await s.fwJobs.end('j3', 'image-gone', T + 7)).toBe(true);
      expect((await s.fwJobs.get('j3'))?.outcome).toBe('image-gone');
    });

    it('tokens: the current and the one before it open the image until the expiry, while the job is open', async () => {
      await s.fwJobs.add(job('j1', dev(1), 'tok-1'));
      expect((await s.fwJobs.tokenValid('j1', 'tok-1', T))?.id).toBe('j1');
      expect(await s.fwJobs.tokenValid('j1', 'tok-x', T)).toBeUndefined();
      expect(await s.fwJobs.tokenValid('j2', 'tok-1', T)).toBeUndefined();
      expect(await s.fwJobs.tokenValid('j1', 'tok-1', T + HOUR)).toBeUndefined();

      await s.fwJobs.renewToken('j1', 'tok-2', T + 2 * HOUR);
      expect((await s.fwJobs.get('j1'))?.tokenExpires).toBe(T + 2 * HOUR);
      expect(await s.fwJobs.tokenValid('j1', 'tok-2', T + HOUR)).toBeDefined();
      expect(await s.fwJobs.tokenValid('j1', 'tok-1', T + HOUR)).toBeDefined();
      await s.fwJobs.renewToken('j1', 'tok-3', T + 2 * HOUR);
      expect(await s.fwJobs.tokenValid('j1', 'tok-1', T)).toBeUndefined();
      expect(await s.fwJobs.tokenValid('j1', 'tok-2', T)).toBeDefined();
      expect(await s.fwJobs.tokenValid('j1', 'tok-3', T)).toBeDefined();

      await s.fwJobs.end('j1', 'abandoned', T + 1);
      expect(await s.fwJobs.tokenValid('j1', 'tok-3', T + 1)).toBeUndefined();
      await s.fwJobs.renewToken('j1', 'tok-4', T + 3 * HOUR);
      expect((await s.fwJobs.get('j1'))?.tokenExpires).toBe(T + 2 * HOUR);
    });
  });

  describe('write', () => {
    it('commits a unit of work whole and answers its value; its writes are visible inside it', async () => {
      const value = await s.write(async (tx) => {
        await tx.createFrontend(frontendOf('f1', true));
        expect((await tx.frontend('f1'))?.id).toBe('f1');
        expect((await tx.defaultFrontend())?.id).toBe('f1');
        await tx.devices.touch(dev(1), T);
        await tx.devices.putVersion(dev(1), version('d', 'mode', 'on', T, 'cloud'), 0, 'user');
        expect(text((await tx.devices.getVar(dev(1), 'd', 'mode'))?.value)).toBe('on');
        expect(await tx.devices.deviceJson(dev(1))).toContain('"mode"');
        return 42;
      });
      expect(value).toBe(42);
      expect((await s.frontend('f1'))?.id).toBe('f1');
      expect((await s.defaultFrontend())?.id).toBe('f1');
      expect(text((await s.devices.getVar(dev(1), 'd', 'mode'))?.value)).toBe('on');
      expect(await s.write(async (tx) => (await tx.devices.count()) + 1, { durable: false })).toBe(2);
    });

    it('rolls back every write of a unit that throws, and rejects with its error', async () => {
      await s.devices.touch(dev(1), T);
      const boom = new Error('boom');
      const err = await s
        .write(async (tx) => {
          await tx.createFrontend(frontendOf('f1', true));
          await tx.devices.touch(dev(2), T);
          await tx.devices.putVersion(dev(1), version('d', 'mode', 'on', T, 'cloud'), 0, 'user');
          await tx.commands.add(command(1, dev(1)));
          expect(await tx.devices.count()).toBe(2);
          throw boom;
        })
        .catch((e: unknown) => e);
      expect(err).toBe(boom);
      expect(await s.frontend('f1')).toBeUndefined();
      expect(await s.frontends()).toEqual([]);
      expect(await s.devices.count()).toBe(1);
      expect(await s.devices.getVar(dev(1), 'd', 'mode')).toBeUndefined();
      expect(await s.devices.history(dev(1), 'd', 'mode', 10)).toEqual([]);
      expect(await s.commands.get(cmdId(1))).toBeUndefined();

      // A failing statement fails its unit the same way, and the store goes on.
      const failed = await s
        .write(async (tx) => {
          await tx.devices.touch(dev(3), T);
          await tx.commands.add(command(2, dev(9)));
        })
        .catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(Error);
      expect(await s.devices.device(dev(3))).toBeUndefined();
      await s.write((tx) => tx.devices.touch(dev(3), T));
      expect(await s.devices.device(dev(3))).toBeDefined();
    });

    it('reports the size of the database, and no checkpoint under way', async () => {
      const size = await s.databaseSize();
      expect(size.bytes).toBeGreaterThan(0);
      expect(size.freeBytes).toBeGreaterThanOrEqual(0);
      expect(s.checkpointing).toBe(false);
      expect(s.storage).toMatchObject({ full: false, refused: 0 });
    });
  });
}

function logger() {
  const sink = new LogSink();
  return { sink, log: createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink }) };
}

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const dataDir = () => {
  const d = tempDir('devcloud-store-');
  dirs.push(d);
  return d;
};

describe('the bridge store on SQLite', () => {
  behaviour(() => Promise.resolve(new SqliteStore(dataDir())));
});

describe.skipIf(await missingPostgres())('the bridge store on PostgreSQL', () => {
  const db = usePostgres();
  beforeEach(() => db.reset());
  const open = (log = logger().log, poolSize = 4) => openPostgresStore(db.url, log, { dataDir: dataDir(), poolSize });

  describe('the shared behaviour', () => {
    behaviour(() => open());
  });

  describe('two bridges on one database', () => {
    let a: PostgresStore;
    let b: PostgresStore;
    beforeEach(async () => {
      a = await open();
      b = await open();
    });
    afterEach(async () => {
      await a.close();
      await b.close();
    });

    /** Resolves once a statement of the test's database waits for a lock. */
    const someoneWaits = () =>
      until(async () => {
        const r = await db.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        );
        return r.rows[0]!.n > 0;
      }, 'a statement waiting for a lock');

    /**
     * Runs `first` in a unit of work of `store` and keeps the unit open, uncommitted, until another statement waits
     * for one of its locks. Resolves once `first` is done, with the unit's outcome to await.
     */
    const holding = async <T>(store: BridgeStore, first: (tx: StoreTx) => Promise<T>) => {
      let ready!: () => void;
      const firstDone = new Promise<void>((resolve) => (ready = resolve));
      const unit = store.write(async (tx) => {
        const value = await first(tx);
        ready();
        await someoneWaits();
        return value;
      });
      await Promise.race([firstDone, unit]);
      return { unit };
    };

    it('two units that lock two variables in opposite orders both commit: the one the server stops runs again', async () => {
      await a.devices.touch(dev(1), T);
      for (const name of ['x', 'y']) await a.devices.putVersion(dev(1), version('d', name, '0', T, 'cloud'), 0, 'user');
      // Each unit locks its first variable, then waits until the other has its own, then asks for the other's.
      let locked = 0;
      const bothLocked = () => until(() => locked >= 2, 'both first locks');
      const runs = { a: 0, b: 0 };
      const unit = (store: BridgeStore, key: 'a' | 'b', first: string, second: string) =>
        store.write(async (tx) => {
          runs[key]++;
          await tx.devices.getVar(dev(1), 'd', first, { forUpdate: true });
          locked++;
          await bothLocked();
          await tx.devices.getVar(dev(1), 'd', second, { forUpdate: true });
          await tx.devices.putVersion(dev(1), version('d', first, key, T + 1, 'cloud'), 0, 'user');
          return key;
        });
      const outcomes = await Promise.allSettled([unit(a, 'a', 'x', 'y'), unit(b, 'b', 'y', 'x')]);
      expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled']);
      // The server broke the deadlock by stopping one of them, which ran a second time.
      expect(runs.a + runs.b).toBe(3);
      expect((await a.devices.getVar(dev(1), 'd', 'x'))?.value?.toString()).toBe('a');
      expect((await a.devices.getVar(dev(1), 'd', 'y'))?.value?.toString()).toBe('b');
    });

    it('see each other’s writes at once: nothing of a device, session or user is kept', async () => {
      await a.createFrontend(frontendOf('f1', true));
      const u = (await a.createUser({ frontendId: 'f1', login: 'ann', passwordHash: 'h', authcode: 'c', now: T }))!;
      await a.createSession({ idHash: 's1', frontendId: 'f1', userId: u.id, createdAt: T, lastSeenAt: T });
      await a.devices.touch(dev(1), T);
      expect((await b.sessionWithUser('s1'))?.user?.login).toBe('ann');
      expect(await b.devices.deviceJson(dev(1))).toBe('{"d":{},"s":{},"meta":{}}');
      expect(await b.devices.deviceIdsOf(u.id)).toEqual([]);

      await a.updateUser(u.id, { confirmed: true });
      await a.devices.claim(dev(1), u.id, T);
      await a.devices.putVersion(dev(1), version('d', 'mode', 'on', T, 'cloud'), 0, 'user');
      expect((await b.sessionWithUser('s1'))?.user?.confirmed).toBe(true);
      expect(await b.devices.deviceIdsOf(u.id)).toEqual([dev(1)]);
      expect((await b.devices.device(dev(1)))?.ownerId).toBe(u.id);
      expect(await b.devices.deviceJson(dev(1))).toContain('"mode"');
      await a.deleteSession('s1');
      expect(await b.sessionWithUser('s1')).toBeUndefined();
    });

    it('a frontend another bridge made or changed is seen within a second', async () => {
      vi.useFakeTimers({ toFake: ['performance'] });
      try {
        expect(await a.frontend('f1')).toBeUndefined();
        expect(await a.defaultFrontend()).toBeUndefined();
        await b.createFrontend(frontendOf('f1', true));
        expect((await b.frontend('f1'))?.id).toBe('f1');
        expect((await a.frontends()).map((f) => f.id)).toEqual(['f1']);
        vi.advanceTimersByTime(1001);
        expect((await a.frontend('f1'))?.id).toBe('f1');
        expect((await a.defaultFrontend())?.id).toBe('f1');
        await b.setFrontendConfig('f1', ProductConfig.parse({ nearby: false }));
        vi.advanceTimersByTime(1001);
        expect((await a.frontend('f1'))?.config.nearby).toBe(false);
      } finally {
        vi.useRealTimers();
      }
    });

    it('two versions of one new variable applied at once: both succeed, the newer stays', async () => {
      await a.devices.touch(dev(1), T);
      // The newer one first, held uncommitted until the other is waiting for it.
      const first = await holding(a, (tx) =>
        tx.devices.applyFromDevice(dev(1), version('d', 'temp', 'new', T + 20), T + 100),
      );
      const second = b.devices.applyFromDevice(dev(1), version('d', 'temp', 'old', T + 10), T + 100);
      expect(await first.unit).toEqual({ outcome: 'applied' });
      expect(await second).toMatchObject({ outcome: 'older', held: { value: Buffer.from('new') } });
      expect(text((await a.devices.getVar(dev(1), 'd', 'temp'))?.value)).toBe('new');

      // The older one first: both are applied, in order.
      const older = await holding(a, (tx) =>
        tx.devices.applyFromDevice(dev(1), version('d', 'hum', 'old', T + 10), T + 100),
      );
      const newer = b.devices.applyFromDevice(dev(1), version('d', 'hum', 'new', T + 20), T + 100);
      expect(await older.unit).toEqual({ outcome: 'applied' });
      expect(await newer).toEqual({ outcome: 'applied' });
      expect(text((await b.devices.getVar(dev(1), 'd', 'hum'))?.value)).toBe('new');
      expect((await b.devices.history(dev(1), 'd', 'hum', 10)).map((h) => text(h.value))).toEqual(['new', 'old']);

      // Many at once, without arranging the order.
      const names = Array.from({ length: 20 }, (_, i) => `v${i}`);
      const outcomes = await Promise.all(
        names.flatMap((n) => [
          a.devices.applyFromDevice(dev(1), version('d', n, 'a', T + 1), T),
          b.devices.applyFromDevice(dev(1), version('d', n, 'b', T + 2), T),
        ]),
      );
      expect(outcomes.every((o) => o.outcome === 'applied' || o.outcome === 'older')).toBe(true);
      for (const n of names) expect(text((await a.devices.getVar(dev(1), 'd', n))?.value)).toBe('b');
    });

    it('two users claiming one device at once: exactly one claims it', async () => {
      await a.createFrontend(frontendOf('f1', true));
      const ann = (await a.createUser({ frontendId: 'f1', login: 'ann', passwordHash: 'h', authcode: 'ca', now: T }))!;
      const bob = (await a.createUser({ frontendId: 'f1', login: 'bob', passwordHash: 'h', authcode: 'cb', now: T }))!;
      await a.devices.touch(dev(1), T);
      const first = await holding(a, (tx) => tx.devices.claim(dev(1), ann.id, T));
      const second = b.devices.claim(dev(1), bob.id, T);
      expect([await first.unit, await second]).toEqual(['claimed', 'taken']);
      expect((await b.devices.device(dev(1)))?.ownerId).toBe(ann.id);

      const ids = Array.from({ length: 10 }, (_, i) => dev(100 + i));
      for (const id of ids) await a.devices.touch(id, T);
      const results = await Promise.all(
        ids.flatMap((id) => [a.devices.claim(id, ann.id, T), b.devices.claim(id, bob.id, T)]),
      );
      for (let i = 0; i < ids.length; i++) {
        expect([results[2 * i], results[2 * i + 1]].sort()).toEqual(['claimed', 'taken']);
      }
    });

    it('one token taken by two at once: one gets it; one auth code set for two devices at once: one keeps it', async () => {
      await a.createFrontend(frontendOf('f1', true));
      const ann = (await a.createUser({ frontendId: 'f1', login: 'ann', passwordHash: 'h', authcode: 'ca', now: T }))!;
      const hashes = Array.from({ length: 10 }, (_, i) => `t${i}`);
      for (const hash of hashes) await a.createToken({ hash, kind: 'confirm', userId: ann.id, expiresAt: T + 10 });
      const taken = await Promise.all(
        hashes.flatMap((h) => [a.takeToken(h, 'confirm', T), b.takeToken(h, 'confirm', T)]),
      );
      expect(taken.filter((t) => t !== undefined)).toHaveLength(hashes.length);

      const pairs = Array.from({ length: 10 }, (_, i) => [dev(200 + 2 * i), dev(201 + 2 * i)] as const);
      for (const [x, y] of pairs) {
        await a.devices.touch(x, T);
        await a.devices.touch(y, T);
      }
      const set = await Promise.all(
        pairs.flatMap(([x, y], i) => [a.devices.setAuthcode(x, `code${i}`), b.devices.setAuthcode(y, `code${i}`)]),
      );
      for (let i = 0; i < pairs.length; i++) {
        expect([set[2 * i], set[2 * i + 1]].sort()).toEqual([false, true]);
      }
    });

    it('one firmware job per device, also when two bridges start one at once', async () => {
      await a.devices.touch(dev(1), T);
      const results = await Promise.allSettled([
        a.write((tx) => tx.fwJobs.add(job('j1', dev(1), 'tok-1'))),
        b.write((tx) => tx.fwJobs.add(job('j2', dev(1), 'tok-2'))),
      ]);
      expect(results.map((r) => r.status).sort()).toEqual(['fulfilled', 'rejected']);
      const rejected = results.find((r) => r.status === 'rejected')!;
      expect(String(rejected.reason)).toContain('has an open firmware job already');
      expect(await a.fwJobs.openCount()).toBe(1);
    });
  });

  describe('failures', () => {
    it('durable: false turns synchronous_commit off for its own transaction only', async () => {
      const store = await open();
      try {
        // What each insert into sessions ran with, noted by a trigger.
        await db.pool.query(`
          CREATE TABLE seen (id_hash TEXT, sync TEXT);
          CREATE FUNCTION note_sync() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN INSERT INTO seen VALUES (NEW.id_hash, current_setting('synchronous_commit')); RETURN NEW; END $$;
          CREATE TRIGGER note_sync BEFORE INSERT ON sessions FOR EACH ROW EXECUTE FUNCTION note_sync();`);
        const session = (idHash: string) => ({ idHash, frontendId: 'f1', userId: null, createdAt: T, lastSeenAt: T });
        await store.write((tx) => tx.createSession(session('relaxed')), { durable: false });
        await store.write((tx) => tx.createSession(session('durable')));
        await store.createSession(session('alone'));
        await store.write((tx) => tx.createSession(session('relaxed-2')), { durable: false });
        await store.write((tx) => tx.createSession(session('durable-2')), { durable: true });
        const seen = await db.pool.query<{ id_hash: string; sync: string }>('SELECT id_hash, sync FROM seen');
        expect(Object.fromEntries(seen.rows.map((r) => [r.id_hash, r.sync]))).toEqual({
          relaxed: 'off',
          durable: 'on',
          alone: 'on',
          'relaxed-2': 'off',
          'durable-2': 'on',
        });
      } finally {
        await store.close();
      }
    });

    it('a full disk rejects writes with StorageFullError until one works again', async () => {
      const { sink, log } = logger();
      let clock = T;
      const store = await openPostgresStore(db.url, log, { dataDir: dataDir(), now: () => clock });
      try {
        // The server's answer when it cannot extend a file: SQLSTATE 53100, made here by a trigger.
        await db.pool.query(`
          CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$;
          CREATE TRIGGER disk_full BEFORE INSERT ON sessions FOR EACH ROW EXECUTE FUNCTION disk_full();`);
        const session = { idHash: 'h1', frontendId: 'f1', userId: null, createdAt: T, lastSeenAt: T };
        const inWrite = await store
          .write(async (tx) => {
            await tx.devices.touch(dev(1), T);
            await tx.createSession(session);
          })
          .catch((e: unknown) => e);
        expect(inWrite).toBeInstanceOf(StorageFullError);
        expect(store.storage).toEqual({ full: true, fullSince: T, refused: 1 });
        expect(await store.devices.device(dev(1))).toBeUndefined();
        clock = T + 5;
        await expect(store.createSession(session)).rejects.toBeInstanceOf(StorageFullError);
        expect(store.storage).toEqual({ full: true, fullSince: T, refused: 2 });
        expect(sink.events('storage.full')).toHaveLength(1);
        expect(sink.events('storage.full')[0]).toMatchObject({
          level: 'error',
          database: expect.any(String) as string,
        });

        // A read changes nothing; a write that works clears it.
        await store.devices.device(dev(1));
        expect(store.storage.full).toBe(true);
        await db.pool.query('DROP TRIGGER disk_full ON sessions');
        await store.write((tx) => tx.createSession(session));
        expect(store.storage).toEqual({ full: false, fullSince: undefined, refused: 2 });
        expect(sink.events('storage.recovered')).toHaveLength(1);
        expect(await store.session('h1')).toBeDefined();
      } finally {
        await store.close();
      }
    });

    it('a unit whose connection breaks fails; the connection is dropped and the pool goes on', async () => {
      const store = await openPostgresStore(db.url, logger().log, { dataDir: dataDir(), poolSize: 1 });
      try {
        const err = await store
          .write(async (tx) => {
            await tx.devices.touch(dev(1), T);
            await db.pool.query(
              "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'",
            );
            await tx.devices.touch(dev(2), T);
          })
          .catch((e: unknown) => e);
        expect(err).toBeInstanceOf(Error);
        // One connection at most: the broken one was not given back.
        await store.write((tx) => tx.devices.touch(dev(3), T));
        expect(await store.devices.count()).toBe(1);
      } finally {
        await store.close();
      }
    });

    it('a store call made through a unit’s tx after it ended is refused', async () => {
      const store = await open();
      try {
        let kept: StoreTx | undefined;
        await store.write((tx) => {
          kept = tx;
          return Promise.resolve();
        });
        await expect(kept!.devices.count()).rejects.toThrow('the store transaction has ended');
      } finally {
        await store.close();
      }
    });
  });
});
