/**
 * Devices, their variables, history and nearby rows in PostgreSQL: `DeviceStore` (bridge/devices/store.ts)
 * translated, statement by statement. Several bridges share these rows, so nothing of them is kept in memory,
 * and each read-compare-write is one statement or one transaction with the row locked (docs/scaling.md, "The
 * PostgreSQL store").
 */
import { compareVersions, type Version } from '../../../protocol/index.js';
import {
  type ClaimOutcome,
  type Device,
  type DeviceRow,
  type DeviceShare,
  type HistoryEntry,
  type NewVersion,
  type SetBy,
  type ShareOutcome,
  type VarKey,
  type VarRecord,
  type VarType,
  toDevice,
} from '../../devices/store.js';
import { renderDevice } from '../../devices/view.js';
import type { DeviceRepo } from '../types.js';
import type { Conn } from './conn.js';

const VAR_COLUMNS = 'type, name, value, time, origin, acked, synced, syncacked';

/** The bytes of `connected`, as the `meta` variable `state` holds them. */
const CONNECTED = "convert_to('connected', 'UTF8')";

/** How often a read-compare-write whose row vanished between its two statements is tried again. */
const ATTEMPTS = 3;

export class PgDeviceRepo implements DeviceRepo {
  constructor(private readonly c: Conn) {}

  // ---- devices ----

  async device(id: string): Promise<Device | undefined> {
    const r = await this.c.query<DeviceRow>('SELECT * FROM devices WHERE id = $1', [id]);
    return r.rows[0] && toDevice(r.rows[0]);
  }

  async deviceByAuthcode(authcode: string): Promise<Device | undefined> {
    const r = await this.c.query<DeviceRow>('SELECT * FROM devices WHERE authcode = $1', [authcode]);
    return r.rows[0] && toDevice(r.rows[0]);
  }

  async deviceIdsOf(userId: number): Promise<readonly string[]> {
    const r = await this.c.query<{ id: string }>(
      `SELECT id FROM (
         SELECT id, 0 AS part, claimed_at AS at FROM devices WHERE owner_id = $1
         UNION ALL
         SELECT device_id, 1, granted_at FROM device_shares WHERE user_id = $1
       ) u ORDER BY part, at, id`,
      [userId],
    );
    return r.rows.map((x) => x.id);
  }

  /**
   * The device row is locked (`FOR SHARE`) while its owner is checked and the share written, so that an unregister
   * running at once either ends this share with the others or finds it not made: no share outlives its owner.
   */
  share(deviceId: string, ownerId: number, userId: number, now: number): Promise<ShareOutcome> {
    return this.c.atomic(async (c) => {
      const own = await c.query('SELECT 1 FROM devices WHERE id = $1 AND owner_id = $2 FOR SHARE', [deviceId, ownerId]);
      if ((own.rowCount ?? 0) === 0) return 'not-owner' as const;
      const r = await c.query(
        'INSERT INTO device_shares (device_id, user_id, granted_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING',
        [deviceId, userId, now],
      );
      return (r.rowCount ?? 0) > 0 ? ('shared' as const) : ('already' as const);
    });
  }

  async unshare(deviceId: string, userId: number): Promise<boolean> {
    const r = await this.c.query('DELETE FROM device_shares WHERE device_id = $1 AND user_id = $2', [deviceId, userId]);
    return (r.rowCount ?? 0) > 0;
  }

  async isSharedWith(deviceId: string, userId: number): Promise<boolean> {
    const r = await this.c.query('SELECT 1 FROM device_shares WHERE device_id = $1 AND user_id = $2', [
      deviceId,
      userId,
    ]);
    return (r.rowCount ?? 0) > 0;
  }

  async sharesOf(deviceId: string): Promise<DeviceShare[]> {
    const r = await this.c.query<{ user_id: number; login: string; granted_at: number }>(
      `SELECT s.user_id, u.login, s.granted_at FROM device_shares s JOIN users u ON u.id = s.user_id
       WHERE s.device_id = $1 ORDER BY s.granted_at, s.user_id`,
      [deviceId],
    );
    return r.rows.map((x) => ({ userId: x.user_id, login: x.login, grantedAt: x.granted_at }));
  }

