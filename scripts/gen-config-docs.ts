/**
 * `npm run docs:config`: writes the configuration reference of docs/operations.md (between its
 * `config-reference` markers) from the zod schemas, so that it cannot drift from what the programs accept.
 * `--check` only compares, and exits 1 when the docs are stale.
 *
 * Key, type, default and range come from the schema (as JSON Schema); flags and environment variables from the
 * option lists. The meaning is the hand-written one of docs/agent.md or docs/api.md where that table has the key,
 * else the key's doc comment in the schema's source, else the option's help text.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import * as prettier from 'prettier';
import ts from 'typescript';
import { z } from 'zod';
import { AGENT_OPTIONS, AgentConfigSchema } from '../agent/config.js';
import { BRIDGE_OPTIONS, BridgeConfigSchema } from '../bridge/config.js';
import type { OptionSpec } from '../lib/config.js';

export const ROOT = resolve(import.meta.dirname, '..');
export const DOC = 'docs/operations.md';
export const START = '<!-- config-reference:start -->';
export const END = '<!-- config-reference:end -->';

interface JsonSchema {
  type?: string;
  default?: unknown;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  anyOf?: JsonSchema[];
  items?: JsonSchema;
  enum?: unknown[];
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  pattern?: string;
  format?: string;
}

interface Program {
  title: string;
  schema: z.ZodType;
  options: readonly OptionSpec[];
  /** Files whose doc comments describe the schema's keys. */
  sources: string[];
  /** The root schema's name in those files. */
  root: string;
  /** The hand-written key table: its file. */
  table: string;
  /** Defaults that are not the schema's: computed at load time, or dependent on the machine. */
  defaults: Record<string, string>;
}

const PROGRAMS: Program[] = [
  {
    title: 'Agent configuration',
    schema: AgentConfigSchema,
    options: AGENT_OPTIONS,
    sources: ['agent/config.ts', 'lib/log.ts'],
    root: 'AgentConfigSchema',
    table: 'docs/agent.md',
    defaults: { stateDir: '`$STATE_DIRECTORY` or `/var/lib/devcloud`', platform: '`linux-<arch>`, e.g. `linux-arm64`' },
  },
  {
    title: 'Bridge configuration',
    schema: BridgeConfigSchema,
    options: BRIDGE_OPTIONS,
    sources: ['bridge/config.ts', 'bridge/mail/mailer.ts', 'bridge/rules/webhook.ts', 'lib/log.ts'],
    root: 'BridgeConfigSchema',
    table: 'docs/api.md',
    defaults: { dataDir: '`$STATE_DIRECTORY` or `/var/lib/devcloud-bridge`' },
  },
];

/**
 * Every key of a JSON Schema object that takes a value, dotted, with its schema. An object is one key of its own
 * (`rateLimits.login`) when the hand-written table describes it as one.
 */
function leaves(schema: JsonSchema, whole: (key: string) => boolean, prefix = ''): Array<[string, JsonSchema]> {
  const out: Array<[string, JsonSchema]> = [];
  for (const [name, sub] of Object.entries(schema.properties ?? {})) {
    const key = prefix + name;
    if (sub.type === 'object' && sub.properties && !whole(key)) out.push(...leaves(sub, whole, `${key}.`));
    else out.push([key, sub]);
  }
  return out;
}

function typeOf(key: string, s: JsonSchema, opt?: OptionSpec): string {
  if (s.anyOf) return s.anyOf.map((a) => typeOf(key, a)).join(' or ');
  if (s.type === 'array') return 'list';
  if (s.type === 'object') return `\`{${Object.keys(s.properties ?? {}).join(', ')}}\``;
  const pathArg = ['FILE', 'DIR', 'PATH', 'EXE'].includes(opt?.arg ?? '');
  if (s.type === 'string' && s.enum === undefined && (pathArg || /(File|Dir|dir|path)$/.test(key))) return 'path';
  if (s.type === 'string' && (s.format === 'uri' || /(url|Url)$/.test(key))) return 'URL';
  return s.type ?? 'any';
}

const code = (v: unknown) => `\`${typeof v === 'string' ? v : JSON.stringify(v)}\``;

