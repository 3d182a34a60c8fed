/**
 * The bridge store in PostgreSQL (docs/scaling.md, "The PostgreSQL store"): the `BridgeStore` of
 * bridge/store/types.ts over a pool that several bridges may share a database through. The SQL and its meaning
 * are those of the SQLite store (bridge/store/sqlite.ts and the stores it names), translated.
 *
 * - Nothing another bridge can change is kept in memory (devices, device objects, sessions, users); only the
 *   frontends are, dropped when any bridge changes one (`frontend.changed` on the event bus, `useEvents`), and
 *   read again after a second at most all the same.
 * - `write` runs its work in one transaction on one connection; outside it each statement is its own
 *   transaction, and a read-compare-write is one statement or takes a transaction of its own (`Conn.atomic`).
 */
import type pg from 'pg';
import type { Logger } from '../../../lib/log.js';
import type { EventBus } from '../../events/bus.js';
import type { StorageState } from '../../../lib/sqlite.js';
import { safeUrl } from '../../../lib/url.js';
import type { DeviceCredentials } from '../../broker.js';
import type { ProductConfig } from '../types.js';
import {
  type AccessToken,
  type BridgeStore,
  type CommandRepo,
  type DeviceRepo,
  type FirmwareRepo,
  type Frontend,
  type FwJobRepo,
  type RuleRepo,
  type NewAccessToken,
  type NewUser,
  type Session,
  type StoreTx,
  type Token,
  type TokenKind,
  type User,
  type UserPatch,
} from '../types.js';
import { PgCommandRepo } from './commands.js';
import { PgRuleRepo } from './rules.js';
import { type Conn, PoolConn, STORE_TYPES, StorageWatch, transaction } from './conn.js';
import { PgDeviceRepo } from './devices.js';
import { PgFirmwareRepo, PgFwJobRepo } from './firmware.js';
import { migratePostgres } from './migrate.js';
import { openPostgres } from './pool.js';
import {
  type AccessTokenRow,
  type FrontendRow,
  type SessionRow,
  type UserRow,
  toAccessToken,
  toFrontend,
  toSession,
  toUser,
} from '../rows.js';

const USER_COLUMNS: ReadonlyArray<keyof UserRow> = [
  'id',
  'frontend_id',
  'login',
  'password_hash',
  'confirmed',
  'data',
  'authcode',
  'authcode_prev',
  'authcode_rotated_at',
  'created_at',
];

/** A session's row joined with its user's, the user's columns prefixed `u_`. */
type SessionUserRow = SessionRow & { [K in keyof UserRow as `u_${K}`]: UserRow[K] | null };

const USER_PATCH_COLUMNS: Record<keyof UserPatch, string> = {
  passwordHash: 'password_hash',
  confirmed: 'confirmed',
  data: 'data',
  authcode: 'authcode',
  authcodePrev: 'authcode_prev',
  authcodeRotatedAt: 'authcode_rotated_at',
};

/** How long the frontends read are used before they are read again, ms (as the SQLite store rechecks them). */
export const FRONTEND_RECHECK_MS = 1000;

/**
 * The frontends, read at most once a second from the pool (committed state only). Every write of a frontend
 * through this process drops them once it is committed, and announces it on the event bus; a `frontend.changed`
 * from another bridge, or a `bus.resync`, drops them too (docs/scaling.md, "The event bus"). The one-second
 * recheck stays, for a change whose event was lost. A read that began before a drop keeps nothing.
 */
class FrontendCache {
  private byId = new Map<string, Frontend>();
  private defaultId: string | undefined;
  private loadedAt = -Infinity;
  private generation = 0;
  private loading: Promise<void> | undefined;
  private events: EventBus | undefined;
  private unsubscribe: (() => void) | undefined;
  /** Reads from the database, for tests: the count of loads. */
  loads = 0;

  constructor(private readonly pool: Conn) {}

  /** Follows `bus` (instead of the one followed before); returns the function that stops following it. */
  follow(bus: EventBus): () => void {
    this.unsubscribe?.();
    this.events = bus;
    const off = bus.subscribe((e) => {
      if (e.type === 'frontend.changed' || e.type === 'bus.resync') this.invalidate();
    });
    const stop = () => {
      off();
      if (this.events === bus) {
        this.events = undefined;
        this.unsubscribe = undefined;
      }
    };
    this.unsubscribe = stop;
    return stop;
  }

