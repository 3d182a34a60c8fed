/**
 * The gateway's variables in SQLite, with the four stamps of docs/decisions.md §3:
 *
 * - `time`: when the current value was set, by whichever side set it; `(name, time, origin)` is its version.
 * - `acked`: when the cloud acknowledged this version (`acked >= time` means acknowledged).
 * - `synced`: when the agent last re-sent the variable without changing it.
 * - `syncacked`: when the cloud acknowledged that re-send (`syncacked >= synced`).
 *
 * A deletion is a version too: a tombstone with no value. Every method here is synchronous and runs inside the
 * caller's transaction (see GroupCommitter).
 */
import type { Db, Migration } from '../../lib/sqlite.js';
import { type AckItem, type Version, compareVersions } from '../../protocol/index.js';

export type VarType = 'd' | 's';
export type Origin = 'device' | 'cloud';

export interface VarRecord {
  type: VarType;
  name: string;
  /** `null` for a tombstone. */
  value: Buffer | null;
  time: number;
  origin: Origin;
  acked: number;
  synced: number;
  syncacked: number;
  /**
   * 1 when `time` was stamped by the gateway's own clock before the agent learnt the cloud's (decision 24): it goes
   * up marked, and the cloud re-stamps it (docs/sync.md#clocks). 0 otherwise.
   */
  unverified: number;
}

export { type Version, compareVersions };

export const VAR_MIGRATIONS: readonly Migration[] = [
  (db) => {
    db.exec(`
      CREATE TABLE vars (
        type      TEXT    NOT NULL CHECK (type IN ('d', 's')),
        name      TEXT    NOT NULL,
        value     BLOB,
        time      INTEGER NOT NULL,
        origin    TEXT    NOT NULL CHECK (origin IN ('device', 'cloud')),
        acked     INTEGER NOT NULL DEFAULT 0,
        synced    INTEGER NOT NULL DEFAULT 0,
        syncacked INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (type, name)
      ) WITHOUT ROWID;
      -- Only versions waiting for the cloud are in these, so catch-up costs what is pending, not what is stored.
      CREATE INDEX vars_unacked ON vars (type, name) WHERE acked < time;
      CREATE INDEX vars_unsynced ON vars (type, name) WHERE syncacked < synced;
      CREATE TABLE history (
        id     INTEGER PRIMARY KEY,
        type   TEXT    NOT NULL,
        name   TEXT    NOT NULL,
        value  BLOB,
        time   INTEGER NOT NULL,
        origin TEXT    NOT NULL
      );
      CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    `);
  },
  (db) => {
    // Every change entered this index and every acknowledgement left it, a cost on the hot path for a query
    // that runs only at catch-up; a scan of the table in key order serves that well enough.
    db.exec('DROP INDEX vars_unacked');
  },
];

/** Decision 24: which versions were stamped before the agent knew the cloud's clock. Appended to the agent's list. */
export const UNVERIFIED_MIGRATION: Migration = (db) => {
  db.exec('ALTER TABLE vars ADD COLUMN unverified INTEGER NOT NULL DEFAULT 0');
};

interface Stamps {
  time: number;
  synced: number;
  syncacked: number;
}

/** A row of `vars` is a record as it is. */
type Row = VarRecord;

/** Where a page of a key-ordered listing ends. */
export interface PageKey {
  type: VarType;
  name: string;
}

export type RemoteOutcome = 'applied' | 'duplicate' | 'older';

export class VarStore {
  private readonly stmts;
  private historyInserts = 0;

