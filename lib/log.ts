/**
 * Logging for field engineers (docs/decisions.md, principle 10): pino JSON lines on stdout for journald, one `event` name
 * on every line, secrets redacted. Human-readable when stdout is a terminal.
 */
import { createRequire } from 'node:module';
import { pino, type Logger } from 'pino';
import { z } from 'zod';
import type { OptionSpec } from './config.js';
import type PinoPretty from 'pino-pretty';

export type { Logger } from 'pino';

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The `log` section of a program's config: the level and when to print for people rather than journald. */
export const LogConfigSchema = z
  .object({
    level: z.enum(LOG_LEVELS).default('info'),
    pretty: z.enum(['auto', 'always', 'never']).default('auto'),
  })
  .strict()
  .prefault({});

/**
 * Keys whose values never reach a log, wherever they appear (top level or one object down). Authcodes are
 * capabilities too; code that logs one logs {@link redactCode} of it instead.
 */
export const REDACT_PATHS = [
  'password',
  'secret',
  'token',
  'sid',
  'cookie',
  'authorization',
  'authcode',
  '*.password',
  '*.secret',
  '*.token',
  '*.sid',
  '*.cookie',
  '*.authorization',
  '*.authcode',
  'req.headers.cookie',
  'req.headers.authorization',
];

/** The log settings every program takes from flags and the environment. */
export const LOG_OPTIONS: readonly OptionSpec[] = [
  {
    key: 'log.level',
    flag: '--log-level',
    env: 'DEVCLOUD_LOG_LEVEL',
    kind: 'string',
    arg: 'LEVEL',
    help: 'fatal, error, warn, info, debug, trace or silent',
  },
  {
    key: 'log.pretty',
    flag: '--log-pretty',
    env: 'DEVCLOUD_LOG_PRETTY',
    kind: 'string',
    arg: 'WHEN',
    help: 'auto, always or never',
  },
];

export interface LogOptions {
  level: LogLevel;
  /** `auto`: pretty when stdout is a terminal. */
  pretty: 'auto' | 'always' | 'never';
  /** Fields bound to every line (service name, device id). */
  base: Record<string, unknown>;
  /** Where JSON lines go; stdout by default. Tests pass a stream to read the lines back. */
  destination?: NodeJS.WritableStream;
}

export function createLogger(options: LogOptions): Logger {
  const usePretty = options.pretty === 'always' || (options.pretty === 'auto' && process.stdout.isTTY === true);
  const opts = {
    level: options.level,
    base: options.base,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
  };
  let dest: pino.DestinationStream;
  if (options.destination) dest = options.destination;
  else if (usePretty) {
    // Loaded only for a terminal: a gateway logging to journald never pays for it. A plain require('...') call,
    // so that scripts/deps-closure.ts sees the package.
    const require = createRequire(import.meta.url);
    const pretty = require('pino-pretty') as typeof PinoPretty;
    dest = pretty({
      sync: true,
      colorize: true,
      singleLine: true,
      translateTime: 'SYS:HH:MM:ss.l',
      // One line per event, its name first: what a field engineer scans for.
      messageFormat: '{event}',
      ignore: 'pid,hostname,service,event',
    });
  } else {
    // Synchronous writes: a line logged just before a crash still reaches the journal.
    dest = pino.destination({ dest: 1, sync: true });
  }
  // Warnings and errors are also kept in a small ring, as written (redacted), for `devcloud-agent status`. The
  // main stream takes every level: the logger's own level decides what is written.
  const ring = new ProblemRing(PROBLEM_RING_SIZE);
  const log = pino(
    opts,
    pino.multistream([
      { level: 'trace', stream: dest },
      { level: 'warn', stream: ring },
    ]),
  );
  rings.set(log, ring);
  return log;
}

/**
 * A warning or error as it was logged, without the fields every line carries. The same line logged again right
 * after (a broker that keeps refusing) counts up `count` and moves `last`, rather than pushing others out.
 */
export interface LoggedProblem {
  time: string;
  level: string;
  event: string;
  fields: Record<string, unknown>;
  count: number;
  last: string;
}

const PROBLEM_RING_SIZE = 10;
/** Longer strings are cut in the ring: a problem line names what went wrong, the journal has the rest. */
const PROBLEM_TEXT_MAX = 300;
const rings = new WeakMap<Logger, ProblemRing>();

class ProblemRing {
  private readonly items: LoggedProblem[] = [];
  constructor(private readonly size: number) {}

  write(line: string): void {
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return;
    }
    const { time, level, event, service: _s, deviceId: _d, pid: _p, hostname: _h, ...rest } = rec;
    const fields: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(rest)) {
      const text = typeof v === 'string' ? v : JSON.stringify(v);
      fields[k] = text.length > PROBLEM_TEXT_MAX ? `${text.slice(0, PROBLEM_TEXT_MAX)}…` : v;
    }
    const entry = { time: String(time), level: String(level), event: typeof event === 'string' ? event : '', fields };
    const prev = this.items.at(-1);
    if (
      prev &&
      prev.event === entry.event &&
      prev.level === entry.level &&
      JSON.stringify(prev.fields) === JSON.stringify(fields)
    ) {
      prev.count++;
      prev.last = entry.time;
      return;
    }
    this.items.push({ ...entry, count: 1, last: entry.time });
    if (this.items.length > this.size) this.items.shift();
  }

  list(): LoggedProblem[] {
    return this.items.map((p) => ({ ...p }));
  }
}

/** The latest warnings and errors (at most 10, oldest first) of a logger made by {@link createLogger}. */
export function recentProblems(log: Logger): LoggedProblem[] {
  return rings.get(log)?.list() ?? [];
}

/** The first characters of a code, enough to tell codes apart in a log without revealing one. */
export function redactCode(code: string): string {
  return code.length <= 6 ? '…' : `${code.slice(0, 6)}…`;
}
