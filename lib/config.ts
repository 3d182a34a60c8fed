/**
 * Configuration loading shared by the agent and the bridge (docs/decisions.md, principle 4).
 *
 * A config is one zod schema. Values come from a file (YAML or JSON), then `DEVCLOUD_*` environment
 * variables, then command-line flags; later sources win. Every error is reported at once with the key that is
 * wrong and where its value came from; the result is frozen and passed down.
 */
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';

/** One setting that can come from the environment or a flag. The table drives parsing, `--help` and docs. */
export interface OptionSpec {
  /** Dotted key in the config object, e.g. `mqtt.url`. */
  key: string;
  /** Long flag, e.g. `--mqtt-url`. */
  flag?: string;
  /** Environment variable, e.g. `DEVCLOUD_MQTT_URL`. */
  env?: string;
  kind: 'string' | 'int' | 'bool' | 'list';
  /** Placeholder in `--help`, e.g. `URL`. */
  arg?: string;
  help: string;
}

export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

export interface LoadInput {
  /** Option specs of this program (file path flags included). */
  options: readonly OptionSpec[];
  /** Defaults that depend on the environment (applied below the file). */
  defaults?: Record<string, unknown>;
  /** Path of the config file, if any. */
  file?: string | undefined;
  env: NodeJS.ProcessEnv;
  /** Parsed flags, keyed by option key. */
  flags: Record<string, unknown>;
}

type Plain = Record<string, unknown>;

function isPlain(v: unknown): v is Plain {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function setPath(target: Plain, key: string, value: unknown): void {
  const parts = key.split('.');
  let node = target;
  for (const part of parts.slice(0, -1)) {
    const next = node[part];
    if (!isPlain(next)) node[part] = {};
    node = node[part] as Plain;
  }
  node[parts[parts.length - 1]!] = value;
}

function deepMerge(base: Plain, over: Plain): Plain {
  const out: Plain = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const prev = out[k];
    out[k] = isPlain(prev) && isPlain(v) ? deepMerge(prev, v) : v;
  }
  return out;
}

export function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) deepFreeze(v);
  }
  return value;
}

/** Converts a string from the environment or a flag to the option's kind; leaves it as is when it does not fit. */
export function convertOption(spec: OptionSpec, raw: string): unknown {
  switch (spec.kind) {
    case 'string':
      return raw;
    case 'int':
      return /^-?\d+$/.test(raw.trim()) ? Number(raw.trim()) : raw;
    case 'bool':
      if (/^(1|true|yes|on)$/i.test(raw)) return true;
      if (/^(0|false|no|off)$/i.test(raw)) return false;
      return raw;
    case 'list':
      return raw
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s.length > 0);
  }
}

/**
 * A key written with no value (`identity:` with everything below it commented out) reads as null; it means
 * "use the defaults", so it is dropped rather than reported as the wrong type.
 */
function withoutNulls(value: Plain): Plain {
  const out: Plain = {};
  for (const [k, v] of Object.entries(value)) {
    if (v === null) continue;
    out[k] = isPlain(v) ? withoutNulls(v) : v;
  }
  return out;
}

/** Reads the config file: YAML 1.2, which also accepts JSON. */
export function readConfigFile(file: string): { value: Plain } | { problem: string } {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return { problem: `config file ${file}: cannot be read (${code ?? String(err)})` };
  }
  let parsed: unknown;
  try {
    parsed = parseYaml(text);
  } catch (err) {
    return { problem: `config file ${file}: not valid YAML or JSON (${(err as Error).message.split('\n')[0]})` };
  }
  if (parsed === null || parsed === undefined) return { value: {} };
  if (!isPlain(parsed)) return { problem: `config file ${file}: the top level must be a mapping of keys` };
  return { value: withoutNulls(parsed) };
}

/**
 * Loads, validates and freezes a config. Throws {@link ConfigError} listing every problem, each with its key and
 * the source of the value.
 */