  constructor(
    private readonly db: Db,
    private readonly historyLimit: number,
    /** Whether the time the caller passes comes from the cloud's clock (decision 24); always, without it. */
    private readonly verified: () => boolean = () => true,
  ) {
    this.stmts = {
      get: db.prepare<[VarType, string], Row>('SELECT * FROM vars WHERE type = ? AND name = ?'),
      list: db.prepare<[VarType], Row>('SELECT * FROM vars WHERE type = ? AND value IS NOT NULL ORDER BY name'),
      upsert: db.prepare(`
        INSERT INTO vars (type, name, value, time, origin, acked, synced, syncacked, unverified)
        VALUES (@type, @name, @value, @time, @origin, @acked, @synced, @syncacked, @unverified)
        ON CONFLICT (type, name) DO UPDATE SET
          value = excluded.value, time = excluded.time, origin = excluded.origin, acked = excluded.acked,
          synced = excluded.synced, syncacked = excluded.syncacked, unverified = excluded.unverified`),
      // A value set on the gateway, in one statement: its time is later than the version it replaces.
      setLocal: db.prepare<[{ type: VarType; name: string; value: Buffer; now: number; unverified: number }], Stamps>(`
        INSERT INTO vars (type, name, value, time, origin, acked, synced, syncacked, unverified)
        VALUES (@type, @name, @value, @now, 'device', 0, 0, 0, @unverified)
        ON CONFLICT (type, name) DO UPDATE SET
          value = excluded.value, time = max(excluded.time, vars.time + 1), origin = 'device', acked = 0,
          unverified = excluded.unverified
        RETURNING time, synced, syncacked`),
      // Acknowledgements change stamps only; the value is not read back.
      // The cloud took the version as it is: from then on it is the cloud's too, verified or not (decision 24).
      ack: db.prepare<[{ now: number; type: VarType; name: string; time: number; origin: Origin }], { acked: number }>(`
        UPDATE vars SET acked = max(@now, time), unverified = 0
        WHERE type = @type AND name = @name AND time = @time AND origin = @origin AND acked < time
        RETURNING acked`),
      syncAck: db.prepare<[{ now: number; type: VarType; name: string; synced: number }], { syncacked: number }>(`
        UPDATE vars SET syncacked = max(@now, synced)
        WHERE type = @type AND name = @name AND synced = @synced AND syncacked < synced
        RETURNING syncacked`),
      setAcked: db.prepare('UPDATE vars SET acked = ? WHERE type = ? AND name = ?'),
      setSynced: db.prepare('UPDATE vars SET synced = ? WHERE type = ? AND name = ?'),
      // Pages in key order, so that a catch-up of any size holds one page in memory at a time.
      unacked: db.prepare<[{ type: string; name: string; limit: number }], Row>(
        'SELECT * FROM vars WHERE acked < time AND (type, name) > (@type, @name) ORDER BY type, name LIMIT @limit',
      ),
      unsynced: db.prepare<[{ type: string; name: string; limit: number }], Row>(
        'SELECT * FROM vars WHERE syncacked < synced AND (type, name) > (@type, @name) ORDER BY type, name LIMIT @limit',
      ),
      allPage: db.prepare<[{ type: string; name: string; limit: number }], Row>(
        'SELECT * FROM vars WHERE type = @type AND name > @name ORDER BY name LIMIT @limit',
      ),
      countUnacked: db.prepare<[], { n: number }>('SELECT count(*) AS n FROM vars WHERE acked < time'),
      countUnsynced: db.prepare<[], { n: number }>('SELECT count(*) AS n FROM vars WHERE syncacked < synced'),
      history: db.prepare('INSERT INTO history (type, name, value, time, origin) VALUES (?, ?, ?, ?, ?)'),
      prune: db.prepare('DELETE FROM history WHERE id <= (SELECT max(id) FROM history) - ?'),
    };
  }

  get(type: VarType, name: string): VarRecord | undefined {
    return this.stmts.get.get(type, name);
  }

  /** Live variables of a type (tombstones left out), by name. */
  list(type: VarType): VarRecord[] {
    return this.stmts.list.all(type);
  }

  /** Records of a type after `name` in name order, tombstones included: a page of a full sync. */
  allPage(type: VarType, afterName: string, limit: number): VarRecord[] {
    return this.stmts.allPage.all({ type, name: afterName, limit });
  }

  /**
   * A change made on the gateway. Its time is later than the version it replaces even when the clock is
   * behind, so that a local change always wins over what the gateway has seen. Deleting what is absent or
   * already deleted changes nothing and returns `undefined`.
   */
  setLocal(type: VarType, name: string, value: Buffer | null, now: number): VarRecord | undefined {
    if (value !== null) {
      const unverified = this.verified() ? 0 : 1;
      const stamps = this.stmts.setLocal.get({ type, name, value, now, unverified })!;
      const rec: VarRecord = { type, name, value, origin: 'device', acked: 0, unverified, ...stamps };
      this.addHistory(rec);
      return rec;
    }
    const cur = this.get(type, name);
    if (value === null && (cur === undefined || cur.value === null)) return undefined;
    const rec: VarRecord = {
      type,
      name,
      value,
      time: cur ? Math.max(now, cur.time + 1) : now,
      origin: 'device',
      acked: 0,
      synced: cur?.synced ?? 0,
      syncacked: cur?.syncacked ?? 0,
      unverified: this.verified() ? 0 : 1,
    };
    this.write(rec);
    return rec;
  }

