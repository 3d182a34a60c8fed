/**
 * The bridge's HTTP application: body parsing, the frontend and the session of every request, the error
 * catalog, and the routes of each resource. `buildApp` makes a complete app that tests drive with `inject()`
 * or on a real port.
 */
import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { isUtf8 } from 'node:buffer';
import { readFileSync } from 'node:fs';
import type { z } from 'zod';
import type { Logger } from '../lib/log.js';
import { isStorageFull } from '../lib/sqlite.js';
import type { PasswordHasher } from './accounts/password.js';
import { RateLimiter } from './accounts/ratelimit.js';
import { registerAccountRoutes } from './accounts/routes.js';
import type { BridgeConfig } from './config.js';
import { registerCommandRoutes } from './commands/routes.js';
import { CommandService } from './commands/service.js';
import { registerDeviceRoutes } from './devices/routes.js';
import { createDeviceService } from './devices/create.js';
import type { DeviceService } from './devices/service.js';
import { ApiError, ERRORS, type ErrorCode, isApiError } from './errors.js';
import { registerFirmwareRoutes } from './firmware/routes.js';
import { type FrontendSource, resolveFrontend } from './frontends/resolve.js';
import { noSniff, registerSecurityHeaders } from './headers.js';
import { LinkMonitor, registerHealthRoute } from './health.js';
import type { Mailer } from './mail/mailer.js';
import { registerMetrics } from './metrics.js';
import { OPENAPI_PATH, buildOpenApi } from './openapi.js';
import { readSession } from './sessions/cookie.js';
import { registerOriginCheck } from './sessions/origin.js';
import { registerSessionRoutes } from './sessions/routes.js';
import type { BridgeStore, Frontend, Session, User } from './store/types.js';
import { registerUserRoutes } from './users/routes.js';

declare module 'fastify' {
  interface FastifyRequest {
    frontend: Frontend;
    frontendSource: FrontendSource;
    /** The valid session of this request in this frontend, if any. */
    session: Session | undefined;
    /** The logged-in user of the session, if any. */
    user: User | undefined;
  }
  interface FastifyContextConfig {
    /** The body token this route answers for missing or malformed input (decision 4). */
    failToken?: ErrorCode;
    /** A route devices call (the firmware image): no frontend, no session. */
    device?: boolean;
  }
}

export interface AppDeps {
  config: BridgeConfig;
  store: BridgeStore;
  hasher: PasswordHasher;
  mailer: Mailer;
  log: Logger;
  now?: () => number;
  /** The devices' side; without it the app makes one that reaches no broker (changes wait for catch-up). */
  devices?: DeviceService;
  /** Commands; likewise. */
  commands?: CommandService;
  /** The state of the link to the broker, for `/healthz` and `/metrics`; without it the app has no broker. */
  link?: LinkMonitor;
}

/** What every route module gets. */
export interface RouteContext {
  config: BridgeConfig;
  store: BridgeStore;
  hasher: PasswordHasher;
  mailer: Mailer;
  log: Logger;
  now: () => number;
  devices: DeviceService;
  commands: CommandService;
  limits: {
    loginByAddress: RateLimiter;
    /** Wrong guesses at one login from one address: the brute-force limit (docs/api.md, Rate limits). */
    loginByLoginAndAddress: RateLimiter;
    /** All attempts at one login from anywhere: a much higher limit, against guessing from many addresses. */
    loginByLogin: RateLimiter;
    signupByAddress: RateLimiter;
    resendByAddress: RateLimiter;
    resendByLogin: RateLimiter;
    recoverByAddress: RateLimiter;
    recoverByLogin: RateLimiter;
  };
}

/** Form fields (and JSON objects) as a flat map; a repeated field keeps its last value. */
export type Fields = Record<string, unknown>;

/** The body of a request whose content type the bridge does not read: no fields. */
export const UNREAD_BODY: Fields = Object.freeze({});

/**
 * Whether the request body is a set of fields: a form, a JSON object, or no body at all. A JSON array, string,
 * number or null, or a body of another content type, is not.
 */
