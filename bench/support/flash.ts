/**
 * The flash figures of `agent-sync` (bench/README.md, "Flash"): bytes written to the state device per variable
 * change by the agent, against a bare better-sqlite3 loop making the same changes on the same file system in the
 * same run, and what SQLite's settings cost the bare loop.
 *
 * Bytes are counted twice: `write_bytes` of `/proc/<pid>/io`, the bytes of the page cache the process dirtied
 * (what the kernel will write for it; a page dirtied again before it was written counts once), and, when the state
 * folder is a file system of its own on a loop device, the sectors that device wrote (`/sys/block/loopN/stat`),
 * which also holds what the process leaves to the kernel: the ext4 journal, inodes, the `-shm` file's pages.
 * `write_bytes` is 0 on tmpfs and on some overlay setups; the benchmark checks that it counts before it relies
 * on it.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  writeSync,
} from 'node:fs';
import { basename, join } from 'node:path';
import { createInterface } from 'node:readline';
import { LocalClient } from '../../agent/local/client.js';
import type { WatchEvent } from '../../agent/local/messages.js';
import type { Cleanup } from './cleanup.js';
import { type Row, round } from './report.js';
import type { BareFlashConfig, BareFlashResult } from './flash-bare-main.js';
import { type AgentRuntime, ROOT, spawnAgentProcess, stopChild } from './processes.js';

export interface IoCounters {
  /** Bytes passed to read and write calls. */
  rchar: number;
  wchar: number;
  /** Bytes the process caused to be read from and written to storage (page cache pages it dirtied). */
  readBytes: number;
  writeBytes: number;
  /** Dirty pages the process dropped before they were written (a file truncated or removed). */
  cancelledWriteBytes: number;
}

/** Parses `/proc/<pid>/io`; throws when a field is missing (a kernel without task I/O accounting). */
export function parseProcIo(text: string): IoCounters {
  const field = (key: string) => {
    const m = new RegExp(`^${key}:\\s*(\\d+)\\s*$`, 'm').exec(text);
    if (!m) throw new Error(`no ${key} in /proc/<pid>/io (a kernel without CONFIG_TASK_IO_ACCOUNTING?)`);
    return Number(m[1]);
  };
  return {
    rchar: field('rchar'),
    wchar: field('wchar'),
    readBytes: field('read_bytes'),
    writeBytes: field('write_bytes'),
    cancelledWriteBytes: field('cancelled_write_bytes'),
  };
}

/** The I/O counters of a process (all its threads), or of this one. Reading another's needs its user or root. */
export function readIo(pid: number | 'self'): IoCounters {
  return parseProcIo(readFileSync(`/proc/${pid}/io`, 'utf8'));
}

/** Bytes a block device has written since it appeared: sectors written (the 7th field of its `stat`) × 512. */
export function parseBlockStatWritten(text: string): number {
  const fields = text.trim().split(/\s+/);
  if (fields.length < 7 || !/^\d+$/.test(fields[6]!)) throw new Error(`not a block device stat line: ${text}`);
  return Number(fields[6]) * 512;
}

/** Where the databases go, and how writes to it are counted. */
export interface FlashPlace {
  dir: string;
  /** What the place is, for the table and the JSON line. */
  describe: string;
  /** The loop device of its own file system (`loop3`), when there is one. */
  device: string | undefined;
  /** Writes what is dirty in the file system to its device (`sync -f`), so that the device's counter is current. */
  settle(): void;
  /** Bytes the device has written so far; undefined without a device of its own. */
  deviceBytes(): number | undefined;
}

const have = (program: string) => spawnSync('sh', ['-c', `command -v ${program}`]).status === 0;

