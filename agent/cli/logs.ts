/**
 * `devcloud-agent logs`: the agent's journal (or a file of its JSON lines) as one readable line per event,
 * filtered by event, device, command or firmware job. Lines that are not JSON (a crash's stack trace, a message
 * from node itself) are printed as they are, whatever the filters.
 */
import { spawn } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';

interface Out {
  out: (s: string) => void;
  err: (s: string) => void;
}

const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

export const LOGS_USAGE = `Usage: devcloud-agent logs [options]

Reads the journal of the devcloud-agent unit (journalctl -u devcloud-agent -o cat -f) and prints each line as
  TIME LEVEL EVENT key=value ...

Options:
  --no-follow        print what is there and stop (default: follow)
  --since TIME       from this time on (journalctl's --since: "1 hour ago", "2026-01-01 10:00")
  -n N, --lines N    start with the last N lines of the journal (default 10 when following, all otherwise)
  --unit NAME        the systemd unit (default devcloud-agent)
  --file PATH        read JSON lines from PATH instead of the journal; - for standard input
  --event PREFIX     only events whose name starts with PREFIX (e.g. cmd. or mqtt.connected)
  --device ID        only lines about this device
  --cmd UUID         only lines about this command
  --job UUID         only lines about this firmware job
  --level LEVEL      only lines at LEVEL or above (trace, debug, info, warn, error, fatal)
  --json             print the matching lines as they are (JSON)
`;

const LEVELS: Record<string, number> = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60 };

/** Fields every line carries, or that the line's head already shows. */
const HEAD_FIELDS = new Set(['time', 'level', 'event', 'service', 'deviceId', 'pid', 'hostname']);

export interface LogFilter {
  event?: string;
  device?: string;
  cmd?: string;
  job?: string;
  minLevel?: number;
}

interface LogsArgs {
  follow: boolean;
  since?: string;
  lines?: number;
  unit: string;
  file?: string;
  json: boolean;
  filter: LogFilter;
}

function parseLogsArgs(argv: string[]): LogsArgs | string {
  const a: LogsArgs = { follow: true, unit: 'devcloud-agent', json: false, filter: {} };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1;
    const name = eq >= 0 ? arg.slice(0, eq) : arg;
    const value = (): string | undefined => (eq >= 0 ? arg.slice(eq + 1) : argv[++i]);
    const need = (): string => {
      const v = value();
      if (v === undefined || v === '') throw new Error(`${name} needs a value`);
      return v;
    };
    try {
      switch (name) {
        case '--no-follow':
          a.follow = false;
          break;
        case '--follow':
        case '-f':
          a.follow = true;
          break;
        case '--json':
          a.json = true;
          break;
        case '--since':
          a.since = need();
          break;
        case '-n':
        case '--lines': {
          const v = need();
          if (!/^\d{1,7}$/.test(v)) return `${name} needs a whole number`;
          a.lines = Number(v);
          break;
        }
        case '--unit':
          a.unit = need();
          break;
        case '--file':
          a.file = need();
          break;
        case '--event':
          a.filter.event = need();
          break;
        case '--device':
          a.filter.device = need();
          break;
        case '--cmd':
          a.filter.cmd = need();
          break;
        case '--job':
          a.filter.job = need();
          break;
        case '--level': {
          const v = need();
          if (LEVELS[v] === undefined) return `--level needs one of ${Object.keys(LEVELS).join(', ')}`;
          a.filter.minLevel = LEVELS[v];
          break;
        }
        default:
          return `logs: unknown argument ${arg}`;
      }
    } catch (err) {
      return (err as Error).message;
    }
  }
  return a;
}

/** Whether a parsed line passes the filters (the agent and the bridge name the ids the same way). */
export function matches(rec: Record<string, unknown>, f: LogFilter): boolean {
  if (f.event !== undefined && !(typeof rec.event === 'string' && rec.event.startsWith(f.event))) return false;
  if (f.device !== undefined && rec.deviceId !== f.device) return false;
  if (f.cmd !== undefined && rec.cmd !== f.cmd) return false;
  if (f.job !== undefined && rec.job !== f.job) return false;
  if (f.minLevel !== undefined) {
    const level = typeof rec.level === 'number' ? rec.level : LEVELS[String(rec.level)];
    if (level === undefined || level < f.minLevel) return false;
  }
  return true;
}