function defaultOf(s: JsonSchema): string | undefined {
  if (s.type === 'object' && s.properties) {
    const inner = Object.entries(s.properties).filter(([, v]) => v.default !== undefined);
    return `\`{${inner.map(([k, v]) => `${k}: ${JSON.stringify(v.default)}`).join(', ')}}\``;
  }
  if (s.default === undefined) return undefined;
  if (Array.isArray(s.default)) return s.default.length === 0 ? '`[]`' : `\`[${s.default.join(', ')}]\``;
  return code(s.default);
}

/** The unit a key's name promises. */
function unitOf(key: string): string {
  const name = key.split('.').pop()!;
  if (/Ms$/.test(name)) return ' ms';
  if (/Sec$/.test(name)) return ' s';
  if (/Days$/.test(name)) return ' days';
  if (/Hours$/.test(name)) return ' h';
  if (/Bytes$/.test(name) || name === 'bodyLimit') return ' bytes';
  return '';
}

function rangeOf(key: string, s: JsonSchema): string {
  if (s.anyOf) return '';
  if (s.type === 'object') {
    return Object.entries(s.properties ?? {})
      .map(([k, v]) => `${k} ${rangeOf(`${key}.${k}`, v)}`)
      .join('; ');
  }
  if (s.enum) return s.enum.map(code).join(', ');
  if (s.type === 'array' && s.items?.enum) return `each ${s.items.enum.map(code).join(', ')}`;
  const parts: string[] = [];
  if (s.minimum !== undefined || s.maximum !== undefined) {
    parts.push(`${s.minimum ?? ''}–${s.maximum ?? ''}${unitOf(key)}`);
  }
  // At least one character is what every string key asks; only other bounds are worth a word.
  if (s.maxLength !== undefined) parts.push(`${s.minLength ?? 0}–${s.maxLength} characters`);
  else if (s.minLength !== undefined && s.minLength > 1) parts.push(`at least ${s.minLength} characters`);
  if (s.pattern !== undefined) parts.push(`matches \`${s.pattern}\``);
  if (s.minItems !== undefined) parts.push(`at least ${s.minItems} item${s.minItems === 1 ? '' : 's'}`);
  return parts.join('; ');
}

/** Doc comments of schema keys, by dotted key, read from the schema's source with the TypeScript parser. */
function docComments(files: string[], root: string): Map<string, string> {
  const decls = new Map<string, ts.Node>();
  for (const file of files) {
    const sf = ts.createSourceFile(file, readFileSync(join(ROOT, file), 'utf8'), ts.ScriptTarget.Latest, true);
    sf.forEachChild((node) => {
      if (ts.isVariableStatement(node)) {
        for (const d of node.declarationList.declarations) {
          if (ts.isIdentifier(d.name) && d.initializer) decls.set(d.name.text, d.initializer);
        }
      } else if (ts.isFunctionDeclaration(node) && node.name && node.body) decls.set(node.name.text, node.body);
    });
  }
  const out = new Map<string, string>();
  const seen = new Set<ts.Node>();
  const walk = (node: ts.Node, prefix: string): void => {
    if (seen.has(node)) return;
    seen.add(node);
    if (ts.isObjectLiteralExpression(node)) {
      for (const p of node.properties) {
        if (!ts.isPropertyAssignment(p) || !(ts.isIdentifier(p.name) || ts.isStringLiteral(p.name))) continue;
        const key = prefix + p.name.text;
        const doc = ts
          .getJSDocCommentsAndTags(p)
          .map((d) => (typeof d.comment === 'string' ? d.comment : ''))
          .join(' ')
          .replace(/\s+/g, ' ')
          .trim();
        if (doc) out.set(key, doc);
        walk(p.initializer, `${key}.`);
      }
      return;
    }
    // A schema built elsewhere (`LogConfigSchema`, `limit(10, 60_000)`, `MailConfigSchema.extend(...)`): its keys
    // sit under this one.
    if (ts.isIdentifier(node)) {
      const d = decls.get(node.text);
      if (d) walk(d, prefix);
      return;
    }
    ts.forEachChild(node, (child) => walk(child, prefix));
  };
  const start = decls.get(root);
  if (!start) throw new Error(`${root} not found in ${files.join(', ')}`);
  walk(start, '');
  return out;
}

