/** The bridge store in SQLite: WAL, `synchronous=FULL`, versioned migrations, group commit (docs/decisions.md §8). */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../../lib/log.js';
import { AsyncGroupCommitter, type Db, type Migration, type StorageState, openDatabase } from '../../lib/sqlite.js';
import { WalCheckpointer } from '../../lib/wal-checkpointer.js';
import type { DeviceCredentials } from '../broker.js';
import { COMMAND_MIGRATION, CommandStore } from '../commands/store.js';
import { DEVICE_MIGRATION, DeviceStore } from '../devices/store.js';
import { FIRMWARE_MIGRATION, FirmwareStore } from '../firmware/catalog.js';
import { FIRMWARE_JOB_MIGRATION, FIRMWARE_JOB_URL_MIGRATION, FirmwareJobStore } from '../firmware/jobs.js';
import { promised } from '../../lib/promised.js';
import { RULES_MIGRATION, RuleStore } from '../rules/store.js';
import type { ProductConfig } from './types.js';
import {
  type AccessToken,
  type BridgeStore,
  type CommandRepo,
  type DeviceRepo,
  type FirmwareRepo,
  type FwJobRepo,
  type RuleRepo,
  type StoreTx,
  type Frontend,
  type NewAccessToken,
  type NewUser,
  type Session,
  type Token,
  type TokenKind,
  type User,
  type UserPatch,
} from './types.js';
import {
  type AccessTokenRow,
  type FrontendRow,
  type SessionRow,
  type UserRow,
  toAccessToken,
  toFrontend,
  toSession,
  toUser,
} from './rows.js';

export const BRIDGE_MIGRATIONS: readonly Migration[] = [
  (db) => {
    db.exec(`
      CREATE TABLE frontends (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL,
        config     TEXT NOT NULL,
        is_default INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
      );
      CREATE TABLE users (
        id                  INTEGER PRIMARY KEY,
        frontend_id         TEXT NOT NULL REFERENCES frontends (id),
        login               TEXT NOT NULL,
        password_hash       TEXT NOT NULL,
        confirmed           INTEGER NOT NULL DEFAULT 0,
        data                TEXT NOT NULL DEFAULT '{}',
        authcode            TEXT NOT NULL UNIQUE,
        authcode_prev       TEXT,
        authcode_rotated_at INTEGER NOT NULL,
        created_at          INTEGER NOT NULL,
        UNIQUE (frontend_id, login)
      );
      CREATE INDEX users_authcode_prev ON users (authcode_prev) WHERE authcode_prev IS NOT NULL;
      CREATE TABLE sessions (
        id_hash      TEXT PRIMARY KEY,
        frontend_id  TEXT NOT NULL,
        user_id      INTEGER REFERENCES users (id) ON DELETE CASCADE,
        created_at   INTEGER NOT NULL,
        last_seen_at INTEGER NOT NULL
      ) WITHOUT ROWID;
      CREATE INDEX sessions_user ON sessions (user_id) WHERE user_id IS NOT NULL;
      CREATE INDEX sessions_last_seen ON sessions (last_seen_at);
      CREATE TABLE tokens (
        hash       TEXT PRIMARY KEY,
        kind       TEXT NOT NULL CHECK (kind IN ('confirm', 'recover')),
        user_id    INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
        expires_at INTEGER NOT NULL
      ) WITHOUT ROWID;
      CREATE INDEX tokens_user ON tokens (user_id, kind);
    `);
  },
  (db) => {
    // Devices known to the broker: the hash of the secret each one enrolled or was provisioned with.
    db.exec(`
      CREATE TABLE devices (
        id          TEXT PRIMARY KEY,
        secret_hash TEXT NOT NULL,
        enrolled_at INTEGER NOT NULL
      ) WITHOUT ROWID;
    `);
  },
  DEVICE_MIGRATION,
  COMMAND_MIGRATION,
  FIRMWARE_MIGRATION,
  FIRMWARE_JOB_MIGRATION,
  FIRMWARE_JOB_URL_MIGRATION,
  (db) => {
    // Migration 8: access tokens (decision 30), the sessions they start, and devices shared with users (decision 23).
    db.exec(`
      CREATE TABLE access_tokens (
        -- AUTOINCREMENT: the number a user revokes a token by is never given to a later one.
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        hash         TEXT NOT NULL UNIQUE,
        user_id      INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
        prefix       TEXT NOT NULL,
        created_at   INTEGER NOT NULL,
        last_used_at INTEGER
      );
      CREATE INDEX access_tokens_user ON access_tokens (user_id, id);
      ALTER TABLE sessions ADD COLUMN access_token_id INTEGER REFERENCES access_tokens (id) ON DELETE CASCADE;
      CREATE INDEX sessions_access_token ON sessions (access_token_id) WHERE access_token_id IS NOT NULL;
      CREATE TABLE device_shares (
        device_id  TEXT NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
        user_id    INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
        granted_at INTEGER NOT NULL,
        PRIMARY KEY (device_id, user_id)
      ) WITHOUT ROWID;
      CREATE INDEX device_shares_user ON device_shares (user_id, granted_at);
    `);
  },
  RULES_MIGRATION,
];