  /**
   * A version received from the cloud. Applied when newer than ours; the cloud holds it, so it counts as
   * acknowledged at once. The same version again is a duplicate, an older one is ignored, except the cloud's answer
   * to a gateway version of ours it re-stamped (`replaces` names our version's time; decision 24,
   * docs/sync.md#clocks): that one takes our version's place, so that both sides keep the same.
   */
  applyRemote(
    type: VarType,
    name: string,
    value: Buffer | null,
    version: Version & { replaces?: number },
    now: number,
  ): { outcome: RemoteOutcome; record: VarRecord | undefined } {
    const cur = this.get(type, name);
    if (cur) {
      const cmp = compareVersions(version, cur);
      if (cmp === 0) return { outcome: 'duplicate', record: cur };
      const answersOurs = cur.origin === 'device' && version.replaces === cur.time;
      if (cmp < 0 && !answersOurs) return { outcome: 'older', record: cur };
    }
    const rec: VarRecord = {
      type,
      name,
      value,
      time: version.time,
      origin: version.origin,
      acked: Math.max(now, version.time),
      synced: cur?.synced ?? 0,
      syncacked: cur?.syncacked ?? 0,
      unverified: 0,
    };
    this.write(rec);
    return { outcome: 'applied', record: rec };
  }

  /**
   * Records the cloud's acknowledgement of a push; ignored unless it names the version we hold. Returns the new
   * `acked`, or `undefined` when nothing changed.
   */
  markAcked(ack: AckItem, now: number): number | undefined {
    return this.stmts.ack.get({ now, type: ack.type, name: ack.name, time: ack.time, origin: ack.origin })?.acked;
  }

  /** Marks a variable as re-sent now; returns the record to send, or `undefined` when there is none. */
  markSynced(type: VarType, name: string, now: number): VarRecord | undefined {
    const cur = this.get(type, name);
    if (!cur) return undefined;
    // Strictly increasing, so that an acknowledgement names exactly one re-send.
    cur.synced = Math.max(now, cur.synced + 1);
    this.stmts.setSynced.run(cur.synced, type, name);
    return cur;
  }

  /** Records the cloud's acknowledgement of a re-send; ignored unless it names our latest one. */
  markSyncAcked(ack: AckItem, now: number): number | undefined {
    if (ack.synced === undefined) return undefined;
    return this.stmts.syncAck.get({ now, type: ack.type, name: ack.name, synced: ack.synced })?.syncacked;
  }

  /** Clears the acknowledgement of the version we hold, so that it is pushed again. */
  unack(type: VarType, name: string): void {
    this.stmts.setAcked.run(0, type, name);
  }

  /** Versions the cloud has not acknowledged yet: a page after `after` in key order (from the start without it). */
  unacked(after?: PageKey, limit = Number.MAX_SAFE_INTEGER): VarRecord[] {
    return this.stmts.unacked.all({ type: after?.type ?? '', name: after?.name ?? '', limit });
  }

  /** Re-sends the cloud has not acknowledged yet, a page at a time like {@link unacked}. */
  unsynced(after?: PageKey, limit = Number.MAX_SAFE_INTEGER): VarRecord[] {
    return this.stmts.unsynced.all({ type: after?.type ?? '', name: after?.name ?? '', limit });
  }

  pendingCounts(): { pushes: number; syncs: number } {
    return { pushes: this.stmts.countUnacked.get()!.n, syncs: this.stmts.countUnsynced.get()!.n };
  }

  private write(rec: VarRecord): void {
    this.stmts.upsert.run(rec);
    this.addHistory(rec);
  }

  private addHistory(rec: VarRecord): void {
    if (this.historyLimit > 0) {
      this.stmts.history.run(rec.type, rec.name, rec.value, rec.time, rec.origin);
      // Pruning in steps keeps its cost off the per-change path.
      if (++this.historyInserts % 256 === 0) this.stmts.prune.run(this.historyLimit);
    }
  }
}
