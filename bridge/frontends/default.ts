/** The default frontend (decision 15): the one a request gets when it names none. */
import { randomUUID } from 'node:crypto';
import { type BridgeStore, type Frontend, ProductConfig } from '../store/types.js';

/** Makes the default frontend at first start (decision 15), so that a new bridge answers at once. */
export async function ensureDefaultFrontend(store: BridgeStore, now: number): Promise<Frontend> {
  const existing = await store.defaultFrontend();
  if (existing) return existing;
  const f: Frontend = {
    id: randomUUID(),
    name: 'default',
    config: ProductConfig.parse({}),
    isDefault: true,
    createdAt: now,
  };
  // Two bridges starting at once on one database: the second finds the first's default inside its transaction.
  return store.write(async (tx) => {
    const raced = await tx.defaultFrontend();
    if (raced) return raced;
    await tx.createFrontend(f);
    return f;
  });
}