/** Sessions (with their users) kept in memory for the check every request makes. */
const SESSION_CACHE_MAX = 10_000;
/** How often the frontends are checked for changes made by another process (the admin CLI). */
const FRONTEND_RECHECK_MS = 1000;

/**
 * The SQLite store's synchronous core; `SqliteStore` is its face as a `BridgeStore`.
 *
 * Only one bridge process writes a data directory's sessions and users, so what this store keeps in memory of
 * them is current: every write through it drops what it touches. Frontends may also be changed by the admin CLI
 * in another process; `PRAGMA data_version` tells when, checked at most once a second.
 */
export class SqliteCore {
  readonly db: Db;
  readonly commit: AsyncGroupCommitter;
  readonly devices: DeviceStore;
  readonly commands: CommandStore;
  readonly firmware: FirmwareStore;
  readonly fwJobs: FirmwareJobStore;
  readonly rules: RuleStore;
  private readonly s;
  private frontendById = new Map<string, Frontend>();
  private defaultFrontendId: string | undefined;
  private frontendsCheckedAt = -Infinity;
  private dataVersion = -1;
  private readonly sessions = new Map<string, { session: Session; user: User | undefined }>();
  private readonly sessionsOfUser = new Map<number, Set<string>>();

  private readonly path: string;
  private readonly checkpointer: WalCheckpointer | undefined;

