/**
 * What the bridge keeps, behind an interface that two engines implement (docs/scaling.md): SQLite, embedded, one
 * bridge per data directory (store/sqlite.ts); PostgreSQL, shared by several bridges (store/postgres/). Every
 * method answers a promise. Writes that belong together go through `write`, which resolves once they are
 * committed, so that a reply never promises what a crash could take back.
 */
import type { Pool } from 'pg';
import { z } from 'zod';
import type { StorageState } from '../../lib/sqlite.js';
import type { CmdStatusMessage, Version } from '../../protocol/index.js';
import type { DeviceCredentials } from '../broker.js';
import type { EventBus } from '../events/bus.js';
import type { BridgeCommandState, NewBridgeCommand, StoredCommand } from '../commands/store.js';
import type {
  ClaimOutcome,
  Device,
  DeviceShare,
  HistoryEntry,
  NewVersion,
  SetBy,
  ShareOutcome,
  VarKey,
  VarRecord,
  VarType,
} from '../devices/store.js';
import type { AddOutcome, FirmwareImage } from '../firmware/catalog.js';
import type {
  DueWebhook,
  EmailState,
  NewRule,
  NewUserEvent,
  Rule,
  RulePatch,
  UserEvent,
  WebhookRecord,
} from '../rules/store.js';
import type { FirmwareJob, JobOutcome, NewJob } from '../firmware/jobs.js';

/** Decision 16: a frontend's product configuration. */
export const ProductConfig = z
  .object({
    /** Users may see nearby devices (`GET /0/network/`). */
    nearby: z.boolean().default(true),
    /** Users may claim devices (`POST /0/devices/`). */
    registration: z.boolean().default(true),
    /** Signup sends a confirmation e-mail. */
    confirmationEmail: z.boolean().default(true),
    /** A claim succeeds only for a device that heard the user's authcode within the nearby window. */
    claimRequiresProximity: z.boolean().default(false),
  })
  .strict();
export type ProductConfig = z.infer<typeof ProductConfig>;

export interface Frontend {
  id: string;
  name: string;
  config: ProductConfig;
  isDefault: boolean;
  createdAt: number;
}

export interface User {
  id: number;
  frontendId: string;
  /** Lower-cased: logins are case-insensitive (decision 12). */
  login: string;
  passwordHash: string;
  confirmed: boolean;
  /** The user data object, as JSON text. */
  data: string;
  authcode: string;
  /** The authcode before the last rotation, still matched for an hour (decision 17). */
  authcodePrev: string | null;
  authcodeRotatedAt: number;
  createdAt: number;
}

export interface Session {
  /** sha256 of the cookie value: the value itself is never stored (docs/decisions.md §9). */
  idHash: string;
  frontendId: string;
  userId: number | null;
  createdAt: number;
  lastSeenAt: number;
  /**
   * The access token this session was started with (`POST /0/session/` with `token`), whose revocation ends it
   * (decision 30); `null` (or absent when made) for a session of a login, a signup or an anonymous one.
   */
  accessTokenId?: number | null;
}

/** A long-lived access token of a user (decision 30): only its sha256 is stored, beside a short prefix to tell it by. */
export interface AccessToken {
  /** Its number, by which the user lists and may revoke it without the secret. */
  id: number;
  hash: string;
  userId: number;
  /** The first characters of the token, to recognise it in a list; not enough to use it. */
  prefix: string;
  createdAt: number;
  /** When it last started a session (or a live channel), `null` before its first use. */
  lastUsedAt: number | null;
}

export type NewAccessToken = Omit<AccessToken, 'id' | 'lastUsedAt'>;

export type TokenKind = 'confirm' | 'recover';

export interface Token {
  hash: string;
  kind: TokenKind;
  userId: number;
  expiresAt: number;
}

export interface NewUser {
  frontendId: string;
  login: string;
  passwordHash: string;
  authcode: string;
  now: number;
}

export interface UserPatch {
  passwordHash?: string;
  confirmed?: boolean;
  data?: string;
  authcode?: string;
  authcodePrev?: string | null;
  authcodeRotatedAt?: number;
}

/**
 * Devices, their variables and history, and who they heard nearby (docs/decisions.md §3 to §5). Writes run in
 * the transaction of the `StoreTx` they were reached through.
 */
