/**
 * Logging for field engineers (STYLE principle 10): pino JSON lines on stdout for journald, one `event` name
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
  if (options.destination) return pino(opts, options.destination);
  if (usePretty) {
    // Loaded only for a terminal: a gateway logging to journald never pays for it.
    const pretty = createRequire(import.meta.url)('pino-pretty') as typeof PinoPretty;
    return pino(
      opts,
      pretty({
        sync: true,
        colorize: true,
        singleLine: true,
        translateTime: 'SYS:HH:MM:ss.l',
        // One line per event, its name first: what a field engineer scans for.
        messageFormat: '{event}',
        ignore: 'pid,hostname,service,event',
      }),
    );
  }
  // Synchronous writes: a line logged just before a crash still reaches the journal.
  return pino(opts, pino.destination({ dest: 1, sync: true }));
}

/** The first characters of a code, enough to tell codes apart in a log without revealing one. */
export function redactCode(code: string): string {
  return code.length <= 6 ? '…' : `${code.slice(0, 6)}…`;
}
