/**
 * Who opens a live channel (docs/api.md, "Live channel"): the frontend of the request, as for every route
 * (decision 15), and its user, from the first authenticator that knows the request. Today that is the session
 * cookie (decisions 1 to 3); an access token presented as `Authorization: Bearer <token>` is a second authenticator
 * in the same list. An anonymous session opens no channel (decision 25).
 */
import type { IncomingMessage } from 'node:http';
import type { FastifyRequest } from 'fastify';
import type { BridgeConfig } from '../config.js';
import { resolveFrontend } from '../frontends/resolve.js';
import { readSession } from '../sessions/cookie.js';
import type { BridgeStore, Frontend, User } from '../store/types.js';

export interface LiveIdentity {
  user: User;
  /** The stored hash of the session, when a session cookie opened it: its end (logout) closes the channel. */
  idHash?: string;
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
