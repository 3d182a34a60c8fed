/**
 * docs/operations.md lists every log `event` the agent and the bridge write at `info` and above, with its level.
 * The names and levels are read from the source here, so the tables stay true: an event added, renamed, removed
 * or moved to another level fails this test until the docs follow.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/agent.js';

type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal';
type Program = 'agent' | 'bridge';
const LEVELS: readonly Level[] = ['trace', 'debug', 'info', 'warn', 'error', 'fatal'];
const SHOWN: readonly Level[] = ['info', 'warn', 'error', 'fatal'];

/**
 * `event` names built from a template: each template, as it stands in its file, and the names it makes. A new
 * template fails the test until it is listed here.
 */
const TEMPLATES: Record<string, { file: string; names: string[] }> = {
  // byHand() takes only the `commit` and `rollback` events of the firmware state machine.
  'fw.${event.type}_by_hand': { file: 'agent/fw/updater.ts', names: ['fw.commit_by_hand', 'fw.rollback_by_hand'] },
};

/** Names held in a variable first and logged at more than one level, as the file does it. */
const INDIRECT: Record<string, { file: string; levels: Level[] }> = {
  // `const line = { event: 'fw.state', ... }`, then error, warn or info by the state moved to.
  'fw.state': { file: 'agent/fw/updater.ts', levels: ['info', 'warn', 'error'] },
};

/** Helpers that log the name they are given: the call pattern, and the level of the helper's own log call. */
const WRAPPERS: Array<{ file: string; call: RegExp; body: RegExp; level: Level }> = [
  {
    file: 'agent/vars/sync.ts',
    call: /this\.failed\(\s*'([^']+)'/g,
    body: /private failed\(event: string, err: unknown\): void \{\s*this\.opts\.log\.error\(\{ event, /,
    level: 'error',
  },
];

/** `event:` keys that are not log lines: the watch events of the local socket. */
const NOT_LOGGED: Record<string, string[]> = {
  'agent/local/server.ts': ['change'],
  'agent/local/messages.ts': ['change', 'acked'],
};

interface Found {
  name: string;
  level: Level;
  program: Program;
  where: string;
}

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => join(dir, f));
}

function programsOf(file: string): Program[] {
  if (file.startsWith('agent/')) return ['agent'];
  if (file.startsWith('bridge/')) return ['bridge'];
  return ['agent', 'bridge'];
}

const lineOf = (src: string, index: number) => src.slice(0, index).split('\n').length;

