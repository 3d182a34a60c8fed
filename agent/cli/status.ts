/**
 * `devcloud-agent status` for people, and the state directory read directly when no agent answers on the socket
 * (for `status` and `queue`): identity, pending changes, the command queue and the firmware job are all on disk.
 */
import { accessSync, constants, existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type LoggedProblem, createLogger } from '../../lib/log.js';
import { openDatabase, type Db } from '../../lib/sqlite.js';
import { VERSION } from '../../lib/version.js';
import { commandJson } from '../agent.js';
import { CommandQueue } from '../commands/queue.js';
import { type AgentConfig, clientSocketPath } from '../config.js';
import { updaterFor } from '../fw/updater.js';
import { Identity, identityPath } from '../identity.js';
import { LocalClient } from '../local/client.js';
import type { QueueJson } from '../local/messages.js';
import { AGENT_MIGRATIONS } from '../migrations.js';
import { VarStore } from '../vars/store.js';
import { withCode } from './fw.js';
import { formatFields } from './logs.js';

interface Out {
  out: (s: string) => void;
  err: (s: string) => void;
}

const EXIT = { ok: 0, failed: 1, usage: 2, unreachable: 3 } as const;

type Json = Record<string, unknown>;

/** What the state directory tells without the agent; `problems` says what could not be read. */
export interface OfflineState {
  running: false;
  socket: string;
  /** The socket is there but this user may not connect: the agent may well be running. */
  socketDenied: boolean;
  stateDir: string;
  deviceId: string | null;
  authcodePrefix: string | null;
  platform: string;
  fwVersion: string;
  version: string;
  broker: string;
  mode: string | null;
  pending: { pushes: number; syncs: number } | null;
  commands: { queue: Record<string, number> } | null;
  firmware: Json | null;
  problems: string[];
}

/** Connects to the running agent, or resolves undefined when nothing answers on its socket. */
export async function tryConnect(config: AgentConfig, env: NodeJS.ProcessEnv): Promise<LocalClient | undefined> {
  try {
    return await LocalClient.connect(clientSocketPath(config, env));
  } catch {
    return undefined;
  }
}

/** Whether the socket is there but this user may not connect to it (not root, not in the agent's group). */
export function socketDenied(config: AgentConfig, env: NodeJS.ProcessEnv): boolean {
  try {
    accessSync(clientSocketPath(config, env), constants.W_OK);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EACCES';
  }
}

