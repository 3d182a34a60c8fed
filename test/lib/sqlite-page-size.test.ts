/**
 * `openDatabase`'s page size (docs/operations.md, "Flash wear"): a new database gets it, an existing one with
 * another is converted once with its rows kept, and a conversion that cannot run now (another connection open)
 * leaves the database as it was, working, for the next open to convert.
 */
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { type Db, openDatabase } from '../../lib/sqlite.js';
import { tempDir } from '../support/agent.js';

const SCHEMA = [(db: Db) => db.exec('CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)')];

const pageSize = (db: Db) => db.pragma('page_size', { simple: true });
const journal = (db: Db) => db.pragma('journal_mode', { simple: true });
const rows = (db: Db) => db.prepare('SELECT id, v FROM t ORDER BY id').all();

function fill(path: string): void {
  const db = openDatabase(path, SCHEMA);
  const insert = db.prepare('INSERT INTO t (v) VALUES (?)');
  for (let i = 0; i < 500; i++) insert.run(`row ${i} `.repeat(20));
  db.close();
}

describe('openDatabase page size', () => {
  it('gives a new database the page size, in WAL mode', () => {
    const db = openDatabase(join(tempDir(), 'new.db'), SCHEMA, { pageSize: 1024 });
    expect(pageSize(db)).toBe(1024);
    expect(journal(db)).toBe('wal');
    db.close();
  });

  it('leaves the page size alone without the option', () => {
    const path = join(tempDir(), 'plain.db');
    fill(path);
    const db = openDatabase(path, SCHEMA);
    expect(pageSize(db)).toBe(4096);
    db.close();
  });

  it('converts a database with another page size once, keeping its rows', () => {
    const path = join(tempDir(), 'old.db');
    fill(path);
    const before = openDatabase(path, SCHEMA);
    const expected = rows(before);
    before.close();

    const told: unknown[] = [];
    const db = openDatabase(path, SCHEMA, { pageSize: 1024, onConverted: (info) => told.push(info) });
    expect(pageSize(db)).toBe(1024);
    expect(told).toEqual([{ fromPageSize: 4096, toPageSize: 1024, bytes: expect.any(Number), ms: expect.any(Number) }]);
    expect((told[0] as { bytes: number }).bytes).toBeGreaterThan(4096);
    expect(journal(db)).toBe('wal');
    expect(db.pragma('synchronous', { simple: true })).toBe(2); // FULL
    expect(rows(db)).toEqual(expected);
    expect(db.pragma('integrity_check', { simple: true })).toBe('ok');
    db.close();
    // Once: the next open finds the page size it wants.
    openDatabase(path, SCHEMA, { pageSize: 1024, onConverted: (info) => told.push(info) }).close();
    expect(told).toHaveLength(1);
  });

  it('leaves a database larger than the conversion limit as it is, working', () => {
    const path = join(tempDir(), 'large.db');
    fill(path);
    const before = openDatabase(path, SCHEMA);
    const size = (before.pragma('page_count', { simple: true }) as number) * 4096;
    const expected = rows(before);
    before.close();
    const db = openDatabase(path, SCHEMA, { pageSize: 1024, convertUpToBytes: size - 1 });
    expect(pageSize(db)).toBe(4096);
    expect(journal(db)).toBe('wal');
    expect(rows(db)).toEqual(expected);
    db.close();
    // At the limit, it is converted.
    const small = openDatabase(path, SCHEMA, { pageSize: 1024, convertUpToBytes: size });
    expect(pageSize(small)).toBe(1024);
    small.close();
  });

  it('keeps the old page size while another connection is open, and converts at the next open', () => {
    const path = join(tempDir(), 'busy.db');
    fill(path);
    const other = new Database(path);
    other.prepare('SELECT count(*) FROM t').get();
    const db = openDatabase(path, SCHEMA, { pageSize: 1024 });
    expect(pageSize(db)).toBe(4096);
    expect(journal(db)).toBe('wal');
    db.prepare('INSERT INTO t (v) VALUES (?)').run('written meanwhile');
    db.close();
    other.close();

    const again = openDatabase(path, SCHEMA, { pageSize: 1024 });
    expect(pageSize(again)).toBe(1024);
    expect(rows(again)).toHaveLength(501);
    again.close();
  });
});