  /**
   * `log` gets one line when writes start failing for lack of space and one when they work again. With
   * `backgroundCheckpoints` (the running bridge), WAL checkpoints run in a worker thread instead of inside a
   * commit on the event loop (lib/wal-checkpointer.ts).
   */
  constructor(dataDir: string, log?: Logger, options: { backgroundCheckpoints?: boolean } = {}) {
    this.path = join(dataDir, 'bridge.db');
    this.db = openDatabase(this.path, BRIDGE_MIGRATIONS);
    if (options.backgroundCheckpoints === true) {
      this.checkpointer = new WalCheckpointer(this.db, {
        onError: (err) => log?.warn({ event: 'storage.checkpoint_failed', err }),
      });
    }
    this.commit = new AsyncGroupCommitter(this.db, {
      onStorageChange: (full, err) => {
        if (full) log?.error({ event: 'storage.full', dataDir, err: String(err) });
        else log?.info({ event: 'storage.recovered', dataDir });
      },
    });
    const db = this.db;
    this.devices = new DeviceStore(db);
    this.commands = new CommandStore(db);
    this.firmware = new FirmwareStore(db, dataDir);
    this.fwJobs = new FirmwareJobStore(db);
    this.rules = new RuleStore(db);
    this.s = {
      insFrontend: db.prepare(
        'INSERT INTO frontends (id, name, config, is_default, created_at) VALUES (@id, @name, @config, @isDefault, @createdAt)',
      ),
      frontend: db.prepare<[string], FrontendRow>('SELECT * FROM frontends WHERE id = ?'),
      defaultFrontend: db.prepare<[], FrontendRow>('SELECT * FROM frontends WHERE is_default = 1 LIMIT 1'),
      frontends: db.prepare<[], FrontendRow>('SELECT * FROM frontends ORDER BY created_at, id'),
      setFrontend: db.prepare('UPDATE frontends SET config = ?, name = coalesce(?, name) WHERE id = ?'),
      insUser: db.prepare<[Record<string, unknown>], UserRow>(`
        INSERT INTO users (frontend_id, login, password_hash, authcode, authcode_rotated_at, created_at)
        VALUES (@frontendId, @login, @passwordHash, @authcode, @now, @now)
        ON CONFLICT (frontend_id, login) DO NOTHING
        RETURNING *`),
      userByLogin: db.prepare<[string, string], UserRow>('SELECT * FROM users WHERE frontend_id = ? AND login = ?'),
      userById: db.prepare<[number], UserRow>('SELECT * FROM users WHERE id = ?'),
      userByAuthcode: db.prepare<[string], UserRow>('SELECT * FROM users WHERE authcode = ?'),
      userByPrevAuthcode: db.prepare<[string], UserRow>('SELECT * FROM users WHERE authcode_prev = ?'),
      insSession: db.prepare(
        `INSERT INTO sessions (id_hash, frontend_id, user_id, created_at, last_seen_at, access_token_id)
         VALUES (@idHash, @frontendId, @userId, @createdAt, @lastSeenAt, @accessTokenId)`,
      ),
      session: db.prepare<[string], SessionRow>('SELECT * FROM sessions WHERE id_hash = ?'),
      touchSession: db.prepare('UPDATE sessions SET last_seen_at = ? WHERE id_hash = ?'),
      delSession: db.prepare('DELETE FROM sessions WHERE id_hash = ?'),
      delUserSessions: db.prepare('DELETE FROM sessions WHERE user_id = ?'),
      pruneSessions: db.prepare('DELETE FROM sessions WHERE last_seen_at < ? OR created_at < ?'),
      insToken: db.prepare(
        'INSERT INTO tokens (hash, kind, user_id, expires_at) VALUES (@hash, @kind, @userId, @expiresAt)',
      ),
      takeToken: db.prepare<
        [string, string, number, number | null],
        { hash: string; kind: TokenKind; user_id: number; expires_at: number }
      >(
        'DELETE FROM tokens WHERE hash = ? AND kind = ? AND expires_at > ? AND user_id = coalesce(?, user_id) RETURNING *',
      ),
      delUserTokens: db.prepare('DELETE FROM tokens WHERE user_id = ? AND kind = ?'),
      insAccessToken: db.prepare<[Record<string, unknown>], AccessTokenRow>(
        `INSERT INTO access_tokens (hash, user_id, prefix, created_at) VALUES (@hash, @userId, @prefix, @createdAt)
         RETURNING *`,
      ),
      accessTokensOf: db.prepare<[number], AccessTokenRow>('SELECT * FROM access_tokens WHERE user_id = ? ORDER BY id'),
      accessTokenByHash: db.prepare<[string], AccessTokenRow>('SELECT * FROM access_tokens WHERE hash = ?'),
      accessTokenById: db.prepare<[number, number], AccessTokenRow>(
        'SELECT * FROM access_tokens WHERE id = ? AND user_id = ?',
      ),
      touchAccessToken: db.prepare('UPDATE access_tokens SET last_used_at = ? WHERE id = ?'),
      sessionsOfAccessToken: db
        .prepare<[number], string>('SELECT id_hash FROM sessions WHERE access_token_id = ?')
        .pluck(),
      // The sessions the token started go with it (ON DELETE CASCADE).
      delAccessToken: db.prepare('DELETE FROM access_tokens WHERE id = ?'),
      delUserAccessTokens: db.prepare('DELETE FROM access_tokens WHERE user_id = ?'),
      pageCount: db.prepare<[], number>('PRAGMA page_count').pluck(),
      pageSize: db.prepare<[], number>('PRAGMA page_size').pluck(),
      freePages: db.prepare<[], number>('PRAGMA freelist_count').pluck(),
    };
  }

  get storage(): StorageState {
    return this.commit.storage;
  }

  get checkpointing(): boolean {
    return this.checkpointer?.busy ?? false;
  }

  databaseSize(): { bytes: number; freeBytes: number } {
    const pages = this.s.pageCount.get() ?? 0;
    const free = this.s.freePages.get() ?? 0;
    const pageSize = this.s.pageSize.get() ?? 0;
    let wal = 0;
    try {
      wal = statSync(`${this.path}-wal`).size;
    } catch {
      // No log yet, or checkpointed away.
    }
    return { bytes: pages * pageSize + wal, freeBytes: free * pageSize };
  }

  createFrontend(f: Frontend): void {
    this.frontendsChanged();
    this.s.insFrontend.run({
      id: f.id,
      name: f.name,
      config: JSON.stringify(f.config),
      isDefault: f.isDefault ? 1 : 0,
      createdAt: f.createdAt,
    });
  }

  setDefaultFrontend(id: string): boolean {
    this.frontendsChanged();
    return this.db.transaction(() => {
      if (!this.s.frontend.get(id)) return false;
      this.db.prepare('UPDATE frontends SET is_default = (id = ?)').run(id);
      return true;
    })();
  }

