/**
 * The rows of frontends, users and sessions as either engine reads them, and the objects the store answers with
 * (types.ts). The flags are SQLite's 0/1 or PostgreSQL's BOOLEAN.
 */
import { type AccessToken, type Frontend, ProductConfig, type Session, type User } from './types.js';

const flag = (v: number | boolean): boolean => v === true || v === 1;

export interface FrontendRow {
  id: string;
  name: string;
  config: string;
  is_default: number | boolean;
  created_at: number;
}

export interface UserRow {
  id: number;
  frontend_id: string;
  login: string;
  password_hash: string;
  confirmed: number | boolean;
  data: string;
  authcode: string;
  authcode_prev: string | null;
  authcode_rotated_at: number;
  created_at: number;
}

export interface SessionRow {
  id_hash: string;
  frontend_id: string;
  user_id: number | null;
  created_at: number;
  last_seen_at: number;
  access_token_id: number | null;
}

export interface AccessTokenRow {
  id: number;
  hash: string;
  user_id: number;
  prefix: string;
  created_at: number;
  last_used_at: number | null;
}

export const toFrontend = (r: FrontendRow): Frontend => ({
  id: r.id,
  name: r.name,
  // Parsed with defaults, so that a key added later has its default for old rows.
  config: ProductConfig.parse(JSON.parse(r.config)),
  isDefault: flag(r.is_default),
  createdAt: r.created_at,
});

export const toUser = (r: UserRow): User => ({
  id: r.id,
  frontendId: r.frontend_id,
  login: r.login,
  passwordHash: r.password_hash,
  confirmed: flag(r.confirmed),
  data: r.data,
  authcode: r.authcode,
  authcodePrev: r.authcode_prev,
  authcodeRotatedAt: r.authcode_rotated_at,
  createdAt: r.created_at,
});

export const toSession = (r: SessionRow): Session => ({
  idHash: r.id_hash,
  frontendId: r.frontend_id,
  userId: r.user_id,
  createdAt: r.created_at,
  lastSeenAt: r.last_seen_at,
  accessTokenId: r.access_token_id,
});

export const toAccessToken = (r: AccessTokenRow): AccessToken => ({
  id: r.id,
  hash: r.hash,
  userId: r.user_id,
  prefix: r.prefix,
  createdAt: r.created_at,
  lastUsedAt: r.last_used_at,
});
