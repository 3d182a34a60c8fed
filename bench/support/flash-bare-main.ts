/**
 * The flash baseline of `agent-sync` (bench/support/flash.ts): a bare better-sqlite3 loop in a process of its own, so
 * that `/proc/self/io` holds its writes only. One argument, a JSON {@link BareFlashConfig}. It makes a fresh
 * database, writes every variable once (the warm-up), prints `ready` and waits for `go` on stdin; then it makes
 * `changes` changes, each in its own transaction, prints one JSON line ({@link BareFlashResult}) and waits for
 * `exit` before it closes the database, so that the caller can read the device's counters first.
 */
import Database from 'better-sqlite3';
import { rmSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { readIo } from './flash.js';

export interface BareFlashConfig {
  path: string;
  changes: number;
  /** Distinct variables, changed in turn. */
  names: number;
  synchronous: 'FULL' | 'NORMAL';
  pageSize: number;
  /** `wal_autocheckpoint` in pages (SQLite's default 1000). */
  autocheckpoint: number;
  /**
   * `row`: one UPSERT of the variable's row per change (the bare figure). `agent`: what the agent does per change
   * without the agent around it: the row and a history row in one transaction, then the acknowledgement stamp
   * in a second one committed with `synchronous=NORMAL`.
   */
  pattern: 'row' | 'agent';
  /**
   * Changes made before the measured ones (after each variable was written once). Past `autocheckpoint` frames
   * the log has been checkpointed and is being written over from its start, as on a gateway that has run a while;
   * before that, every commit grows the file, and the file system's journal writes its new size too.
   */
  warmup: number;
  /** Pause after each measured change, ms (see FlashAgentOptions.paceMs). */
  paceMs: number;
}

export interface BareFlashResult {
  /** `write_bytes` of this process during the changes. */
  writeBytes: number;
  /** Bytes passed to write calls (`wchar`) during the changes: what SQLite asked to write. */
  wchar: number;
  ms: number;
  pageSize: number;
}

export const valueOf = (i: number): Buffer => Buffer.from(`{"temp":21.5,"seq":${i}}`);
export const nameOf = (i: number, names: number): string => `flash.v${i % names}`;

function main(): void {
  const cfg = JSON.parse(process.argv[2]!) as BareFlashConfig;
  for (const suffix of ['', '-wal', '-shm']) rmSync(cfg.path + suffix, { force: true });
  const db = new Database(cfg.path);
  // The page size holds only while the file is empty and not yet in WAL mode.
  db.pragma(`page_size = ${cfg.pageSize}`);
  db.pragma('journal_mode = WAL');
  db.pragma(`synchronous = ${cfg.synchronous}`);
  db.pragma(`wal_autocheckpoint = ${cfg.autocheckpoint}`);
  // The agent's row: the same columns and key (agent/vars/store.ts).
  db.exec(`
    CREATE TABLE vars (
      type TEXT NOT NULL, name TEXT NOT NULL, value BLOB, time INTEGER NOT NULL, origin TEXT NOT NULL,
      acked INTEGER NOT NULL DEFAULT 0, synced INTEGER NOT NULL DEFAULT 0, syncacked INTEGER NOT NULL DEFAULT 0,
      unverified INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (type, name)
    ) WITHOUT ROWID;
    CREATE TABLE history (
      id INTEGER PRIMARY KEY, type TEXT NOT NULL, name TEXT NOT NULL, value BLOB, time INTEGER NOT NULL,
      origin TEXT NOT NULL
    );
  `);
  const upsert = db.prepare(`
    INSERT INTO vars (type, name, value, time, origin) VALUES ('d', ?, ?, ?, 'device')
    ON CONFLICT (type, name) DO UPDATE SET value = excluded.value, time = excluded.time, acked = 0`);
  const history = db.prepare(`INSERT INTO history (type, name, value, time, origin) VALUES ('d', ?, ?, ?, 'device')`);
  const ack = db.prepare(`UPDATE vars SET acked = ? WHERE type = 'd' AND name = ?`);
  const relax = db.prepare('PRAGMA synchronous = NORMAL');
  const tighten = db.prepare(`PRAGMA synchronous = ${cfg.synchronous}`);
  const change = db.transaction((name: string, value: Buffer, time: number) => {
    upsert.run(name, value, time);
    if (cfg.pattern === 'agent') history.run(name, value, time);
  });
  const stamp = db.transaction((name: string, time: number) => ack.run(time, name));
  const one = (i: number) => {
    const name = nameOf(i, cfg.names);
    const time = Date.now();
    change(name, valueOf(i), time);
    if (cfg.pattern === 'agent') {
      relax.run();
      stamp(name, time);
      tighten.run();
    }
  };
  for (let i = 0; i < cfg.names + cfg.warmup; i++) one(i);

  const lines = createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    if (line === 'go') {
      const io0 = readIo('self');
      const t0 = performance.now();
      const pause = new Int32Array(new SharedArrayBuffer(4));
      for (let i = 0; i < cfg.changes; i++) {
        one(i);
        if (cfg.paceMs > 0) Atomics.wait(pause, 0, 0, cfg.paceMs);
      }
      const ms = performance.now() - t0;
      const io1 = readIo('self');
      const result: BareFlashResult = {
        writeBytes: io1.writeBytes - io0.writeBytes,
        wchar: io1.wchar - io0.wchar,
        ms,
        pageSize: db.pragma('page_size', { simple: true }) as number,
      };
      process.stdout.write(`${JSON.stringify(result)}\n`);
    } else if (line === 'exit') {
      db.close();
      process.exit(0);
    }
  });
  process.stdout.write('ready\n');
}

main();