/** Every event the code logs, with its level; throws on an `event:` it cannot account for. */
function scan(): Found[] {
  const found: Found[] = [];
  const problems: string[] = [];
  const seenTemplates = new Set<string>();
  const seenIndirect = new Set<string>();
  for (const file of [...sources('agent'), ...sources('bridge'), ...sources('lib')]) {
    const src = readFileSync(join(ROOT, file), 'utf8');
    const add = (name: string, level: Level, index: number) => {
      for (const program of programsOf(file))
        found.push({ name, level, program, where: `${file}:${lineOf(src, index)}` });
    };
    for (const m of src.matchAll(/\bevent:\s*(['"`])((?:(?!\1)[^\\\n])*)\1/g)) {
      const [, quote, text] = m as unknown as [string, string, string];
      const where = `${file}:${lineOf(src, m.index)}`;
      let names = [text];
      if (quote === '`' && text.includes('${')) {
        const t = TEMPLATES[text];
        if (!t || t.file !== file) {
          problems.push(`${where}: template event \`${text}\`: list the names it makes in TEMPLATES`);
          continue;
        }
        seenTemplates.add(text);
        names = t.names;
      }
      // The log call the object literal is the first argument of: `.info({ event: ...`.
      const call = /\.(trace|debug|info|warn|error|fatal)\(\s*\{\s*$/.exec(
        src.slice(Math.max(0, m.index - 200), m.index),
      );
      if (call) {
        for (const name of names) add(name, call[1] as Level, m.index);
        continue;
      }
      const indirect = INDIRECT[text];
      if (indirect?.file === file) {
        seenIndirect.add(text);
        for (const level of indirect.levels) add(text, level, m.index);
        continue;
      }
      if (NOT_LOGGED[file]?.includes(text)) continue;
      problems.push(`${where}: event '${text}' is not the first key of a log call's object; list it in INDIRECT`);
    }
    // A name chosen by a condition (`event: up ? 'a.enabled' : 'a.disabled'`): both names, at the call's level.
    // Any other name that is not a literal (`{ event: name }`, `{ event, ... }`) is only allowed in a known wrapper.
    const computed = /\.(trace|debug|info|warn|error|fatal)\(\s*\{\s*event(?:\s*[,}]|:\s*[A-Za-z_$!(])/g;
    for (const m of src.matchAll(computed)) {
      const rest = src.slice(m.index + m[0].length - 1);
      const ternary = /^[\w$.!()]+\s*\?\s*'([^']+)'\s*:\s*'([^']+)'\s*[,}]/.exec(rest);
      if (ternary) {
        add(ternary[1]!, m[1] as Level, m.index);
        add(ternary[2]!, m[1] as Level, m.index);
      } else if (!WRAPPERS.some((w) => w.file === file)) {
        problems.push(`${file}:${lineOf(src, m.index)}: an event name that is not a literal; list it in WRAPPERS`);
      }
    }
    for (const w of WRAPPERS.filter((x) => x.file === file)) {
      if (!w.body.test(src)) problems.push(`${file}: the wrapper ${String(w.body)} changed; update WRAPPERS`);
      for (const m of src.matchAll(w.call)) add(m[1]!, w.level, m.index);
    }
  }
  for (const [text, t] of Object.entries(TEMPLATES)) {
    if (!seenTemplates.has(text)) problems.push(`${t.file}: template \`${text}\` is gone; remove it from TEMPLATES`);
  }
  for (const [name, i] of Object.entries(INDIRECT)) {
    if (!seenIndirect.has(name)) problems.push(`${i.file}: '${name}' is no longer logged indirectly; update INDIRECT`);
  }
  if (problems.length > 0) throw new Error(`events the test cannot place:\n  ${problems.join('\n  ')}`);
  return found;
}

interface Row {
  name: string;
  levels: string;
  meaning: string;
  todo: string;
}

/** The rows of the first table after the heading `### <heading>` in docs/operations.md. */
function table(heading: string): Row[] {
  const doc = readFileSync(join(ROOT, 'docs/operations.md'), 'utf8');
  const start = doc.indexOf(`\n### ${heading}\n`);
  if (start < 0) throw new Error(`docs/operations.md has no section "### ${heading}"`);
  const lines = doc.slice(start).split('\n').slice(2);
  const first = lines.findIndex((l) => l.startsWith('|'));
  const rows: Row[] = [];
  for (const line of lines.slice(first + 2)) {
    if (!line.startsWith('|')) break;
    const cells = line
      .slice(1, -1)
      .split(/(?<!\\)\|/)
      .map((c) => c.trim());
    const name = /^`([^`]+)`$/.exec(cells[0] ?? '')?.[1];
    if (!name || cells.length !== 4) throw new Error(`docs/operations.md, "${heading}": a malformed row: ${line}`);
    rows.push({ name, levels: cells[1]!, meaning: cells[2]!, todo: cells[3]! });
  }
  return rows;
}

/** The levels an event is logged at, at info and above, in the order of LEVELS: `info, warn`. */
function levelsByName(found: Found[], program: Program): Map<string, string> {
  const by = new Map<string, Set<Level>>();
  for (const f of found.filter((x) => x.program === program)) {
    const set = by.get(f.name) ?? new Set<Level>();
    set.add(f.level);
    by.set(f.name, set);
  }
  const out = new Map<string, string>();
  for (const [name, set] of by) {
    const shown = LEVELS.filter((l) => SHOWN.includes(l) && set.has(l));
    out.set(name, shown.length > 0 ? shown.join(', ') : 'debug only');
  }
  return out;
}

describe('the log event tables of docs/operations.md', () => {
  const found = scan();

  it('finds the events of both programs in the source', () => {
    // A scanner that found nothing would make the checks below pass vacuously.
    const names = (p: Program) => new Set(found.filter((f) => f.program === p).map((f) => f.name));
    expect(names('agent')).toContain('mqtt.connected');
    expect(names('agent')).toContain('fw.rollback_by_hand');
    expect(names('agent')).toContain('vars.commit_failed');
    expect(names('bridge')).toContain('bridge.started');
    expect(found.find((f) => f.name === 'agent.crashed')?.level).toBe('fatal');
  });

  for (const [program, heading] of [
    ['agent', 'Agent log events'],
    ['bridge', 'Bridge log events'],
  ] as const) {
    describe(`${program}: "${heading}"`, () => {
      const inCode = levelsByName(found, program);
      const rows = table(heading);

      it('lists every event logged at info or above, at the levels the code uses', () => {
        const expected = [...inCode]
          .filter(([, levels]) => levels !== 'debug only')
          .sort(([a], [b]) => a.localeCompare(b));
        const listed = rows.map((r) => [r.name, r.levels] as [string, string]).sort(([a], [b]) => a.localeCompare(b));
        const where = (name: string) =>
          found
            .filter((f) => f.program === program && f.name === name)
            .map((f) => `${f.where} (${f.level})`)
            .join(', ');
        const missing = expected.filter(([n]) => !rows.some((r) => r.name === n)).map(([n]) => `${n}: ${where(n)}`);
        expect(missing, 'logged but not in the table').toEqual([]);
        expect(listed).toEqual(expected);
      });

      it('lists no event the code does not log at info or above', () => {
        const stale = rows.filter((r) => !inCode.has(r.name) || inCode.get(r.name) === 'debug only').map((r) => r.name);
        expect(stale).toEqual([]);
      });

      it('says for every event what it means and what to do', () => {
        const bare = rows.filter((r) => r.meaning.length === 0 || r.todo.length === 0).map((r) => r.name);
        expect(bare).toEqual([]);
        expect(new Set(rows.map((r) => r.name)).size).toBe(rows.length);
      });
    });
  }
});