/** `key=value` pairs; values with spaces, quotes or `=` are quoted as JSON, objects are JSON. */
export function formatFields(fields: Record<string, unknown>): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(fields)) {
    if (v === undefined) continue;
    let text: string;
    if (typeof v === 'string') text = v === '' || /[\s"=\\]/.test(v) ? JSON.stringify(v) : v;
    else text = JSON.stringify(v);
    parts.push(`${k}=${text}`);
  }
  return parts.join(' ');
}

function levelName(level: unknown): string {
  if (typeof level === 'number') {
    const name = Object.entries(LEVELS).find(([, n]) => n === level)?.[0];
    return name ?? String(level);
  }
  return typeof level === 'string' ? level : '?';
}

/** `2026-11-22 07:47:33.182 WARN  mqtt.error url=mqtt://... err="..."` */
export function formatLine(rec: Record<string, unknown>): string {
  const time =
    typeof rec.time === 'string'
      ? rec.time.replace('T', ' ').replace(/Z$/, '')
      : new Date(Number(rec.time)).toISOString();
  const rest: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(rec)) if (!HEAD_FIELDS.has(k)) rest[k] = v;
  const fields = formatFields(rest);
  const event = typeof rec.event === 'string' ? rec.event : '-';
  return `${time} ${levelName(rec.level).toUpperCase().padEnd(5)} ${event}${fields ? ` ${fields}` : ''}`;
}

function parse(line: string): Record<string, unknown> | undefined {
  if (!line.startsWith('{')) return undefined;
  try {
    const v = JSON.parse(line) as unknown;
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** Prints the lines of `input` that pass; with `last`, only the last that many printed lines, at the end. */
async function pump(input: Readable, a: LogsArgs, io: Out, last?: number): Promise<void> {
  const tail: string[] = [];
  const emit = (s: string) => {
    if (last === undefined) io.out(s);
    else {
      tail.push(s);
      if (tail.length > last) tail.shift();
    }
  };
  for await (const line of createInterface({ input, crlfDelay: Infinity })) {
    if (line === '') continue;
    const rec = parse(line);
    if (rec === undefined) emit(line);
    else if (matches(rec, a.filter)) emit(a.json ? line : formatLine(rec));
  }
  for (const s of tail) io.out(s);
}

export async function logsCommand(argv: string[], io: Out, stdin: Readable = process.stdin): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.out(LOGS_USAGE);
    return EXIT.ok;
  }
  const a = parseLogsArgs(argv);
  if (typeof a === 'string') {
    io.err(`devcloud-agent: ${a}`);
    io.err('Run devcloud-agent logs --help for usage.');
    return EXIT.usage;
  }
  if (a.file !== undefined) {
    if (a.since !== undefined) {
      io.err('devcloud-agent: --since works on the journal only, not with --file');
      return EXIT.usage;
    }
    const input = a.file === '-' ? stdin : createReadStream(a.file);
    try {
      await pump(input, a, io, a.lines);
    } catch (err) {
      io.err(`devcloud-agent: cannot read ${a.file}: ${(err as Error).message}`);
      return EXIT.failed;
    }
    return EXIT.ok;
  }
  return journal(a, io);
}

async function journal(a: LogsArgs, io: Out): Promise<number> {
  const args = ['-u', a.unit, '-o', 'cat', '--no-pager'];
  if (a.follow) args.push('-f');
  if (a.since !== undefined) args.push('--since', a.since);
  if (a.lines !== undefined) args.push('-n', String(a.lines));
  const child = spawn('journalctl', args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const spawned = new Promise<NodeJS.ErrnoException | undefined>((resolve) => {
    child.once('spawn', () => resolve(undefined));
    child.once('error', (err) => resolve(err));
  });
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  const failed = await spawned;
  if (failed) {
    io.err(
      `devcloud-agent: cannot run journalctl (${failed.code ?? failed.message}); read a saved log with --file PATH`,
    );
    return EXIT.failed;
  }
  // Ctrl-C reaches journalctl too (same process group); ending with it is the normal way out of --follow.
  const onSigint = () => child.kill('SIGINT');
  process.once('SIGINT', onSigint);
  try {
    await pump(child.stdout, a, io);
    const code = await exited;
    return code === 0 || code === null || a.follow ? EXIT.ok : EXIT.failed;
  } finally {
    process.off('SIGINT', onSigint);
  }
}
