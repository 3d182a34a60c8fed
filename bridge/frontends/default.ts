/** The default frontend (decision 15): the one a request gets when it names none. */
import { randomUUID } from 'node:crypto';
import { type BridgeStore, type Frontend, ProductConfig } from '../store/types.js';

/** Makes the default frontend at first start (decision 15), so that a new bridge answers at once. */
export function ensureDefaultFrontend(store: BridgeStore, now: number): Frontend {
  const existing = store.defaultFrontend();
  if (existing) return existing;
  const f: Frontend = {
    id: randomUUID(),
    name: 'default',
    config: ProductConfig.parse({}),
    isDefault: true,
    createdAt: now,
  };
  store.createFrontend(f);
  return f;
}
