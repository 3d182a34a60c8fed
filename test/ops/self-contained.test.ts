/**
 * The repository stands on its own. Code and docs cite docs/ (the numbered decisions, the design sections and the
 * principles are in docs/decisions.md), never a document kept outside the repository; every decision, section and
 * principle they cite has its heading in docs/decisions.md; and every relative link in the docs reaches a file
 * and, with `#anchor`, a heading of that file, by GitHub's rules for heading anchors.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/agent.js';

/** Folders that are not the repository's own text: dependencies, builds, runtime state (see .gitignore). */
const SKIP_DIRS = new Set(['node_modules', 'dist', '.git', 'var', 'coverage', '.bench', 'release']);

/** Every text file of the repository, as a path relative to the root, in a stable order. */
function repositoryFiles(dir = ROOT): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (!SKIP_DIRS.has(entry.name)) out.push(...repositoryFiles(path));
    } else if (entry.isFile() && !entry.name.endsWith('.log')) {
      out.push(relative(ROOT, path));
    }
  }
  return out;
}

/** The file's text, or null for a binary file (a NUL byte in its first 8 KiB). */
function textOf(file: string): string | null {
  const bytes = readFileSync(join(ROOT, file));
  if (bytes.subarray(0, 8192).includes(0)) return null;
  return bytes.toString('utf8');
}

const FILES = repositoryFiles()
  .map((file) => ({ file, text: textOf(file) }))
  .filter((f): f is { file: string; text: string } => f.text !== null);

const lineOf = (text: string, index: number) => text.slice(0, index).split('\n').length;

/**
 * Citations of documents outside the repository. Written so that this file does not match them itself: a space,
 * a line break or a comment's `*` or `//` may stand between the words.
 */
const OUTSIDE: Array<{ what: string; re: RegExp }> = [
  { what: 'a path into the shared folder beside the repository', re: /\.\.\/shared\b/g },
  { what: 'an outside design or style document', re: /\b(?:DESIGN|STYLE)\.md\b/g },
  { what: 'a section or decision of the outside design', re: /\bDESIGN(?:[\s*]|\/\/)+(?:sections?|decisions?)\b/g },
  { what: 'a principle of the outside style guide', re: /\bSTYLE(?:[\s*]|\/\/)+principles?\b/g },
];

/** Separators inside a list of numbers: `1 to 4`, `3 and 4`, `1–6`, `10, 11`, across a comment's line break. */
const LIST_SEP = String.raw`(?:[\s*,]|\/\/|and|or|to|-|–)+`;

/** The numbers a list such as `1 to 3 and 8` names, ranges expanded. */
function numbersOf(list: string, mark = ''): number[] {
  const out: number[] = [];
  const re = new RegExp(String.raw`${mark}(\d+)(?:\s*(?:-|–|to)\s*${mark}(\d+))?`, 'g');
  for (const m of list.matchAll(re)) {
    const from = Number(m[1]);
    const to = m[2] === undefined ? from : Number(m[2]);
    for (let n = from; n <= to && n - from < 100; n++) out.push(n);
  }
  return out;
}

/** The numbers cited in every file by a pattern whose group 1 is the list. */
function cited(re: RegExp, mark = ''): Array<{ n: number; where: string }> {
  const out: Array<{ n: number; where: string }> = [];
  for (const { file, text } of FILES) {
    for (const m of text.matchAll(re)) {
      for (const n of numbersOf(m[1]!, mark)) out.push({ n, where: `${file}:${lineOf(text, m.index)}` });
    }
  }
  return out;
}

/** The text GitHub renders for a heading's source: code spans, links, emphasis and escapes undone. */
function headingText(source: string): string {
  return source
    .replace(/`([^`]*)`/g, '$1')
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/\\([!-/:-@[-`{-~])/g, '$1')
    .trim();
}