  frontend(id: string): Frontend | undefined {
    this.refreshFrontends();
    return this.frontendById.get(id);
  }

  defaultFrontend(): Frontend | undefined {
    this.refreshFrontends();
    return this.defaultFrontendId === undefined ? undefined : this.frontendById.get(this.defaultFrontendId);
  }

  private refreshFrontends(force = false): void {
    const t = performance.now();
    if (!force && t - this.frontendsCheckedAt < FRONTEND_RECHECK_MS) return;
    this.frontendsCheckedAt = t;
    const version = this.db.pragma('data_version', { simple: true }) as number;
    if (!force && version === this.dataVersion) return;
    this.dataVersion = version;
    const all = this.s.frontends.all().map(toFrontend);
    this.frontendById = new Map(all.map((f) => [f.id, f]));
    this.defaultFrontendId = all.find((f) => f.isDefault)?.id;
  }

  /** After this process changed frontends: read them again at the next lookup. */
  private frontendsChanged(): void {
    this.frontendsCheckedAt = -Infinity;
    this.dataVersion = -1;
  }

  frontends(): Frontend[] {
    return this.s.frontends.all().map(toFrontend);
  }

  setFrontendConfig(id: string, config: ProductConfig, name?: string): boolean {
    this.frontendsChanged();
    return this.s.setFrontend.run(JSON.stringify(config), name ?? null, id).changes > 0;
  }

  createUser(u: NewUser): User | undefined {
    const r = this.s.insUser.get({ ...u });
    return r && toUser(r);
  }

  userByLogin(frontendId: string, login: string): User | undefined {
    const r = this.s.userByLogin.get(frontendId, login);
    return r && toUser(r);
  }

  userById(id: number): User | undefined {
    const r = this.s.userById.get(id);
    return r && toUser(r);
  }

  userByAuthcode(authcode: string): User | undefined {
    const r = this.s.userByAuthcode.get(authcode) ?? this.s.userByPrevAuthcode.get(authcode);
    return r && toUser(r);
  }

  updateUser(id: number, patch: UserPatch): void {
    this.forgetUser(id);
    const cols: string[] = [];
    const values: unknown[] = [];
    const map: Record<keyof UserPatch, string> = {
      passwordHash: 'password_hash',
      confirmed: 'confirmed',
      data: 'data',
      authcode: 'authcode',
      authcodePrev: 'authcode_prev',
      authcodeRotatedAt: 'authcode_rotated_at',
    };
    for (const [k, col] of Object.entries(map) as Array<[keyof UserPatch, string]>) {
      if (patch[k] === undefined) continue;
      cols.push(`${col} = ?`);
      const v = patch[k];
      values.push(typeof v === 'boolean' ? (v ? 1 : 0) : v);
    }
    if (cols.length === 0) return;
    this.db.prepare(`UPDATE users SET ${cols.join(', ')} WHERE id = ?`).run(...values, id);
  }

  createSession(s: Session): void {
    this.s.insSession.run({ ...s, accessTokenId: s.accessTokenId ?? null });
  }

  session(idHash: string): Session | undefined {
    const r = this.s.session.get(idHash);
    return r && toSession(r);
  }

  sessionWithUser(idHash: string): { session: Session; user: User | undefined } | undefined {
    const hit = this.sessions.get(idHash);
    if (hit) return hit;
    // Read outside any transaction (requests are checked before their work starts), so what is kept is committed.
    const session = this.session(idHash);
    if (!session) return undefined;
    const entry = { session, user: session.userId === null ? undefined : this.userById(session.userId) };
    if (this.sessions.size >= SESSION_CACHE_MAX) this.forgetSession(this.sessions.keys().next().value!);
    this.sessions.set(idHash, entry);
    if (session.userId !== null) {
      let set = this.sessionsOfUser.get(session.userId);
      if (!set) this.sessionsOfUser.set(session.userId, (set = new Set()));
      set.add(idHash);
    }
    return entry;
  }

  private forgetSession(idHash: string): void {
    const entry = this.sessions.get(idHash);
    if (!entry) return;
    this.sessions.delete(idHash);
    const uid = entry.session.userId;
    if (uid === null) return;
    const set = this.sessionsOfUser.get(uid);
    set?.delete(idHash);
    if (set?.size === 0) this.sessionsOfUser.delete(uid);
  }

  private forgetUser(userId: number): void {
    for (const h of [...(this.sessionsOfUser.get(userId) ?? [])]) this.forgetSession(h);
  }

  touchSession(idHash: string, now: number): void {
    this.forgetSession(idHash);
    this.s.touchSession.run(now, idHash);
  }

