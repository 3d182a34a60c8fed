/**
 * `GET /metrics`: the bridge's figures in the Prometheus text format (prom-client). Each app has its own
 * registry, so that several apps can run in one process (tests). Counters kept elsewhere (the link's, the device
 * service's) and what the database holds are read at scrape time; HTTP requests are counted as they finish.
 *
 * Access (docs/api.md, GET /metrics): `metrics.enabled` (default true) registers the route; `metrics.tokenFile`
 * names a file holding a bearer token the scraper must send, compared in constant time. Without a token file only
 * loopback clients are answered: the client address is the socket's peer (or, with `http.trustProxy`, the client
 * a trusted proxy names), and a request that carries forwarding headers the bridge does not trust came through a
 * proxy, so it is not taken for a local one.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { Counter, Gauge, type Metric, Registry, collectDefaultMetrics } from 'prom-client';
import { z } from 'zod';
import { UP_TOPICS } from '../protocol/index.js';
import type { BridgeConfig } from './config.js';
import type { DeviceService } from './devices/service.js';
import type { LinkMonitor } from './health.js';
import type { LiveFigures } from './live/hub.js';
import type { EngineFigures } from './rules/engine.js';
import type { WebhookWorker } from './rules/webhook-worker.js';
import type { Route } from './http/route.js';
import type { BridgeStore } from './store/types.js';

export const METRICS_PATH = '/metrics';
/** The answer to a scrape without the right token. */
export const METRICS_UNAUTHORIZED = 'unauthorized';
/** The answer to a scrape from another machine when no token is set. */
export const METRICS_FORBIDDEN = 'metrics-local-only';

/** Whether an address is a loopback one: 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6. */
export function isLoopback(address: string | undefined): boolean {
  if (address === undefined) return false;
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(v4) || address === '::1';
}

/**
 * Whether a request comes from this machine. Without forwarding headers: its socket's peer is a loopback address.
 * With them it came through a proxy, through which any client would look local: then only when `http.trustProxy`
 * trusts that proxy and the client it names is a loopback one (`req.ips` holds more than the socket's peer only
 * when the peer is trusted).
 */
export function isLocalRequest(req: FastifyRequest): boolean {
  if (!isLoopback(req.ip)) return false;
  const forwarded = req.headers['x-forwarded-for'] !== undefined || req.headers.forwarded !== undefined;
  if (!forwarded) return true;
  return (req.ips?.length ?? 0) > 1;
}

const COMMAND_STATES = ['queued', 'sent', 'running', 'done', 'failed', 'expired'] as const;

export interface MetricsDeps {
  config: BridgeConfig;
  store: BridgeStore;
  devices: DeviceService;
  link: LinkMonitor;
  /** The live channel's figures (bridge/live/hub.ts). */
  live?: LiveFigures;
  /** The notification rules' figures (bridge/rules/engine.ts, bridge/rules/webhook-worker.ts). */
  rules?: { engine: EngineFigures; webhooks: WebhookWorker['figures'] };
}

const sha256 = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** Reads the scrapers' token; a missing or empty file is a configuration error. */
export function readMetricsToken(file: string): string {
  let token: string;
  try {
    token = readFileSync(file, 'utf8').trim();
  } catch (err) {
    throw new Error(`cannot read the metrics token file: ${(err as Error).message}`);
  }
  if (token.length === 0) throw new Error(`the metrics token file ${file} is empty`);
  return token;
}

