/**
 * What the bridge keeps, behind an interface narrow enough that another database can implement it without
 * touching the routes. Reads are synchronous; writes go through `write`, which resolves once they are durable
 * (group commit), so that a reply never promises what a crash could take back.
 */
import { z } from 'zod';
import type { StorageState } from '../../lib/sqlite.js';
import type { CommandStore } from '../commands/store.js';
import type { DeviceStore } from '../devices/store.js';
import type { FirmwareJobStore } from '../firmware/jobs.js';
import type { FirmwareStore } from '../firmware/catalog.js';

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
}

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

export interface BridgeStore {
  /** Devices, their variables and history, and who they heard nearby. */
  readonly devices: DeviceStore;
  /** Commands sent to devices, with their states. */
  readonly commands: CommandStore;
  /** The firmware catalog: images added with `devcloud-bridge firmware add`. */
  readonly firmware: FirmwareStore;
  /** Firmware update jobs, at most one open per device. */
  readonly fwJobs: FirmwareJobStore;

  /**
   * Runs writes in a transaction that is on disk when the promise resolves. On a full disk it rejects with
   * `StorageFullError` (lib/sqlite.ts), which the API answers `507 storage-full`.
   */
  write<T>(work: () => T, options?: { durable?: boolean }): Promise<T>;
  /** Whether the last writes failed for lack of space (`/healthz`). */
  readonly storage: StorageState;
  /**
   * Whether a WAL checkpoint runs in the background now (lib/wal-checkpointer.ts): bulk work (the history
   * retention) waits for its end before its next write.
   */
  readonly checkpointing: boolean;

  /**
   * The database's size on disk, bytes: its pages and its write-ahead log; and of that, the pages free for reuse
   * (removed rows leave free pages, which new rows fill before the file grows again). For metrics.
   */
  databaseSize(): { bytes: number; freeBytes: number };

  createFrontend(f: Frontend): void;
  frontend(id: string): Frontend | undefined;
  defaultFrontend(): Frontend | undefined;
  frontends(): Frontend[];
  setFrontendConfig(id: string, config: ProductConfig, name?: string): boolean;
  /** Makes this frontend the default one (and no other). */
  setDefaultFrontend(id: string): boolean;

  /** `undefined` when the login is taken in that frontend. */
  createUser(u: NewUser): User | undefined;
  userByLogin(frontendId: string, login: string): User | undefined;
  userById(id: number): User | undefined;
  /** Matches the current and, within its grace hour, the previous authcode. */
  userByAuthcode(authcode: string): User | undefined;
  updateUser(id: number, patch: UserPatch): void;

  createSession(s: Session): void;
  session(idHash: string): Session | undefined;
  /**
   * The session and its user, for the check every request makes. An implementation may answer it from memory:
   * every write to sessions and users through this store keeps such an answer current.
   */
  sessionWithUser(idHash: string): { session: Session; user: User | undefined } | undefined;
  touchSession(idHash: string, now: number): void;
  deleteSession(idHash: string): boolean;
  deleteSessionsOfUser(userId: number): number;
  /** Removes sessions idle or older than the limits; returns how many. */
  pruneSessions(idleBefore: number, createdBefore: number): number;

  createToken(t: Token): void;
  /**
   * Uses a token once: returns it and removes it when it exists, has the kind, has not expired and, when
   * `userId` is given, belongs to that user (a token presented for someone else stays usable by its owner).
   */
  takeToken(hash: string, kind: TokenKind, now: number, userId?: number): Token | undefined;
  deleteTokensOfUser(userId: number, kind: TokenKind): void;

  close(): void;
}
