/**
 * The default frontend and one user, written through the bridge's own store before the bridge starts, with one
 * password hash at the production cost: what a benchmark that logs in as one user needs.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { PasswordHasher } from '../../bridge/accounts/password.js';
import { ensureDefaultFrontend } from '../../bridge/frontends/default.js';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';

export async function seedUser(dataDir: string, login: string, password: string): Promise<void> {
  const config = BridgeConfigSchema.parse({ dataDir });
  const a = config.accounts;
  const hasher = new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: 1,
    maxQueued: 0,
  });
  const passwordHash = await hasher.hash(password);
  mkdirSync(dataDir, { recursive: true });
  const store = new SqliteStore(dataDir);
  try {
    const now = Date.now();
    const frontend = await ensureDefaultFrontend(store, now);
    await store.write((tx) =>
      tx.createUser({
        frontendId: frontend.id,
        login,
        passwordHash,
        authcode: randomBytes(16).toString('hex'),
        now,
      }),
    );
  } finally {
    await store.close();
  }
}