/** The registry with every metric of the bridge. */
export function createRegistry(deps: MetricsDeps): {
  registry: Registry;
  observe: (method: string, route: string, status: number, seconds: number) => void;
} {
  const { store, devices, link } = deps;
  const registry = new Registry();
  const registers = [registry];
  collectDefaultMetrics({ register: registry });

  const http = new HttpFigures();
  for (const metric of http.metrics()) registry.registerMetric(metric as unknown as Metric);
  new Counter({
    name: 'devcloud_mqtt_messages_received_total',
    help: 'Valid messages devices published, by topic.',
    labelNames: ['topic'] as const,
    registers,
    collect() {
      // The link counts; the counter shows its figures (monotonic, so a reset and set keeps it a counter).
      this.reset();
      const received = link.link?.received ?? {};
      for (const topic of UP_TOPICS) this.inc({ topic }, received[topic] ?? 0);
    },
  });
  new Counter({
    name: 'devcloud_mqtt_messages_dropped_total',
    help:
      'Messages dropped, by reason: invalid (failed validation), foreign (not a device topic), hello_mismatch ' +
      '(a hello naming another device), failed (handling failed, e.g. a database error).',
    labelNames: ['reason'] as const,
    registers,
    collect() {
      this.reset();
      const dropped = link.link?.dropped ?? { invalid: 0, foreign: 0 };
      this.inc({ reason: 'invalid' }, dropped.invalid);
      this.inc({ reason: 'foreign' }, dropped.foreign);
      this.inc({ reason: 'hello_mismatch' }, devices.counters.helloMismatch);
      this.inc({ reason: 'failed' }, devices.counters.failed);
    },
  });
  new Gauge({
    name: 'devcloud_mqtt_link_connected',
    help: '1 while the bridge is connected to its MQTT broker.',
    registers,
    collect() {
      this.set(link.connected ? 1 : 0);
    },
  });
  new Gauge({
    name: 'devcloud_mqtt_link_down_seconds',
    help: 'How long the link to the MQTT broker has been down; 0 while it is up.',
    registers,
    collect() {
      this.set(link.downForMs() / 1000);
    },
  });
  // The database figures: a scrape while the database fails still answers the process figures.
  new Gauge({
    name: 'devcloud_devices_known',
    help: 'Devices the bridge knows.',
    registers,
    async collect() {
      await safely(async () => this.set(await store.devices.count()));
    },
  });
  new Gauge({
    name: 'devcloud_devices_connected',
    help: 'Devices whose meta state is connected.',
    registers,
    async collect() {
      await safely(async () => this.set((await store.devices.connectedIds()).length));
    },
  });
  new Gauge({
    name: 'devcloud_commands',
    help: 'Commands the bridge holds, by state.',
    labelNames: ['state'] as const,
    registers,
    async collect() {
      await safely(async () => {
        const counts = await store.commands.countByState();
        for (const state of COMMAND_STATES) this.set({ state }, counts[state] ?? 0);
      });
    },
  });
  new Gauge({
    name: 'devcloud_bridge_database_bytes',
    help: 'Size of the bridge database on disk: its pages and its write-ahead log.',
    registers,
    async collect() {
      await safely(async () => this.set((await store.databaseSize()).bytes));
    },
  });
  new Gauge({
    name: 'devcloud_bridge_database_free_bytes',
    help: 'Of the database, pages free for reuse (left by removed rows): filled before the file grows again.',
    registers,
    async collect() {
      await safely(async () => this.set((await store.databaseSize()).freeBytes));
    },
  });
  new Counter({
    name: 'devcloud_history_pruned_total',
    help: 'History entries removed by the retention since start, by limit: age (devices.historyDays) or count (devices.historyPerVariable).',
    labelNames: ['limit'] as const,
    registers,
    collect() {
      this.reset();
      this.inc({ limit: 'age' }, devices.retention.removed.age);
      this.inc({ limit: 'count' }, devices.retention.removed.count);
    },
  });
  new Counter({
    name: 'devcloud_vars_resent_total',
    help: 'Changes sent again to connected devices that had not acknowledged them.',
    registers,
    collect() {
      this.reset();
      this.inc(devices.resend.resent);
    },
  });
  new Gauge({
    name: 'devcloud_firmware_jobs_open',
    help: 'Firmware update jobs not yet ended.',
    registers,
    async collect() {
      await safely(async () => this.set(await store.fwJobs.openCount()));
    },
  });
  const live = deps.live;
  if (live) {
    new Gauge({
      name: 'devcloud_live_channels_open',
      help: 'Live channels open on this bridge, by kind: ws (WebSocket /0/session/) or sse (GET /0/events).',
      labelNames: ['kind'] as const,
      registers,
      collect() {
        for (const kind of ['ws', 'sse'] as const) this.set({ kind }, live.open[kind]);
      },
    });
    new Counter({
      name: 'devcloud_live_frames_sent_total',
      help: 'Frames the live channels sent, by kind of channel and frame type (devices, delta, events).',
      labelNames: ['kind', 'type'] as const,
      registers,
      collect() {
        this.reset();
        for (const kind of ['ws', 'sse'] as const)
          for (const type of ['devices', 'delta', 'events'] as const) this.inc({ kind, type }, live.frames[kind][type]);
      },
    });
    new Counter({
      name: 'devcloud_live_channels_closed_total',
      help:
        'Live channels that ended, by reason: client (it left), session (its session ended), slow (too far ' +
        'behind), ping (no pong), shutdown, error.',
      labelNames: ['reason'] as const,
      registers,
      collect() {
        this.reset();
        for (const [reason, n] of Object.entries(live.closed)) this.inc({ reason }, n);
      },
    });
  }
  const rules = deps.rules;
  if (rules) {
    new Counter({
      name: 'devcloud_rules_events_total',
      help:
        'Rule evaluations and their outcomes on this bridge: evaluated (changes of devices with rules), fired ' +
        '(events logged, tests included), suppressed (held back by a rate limit), failed (an evaluation that could ' +
        'not read or write the store).',
      labelNames: ['outcome'] as const,
      registers,
      collect() {
        this.reset();
        const e = rules.engine;
        for (const outcome of ['evaluated', 'fired', 'suppressed', 'failed'] as const)
          this.inc({ outcome }, e[outcome]);
      },
    });
    new Counter({
      name: 'devcloud_webhook_attempts_total',
      help: 'Webhook attempts on this bridge, by outcome: delivered, retried (to be tried again), failed (given up).',
      labelNames: ['outcome'] as const,
      registers,
      collect() {
        this.reset();
        const w = rules.webhooks;
        this.inc({ outcome: 'delivered' }, w.delivered);
        this.inc({ outcome: 'retried' }, w.retried);
        this.inc({ outcome: 'failed' }, w.failed);
      },
    });
    new Gauge({
      name: 'devcloud_webhook_in_flight',
      help: 'Webhook attempts under way on this bridge.',
      registers,
      collect() {
        this.set(rules.webhooks.inFlight);
      },
    });
  }
  return { registry, observe: (method, route, status, seconds) => http.record(method, route, status, seconds) };
}

