/**
 * Group commit on a disk that fills up (a small tmpfs): every refused write rejects with `StorageFullError` and
 * keeps nothing, the connection is never left inside a transaction, reads go on, writes work again as soon as
 * space is freed, and after reopening the file holds exactly the writes that resolved.
 */
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type Db, GroupCommitter, StorageFullError, isStorageFull, openDatabase } from '../../lib/sqlite.js';
import { type SmallDisk, smallDiskOrSkip } from '../support/tmpfs.js';

const mounted = smallDiskOrSkip(4 * 1024 * 1024, 'the full-disk tests of group commit');

const SCHEMA = [(db: Db) => db.exec('CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)')];

describe.skipIf(mounted === undefined)('group commit on a full disk', () => {
  const d = mounted!;
  afterAll(() => (d as SmallDisk | undefined)?.unmount());

  it('refuses with StorageFullError, keeps nothing refused, and recovers when space returns', async () => {
    const path = join(d.dir, 'test.db');
    const db = openDatabase(path, SCHEMA);
    const changes: boolean[] = [];
    const commit = new GroupCommitter(db, { onStorageChange: (full) => changes.push(full) });
    const insert = db.prepare('INSERT INTO t (v) VALUES (?)');
    const count = () => (db.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n;
    let resolved = 0;
    const write = async (bytes: number): Promise<unknown> => {
      try {
        await commit.run(() => insert.run(randomBytes(bytes)));
        resolved++;
        return 'ok';
      } catch (err) {
        return err;
      }
    };

    await write(100);
    d.fill();
    let refused: unknown = 'ok';
    for (let i = 0; i < 2000 && refused === 'ok'; i++) refused = await write(8000);
    expect(refused).toBeInstanceOf(StorageFullError);
    expect(isStorageFull(refused)).toBe(true);
    expect(commit.storage.full).toBe(true);
    expect(commit.storage.fullSince).toBeGreaterThan(0);
    expect(db.inTransaction).toBe(false);

    // A batch of several units, one of which fails by itself: all are refused, none is half-done.
    const batch = await Promise.all([
      write(8000),
      commit
        .run(() => {
          throw new Error('a unit that fails');
        })
        .catch((err: unknown) => err),
      write(8000),
    ]);
    expect(batch[0]).toBeInstanceOf(StorageFullError);
    expect(batch[2]).toBeInstanceOf(StorageFullError);
    expect(db.inTransaction).toBe(false);
    // Reads are served, and a batch that only reads does not count as a recovery.
    expect(count()).toBe(resolved);
    await commit.run(() => count());
    expect(commit.storage.full).toBe(true);

    d.free();
    expect(await write(8000)).toBe('ok');
    expect(commit.storage.full).toBe(false);
    expect(commit.storage.fullSince).toBeUndefined();
    expect(changes).toEqual([true, false]);
    expect(count()).toBe(resolved);

    commit.close();
    db.close();
    const reopened = openDatabase(path, SCHEMA);
    try {
      expect((reopened.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n).toBe(resolved);
      expect(reopened.pragma('integrity_check', { simple: true })).toBe('ok');
    } finally {
      reopened.close();
    }
  });
});