  /** A frontend was written and committed: dropped here, announced to every bridge (this one's cache included). */
  changed(id: string): void {
    this.invalidate();
    this.events?.publish({ type: 'frontend.changed', id });
  }

  async frontend(id: string): Promise<Frontend | undefined> {
    await this.fresh();
    return this.byId.get(id);
  }

  async defaultFrontend(): Promise<Frontend | undefined> {
    await this.fresh();
    return this.defaultId === undefined ? undefined : this.byId.get(this.defaultId);
  }

  invalidate(): void {
    this.generation++;
    this.loadedAt = -Infinity;
    this.loading = undefined;
  }

  private fresh(): Promise<void> {
    if (performance.now() - this.loadedAt < FRONTEND_RECHECK_MS) return Promise.resolve();
    this.loading ??= this.load();
    return this.loading;
  }

  private async load(): Promise<void> {
    const generation = this.generation;
    this.loads++;
    try {
      const r = await this.pool.query<FrontendRow>('SELECT * FROM frontends ORDER BY created_at, id');
      if (generation !== this.generation) return;
      const all = r.rows.map(toFrontend);
      this.byId = new Map(all.map((f) => [f.id, f]));
      this.defaultId = all.find((f) => f.isDefault)?.id;
      this.loadedAt = performance.now();
    } finally {
      if (generation === this.generation) this.loading = undefined;
    }
  }
}

/** The store's reads and writes on one `Conn`: the pool (`PostgresStore`), or one transaction (`write`'s `tx`). */
class PgTx implements StoreTx {
  readonly devices: DeviceRepo;
  readonly commands: CommandRepo;
  readonly firmware: FirmwareRepo;
  readonly fwJobs: FwJobRepo;
  readonly rules: RuleRepo;

  constructor(
    protected readonly conn: Conn,
    protected readonly frontendCache: FrontendCache,
    dataDir: string,
  ) {
    this.devices = new PgDeviceRepo(conn);
    this.commands = new PgCommandRepo(conn);
    this.firmware = new PgFirmwareRepo(conn, dataDir);
    this.fwJobs = new PgFwJobRepo(conn);
    this.rules = new PgRuleRepo(conn);
  }

  /** After a change to frontend `id`: read them again, and say so on the event bus, once it is committed. */
  private frontendsChanged(id: string): void {
    this.frontendCache.invalidate();
    this.conn.afterCommit(() => this.frontendCache.changed(id));
  }

  // ---- frontends ----

  async createFrontend(f: Frontend): Promise<void> {
    await this.conn.query(
      'INSERT INTO frontends (id, name, config, is_default, created_at) VALUES ($1, $2, $3, $4, $5)',
      [f.id, f.name, JSON.stringify(f.config), f.isDefault, f.createdAt],
    );
    this.frontendsChanged(f.id);
  }

  /** Outside a transaction from the frontends kept for a second; inside one from the transaction (it may have made it). */
  async frontend(id: string): Promise<Frontend | undefined> {
    if (!this.conn.inTransaction) return this.frontendCache.frontend(id);
    const r = await this.conn.query<FrontendRow>('SELECT * FROM frontends WHERE id = $1', [id]);
    return r.rows[0] && toFrontend(r.rows[0]);
  }

  async defaultFrontend(): Promise<Frontend | undefined> {
    if (!this.conn.inTransaction) return this.frontendCache.defaultFrontend();
    const r = await this.conn.query<FrontendRow>('SELECT * FROM frontends WHERE is_default LIMIT 1');
    return r.rows[0] && toFrontend(r.rows[0]);
  }

  async frontends(): Promise<Frontend[]> {
    const r = await this.conn.query<FrontendRow>('SELECT * FROM frontends ORDER BY created_at, id');
    return r.rows.map(toFrontend);
  }

  async setFrontendConfig(id: string, config: ProductConfig, name?: string): Promise<boolean> {
    const r = await this.conn.query('UPDATE frontends SET config = $1, name = coalesce($2, name) WHERE id = $3', [
      JSON.stringify(config),
      name ?? null,
      id,
    ]);
    if ((r.rowCount ?? 0) > 0) this.frontendsChanged(id);
    return (r.rowCount ?? 0) > 0;
  }