const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

interface MetricValue {
  labels: Record<string, string | number>;
  value: number;
  metricName?: string;
}

/**
 * The HTTP figures, counted in plain maps and handed to the registry only at a scrape. prom-client's counters
 * and histograms look their series up by hashing the labels on every call, which cost more per request than a
 * device route's own work leaves room for; here a request costs one map lookup and a few additions.
 */
class HttpFigures {
  private readonly requests = new Map<string, { labels: MetricValue['labels']; count: number }>();
  private readonly durations = new Map<
    string,
    { labels: MetricValue['labels']; buckets: number[]; sum: number; count: number }
  >();

  record(method: string, route: string, status: number, seconds: number): void {
    const rk = `${status} ${method} ${route}`;
    let r = this.requests.get(rk);
    if (r === undefined) {
      r = { labels: { method, route, status: String(status) }, count: 0 };
      this.requests.set(rk, r);
    }
    r.count++;
    const dk = `${method} ${route}`;
    let d = this.durations.get(dk);
    if (d === undefined) {
      d = { labels: { method, route }, buckets: DURATION_BUCKETS.map(() => 0), sum: 0, count: 0 };
      this.durations.set(dk, d);
    }
    // Counted in the first bucket it fits; the exposition adds them up into cumulative `le` buckets.
    const b = DURATION_BUCKETS.findIndex((le) => seconds <= le);
    if (b >= 0) d.buckets[b]!++;
    d.sum += seconds;
    d.count++;
  }