export interface DeviceRepo {
  device(id: string): Promise<Device | undefined>;
  deviceByAuthcode(authcode: string): Promise<Device | undefined>;
  /**
   * The ids of the devices a user may use as theirs (decision 23): those registered to the user, in the order they
   * were claimed, then those shared with the user, in the order they were shared. The device list and the live
   * channel read this.
   */
  deviceIdsOf(userId: number): Promise<readonly string[]>;
  /**
   * Shares a device its owner `ownerId` has with `userId` (decision 23): `shared`, `already` (it was), or
   * `not-owner` when `ownerId` does not own it (any more: the device row is locked against a concurrent unregister).
   */
  share(deviceId: string, ownerId: number, userId: number, now: number): Promise<ShareOutcome>;
  /** Takes a share back; `false` when there was none. */
  unshare(deviceId: string, userId: number): Promise<boolean>;
  /** Whether the device is shared with the user (whoever owns it). */
  isSharedWith(deviceId: string, userId: number): Promise<boolean>;
  /** The users a device is shared with, in the order they were shared. */
  sharesOf(deviceId: string): Promise<DeviceShare[]>;
  secretHash(deviceId: string): Promise<string | undefined>;
  /** Trust on first use: the first secret a device presents is kept. */
  enroll(deviceId: string, secretHash: string, now: number): Promise<void>;
  /** Makes sure a device the broker let in has a row (devices met through an external broker). */
  touch(deviceId: string, now: number): Promise<void>;
  /** Records the auth code a device reports; `false` when another device already has it. */
  setAuthcode(deviceId: string, authcode: string): Promise<boolean>;
  /** A claim by a new owner also ends any share left of the device (decision 23). */
  claim(deviceId: string, userId: number, now: number): Promise<ClaimOutcome>;
  /** Unregisters a device: its `s` variables, history, nearby rows and shares go; `d` and `meta` stay. */
  unregister(deviceId: string, userId: number): Promise<boolean>;

  /** `forUpdate`: as `StoreTx.userById`, for a read-modify-write of the variable (a user's change, a sync). */
  getVar(
    deviceId: string,
    type: VarType,
    name: string,
    options?: { forUpdate?: boolean },
  ): Promise<VarRecord | undefined>;
  vars(deviceId: string, type?: VarType): Promise<VarRecord[]>;
  /** Writes a version (with `acked` as given) and, unless `history` is false, its history entry. */
  putVersion(deviceId: string, v: NewVersion, acked: number, by: SetBy, history?: boolean): Promise<void>;
  /**
   * Applies a version received from the device when it is newer than the one held, atomically with the
   * comparison (two bridges may handle two messages of one device at once).
   */
  applyFromDevice(
    deviceId: string,
    v: NewVersion,
    now: number,
  ): Promise<{ outcome: 'applied' | 'same' } | { outcome: 'older'; held: VarRecord }>;
  ackVersion(deviceId: string, type: VarType, name: string, version: Version, now: number): Promise<boolean>;
  unack(deviceId: string, type: VarType, name: string): Promise<void>;
  /** A new sync of the variable: `synced = max(now, synced + 1)`; `undefined` when it does not exist. */
  markSynced(deviceId: string, type: VarType, name: string, now: number): Promise<number | undefined>;
  ackSync(deviceId: string, type: VarType, name: string, synced: number, now: number): Promise<boolean>;
  /** A page of what the device has not acknowledged, in name order after `after`. */
  pending(deviceId: string, after: string, limit: number): Promise<VarRecord[]>;
  setMeta(deviceId: string, name: string, value: string, time: number, by: SetBy, history?: boolean): Promise<void>;
  count(): Promise<number>;
  connectedIds(): Promise<string[]>;
  markAllDisconnected(now: number): Promise<number>;

  history(deviceId: string, type: VarType, name: string, limit: number, before?: number): Promise<HistoryEntry[]>;
  /** The oldest `limit` entries with an id at or above `since`, newest first (`startid`, docs/api.md, History). */
  historySince(deviceId: string, type: VarType, name: string, limit: number, since: number): Promise<HistoryEntry[]>;
  pruneHistory(before: number, max: number): Promise<number>;
  pruneVariableHistory(key: VarKey, keep: number, max: number): Promise<number>;
  varKeys(after: VarKey | undefined, limit: number): Promise<VarKey[]>;
  /** The variables whose history grew since the last call; `undefined` when unknown (walk them all). */
  takeGrown(): Promise<VarKey[] | undefined>;

  heard(deviceId: string, userId: number, at: number): Promise<void>;
  heardBy(deviceId: string, userId: number, since: number): Promise<boolean>;
  nearbyOf(userId: number, since: number): Promise<Device[]>;
  pruneNearby(before: number): Promise<number>;

  /** The JSON of a device object (decision 9). */
  deviceJson(deviceId: string): Promise<string>;
}

