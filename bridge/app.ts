/**
 * The bridge's HTTP application: the HTTP server (`http/server.ts`) with the route tables of every resource, of
 * health and metrics, and of the API document, which is generated from exactly the routes registered here.
 * `buildApp` makes a complete app that tests drive with `inject()` or on a real port.
 */
import type { FastifyInstance } from 'fastify';
import type { Pool } from 'pg';
import type { Logger } from '../lib/log.js';
import { createLimits } from './accounts/limits.js';
import type { PasswordHasher } from './accounts/password.js';
import { accountRoutes } from './accounts/routes.js';
import { commandRoutes } from './commands/routes.js';
import { CommandService } from './commands/service.js';
import type { BridgeConfig } from './config.js';
import { deviceRoutes } from './devices/routes.js';
import { createDeviceService } from './devices/create.js';
import { type EventBus, LocalBus } from './events/bus.js';
import type { DeviceService } from './devices/service.js';
import { firmwareRoutes } from './firmware/routes.js';
import { frontendRoutes } from './frontends/routes.js';
import { LinkMonitor, healthRoutes } from './health.js';
import { registerLive } from './live/index.js';
import type { RouteContext } from './http/context.js';
import { createServer } from './http/server.js';
import type { Mailer } from './mail/mailer.js';
import { metricsRoutes } from './metrics.js';
import { buildOpenApi, openApiRoutes } from './openapi.js';
import { consoleRoutes } from './console/routes.js';
import { RuleEngine } from './rules/engine.js';
import { ruleRoutes } from './rules/routes.js';
import { webhookOutbox } from './rules/outbox.js';
import { WebhookWorker } from './rules/webhook-worker.js';
import { accessTokenRoutes } from './sessions/accesstokens.js';
import { sessionRoutes } from './sessions/routes.js';
import type { BridgeStore } from './store/types.js';
import { userRoutes } from './users/routes.js';

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
  /**
   * Hold every answer to its route's description, and answer 500 `undocumented-answer` where they part
   * (`http/checker.ts`). For tests; off by default.
   */
  checkAnswers?: boolean;
  /**
   * The PostgreSQL database whose `rate_limits` table the account routes count their attempts in, shared with
   * every other bridge on it (docs/api.md, Rate limits). Without it, the limits live in this process's memory.
   */
  rateLimitPool?: Pool;
  /**
   * The bridge's event bus (docs/scaling.md, "The event bus"), which the services and routes made here publish
   * to; without it, one in this process that nothing outside the app hears.
   */
  events?: EventBus;
  /** The CA (PEM) webhook receivers' certificates are checked against besides the system's (`notifications.webhook.caFile`). */
  webhookCa?: Buffer;
}

export function buildApp(deps: AppDeps): FastifyInstance {
  const { config, log } = deps;
  const now = deps.now ?? Date.now;
  const server = createServer({ config, store: deps.store, log, now, checkAnswers: deps.checkAnswers === true });
  const { app } = server;

  const events = deps.events ?? new LocalBus(log);
  const commands =
    deps.commands ?? new CommandService({ store: deps.store, log, now, maxOpen: config.commands.maxOpen, events });
  const devices = deps.devices ?? createDeviceService(config, deps.store, log, now, commands, events);
  // A service made here stops with the app; one passed in belongs to its maker.
  if (!deps.devices) {
    app.addHook('onClose', () => devices.close());
  }
  const ctx: RouteContext = {
    config,
    store: deps.store,
    hasher: deps.hasher,
    mailer: deps.mailer,
    log,
    now,
    devices,
    commands,
    limits: createLimits(config.rateLimits, now, deps.rateLimitPool ? { pool: deps.rateLimitPool } : undefined),
    events,
  };

  const link = deps.link ?? new LinkMonitor(now);
  // The live channel follows the bus: WebSocket upgrades on the app's server, and `GET /0/events`.
  const live = registerLive(app, {
    config,
    store: deps.store,
    events,
    log,
    now,
    tokenLimiter: ctx.limits.accessTokenByAddress,
  });
  // Notification rules follow the bus too; their webhooks go out through the event log's outbox.
  const webhooks = new WebhookWorker({
    outbox: webhookOutbox(deps.store, log),
    config: config.notifications.webhook,
    ...(deps.webhookCa ? { ca: deps.webhookCa } : {}),
    log,
    now,
  });
  const rules = new RuleEngine({
    config,
    store: deps.store,
    events,
    mailer: deps.mailer,
    log,
    now,
    ...(deps.rateLimitPool ? { pool: deps.rateLimitPool } : {}),
    onWebhook: () => webhooks.kick(),
  });
  rules.start();
  webhooks.start();
  app.addHook('onClose', async () => {
    await rules.stop();
    await webhooks.stop();
  });
  // Before the routes: its hook counts every request.
  const metrics = metricsRoutes(app, {
    config,
    store: deps.store,
    devices,
    link,
    live: live.hub.figures,
    rules: { engine: rules.figures, webhooks: webhooks.figures },
  });
  server.register([
    ...sessionRoutes(ctx),
    ...accessTokenRoutes(ctx),
    ...accountRoutes(ctx),
    ...userRoutes(ctx),
    ...frontendRoutes(),
    ...deviceRoutes(ctx),
    ...commandRoutes(ctx),
    ...firmwareRoutes(ctx),
    ...ruleRoutes(ctx, rules),
    ...live.routes,
    ...consoleRoutes({ log }),
  ]);
  // The API document describes routes, not a session: it is the same for every caller. It is made once every
  // route, its own included, is registered.
  let document = '';
  server.register(openApiRoutes(() => document));
  server.register(
    healthRoutes({
      store: deps.store,
      dataDir: config.dataDir,
      link,
      linkGraceMs: config.health.linkGraceMs,
      minFreeBytes: config.health.minFreeBytes,
      log,
    }),
  );
  server.register(metrics);
  document = JSON.stringify(buildOpenApi(config, server.routes));
  return app;
}