/** GitHub's anchor for a heading (github-slugger): lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
function slug(text: string): string {
  return text
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc}\- ]/gu, '')
    .replace(/ /g, '-');
}

/** The lines of a markdown file that are not inside a fenced code block, with their line numbers. */
function proseLines(text: string): Array<{ line: string; no: number }> {
  const out: Array<{ line: string; no: number }> = [];
  let fence: string | null = null;
  text.split('\n').forEach((line, i) => {
    const open = /^ {0,3}(`{3,}|~{3,})/.exec(line);
    if (fence !== null) {
      if (open && open[1]![0] === fence[0] && open[1]!.length >= fence.length && line.trim() === open[1]) fence = null;
      return;
    }
    if (open) {
      fence = open[1]!;
      return;
    }
    out.push({ line, no: i + 1 });
  });
  return out;
}

/** The headings of a markdown file: their text and their anchors (a repeated anchor gets `-1`, `-2`, ...). */
function headingsOf(file: string): { texts: string[]; anchors: Set<string> } {
  const texts: string[] = [];
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const { line } of proseLines(readFileSync(join(ROOT, file), 'utf8'))) {
    const m = /^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$/.exec(line);
    if (!m) continue;
    const text = headingText(m[1]!);
    texts.push(text);
    const base = slug(text);
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    anchors.add(count === 0 ? base : `${base}-${count}`);
  }
  return { texts, anchors };
}

const DECISIONS = 'docs/decisions.md';

describe('the repository stands on its own', () => {
  it('cites no document kept outside it', () => {
    const found: string[] = [];
    for (const { file, text } of FILES) {
      for (const { what, re } of OUTSIDE) {
        for (const m of text.matchAll(re)) found.push(`${file}:${lineOf(text, m.index)}: ${what}: ${m[0]}`);
      }
    }
    expect(found).toEqual([]);
  });

  it('finds the citations it looks for', () => {
    // A scan that matched nothing would pass the tests below whatever the files say.
    expect(FILES.some((f) => f.file === 'bridge/errors.ts')).toBe(true);
    expect(cited(/\bdecisions?\s+(\d+(?:\s*(?:-|–|to)\s*\d+)?)/gi).length).toBeGreaterThan(100);
    expect(numbersOf('1 to 3 and 8, 10–11')).toEqual([1, 2, 3, 8, 10, 11]);
    expect(slug(headingText('POST /0/devices/\\<id\\>/fw/\\<name\\>'))).toBe('post-0devicesidfwname');
    expect(slug(headingText('10. `latest`, and 11. History `by`'))).toBe('10-latest-and-11-history-by');
  });

  it('numbers decisions 1 to 25, sections 1 to 9 and principles 1 to 14 in docs/decisions.md, in order', () => {
    const { texts } = headingsOf(DECISIONS);
    const numbered = (re: RegExp) => texts.flatMap((t) => (re.exec(t) ? [Number(re.exec(t)![1])] : []));
    const upTo = (n: number) => Array.from({ length: n }, (_, i) => i + 1);
    expect(numbered(/^Decision (\d+): /)).toEqual(upTo(25));
    expect(numbered(/^(\d+)\. /)).toEqual(upTo(9));
    expect(numbered(/^Principle (\d+): /)).toEqual(upTo(14));
  });

  it('has a heading in docs/decisions.md for every decision, section and principle cited', () => {
    const { texts } = headingsOf(DECISIONS);
    const has = (re: RegExp, n: number) => texts.some((t) => Number(re.exec(t)?.[1]) === n);
    const missing = [
      ...cited(new RegExp(String.raw`\bdecisions?\s+(\d+(?:${LIST_SEP}\d+)*)`, 'gi'))
        .filter(({ n }) => !has(/^Decision (\d+): /, n))
        .map(({ n, where }) => `${where}: decision ${n}`),
      ...cited(new RegExp(String.raw`decisions\.md(?:[\s*]|\/\/)+(§\d+(?:${LIST_SEP}§\d+)*)`, 'g'), '§')
        .filter(({ n }) => !has(/^(\d+)\. /, n))
        .map(({ n, where }) => `${where}: §${n}`),
      ...cited(new RegExp(String.raw`decisions\.md,?(?:[\s*]|\/\/)+principles?\s+(\d+(?:${LIST_SEP}\d+)*)`, 'g'))
        .filter(({ n }) => !has(/^Principle (\d+): /, n))
        .map(({ n, where }) => `${where}: principle ${n}`),
    ];
    expect(missing).toEqual([]);
  });

  it('links, in docs/*.md and README.md, only to files and headings that exist', () => {
    const pages = [
      'README.md',
      ...readdirSync(join(ROOT, 'docs'))
        .filter((f) => f.endsWith('.md'))
        .map((f) => `docs/${f}`),
    ];
    const anchorsOf = new Map<string, Set<string>>();
    const anchors = (file: string) => {
      if (!anchorsOf.has(file)) anchorsOf.set(file, headingsOf(file).anchors);
      return anchorsOf.get(file)!;
    };
    const broken: string[] = [];
    let checked = 0;
    for (const page of pages) {
      for (const { line, no } of proseLines(readFileSync(join(ROOT, page), 'utf8'))) {
        // Inline code is not a link: `[x](y)` inside backticks is left alone.
        const prose = line.replace(/`[^`]*`/g, '``');
        for (const m of prose.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
          const target = m[1]!;
          if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto: ...
          checked++;
          const hash = target.indexOf('#');
          const path = decodeURIComponent(hash < 0 ? target : target.slice(0, hash));
          const anchor = hash < 0 ? null : decodeURIComponent(target.slice(hash + 1));
          const file = path === '' ? page : relative(ROOT, join(ROOT, dirname(page), path));
          const where = `${page}:${no}: ${target}`;
          if (file.startsWith('..') || !existsSync(join(ROOT, file))) broken.push(`${where}: no file ${file}`);
          else if (anchor !== null) {
            if (!file.endsWith('.md')) broken.push(`${where}: an anchor into a file that is not markdown`);
            else if (!anchors(file).has(anchor)) broken.push(`${where}: no heading with that anchor in ${file}`);
          }
        }
      }
    }
    expect(checked).toBeGreaterThan(100);
    expect(broken).toEqual([]);
  });
});