  deleteSession(idHash: string): boolean {
    this.forgetSession(idHash);
    return this.s.delSession.run(idHash).changes > 0;
  }

  deleteSessionsOfUser(userId: number): number {
    this.forgetUser(userId);
    return this.s.delUserSessions.run(userId).changes;
  }

  pruneSessions(idleBefore: number, createdBefore: number): number {
    this.sessions.clear();
    this.sessionsOfUser.clear();
    return this.s.pruneSessions.run(idleBefore, createdBefore).changes;
  }

  createToken(t: Token): void {
    this.s.insToken.run({ ...t });
  }

  takeToken(hash: string, kind: TokenKind, now: number, userId?: number): Token | undefined {
    const r = this.s.takeToken.get(hash, kind, now, userId ?? null);
    return r && { hash: r.hash, kind: r.kind, userId: r.user_id, expiresAt: r.expires_at };
  }

  deleteTokensOfUser(userId: number, kind: TokenKind): void {
    this.s.delUserTokens.run(userId, kind);
  }

  createAccessToken(t: NewAccessToken): AccessToken {
    return toAccessToken(this.s.insAccessToken.get({ ...t })!);
  }

  accessTokensOf(userId: number): AccessToken[] {
    return this.s.accessTokensOf.all(userId).map(toAccessToken);
  }

  accessTokenByHash(hash: string): AccessToken | undefined {
    const r = this.s.accessTokenByHash.get(hash);
    return r && toAccessToken(r);
  }

  touchAccessToken(id: number, now: number): boolean {
    return this.s.touchAccessToken.run(now, id).changes > 0;
  }

  deleteAccessToken(
    userId: number,
    which: { hash: string } | { id: number },
  ): { token: AccessToken; sessions: string[] } | undefined {
    const r = 'hash' in which ? this.s.accessTokenByHash.get(which.hash) : this.s.accessTokenById.get(which.id, userId);
    if (!r || r.user_id !== userId) return undefined;
    const sessions = this.s.sessionsOfAccessToken.all(r.id);
    this.forgetUser(userId);
    this.s.delAccessToken.run(r.id);
    return { token: toAccessToken(r), sessions };
  }

  deleteAccessTokensOfUser(userId: number): number {
    this.forgetUser(userId);
    return this.s.delUserAccessTokens.run(userId).changes;
  }

  // ---- device credentials (the embedded broker's enrolment) ----

  secretHash(deviceId: string): string | undefined {
    return this.devices.secretHash(deviceId);
  }

  /**
   * Trust on first use: the first secret a device presents is kept. Written at once and durably (the broker
   * accepts the connection only after this returns), so that a restart cannot let another secret in.
   */
  enroll(deviceId: string, secretHash: string, at: number): void {
    this.devices.enroll(deviceId, secretHash, at);
  }

  async close(): Promise<void> {
    await this.commit.close();
    this.checkpointer?.close();
    this.db.close();
  }
}

const wrap = <T>(fn: () => T): Promise<T> => {
  try {
    return Promise.resolve(fn());
  } catch (err) {
    return Promise.reject(err instanceof Error ? err : new Error(String(err)));
  }
};

/**
 * The bridge store in SQLite: the synchronous core behind the asynchronous interface both engines share. The
 * store is also its own transaction: one connection, and `write` runs one unit of work at a time on it.
 */
export class SqliteStore implements BridgeStore {
  readonly engine = 'sqlite' as const;
  /** The synchronous core, for tools and tests that work on the file directly. */
  readonly core: SqliteCore;
  readonly devices: DeviceRepo;
  readonly commands: CommandRepo;
  readonly firmware: FirmwareRepo;
  readonly fwJobs: FwJobRepo;
  readonly rules: RuleRepo;
  readonly credentials: DeviceCredentials;

  constructor(dataDir: string, log?: Logger, options: { backgroundCheckpoints?: boolean } = {}) {
    const core = (this.core = new SqliteCore(dataDir, log, options));
    this.devices = promised(core.devices);
    this.commands = promised(core.commands);
    const fw = core.firmware;
    this.firmware = {
      imageDir: fw.imageDir,
      byName: (name) => wrap(() => fw.byName(name)),
      list: () => wrap(() => fw.list()),
      imagePath: (image) => fw.imagePath(image),
      add: (image) => wrap(() => fw.add(image)),
      isUsed: (sha256) => wrap(() => fw.isUsed(sha256)),
    };
    this.fwJobs = promised(core.fwJobs);
    this.rules = promised(core.rules);
    this.credentials = {
      secretHash: (id) => wrap(() => core.secretHash(id)),
      enroll: (id, hash, at) => wrap(() => core.enroll(id, hash, at)),
    };
  }

