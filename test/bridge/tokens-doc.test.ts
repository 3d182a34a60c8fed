/**
 * docs/api.md lists every plain-text token the bridge can answer, with its statuses and its source, in one table
 * (between its `answer-tokens` markers). The tokens and statuses are read here from the API document, which is
 * generated from the route tables and the error catalog (`bridge/errors.ts`, `bridge/http/outcomes.ts`), so the
 * table stays true: a token added, renamed or answered at another status fails this test until the docs follow.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERRORS } from '../../bridge/errors.js';
import { OPENAPI_PATH } from '../../bridge/openapi.js';
import { ROOT } from '../support/agent.js';
import { type TestBridge, startTestBridge } from '../support/bridge.js';

const START = '<!-- answer-tokens:start -->';
const END = '<!-- answer-tokens:end -->';

type Doc = {
  paths: Record<
    string,
    Record<string, { responses: Record<string, { content?: Record<string, { schema: { enum?: string[] } }> }> }>
  >;
};

/** Every token of the document, with the statuses it is answered at. */
function tokensOf(doc: Doc): Map<string, Set<number>> {
  const out = new Map<string, Set<number>>();
  for (const methods of Object.values(doc.paths))
    for (const op of Object.values(methods))
      for (const [status, response] of Object.entries(op.responses))
        for (const token of response.content?.['text/plain']?.schema.enum ?? []) {
          const statuses = out.get(token) ?? new Set<number>();
          statuses.add(Number(status));
          out.set(token, statuses);
        }
  return out;
}

/** The docs table: token, statuses, source. */
function tableOf(markdown: string): Array<{ token: string; statuses: number[]; source: string }> {
  const start = markdown.indexOf(START);
  const end = markdown.indexOf(END);
  expect(start, `${START} in docs/api.md`).toBeGreaterThan(0);
  expect(end).toBeGreaterThan(start);
  const rows = markdown
    .slice(start + START.length, end)
    .split('\n')
    .filter((l) => l.startsWith('| `'));
  return rows.map((row) => {
    const [token, statuses, source] = row
      .split('|')
      .slice(1, 4)
      .map((c) => c.trim());
    return {
      token: /^`([^`]+)`$/.exec(token!)![1]!,
      statuses: statuses!.split(',').map((s) => Number(s.trim())),
      source: source!,
    };
  });
}

describe('the table of answer tokens in docs/api.md', () => {
  let bridge: TestBridge;
  let doc: Doc;
  beforeAll(async () => {
    bridge = await startTestBridge();
    const r = await bridge.client().get(OPENAPI_PATH);
    doc = JSON.parse(r.body) as Doc;
  });
  afterAll(async () => {
    await bridge.close();
  });

  it('lists every token the routes answer, at exactly the statuses they answer it, and nothing else', () => {
    const table = tableOf(readFileSync(join(ROOT, 'docs/api.md'), 'utf8'));
    const documented = new Map(table.map((r) => [r.token, [...r.statuses].sort((a, b) => a - b)]));
    const answered = new Map([...tokensOf(doc)].map(([t, s]) => [t, [...s].sort((a, b) => a - b)]));
    const shown = (m: Map<string, number[]>) =>
      [...m].sort(([a], [b]) => a.localeCompare(b)).map(([t, s]) => `${t} ${s.join(', ')}`);
    expect(shown(documented)).toEqual(shown(answered));
    expect(table.map((r) => r.token)).toEqual([...new Set(table.map((r) => r.token))]);
  });

  it('names the source of every token: the specification or a decision', () => {
    for (const row of tableOf(readFileSync(join(ROOT, 'docs/api.md'), 'utf8')))
      expect(row.source, row.token).toMatch(/^(specification|decision \d+)\b/);
  });

  it('holds every token of the error catalog', () => {
    const answered = tokensOf(doc);
    for (const [code, e] of Object.entries(ERRORS)) {
      expect(answered.get(e.body), code).toBeDefined();
      expect([...answered.get(e.body)!], code).toContain(e.status);
    }
  });
});
