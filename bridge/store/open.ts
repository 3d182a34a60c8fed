/**
 * Opens the bridge's store on the engine the config names (docs/scaling.md): PostgreSQL when `database.url` is set
 * (its migrations are applied first, under a lock, so that bridges starting together do not race), else SQLite in
 * `dataDir`. Firmware image files stay in `dataDir` either way.
 */
import type { Logger } from '../../lib/log.js';
import type { BridgeConfig } from '../config.js';
import { openPostgresStore } from './postgres/store.js';
import { SqliteStore } from './sqlite.js';
import type { BridgeStore } from './types.js';

export interface OpenStoreOptions {
  /** SQLite: WAL checkpoints in a worker thread (the running bridge), lib/wal-checkpointer.ts. */
  backgroundCheckpoints?: boolean;
  now?: () => number;
}

export async function openStore(
  config: BridgeConfig,
  log: Logger,
  options: OpenStoreOptions = {},
): Promise<BridgeStore> {
  const url = config.database.url;
  if (url === undefined) {
    return new SqliteStore(config.dataDir, log, { backgroundCheckpoints: options.backgroundCheckpoints ?? false });
  }
  return openPostgresStore(url, log, {
    poolSize: config.database.poolSize,
    dataDir: config.dataDir,
    now: options.now ?? Date.now,
  });
}
