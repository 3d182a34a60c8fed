/**
 * Before every handler: the frontend of the request (decisions 15 and 25) and its session (decisions 1 to 3). An
 * unknown frontend answers 404 `not found`. A route devices call reads neither.
 */
import type { FastifyInstance } from 'fastify';
import type { BridgeConfig } from '../config.js';
import { ApiError } from '../errors.js';
import { type FrontendSource, resolveFrontend } from '../frontends/resolve.js';
import { readSession } from '../sessions/cookie.js';
import type { BridgeStore, Frontend } from '../store/types.js';

export interface FrontendDeps {
  config: BridgeConfig;
  store: BridgeStore;
  now: () => number;
}

export function registerFrontendAndSession(app: FastifyInstance, deps: FrontendDeps): void {
  const { config, store, now } = deps;
  app.decorateRequest('frontend', null as unknown as Frontend);
  app.decorateRequest('frontendSource', 'default' as FrontendSource);
  app.decorateRequest('session', undefined);
  app.decorateRequest('user', undefined);

  app.addHook('preHandler', async (req) => {
    const route = req.routeOptions.config?.route;
    if (route?.device) return;
    // Read once: on a route whose body is all data, the session also tells the frontend (decision 25).
    let session: Promise<Awaited<ReturnType<typeof readSession>>> | undefined;
    const readOnce = () => (session ??= readSession(req, store, config, now()));
    const sessionFrontend =
      route?.frontendFrom === 'not-body' ? async () => (await readOnce())?.session.frontendId : undefined;
    const resolved = await resolveFrontend(req, store, config.frontends.allowDefault, sessionFrontend);
    if (!resolved) throw new ApiError('not-found');
    req.frontend = resolved.frontend;
    req.frontendSource = resolved.source;
    const found = await readOnce();
    if (found && found.session.frontendId === req.frontend.id) {
      const session = found.session;
      req.session = session;
      req.user = found.user;
      // Sliding idle timeout (decision 2), written at most once a minute per session and without fsync: losing
      // a touch only makes a session look a minute older.
      if (now() - session.lastSeenAt > 60_000) {
        void store.write((tx) => tx.touchSession(session.idHash, now()), { durable: false }).catch(() => undefined);
      }
    }
  });
}
