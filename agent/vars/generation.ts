/**
 * Whether this start needs a full sync (docs/sync.md, offline and catch-up). A start resumes from the stamps:
 * what the cloud acknowledged is not sent again. That holds only while the stamps are this gateway's latest; a
 * database put back from a backup says "acknowledged" of versions the cloud has since replaced. So every start
 * counts one generation, in the database and in a file beside it that a restore does not bring back; when the
 * two disagree, the database is not the one the agent last ran with, and the first connect syncs everything.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeFileAtomic } from '../../lib/fsutil.js';
import type { Db } from '../../lib/sqlite.js';

const KEY = 'sync.generation';
export const GENERATION_FILE = 'sync-generation';

export interface GenerationCheck {
  /** The database is not the one the previous start left (restored, or copied from another directory). */
  fullSync: boolean;
  generation: number;
  /** What the database and the file said, for the log. */
  database: number;
  file: number | undefined;
}

function readFileGeneration(path: string): number | undefined {
  try {
    const n = Number(readFileSync(path, 'utf8').trim());
    return Number.isSafeInteger(n) && n >= 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Counts this start in the database (durably) and then in the file. A crash between the two leaves them apart,
 * which costs one full sync at the next start, never a missed one.
 */
export function nextGeneration(db: Db, stateDir: string): GenerationCheck {
  const path = join(stateDir, GENERATION_FILE);
  const row = db.prepare<[string], { value: string }>('SELECT value FROM kv WHERE key = ?').get(KEY);
  const database = row ? Number(row.value) || 0 : 0;
  const file = readFileGeneration(path);
  // No file and no count: a new gateway, or one upgraded from a version that synced everything at every start.
  const fullSync = file === undefined ? database !== 0 : file !== database;
  const generation = Math.max(database, file ?? 0) + 1;
  db.prepare('INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value').run(
    KEY,
    String(generation),
  );
  writeFileAtomic(path, `${generation}\n`);
  return { fullSync, generation, database, file };
}