interface HandRow {
  default: string;
  meaning: string;
}

/** The hand-written "### Keys" table of a page, by key (a row may name several keys). */
function handTable(file: string): Map<string, HandRow> {
  const doc = readFileSync(join(ROOT, file), 'utf8');
  const at = doc.indexOf('\n### Keys\n');
  const out = new Map<string, HandRow>();
  if (at < 0) return out;
  const lines = doc.slice(at).split('\n');
  const first = lines.findIndex((l) => l.startsWith('|'));
  for (const line of lines.slice(first + 2)) {
    if (!line.startsWith('|')) break;
    const cells = line
      .slice(1, -1)
      .split(/(?<!\\)\|/)
      .map((c) => c.trim());
    // Links within that page must still lead there from docs/operations.md.
    const here = (c: string) => c.replace(/\]\(#/g, `](${basename(file)}#`);
    const row = { default: here(cells[2] ?? ''), meaning: here(cells.at(-1) ?? '') };
    for (const m of (cells[0] ?? '').matchAll(/`([^`]+)`/g)) out.set(m[1]!, row);
  }
  return out;
}

const cell = (s: string) => s.replace(/(?<!\\)\|/g, '\\|').replace(/\n/g, ' ');

function table(p: Program): string {
  const schema = z.toJSONSchema(p.schema, { io: 'input', unrepresentable: 'any' }) as JsonSchema;
  const docs = docComments(p.sources, p.root);
  const hand = handTable(p.table);
  const rows = leaves(schema, (key) => hand.has(key)).map(([key, s]) => {
    const opt = p.options.find((o) => o.key === key);
    const given = [opt?.flag && `\`${opt.flag}${opt.arg ? ` ${opt.arg}` : ''}\``, opt?.env && `\`${opt.env}\``];
    const meaning = hand.get(key)?.meaning || docs.get(key) || opt?.help || '';
    const dflt = p.defaults[key] ?? defaultOf(s) ?? (hand.get(key)?.default || 'none');
    return [`\`${key}\``, typeOf(key, s, opt), dflt, rangeOf(key, s), given.filter(Boolean).join(', '), meaning].map(
      cell,
    );
  });
  const head = ['Key', 'Type', 'Default', 'Range', 'Flag, environment', 'Meaning'];
  return [head, head.map(() => '-'), ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n');
}

/** The generated reference, as it stands between the markers (Prettier-formatted, like the rest of the docs). */
export async function configReference(): Promise<string> {
  const parts = [
    START,
    '',
    '<!-- Generated by `npm run docs:config` from the zod schemas and the key tables of agent.md and api.md. -->',
    '',
  ];
  for (const p of PROGRAMS) parts.push(`### ${p.title}`, '', table(p), '');
  parts.push(END);
  const options = (await prettier.resolveConfig(join(ROOT, DOC))) ?? {};
  return (await prettier.format(parts.join('\n'), { ...options, parser: 'markdown' })).trimEnd();
}

/** What docs/operations.md holds between the markers, markers included. */
export function currentReference(doc: string): string {
  const a = doc.indexOf(START);
  const b = doc.indexOf(END);
  if (a < 0 || b < a) throw new Error(`${DOC} has no ${START} … ${END} block`);
  return doc.slice(a, b + END.length);
}

async function main(): Promise<number> {
  const path = join(ROOT, DOC);
  const doc = readFileSync(path, 'utf8');
  const now = currentReference(doc);
  const next = await configReference();
  if (process.argv.includes('--check')) {
    if (now === next) return 0;
    console.error(`${DOC}: the configuration reference is stale; run npm run docs:config`);
    return 1;
  }
  if (now !== next)
    writeFileSync(
      path,
      doc.replace(now, () => next),
    );
  console.log(now === next ? `${DOC}: up to date` : `${DOC}: configuration reference written`);
  return 0;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) process.exitCode = await main();