function run(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${(r.stderr || r.error?.message || '').trim()}`);
}

/** Whether `write_bytes` of this process grows when a file in `dir` is written and synced. */
export function writeBytesCount(dir: string): boolean {
  const path = join(dir, '.flash-probe');
  const before = readIo('self').writeBytes;
  const fd = openSync(path, 'w');
  try {
    writeSync(fd, Buffer.alloc(64 * 1024, 1));
    fsyncSync(fd);
  } finally {
    closeSync(fd);
    rmSync(path, { force: true });
  }
  return readIo('self').writeBytes - before >= 64 * 1024;
}

/** The size of the loop file system: room for the databases; the image file is sparse. */
const LOOP_IMAGE_BYTES = 1024 * 1024 * 1024;

/**
 * The place for the flash figures. `dir` given: that folder, counted by `write_bytes` only. Otherwise, as root
 * with `mkfs.ext4` and `mount`: a fresh ext4 (4 KiB blocks, the journal and inode tables written at once so that
 * nothing writes in the background) on a loop device in `tmp`, whose device counter then holds every byte.
 * Otherwise `tmp` itself. Throws when `write_bytes` does not count where the databases would go.
 */
export function prepareFlashPlace(opts: { dir: string | undefined; tmp: string }, cleanup: Cleanup): FlashPlace {
  const plain = (dir: string, why: string): FlashPlace => {
    mkdirSync(dir, { recursive: true });
    if (!writeBytesCount(dir)) {
      throw new Error(
        `write_bytes of /proc/<pid>/io does not count on the file system of ${dir} (tmpfs or overlay?): ` +
          'run the benchmark as root (for a loop-mounted ext4), give --flash-dir on ext4, f2fs or xfs, or --no-flash',
      );
    }
    return {
      dir,
      describe: `${dir} (${why}; write_bytes only)`,
      device: undefined,
      settle: () => run('sync', ['-f', dir]),
      deviceBytes: () => undefined,
    };
  };
  if (opts.dir !== undefined) return plain(opts.dir, '--flash-dir');
  const missing = ['mkfs.ext4', 'mount', 'umount', 'findmnt'].filter((p) => !have(p));
  const fallback = join(opts.tmp, 'flash');
  if (process.getuid?.() !== 0) return plain(fallback, 'not root: no loop device');
  if (missing.length > 0) return plain(fallback, `no loop device: ${missing.join(', ')} missing`);
  const image = join(opts.tmp, 'flash.img');
  const mnt = join(opts.tmp, 'flash-mnt');
  try {
    closeSync(openSync(image, 'w'));
    truncateSync(image, LOOP_IMAGE_BYTES);
    run('mkfs.ext4', ['-q', '-F', '-b', '4096', '-E', 'lazy_itable_init=0,lazy_journal_init=0,nodiscard', image]);
    mkdirSync(mnt, { recursive: true });
    run('mount', ['-o', 'loop', image, mnt]);
  } catch (err) {
    rmSync(image, { force: true });
    return plain(fallback, `no loop device: ${(err as Error).message.split('\n')[0]}`);
  }
  // Unmounting a loop mount made with -o loop detaches the device too.
  cleanup.add('unmount the flash file system', () => run('umount', [mnt]));
  const source = spawnSync('findmnt', ['-n', '-o', 'SOURCE', mnt], { encoding: 'utf8' }).stdout.trim();
  const device = basename(source);
  const statPath = `/sys/block/${device}/stat`;
  const dir = join(mnt, 'db');
  mkdirSync(dir);
  return {
    dir,
    describe: `ext4 on ${source} (a ${LOOP_IMAGE_BYTES / 2 ** 30} GiB image in ${opts.tmp}, 4 KiB blocks)`,
    device,
    settle: () => run('sync', ['-f', dir]),
    deviceBytes: () => parseBlockStatWritten(readFileSync(statPath, 'utf8')),
  };
}

/** Bytes of one measured stretch, in total and per change. */
export interface FlashFigure {
  changes: number;
  /** `write_bytes` of the process over the stretch. */
  writeBytes: number;
  perChange: number;
  /** What the device wrote over the stretch, `sync -f` at both ends; undefined without a device of its own. */
  deviceBytes: number | undefined;
  devicePerChange: number | undefined;
  ms: number;
}

function devRatio(a: FlashFigure, b: FlashFigure): number | undefined {
  return a.devicePerChange === undefined || b.devicePerChange === undefined
    ? undefined
    : a.devicePerChange / b.devicePerChange;
}

function figure(changes: number, writeBytes: number, deviceBytes: number | undefined, ms: number): FlashFigure {
  return {
    changes,
    writeBytes,
    perChange: writeBytes / changes,
    deviceBytes,
    devicePerChange: deviceBytes === undefined ? undefined : deviceBytes / changes,
    ms,
  };
}

/** Runs the bare loop once in a child process on `place` and measures it. */
export async function measureBare(
  place: FlashPlace,
  cfg: Omit<BareFlashConfig, 'path'>,
  cleanup: Cleanup,
): Promise<FlashFigure & { pageSize: number }> {
  const full: BareFlashConfig = { ...cfg, path: join(place.dir, 'bare.db') };
  const proc = spawn(
    process.execPath,
    ['--import', 'tsx', join(ROOT, 'bench/support/flash-bare-main.ts'), JSON.stringify(full)],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] },
  );
  cleanup.add('stop the bare flash loop', () => stopChild(proc, 2000));
  try {
    let stderr = '';
    proc.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4096)));
    const lines = lineReader(proc, () => stderr);
    if ((await lines()) !== 'ready') throw new Error(`the bare flash loop did not start: ${stderr}`);
    place.settle();
    const dev0 = place.deviceBytes();
    proc.stdin.write('go\n');
    const result = JSON.parse(await lines()) as BareFlashResult;
    place.settle();
    const dev1 = place.deviceBytes();
    proc.stdin.write('exit\n');
    await new Promise<void>((res) => (proc.exitCode === null ? proc.once('exit', () => res()) : res()));
    const dev = dev0 === undefined || dev1 === undefined ? undefined : dev1 - dev0;
    return { ...figure(cfg.changes, result.writeBytes, dev, result.ms), pageSize: result.pageSize };
  } finally {
    await stopChild(proc, 2000);
    for (const suffix of ['', '-wal', '-shm']) rmSync(full.path + suffix, { force: true });
  }
}

function lineReader(proc: ChildProcess, stderr: () => string): () => Promise<string> {
  const queue: string[] = [];
  let waiter: ((line: string) => void) | undefined;
  let failed: Error | undefined;
  createInterface({ input: proc.stdout! }).on('line', (line) => {
    if (waiter) {
      const w = waiter;
      waiter = undefined;
      w(line);
    } else queue.push(line);
  });
  proc.once('exit', (code) => {
    failed = new Error(`the bare flash loop exited (${code}): ${stderr()}`);
  });
  return () =>
    new Promise<string>((resolve, reject) => {
      const next = queue.shift();
      if (next !== undefined) return resolve(next);
      if (failed) return reject(failed);
      waiter = resolve;
      proc.once('exit', () => failed && reject(failed));
    });
}

/** The changes a flash run makes. */
export interface FlashPattern {
  /** Changes made one at a time, each waited for until the cloud's acknowledgement is recorded. */
  changes: number;
  /** Changes one at a time before the measured ones, so that the log has been written over once. */
  warmup: number;
  /**
   * Pause after each change made one at a time, ms. A gateway's changes are seconds apart, so that each commit
   * changes the log file's time stamp and its `fsync` (better-sqlite3's SQLite calls `fsync`, not `fdatasync`)
   * also commits the file system's journal; commits closer together than the kernel's clock tick share one.
   */
  paceMs: number;
  /** Changes of the burst, `window` outstanding at a time. */
  burst: number;
  window: number;
  names: number;
}

export interface FlashAgentOptions extends FlashPattern {
  runtime: AgentRuntime;
  mqttUrl: string;
  /** Whether the cloud has seen the device's hello. */
  hasHello: (deviceId: string) => boolean;
  nodeArgs: string[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(check: () => boolean | Promise<boolean>, what: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

interface AgentStatus {
  deviceId: string;
  state: string;
  pending: { pushes: number; syncs: number };
}

/**
 * A fresh agent with its state folder on `place`, measured over `changes` changes one at a time (each set through
 * the local socket, committed, pushed, committed by the cloud, acknowledged, and the acknowledgement recorded before
 * the next) and then over a burst of `burst` changes. The variables are `names` in turn, each set once before.
 */
export async function measureAgent(
  place: FlashPlace,
  opts: FlashAgentOptions,
  cleanup: Cleanup,
): Promise<{ oneByOne: FlashFigure; burst: FlashFigure; dbBytes: number; pageSize: number }> {
  const stateDir = join(place.dir, 'agent');
  const agent = spawnAgentProcess(
    { runtime: opts.runtime, mqttUrl: opts.mqttUrl, stateDir, nodeArgs: opts.nodeArgs },
    cleanup,
  );
  let client: LocalClient | undefined;
  try {
    const deadline = Date.now() + 30_000;
    while (!client) {
      try {
        client = await LocalClient.connect(agent.socket);
      } catch (err) {
        if (Date.now() > deadline)
          throw new Error(`the flash agent did not open its socket: ${agent.output()}`, { cause: err });
        await sleep(50);
      }
    }
    const c = client;
    const { deviceId } = await c.status<AgentStatus>();
    await until(async () => (await c.status<AgentStatus>()).state === 'connected', 'the flash agent to connect');
    await until(() => opts.hasHello(deviceId), 'the flash agent hello');
    const ackWaiters = new Map<string, () => void>();
    await c.watch((ev: WatchEvent) => {
      if (ev.event !== 'acked') return;
      const w = ackWaiters.get(ev.var.name);
      ackWaiters.delete(ev.var.name);
      w?.();
    });
    const value = (i: number) => `{"temp":21.5,"seq":${i}}`;
    const name = (i: number) => `flash.v${i % opts.names}`;
    const oneAcked = async (i: number) => {
      const acked = new Promise<void>((resolve) => ackWaiters.set(name(i), resolve));
      await c.set('d', name(i), value(i));
      await acked;
    };
    // Warm-up: every variable exists and has been acknowledged; the log has been checkpointed and is written
    // over from its start, as on a gateway that has run for a while.
    for (let i = 0; i < opts.names + opts.warmup; i++) await oneAcked(i);

    const stretch = async (changes: number, work: () => Promise<void>): Promise<FlashFigure> => {
      place.settle();
      const dev0 = place.deviceBytes();
      const io0 = readIo(agent.pid).writeBytes;
      const t0 = performance.now();
      await work();
      const ms = performance.now() - t0;
      const io1 = readIo(agent.pid).writeBytes;
      place.settle();
      const dev1 = place.deviceBytes();
      return figure(changes, io1 - io0, dev0 === undefined || dev1 === undefined ? undefined : dev1 - dev0, ms);
    };
    const oneByOne = await stretch(opts.changes, async () => {
      for (let i = 0; i < opts.changes; i++) {
        await oneAcked(i);
        if (opts.paceMs > 0) await sleep(opts.paceMs);
      }
    });
    const burst = await stretch(opts.burst, async () => {
      await new Promise<void>((resolve, reject) => {
        let next = 0;
        let done = 0;
        const launch = () => {
          while (next < opts.burst && next - done < opts.window) {
            const i = next++;
            c.set('d', name(i), value(opts.changes + i)).then(() => {
              if (++done === opts.burst) resolve();
              else launch();
            }, reject);
          }
        };
        launch();
      });
      await until(async () => (await c.status<AgentStatus>()).pending.pushes === 0, 'the flash burst acks');
    });
    const dbPath = join(stateDir, 'agent.db');
    const dbBytes = statSync(dbPath).size;
    // The page size is in the file's header (bytes 16 and 17, big-endian; 1 stands for 65536).
    const raw = readFileSync(dbPath).readUInt16BE(16);
    const pageSize = raw === 1 ? 65536 : raw;
    return { oneByOne, burst, dbBytes, pageSize };
  } finally {
    client?.close();
    await agent.stop();
  }
}

/** One variation of the bare loop for the settings table. */
export interface FlashSetting {
  label: string;
  cfg: Omit<BareFlashConfig, 'path' | 'changes' | 'names' | 'warmup' | 'paceMs'>;
  /** Measured on a fresh log: no warm-up beyond writing each variable once. */
  freshLog?: boolean;
}

/**
 * The bare loop's baseline: SQLite's defaults with the agent's durability (WAL, `synchronous=FULL`; lib/sqlite.ts
 * openDatabase). The agent's own database has 1 KiB pages (agent/migrations.ts AGENT_DB_OPTIONS).
 */
export const BARE_SQLITE = { synchronous: 'FULL', pageSize: 4096, autocheckpoint: 1000 } as const;

export const FLASH_SETTINGS: readonly FlashSetting[] = [
  { label: 'FULL, page_size 4096, autocheckpoint 1000 (the baseline)', cfg: { ...BARE_SQLITE, pattern: 'row' } },
  {
    label: 'synchronous NORMAL (loses the last commits on power loss)',
    cfg: { ...BARE_SQLITE, synchronous: 'NORMAL', pattern: 'row' },
  },
  { label: "page_size 1024 (the agent's)", cfg: { ...BARE_SQLITE, pageSize: 1024, pattern: 'row' } },
  { label: 'page_size 8192', cfg: { ...BARE_SQLITE, pageSize: 8192, pattern: 'row' } },
  { label: 'wal_autocheckpoint 100', cfg: { ...BARE_SQLITE, autocheckpoint: 100, pattern: 'row' } },
  { label: 'wal_autocheckpoint 10000', cfg: { ...BARE_SQLITE, autocheckpoint: 10000, pattern: 'row' } },
  {
    label: 'a fresh log: the first commits after a start (the log grows)',
    cfg: { ...BARE_SQLITE, pattern: 'row' },
    freshLog: true,
  },
  {
    label: "the agent's pattern (+ history row, + ack stamp commit), 4096",
    cfg: { ...BARE_SQLITE, pattern: 'agent' },
  },
  {
    label: "the agent's pattern, page_size 1024",
    cfg: { ...BARE_SQLITE, pageSize: 1024, pattern: 'agent' },
  },
];

/** Target: the agent writes at most this many times the bare loop's bytes per change. */
export const FLASH_TARGET_FACTOR = 2;

export interface FlashSectionOptions extends FlashPattern {
  settings: boolean;
  dir: string | undefined;
}

const kb = (bytes: number | undefined) => (bytes === undefined ? '–' : `${round(bytes / 1024)} KiB`);

/**
 * The whole flash section: the place, the bare baseline, the agent one at a time and in a burst, the same bare
 * loop again (so that a drift of the machine shows), and with `settings` the bare loop's variations. Returns the
 * rows for the table, the JSON for the last line, and whether the target was met.
 */
export async function flashSection(
  opts: FlashSectionOptions,
  agent: Omit<FlashAgentOptions, keyof FlashPattern>,
  tmp: string,
  cleanup: Cleanup,
): Promise<{ rows: Row[]; settingsRows: Row[]; json: Record<string, unknown>; met: boolean }> {
  const place = prepareFlashPlace({ dir: opts.dir, tmp }, cleanup);
  console.log(`flash: databases on ${place.describe}`);
  // Enough warm-up that the log has been checkpointed and is written over (see BareFlashConfig.warmup).
  const warmupFor = (autocheckpoint: number) => Math.max(opts.warmup, autocheckpoint + 100);
  const bareCfg = {
    ...BARE_SQLITE,
    pattern: 'row' as const,
    changes: opts.changes,
    names: opts.names,
    warmup: warmupFor(BARE_SQLITE.autocheckpoint),
    paceMs: opts.paceMs,
  };
  const bareBefore = await measureBare(place, bareCfg, cleanup);
  const a = await measureAgent(
    place,
    {
      ...agent,
      changes: opts.changes,
      warmup: opts.warmup,
      paceMs: opts.paceMs,
      burst: opts.burst,
      window: opts.window,
      names: opts.names,
    },
    cleanup,
  );
  const bareAfter = await measureBare(place, bareCfg, cleanup);
  // The smaller bare figure is the baseline: the ratio is then the stricter one.
  const bare = bareBefore.perChange <= bareAfter.perChange ? bareBefore : bareAfter;
  const ratios = {
    oneByOne: a.oneByOne.perChange / bare.perChange,
    burst: a.burst.perChange / bare.perChange,
    oneByOneDevice: devRatio(a.oneByOne, bare),
    burstDevice: devRatio(a.burst, bare),
  };
  const within = (r: number | undefined) => r === undefined || r <= FLASH_TARGET_FACTOR;
  const met = Object.values(ratios).every(within);
  const dev = (f: FlashFigure) => (f.devicePerChange === undefined ? '' : `; device ${kb(f.devicePerChange)}`);
  const target = `≤ ${FLASH_TARGET_FACTOR} × bare`;
  const row = (figure: string, agentB: number | undefined, bareB: number | undefined, r: number | undefined): Row => ({
    figure,
    measured: kb(agentB),
    baseline: `${kb(bareB)} bare`,
    ratio: r === undefined ? '' : String(round(r)),
    target,
    met: within(r),
  });
  const one = `one at a time (${opts.changes}, ${opts.paceMs} ms apart)`;
  const burst = `burst (${opts.burst}, window ${opts.window})`;
  const rows: Row[] = [
    row(`flash bytes/change, ${one}: write_bytes`, a.oneByOne.perChange, bare.perChange, ratios.oneByOne),
    ...(ratios.oneByOneDevice === undefined
      ? []
      : [
          row(
            `flash bytes/change, ${one}: ${place.device}`,
            a.oneByOne.devicePerChange,
            bare.devicePerChange,
            ratios.oneByOneDevice,
          ),
        ]),
    row(`flash bytes/change, ${burst}: write_bytes`, a.burst.perChange, bare.perChange, ratios.burst),
    ...(ratios.burstDevice === undefined
      ? []
      : [
          row(
            `flash bytes/change, ${burst}: ${place.device}`,
            a.burst.devicePerChange,
            bare.devicePerChange,
            ratios.burstDevice,
          ),
        ]),
  ];
  const settings: Array<{ label: string; perChange: number; devicePerChange: number | undefined; ratio: number }> = [];
  const settingsRows: Row[] = [];
  if (opts.settings) {
    for (const s of FLASH_SETTINGS) {
      const warmup = s.freshLog ? 0 : warmupFor(s.cfg.autocheckpoint);
      const f = await measureBare(
        place,
        { ...s.cfg, changes: opts.changes, names: opts.names, warmup, paceMs: opts.paceMs },
        cleanup,
      );
      const r = f.perChange / bare.perChange;
      settings.push({
        label: s.label,
        perChange: round(f.perChange),
        devicePerChange: round(f.devicePerChange ?? NaN),
        ratio: round(r),
      });
      settingsRows.push({
        figure: s.label,
        measured: kb(f.perChange) + dev(f),
        baseline: `${kb(bare.perChange)} bare`,
        ratio: String(round(r)),
        target: '(reported)',
        met: undefined,
      });
    }
  }
  const fig = (f: FlashFigure) => ({
    changes: f.changes,
    writeBytesPerChange: round(f.perChange),
    devicePerChange: f.devicePerChange === undefined ? null : round(f.devicePerChange),
    ms: round(f.ms),
  });
  return {
    rows,
    settingsRows,
    met,
    json: {
      place: place.describe,
      device: place.device ?? null,
      names: opts.names,
      bareSqlite: BARE_SQLITE,
      agentPageSize: a.pageSize,
      agentOneByOne: fig(a.oneByOne),
      agentBurst: fig(a.burst),
      bare: fig(bare),
      bareRuns: [fig(bareBefore), fig(bareAfter)],
      paceMs: opts.paceMs,
      ratio: round(ratios.oneByOne),
      deviceRatio: ratios.oneByOneDevice === undefined ? null : round(ratios.oneByOneDevice),
      burstRatio: round(ratios.burst),
      burstDeviceRatio: ratios.burstDevice === undefined ? null : round(ratios.burstDevice),
      agentDbBytes: a.dbBytes,
      settings,
      targetFactor: FLASH_TARGET_FACTOR,
      met,
    },
  };
}
