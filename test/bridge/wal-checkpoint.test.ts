/**
 * WAL checkpoints off the event loop (lib/wal-checkpointer.ts, docs/api.md "Retention"): the running bridge's
 * connection never checkpoints inside a commit, a worker thread copies the log into the database once it has
 * grown past 1000 pages (seen in the log file's header: its checkpoint sequence number moves when the log starts
 * over, which only a complete checkpoint allows), and closing the store closes the worker's connection too (the
 * last connection to close removes the log file).
 */
import { randomUUID } from 'node:crypto';
import { existsSync, openSync, readSync, closeSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { tempDir } from '../support/agent.js';
import { until } from '../support/wait.js';

/** The checkpoint sequence number in the header of a WAL file (bytes 12 to 15, big-endian). */
function walSequence(path: string): number {
  const fd = openSync(path, 'r');
  try {
    const b = Buffer.alloc(16);
    readSync(fd, b, 0, 16, 0);
    return b.readUInt32BE(12);
  } finally {
    closeSync(fd);
  }
}

describe('WAL checkpoints in the background', () => {
  const dirs: string[] = [];
  const stores: SqliteStore[] = [];

  afterEach(async () => {
    for (const s of stores.splice(0)) await s.close();
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  function open(backgroundCheckpoints: boolean): { store: SqliteStore; wal: string } {
    const dir = tempDir();
    dirs.push(dir);
    const store = new SqliteStore(dir, undefined, { backgroundCheckpoints });
    stores.push(store);
    return { store, wal: join(dir, 'bridge.db-wal') };
  }

  /** About `mib` MiB of history on one variable, in one commit. */
  async function fill(store: SqliteStore, mib: number): Promise<void> {
    const id = randomUUID();
    const value = Buffer.alloc(4000, 'x');
    await store.write(async (tx) => {
      await tx.devices.touch(id, 1);
      for (let i = 0; i < mib * 256; i++)
        await tx.devices.putVersion(id, { type: 'd', name: 'v', value, time: i + 1, origin: 'cloud' }, i + 1, 'user');
    });
  }

  const autocheckpoint = (store: SqliteStore): unknown => store.core.db.pragma('wal_autocheckpoint', { simple: true });

  it('copies a log past 1000 pages into the database from a worker, never inside a commit', async () => {
    const { store, wal } = open(true);
    expect(autocheckpoint(store)).toBe(0);
    await fill(store, 1);
    const before = walSequence(wal);
    await fill(store, 6);
    // Only a complete checkpoint lets the next commit start the log over; no commit of this connection makes one.
    await until(async () => {
      await fill(store, 0.01);
      return walSequence(wal) !== before;
    }, 'the log to start over after a checkpoint');
  });

  it('without it (the command-line tools), SQLite checkpoints by itself', () => {
    const { store } = open(false);
    expect(autocheckpoint(store)).toBe(1000);
  });

  it('closing the store closes the worker connection: the log file goes away', async () => {
    const { store, wal } = open(true);
    await fill(store, 1);
    expect(existsSync(wal)).toBe(true);
    stores.splice(stores.indexOf(store), 1);
    await store.close();
    expect(existsSync(wal)).toBe(false);
  });
});
