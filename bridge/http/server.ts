/**
 * The bridge's HTTP server: Fastify with the body parsers, the security headers, the cross-site check, the
 * frontend and session of every request, the error handler, and, for tests, the answer checker. Routes come as
 * tables (`route.ts`); `register` turns each into a Fastify route and keeps the list, which is what the API
 * document is generated from (`bridge/openapi.ts`).
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { readFileSync } from 'node:fs';
import type { Logger } from '../../lib/log.js';
import type { BridgeConfig } from '../config.js';
import { registerOriginCheck } from '../sessions/origin.js';
import type { BridgeStore } from '../store/types.js';
import { registerBodyParsers } from './body.js';
import { registerAnswerChecker } from './checker.js';
import { registerErrorHandler, routingFailed } from './error-handler.js';
import type {} from './fastify.js';
import { registerFrontendAndSession } from './frontend.js';
import { registerSecurityHeaders } from './headers.js';
import { type Route, routerPath } from './route.js';

export interface ServerOptions {
  config: BridgeConfig;
  store: BridgeStore;
  log: Logger;
  now: () => number;
  /** Hold every answer to its route's description (`checker.ts`). */
  checkAnswers?: boolean;
}

export interface Server {
  app: FastifyInstance;
  /** Every route registered so far, in order. */
  readonly routes: readonly Route[];
  register(routes: readonly Route[]): void;
}

export function createServer(opts: ServerOptions): Server {
  const { config, log } = opts;
  const https =
    config.http.certFile !== undefined && config.http.keyFile !== undefined
      ? { key: readFileSync(config.http.keyFile), cert: readFileSync(config.http.certFile) }
      : undefined;
  const app = Fastify({
    ...(https ? { https } : {}),
    trustProxy: config.http.trustProxy,
    bodyLimit: config.http.bodyLimit,
    logger: false,
    // The Host header names the frontend; `/0/user` and `/0/user/` are the same route.
    // (In `routerOptions`: the top-level spelling prints a deprecation warning on every start.)
    // A path parameter may be as long as the longest device auth code (128 hex digits).
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 256 },
    return503OnClosing: true,
    frameworkErrors: routingFailed,
  }) as unknown as FastifyInstance;

  registerBodyParsers(app);
  registerSecurityHeaders(app);
  // Before anything else of a state-changing request: a cross-site one is refused unread.
  registerOriginCheck(app, config, log);
  registerFrontendAndSession(app, opts);
  registerErrorHandler(app, log);
  if (opts.checkAnswers) registerAnswerChecker(app, log);

  const routes: Route[] = [];
  return {
    app,
    routes,
    register(table) {
      for (const route of table) {
        app.route({ method: route.method, url: routerPath(route), config: { route }, handler: route.handler });
        routes.push(route);
      }
    },
  };
}