  async secretHash(deviceId: string): Promise<string | undefined> {
    const r = await this.c.query<{ secret_hash: string | null }>('SELECT secret_hash FROM devices WHERE id = $1', [
      deviceId,
    ]);
    return r.rows[0]?.secret_hash ?? undefined;
  }

  async enroll(deviceId: string, secretHash: string, now: number): Promise<void> {
    await this.c.query(
      `INSERT INTO devices (id, secret_hash, enrolled_at) VALUES ($1, $2, $3)
       ON CONFLICT (id) DO UPDATE SET secret_hash = excluded.secret_hash WHERE devices.secret_hash IS NULL`,
      [deviceId, secretHash, now],
    );
  }

  async touch(deviceId: string, now: number): Promise<void> {
    await this.c.query('INSERT INTO devices (id, enrolled_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING', [
      deviceId,
      now,
    ]);
  }

  /**
   * The unique key on `authcode` would fail a statement that takes a code another device holds, and with it the
   * whole transaction: a transaction-scoped advisory lock on the code makes the check and the update one step for
   * every bridge instead (only this method sets `authcode`).
   */
  setAuthcode(deviceId: string, authcode: string): Promise<boolean> {
    return this.c.atomic(async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtextextended('devices.authcode:' || $1, 0))", [authcode]);
      const other = await c.query<{ id: string }>('SELECT id FROM devices WHERE authcode = $1', [authcode]);
      const holder = other.rows[0]?.id;
      if (holder !== undefined) return holder === deviceId;
      await c.query('UPDATE devices SET authcode = $1 WHERE id = $2', [authcode, deviceId]);
      return true;
    });
  }

  /**
   * The conditional update decides; only when it did not claim is the owner read, to say why. A claim ends the shares
   * an owner who is gone left (decision 23).
   */
  claim(deviceId: string, userId: number, now: number): Promise<ClaimOutcome> {
    return this.c.atomic(async (c) => {
      const claimed = await c.query(
        'UPDATE devices SET owner_id = $1, claimed_at = $2 WHERE id = $3 AND owner_id IS NULL',
        [userId, now, deviceId],
      );
      if ((claimed.rowCount ?? 0) > 0) {
        await c.query('DELETE FROM device_shares WHERE device_id = $1', [deviceId]);
        return 'claimed' as const;
      }
      const r = await c.query<{ owner_id: number | null }>('SELECT owner_id FROM devices WHERE id = $1', [deviceId]);
      return r.rows[0]?.owner_id === userId ? ('already-yours' as const) : ('taken' as const);
    });
  }

  unregister(deviceId: string, userId: number): Promise<boolean> {
    return this.c.atomic(async (c) => {
      const r = await c.query('UPDATE devices SET owner_id = NULL, claimed_at = NULL WHERE id = $1 AND owner_id = $2', [
        deviceId,
        userId,
      ]);
      if ((r.rowCount ?? 0) === 0) return false;
      await c.query('DELETE FROM device_shares WHERE device_id = $1', [deviceId]);
      await c.query("DELETE FROM vars WHERE device_id = $1 AND type = 's'", [deviceId]);
      await c.query('DELETE FROM history WHERE device_id = $1', [deviceId]);
      await c.query('DELETE FROM nearby WHERE device_id = $1', [deviceId]);
      return true;
    });
  }

  // ---- variables ----

  async getVar(
    deviceId: string,
    type: VarType,
    name: string,
    options: { forUpdate?: boolean } = {},
  ): Promise<VarRecord | undefined> {
    // Locked for the rest of the transaction: a user's change or sync reads, then writes, the variable.
    const lock = options.forUpdate === true ? ' FOR UPDATE' : '';
    const r = await this.c.query<VarRecord>(
      `SELECT ${VAR_COLUMNS} FROM vars WHERE device_id = $1 AND type = $2 AND name = $3${lock}`,
      [deviceId, type, name],
    );
    return r.rows[0];
  }

  async vars(deviceId: string, type?: VarType): Promise<VarRecord[]> {
    const r =
      type === undefined
        ? await this.c.query<VarRecord>(`SELECT ${VAR_COLUMNS} FROM vars WHERE device_id = $1 ORDER BY type, name`, [
            deviceId,
          ])
        : await this.c.query<VarRecord>(
            `SELECT ${VAR_COLUMNS} FROM vars WHERE device_id = $1 AND type = $2 ORDER BY name`,
            [deviceId, type],
          );
    return r.rows;
  }

  async putVersion(deviceId: string, v: NewVersion, acked: number, by: SetBy, history = true): Promise<void> {
    await this.c.query(
      `INSERT INTO vars (device_id, type, name, value, time, origin, acked, synced, syncacked)
       VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0)
       ON CONFLICT (device_id, type, name) DO UPDATE SET
         value = excluded.value, time = excluded.time, origin = excluded.origin, acked = excluded.acked`,
      [deviceId, v.type, v.name, v.value, v.time, v.origin, acked],
    );
    if (history) await this.addHistory(this.c, deviceId, v, by);
  }

  private async addHistory(c: Conn, deviceId: string, v: NewVersion, by: SetBy): Promise<void> {
    await c.query(
      'INSERT INTO history (device_id, type, name, value, "by", "timestamp") VALUES ($1, $2, $3, $4, $5, $6)',
      [deviceId, v.type, v.name, v.value, by, v.time],
    );
  }

  /**
   * In one transaction: a new variable is inserted unless another bridge got there first (`ON CONFLICT DO
   * NOTHING` waits for that one's commit); an existing one is locked (`FOR UPDATE`) and compared, so that of two
   * bridges applying two versions at once the newer one is what stays.
   */
  applyFromDevice(
    deviceId: string,
    v: NewVersion,
    now: number,
  ): Promise<{ outcome: 'applied' | 'same' } | { outcome: 'older'; held: VarRecord }> {
    const acked = Math.max(now, v.time);
    return this.c.atomic(async (c) => {
      for (let attempt = 1; ; attempt++) {
        const inserted = await c.query(
          `INSERT INTO vars (device_id, type, name, value, time, origin, acked, synced, syncacked)
           VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0) ON CONFLICT (device_id, type, name) DO NOTHING`,
          [deviceId, v.type, v.name, v.value, v.time, v.origin, acked],
        );
        if ((inserted.rowCount ?? 0) === 0) {
          const cur = await c.query<VarRecord>(
            `SELECT ${VAR_COLUMNS} FROM vars WHERE device_id = $1 AND type = $2 AND name = $3 FOR UPDATE`,
            [deviceId, v.type, v.name],
          );
          const held = cur.rows[0];
          if (held === undefined) {
            // Deleted between the two statements (an unregistration): insert again.
            if (attempt < ATTEMPTS) continue;
            throw new Error(`variable ${v.type}/${v.name} of device ${deviceId} keeps vanishing while applied`);
          }
          const cmp = compareVersions(v, held);
          if (cmp === 0) return { outcome: 'same' as const };
          if (cmp < 0) return { outcome: 'older' as const, held };
          await c.query(
            `UPDATE vars SET value = $4, time = $5, origin = $6, acked = $7
             WHERE device_id = $1 AND type = $2 AND name = $3`,
            [deviceId, v.type, v.name, v.value, v.time, v.origin, acked],
          );
        }
        await this.addHistory(c, deviceId, v, 'device');
        return { outcome: 'applied' as const };
      }
    });
  }

  async ackVersion(deviceId: string, type: VarType, name: string, version: Version, now: number): Promise<boolean> {
    const r = await this.c.query(
      `UPDATE vars SET acked = GREATEST($1, time)
       WHERE device_id = $2 AND type = $3 AND name = $4 AND time = $5 AND origin = $6 AND acked < time`,
      [now, deviceId, type, name, version.time, version.origin],
    );
    return (r.rowCount ?? 0) > 0;
  }

  async unack(deviceId: string, type: VarType, name: string): Promise<void> {
    await this.c.query('UPDATE vars SET acked = 0 WHERE device_id = $1 AND type = $2 AND name = $3', [
      deviceId,
      type,
      name,
    ]);
  }

  async markSynced(deviceId: string, type: VarType, name: string, now: number): Promise<number | undefined> {
    const r = await this.c.query<{ synced: number }>(
      `UPDATE vars SET synced = GREATEST($1, synced + 1) WHERE device_id = $2 AND type = $3 AND name = $4
       RETURNING synced`,
      [now, deviceId, type, name],
    );
    return r.rows[0]?.synced;
  }

  async ackSync(deviceId: string, type: VarType, name: string, synced: number, now: number): Promise<boolean> {
    const r = await this.c.query(
      `UPDATE vars SET syncacked = GREATEST($1, synced)
       WHERE device_id = $2 AND type = $3 AND name = $4 AND synced = $5 AND syncacked < synced`,
      [now, deviceId, type, name, synced],
    );
    return (r.rowCount ?? 0) > 0;
  }

  async pending(deviceId: string, after: string, limit: number): Promise<VarRecord[]> {
    const r = await this.c.query<VarRecord>(
      `SELECT ${VAR_COLUMNS} FROM vars
       WHERE device_id = $1 AND type = 'd' AND (acked < time OR syncacked < synced) AND name > $2
       ORDER BY name LIMIT $3`,
      [deviceId, after, limit],
    );
    return r.rows;
  }

  /**
   * One statement: the value is written only when it differs from the one held (the update's `WHERE`), and the
   * history entry only for a row written.
   */
  async setMeta(deviceId: string, name: string, value: string, time: number, by: SetBy, history = true): Promise<void> {
    await this.c.query(
      `WITH put AS (
         INSERT INTO vars AS v (device_id, type, name, value, time, origin, acked, synced, syncacked)
         VALUES ($1, 'meta', $2, $3, $4, 'device', $4, 0, 0)
         ON CONFLICT (device_id, type, name) DO UPDATE SET
           value = excluded.value, time = excluded.time, origin = excluded.origin, acked = excluded.acked
         WHERE v.value IS DISTINCT FROM excluded.value
         RETURNING device_id, type, name, value, time)
       INSERT INTO history (device_id, type, name, value, "by", "timestamp")
       SELECT device_id, type, name, value, $5, time FROM put WHERE $6`,
      [deviceId, name, Buffer.from(value, 'utf8'), time, by, history],
    );
  }

  async count(): Promise<number> {
    const r = await this.c.query<{ n: number }>('SELECT count(*) AS n FROM devices');
    return r.rows[0]?.n ?? 0;
  }

  async connectedIds(): Promise<string[]> {
    const r = await this.c.query<{ device_id: string }>(
      `SELECT device_id FROM vars WHERE type = 'meta' AND name = 'state' AND value = ${CONNECTED}`,
    );
    return r.rows.map((x) => x.device_id);
  }

  /** `setMeta(id, 'state', 'disconnected', now, 'server')` for every connected device, in one statement. */
  async markAllDisconnected(now: number): Promise<number> {
    const r = await this.c.query(
      `WITH put AS (
         UPDATE vars SET value = convert_to('disconnected', 'UTF8'), time = $1, origin = 'device', acked = $1
         WHERE type = 'meta' AND name = 'state' AND value = ${CONNECTED}
         RETURNING device_id, type, name, value, time)
       INSERT INTO history (device_id, type, name, value, "by", "timestamp")
       SELECT device_id, type, name, value, 'server', time FROM put`,
      [now],
    );
    return r.rowCount ?? 0;
  }

  // ---- history ----

  async history(
    deviceId: string,
    type: VarType,
    name: string,
    limit: number,
    before = Number.MAX_SAFE_INTEGER,
  ): Promise<HistoryEntry[]> {
    const r = await this.c.query<HistoryEntry>(
      `SELECT id, type, name, value, "by", "timestamp" FROM history
       WHERE device_id = $1 AND type = $2 AND name = $3 AND id < $4 ORDER BY id DESC LIMIT $5`,
      [deviceId, type, name, before, limit],
    );
    return r.rows;
  }

  async historySince(
    deviceId: string,
    type: VarType,
    name: string,
    limit: number,
    since: number,
  ): Promise<HistoryEntry[]> {
    const r = await this.c.query<HistoryEntry>(
      `SELECT id, type, name, value, "by", "timestamp" FROM history
       WHERE device_id = $1 AND type = $2 AND name = $3 AND id >= $4 ORDER BY id LIMIT $5`,
      [deviceId, type, name, since, limit],
    );
    return r.rows.reverse();
  }

  async pruneHistory(before: number, max: number): Promise<number> {
    const r = await this.c.query(
      `DELETE FROM history WHERE id IN (
         SELECT id FROM history WHERE "timestamp" < $1 ORDER BY "timestamp" LIMIT $2)`,
      [before, max],
    );
    return r.rowCount ?? 0;
  }

  /** The cutoff (the newest entry past the first `keep`) and the deletion up to it, in one statement. */
  async pruneVariableHistory(key: VarKey, keep: number, max: number): Promise<number> {
    const r = await this.c.query(
      `DELETE FROM history WHERE id IN (
         SELECT id FROM history
         WHERE device_id = $1 AND type = $2 AND name = $3
           AND id <= (SELECT id FROM history WHERE device_id = $1 AND type = $2 AND name = $3
                      ORDER BY id DESC LIMIT 1 OFFSET $4)
         ORDER BY id LIMIT $5)`,
      [key.deviceId, key.type, key.name, keep, max],
    );
    return r.rowCount ?? 0;
  }

  async varKeys(after: VarKey | undefined, limit: number): Promise<VarKey[]> {
    const a = after ?? { deviceId: '', type: '', name: '' };
    const r = await this.c.query<{ device_id: string; type: VarType; name: string }>(
      `SELECT device_id, type, name FROM vars WHERE (device_id, type, name) > ($1, $2, $3)
       ORDER BY device_id, type, name LIMIT $4`,
      [a.deviceId, a.type, a.name, limit],
    );
    return r.rows.map((x) => ({ deviceId: x.device_id, type: x.type, name: x.name }));
  }

  /** Which variables grew is known to the bridge that wrote them, not to this one: the retention walks them all. */
  takeGrown(): Promise<VarKey[] | undefined> {
    return Promise.resolve(undefined);
  }

  // ---- nearby ----

  async heard(deviceId: string, userId: number, at: number): Promise<void> {
    await this.c.query(
      `INSERT INTO nearby (user_id, device_id, heard_at) VALUES ($1, $2, $3)
       ON CONFLICT (user_id, device_id) DO UPDATE SET heard_at = GREATEST(nearby.heard_at, excluded.heard_at)`,
      [userId, deviceId, at],
    );
  }

  async heardBy(deviceId: string, userId: number, since: number): Promise<boolean> {
    const r = await this.c.query('SELECT 1 FROM nearby WHERE device_id = $1 AND user_id = $2 AND heard_at >= $3', [
      deviceId,
      userId,
      since,
    ]);
    return r.rows.length > 0;
  }

  /** SQLite sorts a `NULL` authcode first: so does this. */
  async nearbyOf(userId: number, since: number): Promise<Device[]> {
    const r = await this.c.query<DeviceRow>(
      `SELECT d.* FROM nearby n JOIN devices d ON d.id = n.device_id
       WHERE n.user_id = $1 AND n.heard_at >= $2 ORDER BY d.authcode NULLS FIRST`,
      [userId, since],
    );
    return r.rows.map(toDevice);
  }

  async pruneNearby(before: number): Promise<number> {
    const r = await this.c.query('DELETE FROM nearby WHERE heard_at < $1', [before]);
    return r.rowCount ?? 0;
  }

  // ---- device objects ----

  /** Built from the variables at each call: another bridge may have changed them since the last. */
  async deviceJson(deviceId: string): Promise<string> {
    return renderDevice(await this.vars(deviceId));
  }
}