  /** The two metrics, in the shape a prom-client registry serialises (`name`, `help`, `type`, `get()`). */
  metrics(): object[] {
    return [
      {
        name: 'devcloud_http_requests_total',
        help: 'HTTP requests answered, by method, route and status.',
        type: 'counter',
        get: () => ({
          name: 'devcloud_http_requests_total',
          help: 'HTTP requests answered, by method, route and status.',
          type: 'counter',
          aggregator: 'sum',
          values: [...this.requests.values()].map((r) => ({ labels: r.labels, value: r.count })),
        }),
        reset: () => this.requests.clear(),
      },
      {
        name: 'devcloud_http_request_duration_seconds',
        help: 'Time to answer an HTTP request, by method and route.',
        type: 'histogram',
        get: () => {
          const name = 'devcloud_http_request_duration_seconds';
          const values: MetricValue[] = [];
          for (const d of this.durations.values()) {
            let cumulative = 0;
            DURATION_BUCKETS.forEach((le, i) => {
              cumulative += d.buckets[i]!;
              values.push({ metricName: `${name}_bucket`, labels: { ...d.labels, le }, value: cumulative });
            });
            values.push({ metricName: `${name}_bucket`, labels: { ...d.labels, le: '+Inf' }, value: d.count });
            values.push({ metricName: `${name}_sum`, labels: d.labels, value: d.sum });
            values.push({ metricName: `${name}_count`, labels: d.labels, value: d.count });
          }
          return {
            name,
            help: 'Time to answer an HTTP request, by method and route.',
            type: 'histogram',
            aggregator: 'sum',
            values,
          };
        },
        reset: () => this.durations.clear(),
      },
    ];
  }
}

async function safely(work: () => Promise<void>): Promise<void> {
  try {
    await work();
  } catch {
    // Left out of this scrape; `/healthz` says what fails.
  }
}

/**
 * Counts every request (a hook on the app), and declares `GET /metrics`, for Prometheus: no frontend, no session.
 * Nothing when `metrics.enabled` is false.
 */
export function metricsRoutes(app: FastifyInstance, deps: MetricsDeps): Route[] {
  const { config } = deps;
  if (!config.metrics.enabled) return [];
  const tokenFile = config.metrics.tokenFile;
  const tokenHash = tokenFile === undefined ? undefined : sha256(readMetricsToken(tokenFile));
  const { registry, observe } = createRegistry(deps);

  app.addHook('onResponse', (req, reply, done) => {
    // The route's pattern, not the URL: device ids and names in paths would make a series per device.
    observe(req.method, req.routeOptions.url ?? 'unmatched', reply.statusCode, reply.elapsedTime / 1000);
    done();
  });

  const route: Route = {
    method: 'GET',
    path: METRICS_PATH,
    operationId: 'getMetrics',
    tag: 'Operations',
    summary: 'Prometheus metrics',
    description:
      'The Prometheus text format (`text/plain; version=0.0.4`): HTTP requests by route and status and their ' +
      'durations, MQTT messages received and dropped, the link state, devices known and connected, commands by ' +
      'state, open firmware jobs, and the process figures. ' +
      (tokenFile === undefined
        ? 'No token is set (`metrics.tokenFile`): it answers loopback clients only, and asks them for none. '
        : 'It asks for `Authorization: Bearer <token>` with the token of `metrics.tokenFile`. ') +
      'No frontend, no session: `app` is not read. Switched off with `metrics.enabled: false`.',
    device: true,
    responses: {
      200: { description: 'The metrics.', text: z.string() },
      ...(tokenFile !== undefined
        ? {
            401: {
              description: 'No token, or a wrong one (`WWW-Authenticate: Bearer`).',
              tokens: [METRICS_UNAUTHORIZED],
            },
          }
        : {
            403: {
              description:
                'A client that is not on this machine: its address is not a loopback one, or it came through a ' +
                'proxy that `http.trustProxy` does not trust. Set `metrics.tokenFile` to scrape from elsewhere.',
              tokens: [METRICS_FORBIDDEN],
            },
          }),
    },
    handler: async (req, reply) => {
      if (!tokenHash && !isLocalRequest(req)) {
        return reply.code(403).type('text/plain; charset=utf-8').send(METRICS_FORBIDDEN);
      }
      if (tokenHash) {
        const m = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '');
        // Hashes of equal length, so that the comparison takes the same time whatever was sent.
        if (!m || !timingSafeEqual(sha256(m[1]!), tokenHash)) {
          return reply
            .code(401)
            .header('www-authenticate', 'Bearer')
            .type('text/plain; charset=utf-8')
            .send(METRICS_UNAUTHORIZED);
        }
      }
      const text = await registry.metrics();
      return reply.header('cache-control', 'no-store').type(registry.contentType).send(text);
    },
  };
  return [route];
}