/** Opens the agent's database when there is one; `fn` runs with it open. */
function withStateDb<T>(config: AgentConfig, fn: (db: Db) => T): T | string {
  const path = join(config.stateDir, 'agent.db');
  if (!existsSync(path)) return `no database in ${config.stateDir}`;
  let db: Db;
  try {
    db = openDatabase(path, AGENT_MIGRATIONS);
  } catch (err) {
    return `cannot open ${path}: ${(err as Error).message} (run as root or as the agent's user)`;
  }
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

function safeBroker(url: string): string {
  try {
    const u = new URL(url);
    u.username = '';
    u.password = '';
    return u.toString().replace(/\/$/, '');
  } catch {
    return url;
  }
}

/** Reads what it can; never throws on a missing or unreadable part. */
export function readOfflineState(config: AgentConfig, env: NodeJS.ProcessEnv): OfflineState {
  const s: OfflineState = {
    running: false,
    socket: clientSocketPath(config, env),
    socketDenied: socketDenied(config, env),
    stateDir: config.stateDir,
    deviceId: null,
    authcodePrefix: null,
    platform: config.platform,
    fwVersion: config.fwVersion,
    version: VERSION,
    broker: safeBroker(config.mqtt.url),
    mode: null,
    pending: null,
    commands: null,
    firmware: null,
    problems: [],
  };
  if (!existsSync(config.stateDir)) {
    s.problems.push(`the state directory ${config.stateDir} does not exist (the agent has never run here)`);
    return s;
  }
  const idFile = identityPath(config.stateDir);
  try {
    const id = Identity.parse(JSON.parse(readFileSync(idFile, 'utf8')));
    s.deviceId = id.deviceId;
    s.authcodePrefix = id.authcode.slice(0, 6);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    s.problems.push(
      code === 'ENOENT'
        ? `no identity yet (${idFile})`
        : code === 'EACCES'
          ? `cannot read ${idFile} (run as root or as the agent's user)`
          : `${idFile} is not a valid identity file`,
    );
  }
  const r = withStateDb(config, (db) => {
    s.pending = new VarStore(db, config.store.historyLimit).pendingCounts();
    s.mode = new VarStore(db, config.store.historyLimit).get('d', 'mode')?.value?.toString('utf8') ?? 'master';
    s.commands = { queue: new CommandQueue(db).counts() };
    s.firmware = updaterFor(config, {
      db,
      reporter: { publish: () => false, connected: false },
      restartAgent: () => undefined,
      log: createLogger({ level: 'silent', pretty: 'never', base: {}, destination: process.stderr }),
      now: Date.now,
    }).status();
  });
  if (typeof r === 'string') s.problems.push(r);
  return s;
}

/** The `queue` answer read from the database, for when the agent is not running. */
export function readOfflineQueue(config: AgentConfig, recent: number): QueueJson | string {
  return withStateDb(config, (db) => {
    const q = new CommandQueue(db);
    return {
      running: q.running().map(commandJson),
      queued: q.queued().map(commandJson),
      recent: q.recent(recent).map(commandJson),
    };
  });
}

export async function statusCommand(
  config: AgentConfig,
  env: NodeJS.ProcessEnv,
  json: boolean,
  io: Out,
): Promise<number> {
  const client = await tryConnect(config, env);
  if (client) {
    let status: Json;
    try {
      status = await client.status();
    } catch (err) {
      io.err(`devcloud-agent: ${(err as Error).message}`);
      return EXIT.failed;
    } finally {
      client.close();
    }
    if (json) io.out(JSON.stringify(status, null, 2));
    else printRunning(status, io);
    return EXIT.ok;
  }
  const s = readOfflineState(config, env);
  if (json) io.out(JSON.stringify(s, null, 2));
  else printOffline(s, io);
  // Not running is what a script asks `status` about: the same status as every command that needs the agent.
  return EXIT.unreachable;
}

/** The cloud's clock as the agent knows it (docs/sync.md#clocks). */
function clockText(c: Json | undefined): string {
  if (!c || typeof c.offsetMs !== 'number') return "the gateway's own (the cloud's not learnt yet)";
  const off = c.offsetMs;
  const sign = off <= -1000 ? '-' : '+';
  const from = c.source === 'saved' ? 'saved earlier in this boot' : 'learnt';
  return `the cloud's: ${sign}${duration(Math.abs(off))} from the gateway's own, ${from} ${duration(Number(c.ageMs ?? 0))} ago`;
}

function duration(ms: number): string {
  const s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d}d ${h}h`;
  if (h > 0) return `${h}h ${m}m`;
  if (m > 0) return `${m}m ${s % 60}s`;
  return `${s}s`;
}

function counts(c: Record<string, unknown> | null | undefined, order: string[]): string {
  if (!c) return '?';
  const keys = [...order, ...Object.keys(c).filter((k) => !order.includes(k))];
  return keys.map((k) => `${Number(c[k] ?? 0)} ${k}`).join(', ');
}

const QUEUE_ORDER = ['queued', 'running', 'done', 'failed', 'expired'];

/** Text of a status field: strings as they are, anything else as JSON. */
function str(v: unknown): string {
  return typeof v === 'string' ? v : JSON.stringify(v);
}

function row(io: Out, label: string, value: string): void {
  io.out(`  ${label.padEnd(12)} ${value}`);
}

function authcodeText(prefix: unknown): string {
  return typeof prefix === 'string' ? `${prefix}… (first 6 characters; the code itself is in identity.json)` : '?';
}

function printFirmware(fw: Json | null, io: Out): void {
  io.out('firmware');
  if (!fw) {
    row(io, 'state', '?');
    return;
  }
  row(io, 'state', String(fw.state));
  row(io, 'version', `${String(fw.version)} (running)`);
  const slots = fw.slotsDir ? `, active slot ${str(fw.activeSlot ?? 'none')} in ${str(fw.slotsDir)}` : '';
  row(io, 'installer', `${String(fw.installer)}${slots}; restart ${String(fw.restart)}`);
  const job = fw.job as Json | null;
  if (!job) row(io, 'job', 'none received');
  else {
    row(io, 'job', `${String(job.id)}  ${String(job.name)} version ${String(job.version)}, ${String(job.progress)}%`);
    if (job.error) row(io, 'error', withCode(str(job.error), typeof job.errorCode === 'string' ? job.errorCode : ''));
  }
}

function printRunning(s: Json, io: Out): void {
  const mem = s.memory as { rss?: number } | undefined;
  const rss = mem?.rss !== undefined ? `, ${Math.round(mem.rss / 1048576)} MB resident` : '';
  io.out(`devcloud-agent: running for ${duration(Number(s.uptimeMs ?? 0))}${rss}`);
  io.out('identity');
  row(io, 'device id', String(s.deviceId));
  row(io, 'auth code', authcodeText(s.authcodePrefix));
  row(io, 'platform', String(s.platform));
  row(io, 'versions', `agent ${String(s.version)}, firmware ${String(s.fwVersion)}`);
  io.out('connection');
  row(io, 'broker', String(s.broker));
  row(io, 'state', `${String(s.state)} (${Number(s.connects ?? 0)} connects since start)`);
  row(io, 'mode', String(s.mode));
  row(io, 'clock', clockText(s.clock as Json | undefined));
  const nearby = s.nearby as Json | undefined;
  if (nearby) {
    const where = nearby.listening ? `listening on UDP ${String(nearby.port)}` : 'not listening';
    row(io, 'nearby', `${where}; ${Number(nearby.received ?? 0)} heard, ${Number(nearby.reported ?? 0)} reported`);
  }
  const pending = s.pending as { pushes: number; syncs: number } | undefined;
  io.out('sync');
  row(io, 'pending', pending ? `${pending.pushes} changes to push, ${pending.syncs} syncs` : '?');
  const cmd = s.commands as Json | undefined;
  io.out('commands');
  row(io, 'queue', counts(cmd?.queue as Json | undefined, QUEUE_ORDER));
  const { queue: _queue, pdeathsig: _pdeathsig, ...since } = cmd ?? {};
  row(io, 'since start', counts(cmd ? since : undefined, ['received', 'duplicates', 'ran', 'failed', 'expired']));
  if (typeof cmd?.pdeathsig === 'boolean') {
    row(
      io,
      'handlers',
      cmd.pdeathsig ? 'die with the agent (setpriv --pdeathsig)' : 'killed at the next start (no setpriv)',
    );
  }
  printFirmware((s.firmware as Json | undefined) ?? null, io);
  const problems = (s.lastErrors as LoggedProblem[] | undefined) ?? [];
  io.out(`last warnings and errors (${problems.length})`);
  for (const p of problems) {
    const fields = formatFields(p.fields);
    const again = p.count > 1 ? ` (${p.count} times, last ${p.last})` : '';
    io.out(`  ${p.time} ${p.level.toUpperCase().padEnd(5)} ${p.event}${fields ? ` ${fields}` : ''}${again}`);
  }
}

function printOffline(s: OfflineState, io: Out): void {
  io.out(
    s.socketDenied
      ? `devcloud-agent: may not connect to ${s.socket} (permission denied: run as root or in the agent's group); read from ${s.stateDir}`
      : `devcloud-agent: not running (nothing answers on ${s.socket}); read from ${s.stateDir}`,
  );
  io.out('identity');
  row(io, 'device id', s.deviceId ?? '?');
  row(io, 'auth code', authcodeText(s.authcodePrefix));
  row(io, 'platform', `${s.platform} (configured)`);
  row(io, 'versions', `agent ${s.version} (installed), firmware ${s.fwVersion} (configured)`);
  io.out('connection');
  row(io, 'broker', `${s.broker} (configured)`);
  row(io, 'state', 'not running');
  row(io, 'mode', s.mode ?? '?');
  io.out('sync');
  row(io, 'pending', s.pending ? `${s.pending.pushes} changes to push, ${s.pending.syncs} syncs` : '?');
  io.out('commands');
  row(io, 'queue', counts(s.commands?.queue, QUEUE_ORDER));
  printFirmware(s.firmware, io);
  for (const p of s.problems) io.out(`note: ${p}`);
  io.out(
    'last warnings and errors: journalctl -u devcloud-agent -p warning -n 20 (or devcloud-agent logs --level warn)',
  );
}