/** Commands sent to devices, with their states. */
export interface CommandRepo {
  add(c: NewBridgeCommand, sentAt?: number): Promise<void>;
  countByState(): Promise<Partial<Record<BridgeCommandState, number>>>;
  get(id: string): Promise<StoredCommand | undefined>;
  openCount(deviceId: string): Promise<number>;
  open(deviceId: string, afterSeq: number, limit: number): Promise<StoredCommand[]>;
  ofDevice(deviceId: string, limit: number, beforeSeq?: number): Promise<StoredCommand[]>;
  markSent(id: string, now: number): Promise<void>;
  report(deviceId: string, msg: CmdStatusMessage): Promise<boolean>;
  expire(now: number): Promise<number>;
  prune(before: number, max: number): Promise<number>;
  deleteOfDevice(deviceId: string): Promise<void>;
}

/** The firmware catalog: records here, image files in `imageDir`. */
export interface FirmwareRepo {
  readonly imageDir: string;
  byName(name: string): Promise<FirmwareImage | undefined>;
  list(): Promise<FirmwareImage[]>;
  imagePath(image: Pick<FirmwareImage, 'sha256'>): string;
  add(image: FirmwareImage): Promise<AddOutcome>;
  isUsed(sha256: string): Promise<boolean>;
}

/** Firmware update jobs, at most one open per device. */
export interface FwJobRepo {
  get(id: string): Promise<FirmwareJob | undefined>;
  openCount(): Promise<number>;
  openOf(deviceId: string): Promise<FirmwareJob | undefined>;
  add(j: NewJob): Promise<void>;
  end(id: string, outcome: JobOutcome, now: number): Promise<boolean>;
  renewToken(id: string, token: string, expires: number): Promise<void>;
  markCancelled(id: string): Promise<void>;
  tokenValid(id: string, token: string, now: number): Promise<FirmwareJob | undefined>;
}

/**
 * Notification rules, their evaluation state, and the event log with its webhook deliveries (docs/notifications.md).
 * The state transitions are conditional: each answers whether this call made it (two bridges may evaluate one rule
 * at once).
 */
export interface RuleRepo {
  create(r: NewRule): Promise<Rule>;
  /** The user's rule of that number; `undefined` for another user's. */
  get(userId: number, id: number): Promise<Rule | undefined>;
  byId(id: number): Promise<Rule | undefined>;
  ofUser(userId: number): Promise<Rule[]>;
  countOfUser(userId: number): Promise<number>;
  update(userId: number, id: number, patch: RulePatch): Promise<Rule | undefined>;
  remove(userId: number, id: number): Promise<Rule | undefined>;
  /** The rules on a device whose user owns it or has it shared, by number. */
  ofDevice(deviceId: string): Promise<Rule[]>;
  /** `active` from `from` to `to`, with `pendingSince`; `false` when the rule was not at `from`. */
  setActive(id: number, from: boolean, to: boolean, pendingSince: number | null): Promise<boolean>;
  /** An inactive rule whose condition now holds becomes active; `false` when it was active already. */
  fire(id: number): Promise<boolean>;
  /** A `for` ran out: `false` when the rule is no longer pending since `pendingSince`. */
  firePending(id: number, pendingSince: number): Promise<boolean>;
  /** The rule delivered an event: its `fired_at`, which the per-rule rate limit counts from. */
  fireEdge(id: number, now: number): Promise<void>;
  /** `changed`: the value seen, when the one held is still `expected`. */
  setLastValue(id: number, expected: Buffer | null, value: Buffer | null): Promise<boolean>;
  /** Rules whose `for` has run out by `now`, oldest first. */
  duePending(now: number, limit: number): Promise<Rule[]>;

  addEvent(e: NewUserEvent): Promise<UserEvent>;
  event(id: number): Promise<UserEvent | undefined>;
  /** The user's events, newest first, with a number below `before`. */
  events(userId: number, limit: number, before?: number): Promise<UserEvent[]>;
  setEmailState(id: number, state: EmailState): Promise<void>;
  pruneEvents(before: number, max: number): Promise<number>;
  /** Webhook deliveries due at `now`, each leased until `now + leaseMs`. */
  claimDueWebhooks(now: number, limit: number, leaseMs: number): Promise<DueWebhook[]>;
  recordWebhook(id: number, w: WebhookRecord): Promise<void>;
}

/** What the bridge reads and writes: the whole store, or one transaction of it (`BridgeStore.write`). */
export interface StoreTx {
  readonly devices: DeviceRepo;
  readonly commands: CommandRepo;
  readonly firmware: FirmwareRepo;
  readonly fwJobs: FwJobRepo;
  readonly rules: RuleRepo;

  createFrontend(f: Frontend): Promise<void>;
  frontend(id: string): Promise<Frontend | undefined>;
  defaultFrontend(): Promise<Frontend | undefined>;
  frontends(): Promise<Frontend[]>;
  setFrontendConfig(id: string, config: ProductConfig, name?: string): Promise<boolean>;
  /** Makes this frontend the default one (and no other). */
  setDefaultFrontend(id: string): Promise<boolean>;

