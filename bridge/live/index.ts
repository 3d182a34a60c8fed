/**
 * The live channel (docs/api.md, "Live channel"; decision 31): its hub, the WebSocket upgrades on the app's HTTP
 * server, and the SSE route, wired into an app by `bridge/app.ts`. Stops with the app: every channel is closed
 * (1001) before the HTTP server waits for its connections.
 */
import type { FastifyInstance } from 'fastify';
import type { Logger } from '../../lib/log.js';
import type { AttemptLimiter } from '../accounts/ratelimit.js';
import type { BridgeConfig } from '../config.js';
import type { EventBus } from '../events/bus.js';
import type { Route } from '../http/route.js';
import type { BridgeStore } from '../store/types.js';
import { type LiveAuthenticator, bearerAuthenticator, cookieAuthenticator } from './auth.js';
import { LiveHub } from './hub.js';
import { sseRoutes } from './sse.js';
import { serveWebSockets } from './ws.js';

export interface LiveDeps {
  config: BridgeConfig;
  store: BridgeStore;
  events: EventBus;
  log: Logger;
  now: () => number;
  /** Counts bearer-token attempts per client address (`rateLimits.accessToken`, with `POST /0/session/`'s). */
  tokenLimiter?: AttemptLimiter;
  /** Who may open a channel, tried in order; by default the session cookie, then a bearer access token. */
  authenticators?: readonly LiveAuthenticator[];
}

export interface Live {
  hub: LiveHub;
  routes: Route[];
}

export function registerLive(app: FastifyInstance, deps: LiveDeps): Live {
  const { config, store, events, log } = deps;
  const authenticators = deps.authenticators ?? [
    cookieAuthenticator({ store, config, now: deps.now }),
    bearerAuthenticator({ store, config, now: deps.now, limiter: deps.tokenLimiter }),
  ];
  const hub = new LiveHub({ store, events, config, log });
  const stopUpgrades = serveWebSockets(app.server, { hub, store, config, log, authenticators });
  app.addHook('preClose', (done) => {
    stopUpgrades();
    hub.close();
    done();
  });
  return { hub, routes: sseRoutes({ hub, config, authenticators, log }) };
}
