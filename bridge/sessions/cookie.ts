/**
 * The session cookie (decisions 1 to 3): `sid`, 256 random bits from a CSPRNG, stored only as its sha256;
 * `HttpOnly; SameSite=Lax; Path=/`, and `Secure` when the request came over TLS (directly or through a trusted
 * proxy). Sessions expire after an idle time (sliding) and an absolute lifetime.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { BridgeConfig } from '../config.js';
import type { EventBus } from '../events/bus.js';
import type { BridgeStore, Session, StoreTx, User } from '../store/types.js';

export const COOKIE_NAME = 'sid';
const DAY_MS = 86_400_000;
/** 32 bytes in base64url. */
const SID_RE = /^[A-Za-z0-9_-]{43}$/;

export function hashSecretValue(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}

/** The `sid` value of the request's Cookie header, if it has the right shape. */
export function cookieValue(req: FastifyRequest): string | undefined {
  const header = req.headers.cookie;
  if (typeof header !== 'string') return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    if (part.slice(0, eq).trim() !== COOKIE_NAME) continue;
    const v = part.slice(eq + 1).trim();
    return SID_RE.test(v) ? v : undefined;
  }
  return undefined;
}

/** The request's session and its user, if its cookie names a session that has not expired. */
export async function readSession(
  req: FastifyRequest,
  store: BridgeStore,
  config: BridgeConfig,
  now: number,
): Promise<{ session: Session; user: User | undefined } | undefined> {
  const value = cookieValue(req);
  if (value === undefined) return undefined;
  const found = await store.sessionWithUser(hashSecretValue(value));
  if (!found) return undefined;
  const s = found.session;
  if (now - s.lastSeenAt > config.sessions.idleDays * DAY_MS) return undefined;
  if (now - s.createdAt > config.sessions.absoluteDays * DAY_MS) return undefined;
  return found;
}

/** A fresh session id: the cookie value and the hash that is stored. */
export function newSessionId(): { value: string; hash: string } {
  const value = randomBytes(32).toString('base64url');
  return { value, hash: hashSecretValue(value) };
}

export function setSessionCookie(req: FastifyRequest, reply: FastifyReply, value: string, config: BridgeConfig): void {
  const maxAge = Math.floor(config.sessions.absoluteDays * 86_400);
  const secure = req.protocol === 'https' ? '; Secure' : '';
  reply.header('set-cookie', `${COOKIE_NAME}=${value}; Max-Age=${maxAge}; Path=/; HttpOnly; SameSite=Lax${secure}`);
}

export function clearSessionCookie(req: FastifyRequest, reply: FastifyReply): void {
  const secure = req.protocol === 'https' ? '; Secure' : '';
  reply.header('set-cookie', `${COOKIE_NAME}=; Max-Age=0; Path=/; HttpOnly; SameSite=Lax${secure}`);
}

/**
 * Starts a new session (for a user, or anonymous) in the request's frontend, replacing the request's old one
 * (decision 1: a new id on login, signup and logout), and sets its cookie. Durable before the reply. The old one's
 * end is announced on `events` (`session.ended`, by its stored hash).
 */
export async function startSession(
  req: FastifyRequest,
  reply: FastifyReply,
  store: BridgeStore,
  config: BridgeConfig,
  userId: number | null,
  now: number,
  events?: EventBus,
): Promise<void> {
  await replaceSession(req, reply, store, config, now, events, () => Promise.resolve({ userId }));
}

/** Whose the new session of {@link replaceSession} is: a user (and the access token it was started with), or none. */
export interface SessionOwner {
  userId: number | null;
  accessTokenId?: number | null;
}

/**
 * As {@link startSession}, with the new session's user decided by `decide` inside the same transaction (an access
 * token is looked up, stamped and recorded with the session it starts, decision 30); answers what it decided.
 */
export async function replaceSession<T extends SessionOwner>(
  req: FastifyRequest,
  reply: FastifyReply,
  store: BridgeStore,
  config: BridgeConfig,
  now: number,
  events: EventBus | undefined,
  decide: (tx: StoreTx) => Promise<T>,
): Promise<T> {
  const id = newSessionId();
  const old = req.session;
  const owner = await store.write(async (tx) => {
    const o = await decide(tx);
    if (old) await tx.deleteSession(old.idHash);
    await tx.createSession({
      idHash: id.hash,
      frontendId: req.frontend.id,
      userId: o.userId,
      createdAt: now,
      lastSeenAt: now,
      accessTokenId: o.accessTokenId ?? null,
    });
    return o;
  });
  if (old) events?.publish({ type: 'session.ended', idHash: old.idHash, userId: old.userId });
  setSessionCookie(req, reply, id.value, config);
  return owner;
}