  /** One statement: the frontend becomes the default and every other one stops being it, or nothing changes. */
  async setDefaultFrontend(id: string): Promise<boolean> {
    const r = await this.conn.query(
      'UPDATE frontends SET is_default = (id = $1) WHERE EXISTS (SELECT 1 FROM frontends WHERE id = $1)',
      [id],
    );
    if ((r.rowCount ?? 0) > 0) this.frontendsChanged(id);
    return (r.rowCount ?? 0) > 0;
  }

  // ---- users ----

  async createUser(u: NewUser): Promise<User | undefined> {
    const r = await this.conn.query<UserRow>(
      `INSERT INTO users (frontend_id, login, password_hash, authcode, authcode_rotated_at, created_at)
       VALUES ($1, $2, $3, $4, $5, $5)
       ON CONFLICT (frontend_id, login) DO NOTHING
       RETURNING *`,
      [u.frontendId, u.login, u.passwordHash, u.authcode, u.now],
    );
    return r.rows[0] && toUser(r.rows[0]);
  }

  async userByLogin(frontendId: string, login: string): Promise<User | undefined> {
    const r = await this.conn.query<UserRow>('SELECT * FROM users WHERE frontend_id = $1 AND login = $2', [
      frontendId,
      login,
    ]);
    return r.rows[0] && toUser(r.rows[0]);
  }

  async userById(id: number, options: { forUpdate?: boolean } = {}): Promise<User | undefined> {
    // Locked for the rest of the transaction: the user data merge and the authcode rotation read, then write.
    const lock = options.forUpdate === true ? ' FOR UPDATE' : '';
    const r = await this.conn.query<UserRow>(`SELECT * FROM users WHERE id = $1${lock}`, [id]);
    return r.rows[0] && toUser(r.rows[0]);
  }

  /** The current authcode first, then the previous one: one query. */
  async userByAuthcode(authcode: string): Promise<User | undefined> {
    const r = await this.conn.query<UserRow>(
      'SELECT * FROM users WHERE authcode = $1 OR authcode_prev = $1 ORDER BY authcode = $1 DESC LIMIT 1',
      [authcode],
    );
    return r.rows[0] && toUser(r.rows[0]);
  }

  async updateUser(id: number, patch: UserPatch): Promise<void> {
    const cols: string[] = [];
    const values: unknown[] = [];
    for (const [k, col] of Object.entries(USER_PATCH_COLUMNS) as Array<[keyof UserPatch, string]>) {
      if (patch[k] === undefined) continue;
      values.push(patch[k]);
      cols.push(`${col} = $${values.length}`);
    }
    if (cols.length === 0) return;
    values.push(id);
    await this.conn.query(`UPDATE users SET ${cols.join(', ')} WHERE id = $${values.length}`, values);
  }

  // ---- sessions ----

  async createSession(s: Session): Promise<void> {
    await this.conn.query(
      `INSERT INTO sessions (id_hash, frontend_id, user_id, created_at, last_seen_at, access_token_id)
       VALUES ($1, $2, $3, $4, $5, $6)`,
      [s.idHash, s.frontendId, s.userId, s.createdAt, s.lastSeenAt, s.accessTokenId ?? null],
    );
  }

  async session(idHash: string): Promise<Session | undefined> {
    const r = await this.conn.query<SessionRow>('SELECT * FROM sessions WHERE id_hash = $1', [idHash]);
    return r.rows[0] && toSession(r.rows[0]);
  }

  /** The check every request makes: one query, never a copy kept (another bridge may end the session). */
  async sessionWithUser(idHash: string): Promise<{ session: Session; user: User | undefined } | undefined> {
    const r = await this.conn.query<SessionUserRow>(
      `SELECT s.*, ${USER_COLUMNS.map((c) => `u.${c} AS u_${c}`).join(', ')}
       FROM sessions s LEFT JOIN users u ON u.id = s.user_id WHERE s.id_hash = $1`,
      [idHash],
    );
    const row = r.rows[0];
    if (!row) return undefined;
    let user: User | undefined;
    if (row.u_id !== null) {
      const u = Object.fromEntries(USER_COLUMNS.map((c) => [c, row[`u_${c}`]])) as unknown as UserRow;
      user = toUser(u);
    }
    return { session: toSession(row), user };
  }