  /** `undefined` when the login is taken in that frontend. */
  createUser(u: NewUser): Promise<User | undefined>;
  userByLogin(frontendId: string, login: string): Promise<User | undefined>;
  /**
   * `forUpdate`: inside `write`, the row stays locked until the transaction ends, so that a read-modify-write of
   * the user (its data, its authcode's rotation) does not lose a concurrent one (PostgreSQL; SQLite has one writer).
   */
  userById(id: number, options?: { forUpdate?: boolean }): Promise<User | undefined>;
  /** Matches the current and, within its grace hour, the previous authcode. */
  userByAuthcode(authcode: string): Promise<User | undefined>;
  updateUser(id: number, patch: UserPatch): Promise<void>;

  createSession(s: Session): Promise<void>;
  session(idHash: string): Promise<Session | undefined>;
  /** The session and its user, for the check every request makes. */
  sessionWithUser(idHash: string): Promise<{ session: Session; user: User | undefined } | undefined>;
  touchSession(idHash: string, now: number): Promise<void>;
  deleteSession(idHash: string): Promise<boolean>;
  deleteSessionsOfUser(userId: number): Promise<number>;
  /** Removes sessions idle or older than the limits; returns how many. */
  pruneSessions(idleBefore: number, createdBefore: number): Promise<number>;

  createToken(t: Token): Promise<void>;
  /**
   * Uses a token once: returns it and removes it when it exists, has the kind, has not expired and, when
   * `userId` is given, belongs to that user (a token presented for someone else stays usable by its owner).
   */
  takeToken(hash: string, kind: TokenKind, now: number, userId?: number): Promise<Token | undefined>;
  deleteTokensOfUser(userId: number, kind: TokenKind): Promise<void>;

  /** Adds an access token (decision 30); its number is the answer. */
  createAccessToken(t: NewAccessToken): Promise<AccessToken>;
  /** The user's access tokens, oldest first. */
  accessTokensOf(userId: number): Promise<AccessToken[]>;
  accessTokenByHash(hash: string): Promise<AccessToken | undefined>;
  /** Stamps the token's last use; `false` when it no longer exists. */
  touchAccessToken(id: number, now: number): Promise<boolean>;
  /**
   * Revokes one of the user's access tokens, by its hash or its number, and with it the sessions it started;
   * `undefined` when the user has no such token, else the token and the stored hashes of the sessions that ended.
   */
  deleteAccessToken(
    userId: number,
    which: { hash: string } | { id: number },
  ): Promise<{ token: AccessToken; sessions: string[] } | undefined>;
  /** Revokes every access token of the user (a password reset), and the sessions they started; returns how many. */
  deleteAccessTokensOfUser(userId: number): Promise<number>;
}

export type StoreEngine = 'sqlite' | 'postgres';

export interface BridgeStore extends StoreTx {
  readonly engine: StoreEngine;
  /**
   * Runs `work` in one transaction, committed (on disk) when the promise resolves; a rejection rolls back all
   * of it. `work` reads and writes through the `tx` it is given and awaits nothing but the store: SQLite runs
   * the units of work one after another on its one connection (group commit, docs/decisions.md §8). On a full
   * disk it rejects with `StorageFullError` (lib/sqlite.ts), which the API answers `507 storage-full`.
   * `durable: false` is for work whose loss costs only a repeat (an activity stamp).
   */
  write<T>(work: (tx: StoreTx) => Promise<T>, options?: { durable?: boolean }): Promise<T>;
  /** Whether the last writes failed for lack of space (`/healthz`). */
  readonly storage: StorageState;
  /**
   * Whether a WAL checkpoint runs in the background now (lib/wal-checkpointer.ts): bulk work (the history
   * retention) waits for its end before its next write. Always false on PostgreSQL.
   */
  readonly checkpointing: boolean;
  /**
   * The database's size on disk, bytes, and of that the part free for reuse (removed rows leave free pages,
   * which new rows fill before the file grows again). For metrics.
   */
  databaseSize(): Promise<{ bytes: number; freeBytes: number }>;
  /**
   * PostgreSQL's connection pool, for what the bridges share beyond the store (the attempt limits, the event bus);
   * SQLite: none.
   */
  readonly pool?: Pool;
  /**
   * An engine that keeps copies of rows other processes change (PostgreSQL's frontends) follows the event bus
   * with it, and publishes its own such changes there (docs/scaling.md, "The event bus"); returns the function
   * that stops that. SQLite: none (one bridge; its copies are rechecked every second).
   */
  useEvents?(bus: EventBus): () => void;
  /** Where enrolled devices' secret hashes are kept, for the embedded broker. */
  readonly credentials: DeviceCredentials;
  close(): Promise<void>;
}