  write<T>(work: (tx: StoreTx) => Promise<T>, options?: { durable?: boolean }): Promise<T> {
    return this.core.commit.run(() => work(this), options);
  }

  get storage(): StorageState {
    return this.core.storage;
  }

  get checkpointing(): boolean {
    return this.core.checkpointing;
  }

  databaseSize(): Promise<{ bytes: number; freeBytes: number }> {
    return wrap(() => this.core.databaseSize());
  }

  createFrontend(f: Frontend): Promise<void> {
    return wrap(() => this.core.createFrontend(f));
  }
  frontend(id: string): Promise<Frontend | undefined> {
    return wrap(() => this.core.frontend(id));
  }
  defaultFrontend(): Promise<Frontend | undefined> {
    return wrap(() => this.core.defaultFrontend());
  }
  frontends(): Promise<Frontend[]> {
    return wrap(() => this.core.frontends());
  }
  setFrontendConfig(id: string, config: ProductConfig, name?: string): Promise<boolean> {
    return wrap(() => this.core.setFrontendConfig(id, config, name));
  }
  setDefaultFrontend(id: string): Promise<boolean> {
    return wrap(() => this.core.setDefaultFrontend(id));
  }
  createUser(u: NewUser): Promise<User | undefined> {
    return wrap(() => this.core.createUser(u));
  }
  userByLogin(frontendId: string, login: string): Promise<User | undefined> {
    return wrap(() => this.core.userByLogin(frontendId, login));
  }
  userById(id: number): Promise<User | undefined> {
    return wrap(() => this.core.userById(id));
  }
  userByAuthcode(authcode: string): Promise<User | undefined> {
    return wrap(() => this.core.userByAuthcode(authcode));
  }
  updateUser(id: number, patch: UserPatch): Promise<void> {
    return wrap(() => this.core.updateUser(id, patch));
  }
  createSession(s: Session): Promise<void> {
    return wrap(() => this.core.createSession(s));
  }
  session(idHash: string): Promise<Session | undefined> {
    return wrap(() => this.core.session(idHash));
  }
  sessionWithUser(idHash: string): Promise<{ session: Session; user: User | undefined } | undefined> {
    return wrap(() => this.core.sessionWithUser(idHash));
  }
  touchSession(idHash: string, now: number): Promise<void> {
    return wrap(() => this.core.touchSession(idHash, now));
  }
  deleteSession(idHash: string): Promise<boolean> {
    return wrap(() => this.core.deleteSession(idHash));
  }
  deleteSessionsOfUser(userId: number): Promise<number> {
    return wrap(() => this.core.deleteSessionsOfUser(userId));
  }
  pruneSessions(idleBefore: number, createdBefore: number): Promise<number> {
    return wrap(() => this.core.pruneSessions(idleBefore, createdBefore));
  }
  createToken(t: Token): Promise<void> {
    return wrap(() => this.core.createToken(t));
  }
  takeToken(hash: string, kind: TokenKind, now: number, userId?: number): Promise<Token | undefined> {
    return wrap(() => this.core.takeToken(hash, kind, now, userId));
  }
  deleteTokensOfUser(userId: number, kind: TokenKind): Promise<void> {
    return wrap(() => this.core.deleteTokensOfUser(userId, kind));
  }
  createAccessToken(t: NewAccessToken): Promise<AccessToken> {
    return wrap(() => this.core.createAccessToken(t));
  }
  accessTokensOf(userId: number): Promise<AccessToken[]> {
    return wrap(() => this.core.accessTokensOf(userId));
  }
  accessTokenByHash(hash: string): Promise<AccessToken | undefined> {
    return wrap(() => this.core.accessTokenByHash(hash));
  }
  touchAccessToken(id: number, now: number): Promise<boolean> {
    return wrap(() => this.core.touchAccessToken(id, now));
  }
  deleteAccessToken(
    userId: number,
    which: { hash: string } | { id: number },
  ): Promise<{ token: AccessToken; sessions: string[] } | undefined> {
    return wrap(() => this.core.deleteAccessToken(userId, which));
  }
  deleteAccessTokensOfUser(userId: number): Promise<number> {
    return wrap(() => this.core.deleteAccessTokensOfUser(userId));
  }

  close(): Promise<void> {
    return this.core.close();
  }
}
