/**
 * The parts of the fleet benchmark's scenarios b and c besides the bridges (bench/README.md, "fleet"): a database
 * of its own on a PostgreSQL server, made and dropped by the benchmark; the CPU that server's processes spend for
 * it; and a private Mosquitto sized for the fleet.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { freePort } from '../../test/support/brokers.js';
import { databaseUrl, dropDatabase, onServer, quoteIdent as quote } from '../../test/support/pg-server.js';
import type { Cleanup } from './cleanup.js';
import { canConnect, readCpuMs, stopChild } from './processes.js';

/** The machine's server, trust auth for local TCP (as the tests use it: test/support/postgres.ts). */
export const DEFAULT_SERVER_URL = 'postgres://postgres@127.0.0.1:5432/postgres';

export interface BenchDatabase {
  name: string;
  url: string;
  /** The server's main process, whose children are its backends and background processes (Linux). */
  postmasterPid: number | undefined;
  drop(): Promise<void>;
}

/** The parent process id, from `/proc/<pid>/stat`. */
function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return undefined;
  }
}

/**
 * An empty database `devcloud_bench_<bench>_<random>` on the server of `serverUrl`; dropped by cleanup too. The
 * live and rules benchmarks make their databases here as well (`bench` `live`, `rules`).
 */
export async function createBenchDatabase(
  serverUrl: string,
  cleanup: Cleanup,
  bench: 'fleet' | 'live' | 'rules' = 'fleet',
): Promise<BenchDatabase> {
  const name = `devcloud_bench_${bench}_${randomBytes(4).toString('hex')}`;
  const postmaster = await onServer(serverUrl, async (c) => {
    await c.query(`CREATE DATABASE ${quote(name)}`);
    const pid = (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]?.pid;
    // While the connection is open: its backend exits with it.
    return pid === undefined ? undefined : parentOf(pid);
  });
  // The server's processes are visible only when it runs on this machine.
  const local = ['127.0.0.1', 'localhost', '::1', '[::1]', ''].includes(new URL(serverUrl).hostname);
  let dropped = false;
  const drop = async () => {
    if (dropped) return;
    dropped = true;
    await onServer(serverUrl, (c) => dropDatabase(c, name));
  };
  cleanup.add(`drop the database ${name}`, drop);
  return {
    name,
    url: databaseUrl(serverUrl, name),
    postmasterPid: local ? postmaster : undefined,
    drop,
  };
}

/** Background processes of the server that work for every database (WAL, checkpoints, vacuum). */
const BACKGROUND =
  /^postgres: (?:\S+ )?(checkpointer|background writer|walwriter|autovacuum launcher|logical replication launcher)/;

/**
 * CPU time of the PostgreSQL server's processes that work for one database, approximately: the children of the
 * postmaster whose command line (`postgres: user database host(port) state`, or `autovacuum worker database`)
 * names the database, and the background processes shared by every database (WAL writer, checkpointer, background
 * writer, the launchers). Backends of other databases are left out. Sampled every 250 ms so that a backend that
 * ends (the pool closes idle connections) loses at most its last quarter second.
 */
export class PostgresCpu {
  private readonly last = new Map<number, number>();
  private total = 0;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly postmasterPid: number,
    private readonly database: string,
  ) {
    this.sample(true);
    this.timer = setInterval(() => this.sample(false), 250);
    this.timer.unref();
  }

  private pids(): number[] {
    const out: number[] = [];
    for (const entry of readdirSync('/proc')) {
      const pid = Number(entry);
      if (!Number.isInteger(pid) || parentOf(pid) !== this.postmasterPid) continue;
      let cmdline: string;
      try {
        cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
      } catch {
        continue;
      }
      if (BACKGROUND.test(cmdline) || cmdline.split(' ').includes(this.database)) out.push(pid);
    }
    return out;
  }

  private sample(initial: boolean): void {
    const seen = new Set<number>();
    for (const pid of this.pids()) {
      let cpu: number;
      try {
        cpu = readCpuMs(pid);
      } catch {
        continue;
      }
      seen.add(pid);
      const before = this.last.get(pid);
      // A process new since the last sample: all its CPU is new (except at the start, which is the zero).
      if (!initial) this.total += cpu - (before ?? 0);
      this.last.set(pid, cpu);
    }
    for (const pid of this.last.keys()) if (!seen.has(pid)) this.last.delete(pid);
  }

  /** CPU ms used since this object was made. */
  cpuMs(): number {
    this.sample(false);
    return this.total;
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

export interface FleetMosquitto {
  url: string;
  pid: number;
  output(): string;
  stop(): Promise<void>;
}

/**
 * A private Mosquitto for `devices` devices and the bridges: one MQTT listener on 127.0.0.1, anonymous clients,
 * no persistence, `TCP_NODELAY`, no limit on connections, QoS 1 messages in flight per client without a limit
 * (an MQTT 5 client, the bridge's link, sets its own receive maximum), and a queue per client long enough to
 * hold every device's messages of several seconds at the highest rate searched, for a bridge that falls behind.
 */
export async function startFleetMosquitto(devices: number, queued: number, cleanup: Cleanup): Promise<FleetMosquitto> {
  const dir = mkdtempSync(join(tmpdir(), 'devcloud-bench-fleet-mosq-'));
  cleanup.add('remove the Mosquitto folder', () => rmSync(dir, { recursive: true, force: true }));
  const port = await freePort();
  const conf = join(dir, 'mosquitto.conf');
  writeFileSync(
    conf,
    [
      `# for ${devices} devices and the bridges`,
      `listener ${port} 127.0.0.1`,
      'protocol mqtt',
      'allow_anonymous true',
      'persistence false',
      'set_tcp_nodelay true',
      'max_connections -1',
      'max_inflight_messages 0',
      `max_queued_messages ${queued}`,
      'max_queued_bytes 0',
      'log_dest stderr',
      'log_type error',
      '',
    ].join('\n'),
  );
  const proc: ChildProcess = spawn('mosquitto', ['-c', conf], {
    stdio: ['ignore', 'ignore', 'pipe'],
    // Debian puts it in /usr/sbin, which a user's PATH may lack.
    env: { ...process.env, PATH: `${process.env.PATH ?? ''}:/usr/sbin:/usr/local/sbin` },
  });
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-8192)));
  const stop = () => stopChild(proc, 2000);
  cleanup.add('stop Mosquitto', stop);
  const deadline = Date.now() + 20_000;
  while (!(await canConnect(port))) {
    if (proc.exitCode !== null) throw new Error(`mosquitto exited: ${stderr}`);
    if (Date.now() > deadline) throw new Error(`mosquitto did not listen on ${port}: ${stderr}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return { url: `mqtt://127.0.0.1:${port}`, pid: proc.pid!, output: () => stderr, stop };
}

/** Busy CPU time of the whole machine so far (every core, from `/proc/stat`), ms. */
export function machineBusyMs(): number {
  const first = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!;
  const f = first.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal ...
  const busy = f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + f[7]!;
  return (busy * 1000) / USER_HZ;
}

/** `/proc/stat` counts in USER_HZ, 100 on Linux whatever the kernel's tick. */
const USER_HZ = 100;