export function bodyIsFields(req: FastifyRequest): boolean {
  const body = req.body;
  if (body === undefined) return true;
  return typeof body === 'object' && body !== null && !Array.isArray(body) && body !== UNREAD_BODY;
}

export function fields(req: FastifyRequest): Fields {
  const body = req.body;
  return typeof body === 'object' && body !== null && !Array.isArray(body) ? (body as Fields) : {};
}

/** The query parameters as a flat map; a repeated parameter is an array. */
export function query(req: FastifyRequest): Fields {
  const q = req.query;
  return typeof q === 'object' && q !== null ? (q as Fields) : {};
}

/** One field read through its schema: its value, or `ok: false` when it is missing or malformed. */
export type FieldResult<T> = { ok: true; value: T } | { ok: false };

/**
 * Reads fields through a form schema one field at a time (STYLE principle 3), so that a route answers the
 * failure token of the field at fault, in its own order (decision 4), and ignores a field it does not use on
 * the path it takes.
 */
export function readForm<S extends Record<string, z.ZodType>>(
  values: Fields,
  form: z.ZodObject<S>,
): { [K in keyof S]: FieldResult<z.output<S[K]>> } {
  const out: Record<string, FieldResult<unknown>> = {};
  for (const [name, schema] of Object.entries(form.shape)) {
    const r = schema.safeParse(Object.hasOwn(values, name) ? values[name] : undefined);
    out[name] = r.success ? { ok: true, value: r.data } : { ok: false };
  }
  return out as { [K in keyof S]: FieldResult<z.output<S[K]>> };
}

export function send(reply: FastifyReply, status: number, token: string): FastifyReply {
  return reply.code(status).type('text/plain; charset=utf-8').send(token);
}

/**
 * The limit on attempts at one login from all addresses together, as a multiple of `rateLimits.login.limit`
 * (which counts per login and address): a guesser at one address cannot lock the login for everyone else, while
 * guessing from many addresses at once still stops (docs/api.md, Rate limits).
 */
export const LOGIN_GLOBAL_FACTOR = 10;

