/**
 * `devcloud-bridge frontend ...`: the frontends of the database in `dataDir` (docs/api.md, "devcloud-bridge
 * frontend").
 *
 * - `create [--name NAME] [KEY=VALUE ...]`: prints the new frontend's id.
 * - `list [--json]`: every frontend, the default one made first if there is none.
 * - `set ID [name=NAME] [default=true] [KEY=VALUE ...]`.
 *
 * Exit codes as the rest of the CLI: 0 success; 1 the operation failed; 2 usage.
 *
 * On PostgreSQL, what it changes is announced to the running bridges (`frontend.changed` on the event bus,
 * docs/scaling.md, "The event bus"), which drop their copies of the frontends at once.
 */
import { randomUUID } from 'node:crypto';
import type { BridgeConfig } from '../config.js';
import { commandLog } from '../command-log.js';
import { eventBusFor } from '../events/bus.js';
import { openStore } from '../store/open.js';
import { type Frontend, ProductConfig } from '../store/types.js';
import { ensureDefaultFrontend } from './default.js';

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
}

function parseSettings(pairs: string[], io: Io): { settings: Record<string, boolean>; name?: string } | undefined {
  const settings: Record<string, boolean> = {};
  let name: string | undefined;
  for (const p of pairs) {
    const eq = p.indexOf('=');
    const key = eq > 0 ? p.slice(0, eq) : '';
    const value = p.slice(eq + 1);
    if (key === 'name') {
      name = value;
      continue;
    }
    // An own key only: `in` would also accept inherited names such as `constructor`.
    if (!Object.hasOwn(ProductConfig.shape, key) || !/^(true|false)$/.test(value)) {
      io.err(
        `devcloud-bridge: ${p}: expected KEY=true|false with KEY one of ${Object.keys(ProductConfig.shape).join(', ')}`,
      );
      return undefined;
    }
    settings[key] = value === 'true';
  }
  return name === undefined ? { settings } : { settings, name };
}

export async function frontendCommand(
  config: BridgeConfig,
  params: string[],
  json: boolean,
  name: string | undefined,
  io: Io,
  now: number,
): Promise<number> {
  const [sub, ...rest] = params;
  const log = commandLog(config);
  const store = await openStore(config, log);
  // Publishing only: nothing here listens, so the bus is never started; its stop sends what is queued.
  const events = eventBusFor(store, config.database.url, log);
  const unfollow = store.useEvents?.(events);
  try {
    switch (sub) {
      case 'list': {
        await ensureDefaultFrontend(store, now);
        const all = await store.frontends();
        if (json) io.out(JSON.stringify(all));
        else
          for (const f of all)
            io.out(`${f.id}  ${f.isDefault ? '(default) ' : ''}${f.name}  ${JSON.stringify(f.config)}`);
        return 0;
      }
      case 'create': {
        const parsed = parseSettings(rest, io);
        if (!parsed) return 2;
        const f: Frontend = {
          id: randomUUID(),
          name: name ?? parsed.name ?? 'frontend',
          config: ProductConfig.parse(parsed.settings),
          isDefault: false,
          createdAt: now,
        };
        await store.createFrontend(f);
        io.out(json ? JSON.stringify(f) : f.id);
        return 0;
      }
      case 'set': {
        const [id, ...pairs] = rest;
        const f = id ? await store.frontend(id) : undefined;
        if (!f) {
          io.err(`devcloud-bridge: no frontend ${id ?? '(missing id)'}`);
          return 1;
        }
        const makeDefault = pairs.includes('default=true');
        const parsed = parseSettings(
          pairs.filter((p) => p !== 'default=true'),
          io,
        );
        if (!parsed) return 2;
        await store.setFrontendConfig(
          f.id,
          ProductConfig.parse({ ...f.config, ...parsed.settings }),
          parsed.name ?? name,
        );
        if (makeDefault) await store.setDefaultFrontend(f.id);
        const updated = (await store.frontend(f.id))!;
        io.out(json ? JSON.stringify(updated) : `${updated.id}  ${updated.name}  ${JSON.stringify(updated.config)}`);
        return 0;
      }
      default:
        io.err('devcloud-bridge: frontend needs one of create, list, set');
        return 2;
    }
  } finally {
    await events.stop().catch(() => undefined);
    unfollow?.();
    await store.close();
  }
}