export function loadConfig<S extends z.ZodType>(schema: S, input: LoadInput): z.infer<S> {
  const problems: string[] = [];
  const sources = new Map<string, string>();
  let merged: Plain = {};
  for (const [key, value] of Object.entries(input.defaults ?? {})) setPath(merged, key, value);

  if (input.file !== undefined) {
    const read = readConfigFile(input.file);
    if ('problem' in read) problems.push(read.problem);
    else {
      merged = deepMerge(merged, read.value);
      markSources(read.value, '', `file ${input.file}`, sources);
    }
  }

  const fromEnv: Plain = {};
  for (const spec of input.options) {
    if (spec.env === undefined) continue;
    const raw = input.env[spec.env];
    if (raw === undefined || raw === '') continue;
    setPath(fromEnv, spec.key, convertOption(spec, raw));
    sources.set(spec.key, `environment ${spec.env}`);
  }
  merged = deepMerge(merged, fromEnv);

  const fromFlags: Plain = {};
  for (const [key, value] of Object.entries(input.flags)) {
    setPath(fromFlags, key, value);
    const spec = input.options.find((o) => o.key === key);
    sources.set(key, spec?.flag !== undefined ? `flag ${spec.flag}` : `flag for ${key}`);
  }
  merged = deepMerge(merged, fromFlags);

  const parsed = schema.safeParse(merged);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) {
      const key = issue.path.map(String).join('.');
      // Unknown keys are reported one by one, with their full name.
      const keys = issue.code === 'unrecognized_keys' ? issue.keys.map((k) => (key ? `${key}.${k}` : k)) : [key];
      for (const k of keys) {
        const source = sourceOf(k, sources);
        const what = issue.code === 'unrecognized_keys' ? 'unknown key' : issue.message;
        problems.push(`${k || '(top level)'}: ${what}${source ? ` (from ${source})` : ''}`);
      }
    }
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return deepFreeze((parsed as { data: z.infer<S> }).data);
}

function markSources(value: Plain, prefix: string, source: string, out: Map<string, string>): void {
  for (const [k, v] of Object.entries(value)) {
    const key = prefix ? `${prefix}.${k}` : k;
    out.set(key, source);
    if (isPlain(v)) markSources(v, key, source, out);
  }
}

function sourceOf(key: string, sources: Map<string, string>): string | undefined {
  for (let k = key; k.length > 0; k = k.includes('.') ? k.slice(0, k.lastIndexOf('.')) : '') {
    const s = sources.get(k);
    if (s !== undefined) return s;
  }
  return undefined;
}

export interface ParsedArgs {
  /** Values keyed by option key. */
  flags: Record<string, unknown>;
  positionals: string[];
  help: boolean;
  problems: string[];
}

/**
 * Parses `--flag value` and `--flag=value` for the given options; `--help`/`-h` anywhere. Unknown flags are
 * problems, reported together with the config's own.
 */
export function parseArgs(argv: readonly string[], options: readonly OptionSpec[]): ParsedArgs {
  const out: ParsedArgs = { flags: {}, positionals: [], help: false, problems: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--help' || arg === '-h') {
      out.help = true;
      continue;
    }
    if (arg === '--') {
      out.positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!arg.startsWith('--')) {
      out.positionals.push(arg);
      continue;
    }
    const eq = arg.indexOf('=');
    const name = eq >= 0 ? arg.slice(0, eq) : arg;
    const spec = options.find((o) => o.flag === name);
    if (!spec) {
      out.problems.push(`unknown flag ${name}`);
      continue;
    }
    let raw: string | undefined;
    if (eq >= 0) raw = arg.slice(eq + 1);
    else if (spec.kind === 'bool' && (argv[i + 1] === undefined || argv[i + 1]!.startsWith('--'))) raw = 'true';
    else raw = argv[++i];
    if (raw === undefined) {
      out.problems.push(`flag ${name} needs a value`);
      continue;
    }
    const value = convertOption(spec, raw);
    if (spec.kind === 'list') {
      const prev = out.flags[spec.key];
      out.flags[spec.key] = [...(Array.isArray(prev) ? (prev as unknown[]) : []), ...(value as unknown[])];
    } else out.flags[spec.key] = value;
  }
  return out;
}

/** The options part of `--help`. */
export function formatOptions(options: readonly OptionSpec[]): string {
  const rows = options
    .filter((o) => o.flag !== undefined)
    .map((o) => [`  ${o.flag}${o.arg ? ` ${o.arg}` : ''}`, `${o.help}${o.env ? ` [${o.env}]` : ''}`] as const);
  const width = Math.max(...rows.map(([l]) => l.length)) + 2;
  return rows.map(([l, r]) => l.padEnd(width) + r).join('\n');
}
