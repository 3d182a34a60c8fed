/**
 * What the bridge keeps of devices (docs/decisions.md §3 to §5), in the bridge's SQLite database:
 *
 * - `devices`: every device the bridge has met, its auth code (claim token) and its owner;
 * - `vars`: the `d`, `s` and `meta` variables of each device, `d` with the four stamps of docs/decisions.md §3;
 * - `history`: every value a variable took, indexed by variable and id, so that reading the newest N entries
 *   costs the same whatever the length of the history (decisions 10 and 11);
 * - `nearby`: which user's authcode each device heard last, and when (decision 18);
 * - `device_shares`: the users an owner shared a device with (decision 23; migration 8, bridge/store/sqlite.ts).
 *
 * Every method is synchronous; writes run inside the caller's transaction (`BridgeStore.write`). Only one
 * bridge process serves a data directory, so the JSON of a device object is kept in memory once built and
 * dropped by every write that changes the device; so is the list of each user's devices, dropped by the user's
 * claims and unregistrations (the only writes that change a device's owner) and by the shares that name the user,
 * granted, taken back, or ended with their device's registration.
 */
import type { Db, Migration } from '../../lib/sqlite.js';
import { type Version, compareVersions } from '../../protocol/index.js';
import { type RenderableVar, renderDevice } from './view.js';

export type VarType = 'd' | 's' | 'meta';
export type Origin = 'device' | 'cloud';
/** Decision 11: who set a value. */
export type SetBy = 'device' | 'user' | 'server';

export interface Device {
  id: string;
  /** The device's claim token and its key in `GET /0/network/`; `null` until its first hello. */
  authcode: string | null;
  ownerId: number | null;
  claimedAt: number | null;
  enrolledAt: number;
}

export interface VarRecord extends RenderableVar {
  type: VarType;
  name: string;
  origin: Origin;
}

export interface HistoryEntry {
  id: number;
  type: VarType;
  name: string;
  /** `null` for a deletion. */
  value: Buffer | null;
  by: SetBy;
  timestamp: number;
}

/** A new version of a variable. */
export interface NewVersion {
  type: VarType;
  name: string;
  value: Buffer | null;
  time: number;
  origin: Origin;
}

