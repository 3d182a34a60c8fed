/**
 * `GET /healthz`: whether this bridge can do its work, for a load balancer, systemd or a monitoring probe. It
 * answers 200 while the database answers and its folder is writable, its disk has room (`storage`), and the
 * link to the MQTT broker is up or has been down for less than `health.linkGraceMs`; 503 otherwise. No
 * frontend, no session.
 */
import { constants } from 'node:fs';
import { access } from 'node:fs/promises';
import { z } from 'zod';
import type { Logger } from '../lib/log.js';
import { freeBytes } from '../lib/sqlite.js';
import { VERSION } from '../lib/version.js';
import type { Link } from './devices/link.js';
import { type Route, named } from './http/route.js';
import type { BridgeStore } from './store/types.js';

export const HEALTH_PATH = '/healthz';

/** Which broker the link goes to; `none` for an app that reaches no broker (tests, tools). */
export type BrokerKind = 'embedded' | 'external' | 'none';

/**
 * The state of the bridge's link to its broker, for health and metrics. The app is built before the link
 * exists (the bridge's `link` part makes it, bridge/bridge.ts), so the link is attached later.
 */
export class LinkMonitor {
  private current: Link | undefined;
  private kind: BrokerKind = 'none';
  /** When the link went down, or when it was attached and has not come up yet; undefined while up. */
  private downAt: number | undefined;

  constructor(private readonly now: () => number) {}

  /** Follows a link from before its start: until its first `up` it counts as down since now. */
  attach(link: Link, kind: Exclude<BrokerKind, 'none'>): void {
    this.current = link;
    this.kind = kind;
    this.downAt = link.connected ? undefined : this.now();
    link.on('up', () => {
      this.downAt = undefined;
    });
    link.on('down', () => {
      this.downAt ??= this.now();
    });
  }

  get link(): Link | undefined {
    return this.current;
  }

  get broker(): BrokerKind {
    return this.kind;
  }

  get connected(): boolean {
    return this.current?.connected ?? false;
  }

  /** Since when the link is down (ms since the epoch); undefined while it is up, or when there is none. */
  get downSince(): number | undefined {
    if (!this.current || this.connected) return undefined;
    return this.downAt ?? this.now();
  }

  /** How long the link has been down, ms; 0 while it is up or when there is none. */
  downForMs(): number {
    const since = this.downSince;
    return since === undefined ? 0 : this.now() - since;
  }
}

export const HealthObject = z
  .object({
    /**
     * `failing` when `database` is, when `storage` is not `ok`, or when the link has been down longer than
     * `health.linkGraceMs`.
     */
    status: z.enum(['ok', 'failing']),
    /** `ok`: a read in a write transaction answered, and the data directory is writable. */
    database: z.enum(['ok', 'failing']),
    /** The store's engine: `sqlite` in the data directory, or `postgres` at `database.url` (docs/scaling.md). */
    engine: z.enum(['sqlite', 'postgres']),
    storage: z
      .object({
        /**
         * `full`: the last write failed for lack of space (changes answer `507 storage-full`; reads work);
         * `low`: less than `health.minFreeBytes` is free; `ok` otherwise.
         */
        status: z.enum(['ok', 'low', 'full']),
        /** Free bytes on the data directory's file system; null when unknown. */
        freeBytes: z.number().int().min(0).nullable(),
        /** Since when writes fail for lack of space, ms since the epoch; null while they work. */
        fullSince: z.number().int().nullable(),
      })
      .strict(),
    mqtt: z
      .object({
        broker: z.enum(['embedded', 'external', 'none']),
        connected: z.boolean(),
        /** Since when the link is down, ms since the epoch; null while it is up, or when there is no broker. */
        downSince: z.number().int().nullable(),
      })
      .strict(),
    version: z.string(),
    /** Seconds since this bridge process started. */
    uptimeSec: z.number().int().min(0),
  })
  .strict()
  .meta({ description: 'The answer of `GET /healthz`.' });
export type HealthObject = z.infer<typeof HealthObject>;

export interface HealthDeps {
  store: BridgeStore;
  dataDir: string;
  link: LinkMonitor;
  linkGraceMs: number;
  minFreeBytes: number;
  log: Logger;
}

/** `GET /healthz`, for probes: no frontend, no session. */
export function healthRoutes(deps: HealthDeps): Route[] {
  const { store, log, link } = deps;
  let databaseWasOk = true;
  const checkDatabase = async (): Promise<boolean> => {
    try {
      // Through the write path, so that a closed or locked database fails here as a write would.
      await store.write((tx) => tx.devices.count(), { durable: false });
      await access(deps.dataDir, constants.W_OK);
      if (!databaseWasOk) log.info({ event: 'health.database_ok' });
      databaseWasOk = true;
      return true;
    } catch (err) {
      // Once per failure, not once per probe: a probe every few seconds would flood the log.
      if (databaseWasOk) log.error({ event: 'health.database_failed', err: String(err) });
      databaseWasOk = false;
      return false;
    }
  };
  const checkStorage = (): HealthObject['storage'] => {
    const free = freeBytes(deps.dataDir);
    const { full, fullSince } = store.storage;
    const status = full ? 'full' : free !== undefined && free < deps.minFreeBytes ? 'low' : 'ok';
    return { status, freeBytes: free ?? null, fullSince: fullSince ?? null };
  };
  const health = named('Health', HealthObject);
  return [
    {
      method: 'GET',
      path: HEALTH_PATH,
      operationId: 'getHealth',
      tag: 'Operations',
      summary: 'Whether the bridge can do its work',
      description:
        'The database answers a read in a write transaction and its folder is writable, and the link to the MQTT ' +
        `broker is up or has been down for less than ${deps.linkGraceMs} ms (\`health.linkGraceMs\`). ` +
        'No frontend, no session: `app` is not read. `Cache-Control: no-store`.',
      device: true,
      responses: {
        200: { description: 'Healthy.', json: health },
        503: { description: 'The database fails, or the link has been down too long.', json: health },
      },
      handler: async (_req, reply) => {
        const database = await checkDatabase();
        const storage = checkStorage();
        const downSince = link.downSince;
        const linkFailing = downSince !== undefined && link.downForMs() >= deps.linkGraceMs;
        const ok = database && storage.status === 'ok' && !linkFailing;
        const body: HealthObject = {
          status: ok ? 'ok' : 'failing',
          database: database ? 'ok' : 'failing',
          engine: store.engine,
          storage,
          mqtt: { broker: link.broker, connected: link.connected, downSince: downSince ?? null },
          version: VERSION,
          uptimeSec: Math.floor(process.uptime()),
        };
        return reply
          .code(ok ? 200 : 503)
          .header('cache-control', 'no-store')
          .type('application/json; charset=utf-8')
          .send(JSON.stringify(body));
      },
    },
  ];
}
