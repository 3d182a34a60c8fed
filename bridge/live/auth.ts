/**
 * Who opens a live channel (docs/api.md, "Live channel"): the frontend of the request, as for every route
 * (decision 15), and its user, from the first authenticator that knows the request: the session cookie (decisions
 * 1 to 3), then an access token presented as `Authorization: Bearer <token>` (decision 30). An anonymous session
 * opens no channel (decision 31).
 */
import type { IncomingMessage } from 'node:http';
import type { FastifyRequest } from 'fastify';
import type { AttemptLimiter } from '../accounts/ratelimit.js';
import type { BridgeConfig } from '../config.js';
import { ApiError } from '../errors.js';
import { resolveFrontend } from '../frontends/resolve.js';
import { accessTokenOwner } from '../sessions/accesstokens.js';
import { readSession } from '../sessions/cookie.js';
import type { BridgeStore, Frontend, User } from '../store/types.js';

export interface LiveIdentity {
  user: User;
  /** The stored hash of the session, when a session cookie opened it: its end (logout) closes the channel. */
  idHash?: string;
  /** The number of the access token, when a bearer token opened it: its revocation closes the channel. */
  tokenId?: number;
}

/** Reads a request's credentials in a frontend; `undefined` when they are not its kind or name no user. */
export type LiveAuthenticator = (req: IncomingMessage, frontend: Frontend) => Promise<LiveIdentity | undefined>;

export interface AuthDeps {
  store: BridgeStore;
  config: BridgeConfig;
  now: () => number;
}

/**
 * The request as the helpers written for Fastify's read it: they look only at its headers, its query (`app`)
 * and its `host`.
 */
export function asRoutedRequest(req: IncomingMessage, query: Record<string, string> = {}): FastifyRequest {
  return { headers: req.headers, query, body: undefined, host: req.headers.host } as unknown as FastifyRequest;
}

/** The session cookie of a logged-in user of this frontend. */
export function cookieAuthenticator(deps: AuthDeps): LiveAuthenticator {
  return async (req, frontend) => {
    const found = await readSession(asRoutedRequest(req), deps.store, deps.config, deps.now());
    if (!found?.user || found.session.frontendId !== frontend.id) return undefined;
    return { user: found.user, idHash: found.session.idHash };
  };
}

/** The token of an `Authorization: Bearer <token>` header (the scheme's name in any case), else `undefined`. */
export function bearerToken(req: IncomingMessage): string | undefined {
  const h = req.headers.authorization;
  if (typeof h !== 'string') return undefined;
  const m = /^bearer[ \t]+(\S+)[ \t]*$/i.exec(h);
  return m ? m[1] : undefined;
}

export interface BearerDeps extends AuthDeps {
  /**
   * Counts each bearer attempt per client address: the limiter `POST /0/session/` counts its token attempts with
   * (`rateLimits.accessToken`), so that guessing through either is held back together.
   */
  limiter?: AttemptLimiter;
}

/**
 * An access token as `Authorization: Bearer <token>` (decision 30): its user, when the token is valid in this
 * frontend; its last use is stamped. Over the attempt limit it throws `too-many-requests` (429, before the token is
 * looked at). The token itself is never logged.
 */
export function bearerAuthenticator(deps: BearerDeps): LiveAuthenticator {
  return async (req, frontend) => {
    const text = bearerToken(req);
    if (text === undefined) return undefined;
    if (deps.limiter) {
      const r = await deps.limiter.take(clientAddress(req, deps.config));
      if (!r.ok) throw new ApiError('too-many-requests', r.retryAfterMs);
    }
    const owner = await deps.store.write((tx) => accessTokenOwner(tx, text, frontend.id, deps.now()));
    return owner ? { user: owner.user, tokenId: owner.token.id } : undefined;
  };
}

/** The first identity one of `authenticators` finds, in order. */
export async function authenticate(
  authenticators: readonly LiveAuthenticator[],
  req: IncomingMessage,
  frontend: Frontend,
): Promise<LiveIdentity | undefined> {
  for (const a of authenticators) {
    const who = await a(req, frontend);
    if (who) return who;
  }
  return undefined;
}

/** The frontend of an upgrade request: its Host label, else `app` (the path's, for `/0/session/<app>`), else the default. */
export async function liveFrontend(
  req: IncomingMessage,
  app: string | undefined,
  store: BridgeStore,
  config: BridgeConfig,
): Promise<Frontend | undefined> {
  const found = await resolveFrontend(asRoutedRequest(req, app ? { app } : {}), store, config.frontends.allowDefault);
  return found?.frontend;
}

/**
 * The client's address, for the per-address limit: the socket's peer, or with `http.trustProxy` trusting that peer,
 * the address the nearest proxy put last in `X-Forwarded-For`.
 */
export function clientAddress(req: IncomingMessage, config: BridgeConfig): string {
  const peer = req.socket.remoteAddress ?? 'unknown';
  const trust = config.http.trustProxy;
  const trusted = trust === true || (Array.isArray(trust) && trust.includes(peer));
  if (!trusted) return peer;
  const header = req.headers['x-forwarded-for'];
  const list = (Array.isArray(header) ? header.join(',') : (header ?? '')).split(',').map((s) => s.trim());
  return list.filter((s) => s !== '').pop() ?? peer;
}