/** Migration 3: devices get an auth code and an owner; variables, history and the nearby table. */
export const DEVICE_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE devices_v3 (
      id          TEXT PRIMARY KEY,
      secret_hash TEXT,
      enrolled_at INTEGER NOT NULL,
      authcode    TEXT UNIQUE,
      owner_id    INTEGER REFERENCES users (id) ON DELETE SET NULL,
      claimed_at  INTEGER
    ) WITHOUT ROWID;
    INSERT INTO devices_v3 (id, secret_hash, enrolled_at) SELECT id, secret_hash, enrolled_at FROM devices;
    DROP TABLE devices;
    ALTER TABLE devices_v3 RENAME TO devices;
    CREATE INDEX devices_owner ON devices (owner_id, claimed_at) WHERE owner_id IS NOT NULL;

    CREATE TABLE vars (
      device_id TEXT    NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
      type      TEXT    NOT NULL CHECK (type IN ('d', 's', 'meta')),
      name      TEXT    NOT NULL,
      value     BLOB,
      time      INTEGER NOT NULL,
      origin    TEXT    NOT NULL CHECK (origin IN ('device', 'cloud')),
      acked     INTEGER NOT NULL DEFAULT 0,
      synced    INTEGER NOT NULL DEFAULT 0,
      syncacked INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (device_id, type, name)
    ) WITHOUT ROWID;
    -- What the catch-up on hello sends: d versions not acknowledged, and syncs not acknowledged.
    CREATE INDEX vars_pending ON vars (device_id, name)
      WHERE type = 'd' AND (acked < time OR syncacked < synced);

    CREATE TABLE history (
      id        INTEGER PRIMARY KEY,
      device_id TEXT    NOT NULL,
      type      TEXT    NOT NULL,
      name      TEXT    NOT NULL,
      value     BLOB,
      by        TEXT    NOT NULL,
      timestamp INTEGER NOT NULL
    );
    CREATE INDEX history_var ON history (device_id, type, name, id);
    CREATE INDEX history_time ON history (timestamp);

    CREATE TABLE nearby (
      user_id   INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
      device_id TEXT    NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
      heard_at  INTEGER NOT NULL,
      PRIMARY KEY (user_id, device_id)
    ) WITHOUT ROWID;
    CREATE INDEX nearby_device ON nearby (device_id);
    CREATE INDEX nearby_heard ON nearby (heard_at);
  `);
};

/** A row of `devices`, as either engine reads it. */
export interface DeviceRow {
  id: string;
  secret_hash: string | null;
  enrolled_at: number;
  authcode: string | null;
  owner_id: number | null;
  claimed_at: number | null;
}

interface VarRow {
  type: VarType;
  name: string;
  value: Buffer | null;
  time: number;
  origin: Origin;
  acked: number;
  synced: number;
  syncacked: number;
}

interface HistoryRow {
  id: number;
  type: VarType;
  name: string;
  value: Buffer | null;
  by: SetBy;
  timestamp: number;
}

export const toDevice = (r: DeviceRow): Device => ({
  id: r.id,
  authcode: r.authcode,
  ownerId: r.owner_id,
  claimedAt: r.claimed_at,
  enrolledAt: r.enrolled_at,
});

/** Device rows and device JSON kept in memory; beyond this many, the oldest entry is dropped. */
const CACHE_MAX = 20_000;
/**
 * Variables whose history grew since the retention last looked (retention.ts); beyond this many, the set is
 * dropped and the next pass looks at every variable instead.
 */
const GROWN_MAX = 200_000;

/** A variable, as the retention walks them. */
export interface VarKey {
  deviceId: string;
  type: VarType;
  name: string;
}

export type ClaimOutcome = 'claimed' | 'already-yours' | 'taken';

/** Decision 23: what sharing a device did. */
export type ShareOutcome = 'shared' | 'already' | 'not-owner';

/** One user a device is shared with (decision 23). */
export interface DeviceShare {
  userId: number;
  login: string;
  grantedAt: number;
}

export class DeviceStore {
  private readonly s;
  private readonly rows = new Map<string, Device | null>();
  private readonly views = new Map<string, string>();
  /** Device ids by owner, in claim order. */
  private readonly owned = new Map<number, readonly string[]>();
  /**
   * Variables that got history entries since `takeGrown` (keys `device\0type\0name`); `undefined` when that is
   * not known: at start, and after more than `GROWN_MAX`.
   */
  private grown: Set<string> | undefined;

  constructor(private readonly db: Db) {
    this.s = {
      device: db.prepare<[string], DeviceRow>('SELECT * FROM devices WHERE id = ?'),
      byAuthcode: db.prepare<[string], DeviceRow>('SELECT * FROM devices WHERE authcode = ?'),
      // Owned devices in claim order, then shared ones in share order (decision 23); each part from its index.
      idsOfUser: db
        .prepare<[number, number], string>(
          `SELECT id FROM (
             SELECT id, 0 AS part, claimed_at AS at FROM devices WHERE owner_id = ?
             UNION ALL
             SELECT device_id, 1, granted_at FROM device_shares WHERE user_id = ?
           ) ORDER BY part, at, id`,
        )
        .pluck(),
      share: db.prepare(
        'INSERT INTO device_shares (device_id, user_id, granted_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING',
      ),
      unshare: db.prepare('DELETE FROM device_shares WHERE device_id = ? AND user_id = ?'),
      isShared: db
        .prepare<[string, number], number>('SELECT 1 FROM device_shares WHERE device_id = ? AND user_id = ?')
        .pluck(),
      sharesOf: db.prepare<[string], { user_id: number; login: string; granted_at: number }>(
        `SELECT s.user_id, u.login, s.granted_at FROM device_shares s JOIN users u ON u.id = s.user_id
         WHERE s.device_id = ? ORDER BY s.granted_at, s.user_id`,
      ),
      shareUsers: db.prepare<[string], number>('SELECT user_id FROM device_shares WHERE device_id = ?').pluck(),
      delShares: db.prepare('DELETE FROM device_shares WHERE device_id = ?'),
      secret: db.prepare<[string], { secret_hash: string | null }>('SELECT secret_hash FROM devices WHERE id = ?'),
      enroll: db.prepare(
        `INSERT INTO devices (id, secret_hash, enrolled_at) VALUES (@id, @hash, @now)
         ON CONFLICT (id) DO UPDATE SET secret_hash = @hash WHERE secret_hash IS NULL`,
      ),
      touch: db.prepare('INSERT INTO devices (id, enrolled_at) VALUES (?, ?) ON CONFLICT (id) DO NOTHING'),
      setAuthcode: db.prepare('UPDATE devices SET authcode = ? WHERE id = ?'),
      claim: db.prepare('UPDATE devices SET owner_id = ?, claimed_at = ? WHERE id = ? AND owner_id IS NULL'),
      unclaim: db.prepare('UPDATE devices SET owner_id = NULL, claimed_at = NULL WHERE id = ? AND owner_id = ?'),
      delServerVars: db.prepare("DELETE FROM vars WHERE device_id = ? AND type = 's'"),
      delHistory: db.prepare('DELETE FROM history WHERE device_id = ?'),
      delNearby: db.prepare('DELETE FROM nearby WHERE device_id = ?'),
      getVar: db.prepare<[string, string, string], VarRow>(
        'SELECT type, name, value, time, origin, acked, synced, syncacked FROM vars WHERE device_id = ? AND type = ? AND name = ?',
      ),
      varsOf: db.prepare<[string], VarRow>(
        'SELECT type, name, value, time, origin, acked, synced, syncacked FROM vars WHERE device_id = ? ORDER BY type, name',
      ),
      varsOfType: db.prepare<[string, string], VarRow>(
        'SELECT type, name, value, time, origin, acked, synced, syncacked FROM vars WHERE device_id = ? AND type = ? ORDER BY name',
      ),
      putVar: db.prepare(
        `INSERT INTO vars (device_id, type, name, value, time, origin, acked, synced, syncacked)
         VALUES (@deviceId, @type, @name, @value, @time, @origin, @acked, 0, 0)
         ON CONFLICT (device_id, type, name) DO UPDATE SET
           value = excluded.value, time = excluded.time, origin = excluded.origin, acked = excluded.acked`,
      ),
      addHistory: db.prepare(
        'INSERT INTO history (device_id, type, name, value, by, timestamp) VALUES (@deviceId, @type, @name, @value, @by, @timestamp)',
      ),
      setAcked: db.prepare(
        `UPDATE vars SET acked = max(@now, time)
         WHERE device_id = @deviceId AND type = @type AND name = @name AND time = @time AND origin = @origin AND acked < time`,
      ),
      clearAcked: db.prepare('UPDATE vars SET acked = 0 WHERE device_id = ? AND type = ? AND name = ?'),
      setSynced: db.prepare<[number, string, string, string], { synced: number }>(
        'UPDATE vars SET synced = max(?, synced + 1) WHERE device_id = ? AND type = ? AND name = ? RETURNING synced',
      ),
      setSyncacked: db.prepare(
        `UPDATE vars SET syncacked = max(@now, synced)
         WHERE device_id = @deviceId AND type = @type AND name = @name AND synced = @synced AND syncacked < synced`,
      ),
      pending: db.prepare<[string, string, number], VarRow>(
        `SELECT type, name, value, time, origin, acked, synced, syncacked FROM vars
         WHERE device_id = ? AND type = 'd' AND (acked < time OR syncacked < synced) AND name > ?
         ORDER BY name LIMIT ?`,
      ),
      history: db.prepare<[string, string, string, number, number], HistoryRow>(
        `SELECT id, type, name, value, by, timestamp FROM history
         WHERE device_id = ? AND type = ? AND name = ? AND id < ? ORDER BY id DESC LIMIT ?`,
      ),
      historySince: db.prepare<[string, string, string, number, number], HistoryRow>(
        `SELECT id, type, name, value, by, timestamp FROM history
         WHERE device_id = ? AND type = ? AND name = ? AND id >= ? ORDER BY id LIMIT ?`,
      ),
      heard: db.prepare(
        `INSERT INTO nearby (user_id, device_id, heard_at) VALUES (@userId, @deviceId, @at)
         ON CONFLICT (user_id, device_id) DO UPDATE SET heard_at = max(heard_at, excluded.heard_at)`,
      ),
      heardBy: db.prepare<[string, number, number], { heard_at: number }>(
        'SELECT heard_at FROM nearby WHERE device_id = ? AND user_id = ? AND heard_at >= ?',
      ),
      nearbyOf: db.prepare<[number, number], DeviceRow>(
        `SELECT d.* FROM nearby n JOIN devices d ON d.id = n.device_id
         WHERE n.user_id = ? AND n.heard_at >= ? ORDER BY d.authcode`,
      ),
      count: db.prepare<[], number>('SELECT count(*) FROM devices').pluck(),
      connectedDevices: db.prepare<[], { device_id: string }>(
        "SELECT device_id FROM vars WHERE type = 'meta' AND name = 'state' AND value = CAST('connected' AS BLOB)",
      ),
      pruneHistory: db.prepare(
        'DELETE FROM history WHERE id IN (SELECT id FROM history WHERE timestamp < ? ORDER BY timestamp LIMIT ?)',
      ),
      pruneNearby: db.prepare('DELETE FROM nearby WHERE heard_at < ?'),
      varKeys: db.prepare<[string, string, string, number], { device_id: string; type: VarType; name: string }>(
        `SELECT device_id, type, name FROM vars WHERE (device_id, type, name) > (?, ?, ?)
         ORDER BY device_id, type, name LIMIT ?`,
      ),
      // The id of the newest entry past the first `keep`: it and everything older go.
      historyCutoff: db
        .prepare<[string, string, string, number], number>(
          'SELECT id FROM history WHERE device_id = ? AND type = ? AND name = ? ORDER BY id DESC LIMIT 1 OFFSET ?',
        )
        .pluck(),
      pruneVarHistory: db.prepare(
        `DELETE FROM history WHERE id IN (SELECT id FROM history
           WHERE device_id = ? AND type = ? AND name = ? AND id <= ? ORDER BY id LIMIT ?)`,
      ),
    };
  }

  // ---- devices ----

  device(id: string): Device | undefined {
    const hit = this.rows.get(id);
    if (hit !== undefined) return hit ?? undefined;
    const r = this.s.device.get(id);
    const d = r ? toDevice(r) : null;
    this.remember(this.rows, id, d);
    return d ?? undefined;
  }

  deviceByAuthcode(authcode: string): Device | undefined {
    const r = this.s.byAuthcode.get(authcode);
    return r && toDevice(r);
  }

  /**
   * The ids of the devices registered to a user, in the order they were claimed, then those shared with the user,
   * in the order they were shared (decision 23).
   */
  deviceIdsOf(userId: number): readonly string[] {
    const hit = this.owned.get(userId);
    if (hit !== undefined) return hit;
    const ids = this.s.idsOfUser.all(userId, userId);
    this.remember(this.owned, userId, ids);
    return ids;
  }

  /** Shares a device its owner `ownerId` has with `userId` (one writer: the owner read here stays the owner). */
  share(deviceId: string, ownerId: number, userId: number, now: number): ShareOutcome {
    if (this.device(deviceId)?.ownerId !== ownerId) return 'not-owner';
    this.owned.delete(userId);
    return this.s.share.run(deviceId, userId, now).changes > 0 ? 'shared' : 'already';
  }

  unshare(deviceId: string, userId: number): boolean {
    this.owned.delete(userId);
    return this.s.unshare.run(deviceId, userId).changes > 0;
  }

  isSharedWith(deviceId: string, userId: number): boolean {
    return this.s.isShared.get(deviceId, userId) !== undefined;
  }

  sharesOf(deviceId: string): DeviceShare[] {
    return this.s.sharesOf.all(deviceId).map((r) => ({ userId: r.user_id, login: r.login, grantedAt: r.granted_at }));
  }

  /** Ends every share of a device: its users' lists change too. */
  private dropShares(deviceId: string): void {
    for (const u of this.s.shareUsers.all(deviceId)) this.owned.delete(u);
    this.s.delShares.run(deviceId);
  }

  secretHash(deviceId: string): string | undefined {
    return this.s.secret.get(deviceId)?.secret_hash ?? undefined;
  }

  /**
   * Trust on first use: the first secret a device presents to the embedded broker is kept. A device first met
   * through an external broker has no secret here; it gets the first one it presents.
   */
  enroll(deviceId: string, secretHash: string, now: number): void {
    this.forget(deviceId);
    this.s.enroll.run({ id: deviceId, hash: secretHash, now });
  }

  /** Makes sure a device the broker let in has a row (devices met through an external broker). */
  touch(deviceId: string, now: number): void {
    if (this.rows.get(deviceId)) return;
    if (this.s.touch.run(deviceId, now).changes > 0) this.forget(deviceId);
  }

  /** Records the auth code a device reports; `false` when another device already has it. */
  setAuthcode(deviceId: string, authcode: string): boolean {
    const other = this.s.byAuthcode.get(authcode);
    if (other && other.id !== deviceId) return false;
    if (other) return true;
    this.forget(deviceId);
    this.s.setAuthcode.run(authcode, deviceId);
    return true;
  }

  claim(deviceId: string, userId: number, now: number): ClaimOutcome {
    const d = this.device(deviceId);
    if (d?.ownerId === userId) return 'already-yours';
    if (!d || d.ownerId !== null) return 'taken';
    this.forget(deviceId);
    this.owned.delete(userId);
    if (this.s.claim.run(userId, now, deviceId).changes === 0) return 'taken';
    // Shares left by an owner who is gone (a user removed) are not the new owner's (decision 23).
    this.dropShares(deviceId);
    return 'claimed';
  }

  /**
   * Unregisters a device from its owner. What the owner kept on the server about it goes with it: its `s`
   * variables, the history of every variable, who it heard nearby, and the users it was shared with. Its `d` and `meta` variables stay:
   * they belong to the device.
   */
  unregister(deviceId: string, userId: number): boolean {
    this.forget(deviceId);
    this.owned.delete(userId);
    if (this.s.unclaim.run(deviceId, userId).changes === 0) return false;
    this.dropShares(deviceId);
    this.s.delServerVars.run(deviceId);
    this.s.delHistory.run(deviceId);
    this.s.delNearby.run(deviceId);
    return true;
  }

  // ---- variables ----

  getVar(deviceId: string, type: VarType, name: string): VarRecord | undefined {
    return this.s.getVar.get(deviceId, type, name);
  }

  vars(deviceId: string, type?: VarType): VarRecord[] {
    return type === undefined ? this.s.varsOf.all(deviceId) : this.s.varsOfType.all(deviceId, type);
  }

  /**
   * Writes a version and its history entry. `acked` is the stamp to store with it: `0` for a cloud version the
   * device has yet to acknowledge, `max(now, time)` for one received from the device.
   */
  putVersion(deviceId: string, v: NewVersion, acked: number, by: SetBy, history = true): void {
    this.views.delete(deviceId);
    this.s.putVar.run({ deviceId, type: v.type, name: v.name, value: v.value, time: v.time, origin: v.origin, acked });
    if (history) {
      this.s.addHistory.run({ deviceId, type: v.type, name: v.name, value: v.value, by, timestamp: v.time });
      this.grew(deviceId, v.type, v.name);
    }
  }

  /**
   * Applies a version received from the device when it is newer than the one held. Returns what happened:
   * `applied`, `same` (a duplicate), or `older` with the version held.
   */
  applyFromDevice(
    deviceId: string,
    v: NewVersion,
    now: number,
  ): { outcome: 'applied' | 'same' } | { outcome: 'older'; held: VarRecord } {
    const cur = this.getVar(deviceId, v.type, v.name);
    if (cur) {
      const cmp = compareVersions(v, cur);
      if (cmp === 0) return { outcome: 'same' };
      if (cmp < 0) return { outcome: 'older', held: cur };
    }
    this.putVersion(deviceId, v, Math.max(now, v.time), 'device');
    return { outcome: 'applied' };
  }

  /** The device acknowledged a version: `acked` is set if it is still the version held. */
  ackVersion(deviceId: string, type: VarType, name: string, version: Version, now: number): boolean {
    const changed = this.s.setAcked.run({ deviceId, type, name, time: version.time, origin: version.origin, now });
    if (changed.changes === 0) return false;
    this.views.delete(deviceId);
    return true;
  }

  /** The version held must be pushed again (the device showed it lost it). */
  unack(deviceId: string, type: VarType, name: string): void {
    this.views.delete(deviceId);
    this.s.clearAcked.run(deviceId, type, name);
  }

  /** A new sync of the variable: `synced = max(now, synced + 1)`; `undefined` when it does not exist. */
  markSynced(deviceId: string, type: VarType, name: string, now: number): number | undefined {
    this.views.delete(deviceId);
    return this.s.setSynced.get(now, deviceId, type, name)?.synced;
  }

  ackSync(deviceId: string, type: VarType, name: string, synced: number, now: number): boolean {
    if (this.s.setSyncacked.run({ deviceId, type, name, synced, now }).changes === 0) return false;
    this.views.delete(deviceId);
    return true;
  }

  /** A page of what the device has not acknowledged, in name order after `after`. */
  pending(deviceId: string, after: string, limit: number): VarRecord[] {
    return this.s.pending.all(deviceId, after, limit);
  }

  /** A meta variable set by the bridge or reported by the device; no history when `history` is false. */
  setMeta(deviceId: string, name: string, value: string, time: number, by: SetBy, history = true): void {
    const cur = this.s.getVar.get(deviceId, 'meta', name);
    if (cur?.value?.toString('utf8') === value) return;
    this.putVersion(
      deviceId,
      { type: 'meta', name, value: Buffer.from(value, 'utf8'), time, origin: 'device' },
      time,
      by,
      history,
    );
  }

  /** How many devices the bridge knows (metrics). */
  count(): number {
    return this.s.count.get() ?? 0;
  }

  /** The devices whose `meta` `state` is `connected`. */
  connectedIds(): string[] {
    return this.s.connectedDevices.all().map((r) => r.device_id);
  }

  /** At start with the embedded broker, no device can be connected yet. Returns the devices changed. */
  markAllDisconnected(now: number): number {
    const ids = this.s.connectedDevices.all().map((r) => r.device_id);
    for (const id of ids) this.setMeta(id, 'state', 'disconnected', now, 'server');
    return ids.length;
  }

  // ---- history ----

  /** The newest `limit` entries older than entry `before`, newest first. */
  history(
    deviceId: string,
    type: VarType,
    name: string,
    limit: number,
    before = Number.MAX_SAFE_INTEGER,
  ): HistoryEntry[] {
    return this.s.history.all(deviceId, type, name, before, limit);
  }

  /**
   * The oldest `limit` entries with an id at or above `since`, newest first: paging forward with `startid`
   * (docs/api.md, History), so that a client that asks again from one past the newest id it has misses none.
   */
  historySince(deviceId: string, type: VarType, name: string, limit: number, since: number): HistoryEntry[] {
    return this.s.historySince.all(deviceId, type, name, since, limit).reverse();
  }

  /** Removes up to `max` history entries older than `before`; returns how many. */
  pruneHistory(before: number, max: number): number {
    return this.s.pruneHistory.run(before, max).changes;
  }

  /**
   * Removes up to `max` of the entries of one variable beyond its newest `keep`, oldest first; returns how many
   * (fewer than `max`: the variable is within its limit now).
   */
  pruneVariableHistory(key: VarKey, keep: number, max: number): number {
    const cutoff = this.s.historyCutoff.get(key.deviceId, key.type, key.name, keep);
    if (cutoff === undefined) return 0;
    return this.s.pruneVarHistory.run(key.deviceId, key.type, key.name, cutoff, max).changes;
  }

  /** Up to `limit` variables after `after`, in key order: the retention's walk over every variable. */
  varKeys(after: VarKey | undefined, limit: number): VarKey[] {
    const a = after ?? { deviceId: '', type: '', name: '' };
    return this.s.varKeys
      .all(a.deviceId, a.type, a.name, limit)
      .map((r) => ({ deviceId: r.device_id, type: r.type, name: r.name }));
  }

  /**
   * The variables whose history grew since the last call, and forgets them; `undefined` when that is not known
   * (the first call, or they were too many to keep): then every variable must be looked at.
   */
  takeGrown(): VarKey[] | undefined {
    const grown = this.grown;
    this.grown = new Set();
    if (grown === undefined) return undefined;
    return [...grown].map((k) => {
      const [deviceId, type, name] = k.split('\0') as [string, VarType, string];
      return { deviceId, type, name };
    });
  }

  private grew(deviceId: string, type: VarType, name: string): void {
    const grown = this.grown;
    if (grown === undefined) return;
    grown.add(`${deviceId}\0${type}\0${name}`);
    if (grown.size > GROWN_MAX) this.grown = undefined;
  }

  // ---- nearby ----

  heard(deviceId: string, userId: number, at: number): void {
    this.s.heard.run({ deviceId, userId, at });
  }

  heardBy(deviceId: string, userId: number, since: number): boolean {
    return this.s.heardBy.get(deviceId, userId, since) !== undefined;
  }

  nearbyOf(userId: number, since: number): Device[] {
    return this.s.nearbyOf.all(userId, since).map(toDevice);
  }

  pruneNearby(before: number): number {
    return this.s.pruneNearby.run(before).changes;
  }

  // ---- device objects ----

  /** The JSON of a device object (decision 9), built once and kept until the device changes. */
  deviceJson(deviceId: string): string {
    const hit = this.views.get(deviceId);
    if (hit !== undefined) return hit;
    const json = renderDevice(this.vars(deviceId));
    this.remember(this.views, deviceId, json);
    return json;
  }

  private forget(deviceId: string): void {
    this.rows.delete(deviceId);
    this.views.delete(deviceId);
  }

  private remember<K, V>(map: Map<K, V>, key: K, value: V): void {
    // What a transaction has read may still be rolled back: only committed state is kept.
    if (this.db.inTransaction) return;
    if (map.size >= CACHE_MAX) map.delete(map.keys().next().value!);
    map.set(key, value);
  }
}
