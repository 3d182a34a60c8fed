/**
 * The shape of the bridge's import graph (docs/README.md, The repository): no module imports itself through others,
 * type-only imports included, and the route tables (`routes.ts`) are imported only by the module that registers
 * them (`bridge/app.ts`): domain modules, services and the HTTP layer never reach into a resource's routes.
 * Imports are read with TypeScript's own pre-processor, so every spelling counts: `import`, `import type`,
 * `export … from`, side-effect and dynamic imports.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/agent.js';

/** The one module that registers the resources' route tables. */
const REGISTRATION = 'bridge/app.ts';

type Graph = Map<string, string[]>;

/** Every module under `dir` (relative to the repository) with the modules under `dir` it imports. */
function importGraph(dir: string): Graph {
  const files = readdirSync(join(ROOT, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => join(dir, f));
  const graph: Graph = new Map();
  for (const file of files) {
    const { importedFiles } = ts.preProcessFile(readFileSync(join(ROOT, file), 'utf8'), true, true);
    const targets = importedFiles
      .map((i) => i.fileName)
      .filter((name) => name.startsWith('.'))
      .map((name) => normalize(join(dirname(file), name.replace(/\.js$/, '.ts'))))
      .filter((target) => !relative(dir, target).startsWith('..'));
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}

/** The cycles of a graph: its strongly connected components of more than one module, and self-imports. */
function cycles(graph: Graph): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1 || graph.get(v)?.includes(v)) found.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

/** Imports of a route table by any module but the registration. */
function routeImports(graph: Graph): string[] {
  return [...graph].flatMap(([file, targets]) =>
    targets.filter((t) => t.endsWith('/routes.ts') && file !== REGISTRATION).map((t) => `${file} -> ${t}`),
  );
}

describe("the bridge's import graph", () => {
  const graph = importGraph('bridge');

  it('is read completely: value, type-only and multi-line imports', () => {
    expect(graph.get(REGISTRATION)).toEqual(
      expect.arrayContaining(['bridge/sessions/routes.ts', 'bridge/devices/routes.ts', 'bridge/http/server.ts']),
    );
    // `import type { RouteContext } from '../http/context.js'`, and `import {` over several lines `} from './schemas.js'`.
    expect(graph.get('bridge/devices/routes.ts')).toEqual(
      expect.arrayContaining(['bridge/http/context.ts', 'bridge/devices/schemas.ts']),
    );
    // `import type { SendDown, UpMessage } from './link.js'`.
    expect(graph.get('bridge/devices/service.ts')).toContain('bridge/devices/link.ts');
  });

  it('finds a cycle and a route table imported from elsewhere; counts type-only imports and re-exports', () => {
    const sample: Graph = new Map([
      ['bridge/a.ts', ['bridge/b/routes.ts']],
      ['bridge/b/routes.ts', ['bridge/c.ts']],
      ['bridge/c.ts', ['bridge/a.ts']],
      ['bridge/d.ts', ['bridge/d.ts']],
    ]);
    expect(cycles(sample)).toEqual([['bridge/a.ts', 'bridge/b/routes.ts', 'bridge/c.ts'], ['bridge/d.ts']]);
    expect(routeImports(sample)).toEqual(['bridge/a.ts -> bridge/b/routes.ts']);
    const typeOnly = ts.preProcessFile(
      "import type { X } from './x.js';\nexport type { Y } from './y.js';",
      true,
      true,
    );
    expect(typeOnly.importedFiles.map((f) => f.fileName)).toEqual(['./x.js', './y.js']);
  });

  it('has no cycle', () => {
    expect(cycles(graph)).toEqual([]);
  });

  it('imports the route tables only where they are registered', () => {
    expect(routeImports(graph)).toEqual([]);
  });
});
