/**
 * How failures are answered: a code from the error catalog (`bridge/errors.ts`) as its status and token; a full
 * disk as 507 `storage-full` (docs/api.md, Errors); a body Fastify refused as the route's own failure token
 * (decision 4); anything else as 500, logged as `http.failed`. Requests no route serves answer 404 `not found`,
 * and a path the router cannot read answers as a device that does not exist.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from '../../lib/log.js';
import { isStorageFull } from '../../lib/sqlite.js';
import { type ApiError, ERRORS, isApiError } from '../errors.js';
import { noSniff } from './headers.js';
import { BAD_REQUEST } from './outcomes.js';
import { send } from './reply.js';

/**
 * Routing failed on a path parameter (bad percent-encoding, or longer than `maxParamLength`). Only the device routes
 * have parameters: answer as for a device that does not exist (decisions 4 and 14), not with Fastify's JSON that
 * echoes the path. No route matched, so no hook runs for this answer: neither the headers hook nor the answer
 * checker.
 */
export function routingFailed(_err: unknown, req: FastifyRequest, reply: FastifyReply): void {
  noSniff(reply);
  if (!req.url.startsWith('/0/devices/')) void send(reply, 400, BAD_REQUEST);
  else void send(reply, req.method === 'GET' || req.method === 'HEAD' ? 404 : 400, ERRORS['device-fail'].body);
}

export function registerErrorHandler(app: FastifyInstance, log: Logger): void {
  app.setErrorHandler((err: FastifyError | ApiError, req, reply) => {
    if (isApiError(err)) {
      const e = ERRORS[err.code];
      if (err.retryAfterMs !== undefined) reply.header('retry-after', Math.max(1, Math.ceil(err.retryAfterMs / 1000)));
      // A full hashing queue is the bridge shedding load as designed, not a fault: one line per refusal at
      // error level would flood the log exactly when it is busiest.
      if (err.code === 'busy') log.debug({ event: 'http.busy', route: req.routeOptions.url });
      else if (e.status >= 500) log.error({ event: 'http.failed', route: req.routeOptions.url, code: err.code });
      return send(reply, e.status, e.body);
    }
    if (isStorageFull(err)) {
      // Logged once as `storage.full` by the store, not once per refused request.
      log.debug({ event: 'http.storage_full', route: req.routeOptions.url });
      return send(reply, ERRORS['storage-full'].status, ERRORS['storage-full'].body);
    }
    const status = err.statusCode ?? 500;
    if (status < 500) {
      // Fastify refused the input (bad JSON, wrong content, too large): the route's own failure token.
      const token = req.routeOptions.config?.route?.failToken;
      if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE' && token === 'user-data-malformed')
        return send(reply, 413, ERRORS['user-data-failed'].body);
      if (token) return send(reply, ERRORS[token].status, ERRORS[token].body);
      return send(reply, 400, BAD_REQUEST);
    }
    log.error({ event: 'http.failed', route: req.routeOptions.url, err: err.message, stack: err.stack });
    return send(reply, 500, ERRORS.internal.body);
  });

  app.setNotFoundHandler((_req, reply) => send(reply, 404, ERRORS['not-found'].body));
}