  async touchSession(idHash: string, now: number): Promise<void> {
    await this.conn.query('UPDATE sessions SET last_seen_at = $1 WHERE id_hash = $2', [now, idHash]);
  }

  async deleteSession(idHash: string): Promise<boolean> {
    const r = await this.conn.query('DELETE FROM sessions WHERE id_hash = $1', [idHash]);
    return (r.rowCount ?? 0) > 0;
  }

  async deleteSessionsOfUser(userId: number): Promise<number> {
    const r = await this.conn.query('DELETE FROM sessions WHERE user_id = $1', [userId]);
    return r.rowCount ?? 0;
  }

  async pruneSessions(idleBefore: number, createdBefore: number): Promise<number> {
    const r = await this.conn.query('DELETE FROM sessions WHERE last_seen_at < $1 OR created_at < $2', [
      idleBefore,
      createdBefore,
    ]);
    return r.rowCount ?? 0;
  }

  // ---- tokens ----

  async createToken(t: Token): Promise<void> {
    await this.conn.query('INSERT INTO tokens (hash, kind, user_id, expires_at) VALUES ($1, $2, $3, $4)', [
      t.hash,
      t.kind,
      t.userId,
      t.expiresAt,
    ]);
  }

  /** One statement: of two bridges taking one token at once, one gets it. */
  async takeToken(hash: string, kind: TokenKind, now: number, userId?: number): Promise<Token | undefined> {
    const r = await this.conn.query<{ hash: string; kind: TokenKind; user_id: number; expires_at: number }>(
      `DELETE FROM tokens WHERE hash = $1 AND kind = $2 AND expires_at > $3 AND user_id = coalesce($4, user_id)
       RETURNING *`,
      [hash, kind, now, userId ?? null],
    );
    const t = r.rows[0];
    return t && { hash: t.hash, kind: t.kind, userId: t.user_id, expiresAt: t.expires_at };
  }

  async deleteTokensOfUser(userId: number, kind: TokenKind): Promise<void> {
    await this.conn.query('DELETE FROM tokens WHERE user_id = $1 AND kind = $2', [userId, kind]);
  }

  // ---- access tokens ----

  async createAccessToken(t: NewAccessToken): Promise<AccessToken> {
    const r = await this.conn.query<AccessTokenRow>(
      'INSERT INTO access_tokens (hash, user_id, prefix, created_at) VALUES ($1, $2, $3, $4) RETURNING *',
      [t.hash, t.userId, t.prefix, t.createdAt],
    );
    return toAccessToken(r.rows[0]!);
  }

  async accessTokensOf(userId: number): Promise<AccessToken[]> {
    const r = await this.conn.query<AccessTokenRow>('SELECT * FROM access_tokens WHERE user_id = $1 ORDER BY id', [
      userId,
    ]);
    return r.rows.map(toAccessToken);
  }

  async accessTokenByHash(hash: string): Promise<AccessToken | undefined> {
    const r = await this.conn.query<AccessTokenRow>('SELECT * FROM access_tokens WHERE hash = $1', [hash]);
    return r.rows[0] && toAccessToken(r.rows[0]);
  }

  async touchAccessToken(id: number, now: number): Promise<boolean> {
    const r = await this.conn.query('UPDATE access_tokens SET last_used_at = $1 WHERE id = $2', [now, id]);
    return (r.rowCount ?? 0) > 0;
  }

  /**
   * One transaction: the token's sessions are read, then the token is deleted, and they with it (ON DELETE
   * CASCADE). The token row is locked first, so that a session being started from it meanwhile either is in the
   * list or finds the token gone.
   */
  deleteAccessToken(
    userId: number,
    which: { hash: string } | { id: number },
  ): Promise<{ token: AccessToken; sessions: string[] } | undefined> {
    return this.conn.atomic(async (c) => {
      const found =
        'hash' in which
          ? await c.query<AccessTokenRow>('SELECT * FROM access_tokens WHERE hash = $1 AND user_id = $2 FOR UPDATE', [
              which.hash,
              userId,
            ])
          : await c.query<AccessTokenRow>('SELECT * FROM access_tokens WHERE id = $1 AND user_id = $2 FOR UPDATE', [
              which.id,
              userId,
            ]);
      const row = found.rows[0];
      if (!row) return undefined;
      const sessions = await c.query<{ id_hash: string }>('SELECT id_hash FROM sessions WHERE access_token_id = $1', [
        row.id,
      ]);
      await c.query('DELETE FROM access_tokens WHERE id = $1', [row.id]);
      return { token: toAccessToken(row), sessions: sessions.rows.map((x) => x.id_hash) };
    });
  }

