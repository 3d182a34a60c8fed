/**
 * The checks the benchmarks' option parsers share: each failure is a `UsageError` that ends with the benchmark's
 * usage text, which the dispatcher prints before exiting 2.
 */
import { UsageError } from './cleanup.js';

/** A reader of whole-number options of at least `min`. */
export function intOption(usage: string): (key: string, text: string, min: number) => number {
  return (key, text, min) => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < min)
      throw new UsageError(`--${key} must be an integer of at least ${min}\n${usage}`);
    return n;
  };
}

export function checkLogLevel(level: string, usage: string): void {
  if (!['fatal', 'error', 'warn', 'info', 'debug', 'trace'].includes(level)) {
    throw new UsageError(`--log-level fatal|error|warn|info|debug|trace\n${usage}`);
  }
}

/** `--engine`, by default PostgreSQL when `--database-url` is given; `--database-url` is refused with SQLite. */
export function storeEngine(
  engine: string | undefined,
  databaseUrl: string | undefined,
  usage: string,
): 'sqlite' | 'postgres' {
  const e = engine ?? (databaseUrl === undefined ? 'sqlite' : 'postgres');
  if (e !== 'sqlite' && e !== 'postgres') throw new UsageError(`--engine sqlite|postgres\n${usage}`);
  if (e === 'sqlite' && databaseUrl !== undefined) {
    throw new UsageError(`--database-url is for --engine postgres\n${usage}`);
  }
  return e;
}