export function buildApp(deps: AppDeps): FastifyInstance {
  const { config, log } = deps;
  const now = deps.now ?? Date.now;
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
    // Routing failed on a path parameter (bad percent-encoding, or longer than `maxParamLength`). Only the device
    // routes have parameters: answer as for a device that does not exist (decisions 4 and 14), not with Fastify's
    // JSON that echoes the path.
    frameworkErrors: (_err, req, reply) => {
      // The hooks do not run for these answers (registerSecurityHeaders).
      noSniff(reply);
      if (!req.url.startsWith('/0/devices/')) void send(reply, 400, 'bad-request');
      else void send(reply, req.method === 'GET' || req.method === 'HEAD' ? 404 : 400, ERRORS['device-fail'].body);
    },
  }) as unknown as FastifyInstance;

  const rl = config.rateLimits;
  const commands =
    deps.commands ?? new CommandService({ store: deps.store, log, now, maxOpen: config.commands.maxOpen });
  const devices = deps.devices ?? createDeviceService(config, deps.store, log, now, commands);
  // A service made here stops with the app; one passed in belongs to its maker.
  if (!deps.devices) {
    app.addHook('onClose', () => devices.close());
  }
  const ctx: RouteContext = {
    ...deps,
    now,
    devices,
    commands,
    limits: {
      loginByAddress: new RateLimiter({ limit: rl.login.limit * 5, windowMs: rl.login.windowMs, now }),
      loginByLoginAndAddress: new RateLimiter({ ...rl.login, now }),
      loginByLogin: new RateLimiter({ limit: rl.login.limit * LOGIN_GLOBAL_FACTOR, windowMs: rl.login.windowMs, now }),
      signupByAddress: new RateLimiter({ ...rl.signup, now }),
      resendByAddress: new RateLimiter({ limit: rl.resend.limit * 5, windowMs: rl.resend.windowMs, now }),
      resendByLogin: new RateLimiter({ ...rl.resend, now }),
      recoverByAddress: new RateLimiter({ limit: rl.recover.limit * 5, windowMs: rl.recover.windowMs, now }),
      recoverByLogin: new RateLimiter({ ...rl.recover, now }),
    },
  };

  // Decision 4 and the specification: bodies are form fields. JSON objects are accepted too.
  app.addContentTypeParser(
    'application/x-www-form-urlencoded',
    { parseAs: 'buffer' },
    (_req: FastifyRequest, body: Buffer, done: (err: Error | null, value?: unknown) => void) => {
      const text = body.toString('utf8');
      if (!isUtf8(body)) {
        // A 400 like any other malformed input: the route answers its own failure token.
        done(Object.assign(new Error('the body is not UTF-8'), { statusCode: 400 }));
        return;
      }
      const out: Fields = Object.create(null) as Fields;
      for (const [k, v] of new URLSearchParams(text)) out[k] = v;
      done(null, out);
    },
  );
  // A body of another type reads as no fields: the route then answers its own failure token. It is marked, so that
  // a route for which "no fields" means something (a sync of a `d` variable) can tell it from an empty form.
  app.addContentTypeParser(
    '*',
    { parseAs: 'buffer' },
    (_req: FastifyRequest, body: Buffer, done: (err: null, v: unknown) => void) =>
      done(null, body.length === 0 ? {} : UNREAD_BODY),
  );

  registerSecurityHeaders(app);
  // Before anything else of a state-changing request: a cross-site one is refused unread.
  registerOriginCheck(app, config, log);

  app.decorateRequest('frontend', null as unknown as Frontend);
  app.decorateRequest('frontendSource', 'default' as FrontendSource);
  app.decorateRequest('session', undefined);
  app.decorateRequest('user', undefined);

  app.addHook('preHandler', (req, _reply, done) => {
    if (req.routeOptions.config?.device) {
      done();
      return;
    }
    const resolved = resolveFrontend(req, deps.store, config.frontends.allowDefault);
    if (!resolved) {
      done(new ApiError('not-found'));
      return;
    }
    req.frontend = resolved.frontend;
    req.frontendSource = resolved.source;
    const found = readSession(req, deps.store, config, now());
    if (found && found.session.frontendId === req.frontend.id) {
      const session = found.session;
      req.session = session;
      req.user = found.user;
      // Sliding idle timeout (decision 2), written at most once a minute per session and without fsync: losing
      // a touch only makes a session look a minute older.
      if (now() - session.lastSeenAt > 60_000) {
        void deps.store
          .write(() => deps.store.touchSession(session.idHash, now()), { durable: false })
          .catch(() => undefined);
      }
    }
    done();
  });

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
      const token = req.routeOptions.config?.failToken;
      if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE' && token === 'user-data-fail')
        return send(reply, 413, ERRORS['user-data-failed'].body);
      if (token) return send(reply, ERRORS[token].status, ERRORS[token].body);
      return send(reply, 400, 'bad-request');
    }
    log.error({ event: 'http.failed', route: req.routeOptions.url, err: err.message, stack: err.stack });
    return send(reply, 500, ERRORS.internal.body);
  });

  app.setNotFoundHandler((_req, reply) => send(reply, 404, ERRORS['not-found'].body));

  const link = deps.link ?? new LinkMonitor();
  registerMetrics(app, { config, store: deps.store, devices, link });
  registerHealthRoute(app, {
    store: deps.store,
    dataDir: config.dataDir,
    link,
    linkGraceMs: config.health.linkGraceMs,
    minFreeBytes: config.health.minFreeBytes,
    log,
  });

  registerSessionRoutes(app, ctx);
  registerAccountRoutes(app, ctx);
  registerUserRoutes(app, ctx);
  registerDeviceRoutes(app, ctx);
  registerCommandRoutes(app, ctx);
  registerFirmwareRoutes(app, ctx);

  // The API document describes routes, not a session: it is the same for every caller.
  const apiDocument = JSON.stringify(buildOpenApi(config));
  app.get(OPENAPI_PATH, async (_req, reply) => reply.type('application/json; charset=utf-8').send(apiDocument));
  return app;
}