  async deleteAccessTokensOfUser(userId: number): Promise<number> {
    const r = await this.conn.query('DELETE FROM access_tokens WHERE user_id = $1', [userId]);
    return r.rowCount ?? 0;
  }
}

export interface PostgresStoreOptions {
  /** Connections the pool opens at most (`database.poolSize`). */
  poolSize?: number;
  /** Where the firmware image files are (`<dataDir>/firmware/`), as with SQLite. */
  dataDir: string;
  /** The clock of `storage.fullSince`. */
  now?: () => number;
}

/** The bridge store in PostgreSQL; made by {@link openPostgresStore}. */
export class PostgresStore extends PgTx implements BridgeStore {
  readonly engine = 'postgres' as const;
  readonly credentials: DeviceCredentials;

  constructor(
    /** The connection pool, for what the bridges share beyond the store (the attempt limits). */
    readonly pool: pg.Pool,
    private readonly watch: StorageWatch,
    private readonly dataDir: string,
  ) {
    const conn = new PoolConn(pool, watch);
    super(conn, new FrontendCache(conn), dataDir);
    const devices = this.devices;
    this.credentials = {
      secretHash: (id) => devices.secretHash(id),
      // One statement outside any `write`: committed (and flushed) when it resolves.
      enroll: (id, hash, at) => devices.enroll(id, hash, at),
    };
  }

  write<T>(work: (tx: StoreTx) => Promise<T>, options?: { durable?: boolean }): Promise<T> {
    return transaction(
      this.pool,
      this.watch,
      (conn) => work(new PgTx(conn, this.frontendCache, this.dataDir)),
      options?.durable ?? true,
    );
  }

  /**
   * The event bus the frontends follow (docs/scaling.md, "The event bus"): their copy is dropped on any bridge's
   * `frontend.changed` and on `bus.resync`, and this store's frontend writes are published on it once committed.
   * Returns the function that stops following it.
   */
  useEvents(bus: EventBus): () => void {
    return this.frontendCache.follow(bus);
  }

  /** How many times the frontends were read from the database (tests: the one-second recheck did not run). */
  get frontendLoads(): number {
    return this.frontendCache.loads;
  }

  get storage(): StorageState {
    return this.watch.state;
  }

  /** No WAL checkpoint of the bridge's own: the server does its checkpoints. */
  get checkpointing(): boolean {
    return false;
  }

  /**
   * The database's size as the server counts it. `freeBytes` is 0: the space of removed rows that PostgreSQL
   * reuses is not known without reading every page (pgstattuple), too costly for a metric.
   */
  async databaseSize(): Promise<{ bytes: number; freeBytes: number }> {
    const r = await this.conn.query<{ bytes: number }>('SELECT pg_database_size(current_database()) AS bytes');
    return { bytes: r.rows[0]?.bytes ?? 0, freeBytes: 0 };
  }

  close(): Promise<void> {
    return this.pool.end();
  }
}

/**
 * Opens the pool on `url`, brings the schema to this program's version (`migratePostgres`) and answers the store.
 * Rejects, naming the server without its user or password, when it cannot connect or migrate; the pool is then
 * ended.
 */
export async function openPostgresStore(
  url: string,
  log: Logger,
  options: PostgresStoreOptions,
): Promise<PostgresStore> {
  const pool = await openPostgres(url, log, {
    ...(options.poolSize !== undefined && { poolSize: options.poolSize }),
    types: STORE_TYPES,
  });
  try {
    await migratePostgres(pool, { log });
  } catch (err) {
    await pool.end().catch(() => undefined);
    throw err;
  }
  const database = safeUrl(url);
  const watch = new StorageWatch((full, err) => {
    if (full) log.error({ event: 'storage.full', database, err: String(err) });
    else log.info({ event: 'storage.recovered', database });
  }, options.now ?? Date.now);
  return new PostgresStore(pool, watch, options.dataDir);
}
