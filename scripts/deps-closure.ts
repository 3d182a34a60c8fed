/**
 * What one program of a release needs, and nothing more: `tsx scripts/deps-closure.ts RELEASE ENTRY...` follows
 * the imports of the compiled entry files (dist/agent/main.js, say) through dist/ and prints, one per line relative
 * to RELEASE, every file of dist/ they reach and every package folder of node_modules/ they need, with the
 * packages' own dependencies. scripts/deb.sh builds the devcloud-agent package from it, so that a gateway's flash
 * carries no web server, database driver or mail client of the bridge (docs/operations.md, "Debian packages").
 *
 * Imports are found in the text: `import ... from '...'` at a line's end (as tsc writes it), `import '...'`, `import('...')`, `require('...')` and
 * `new URL('./x.js', import.meta.url)` (the worker threads), each with a literal name; an import by a computed
 * name is not followed, so the package test runs the installed programs to catch one.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, join, relative, resolve } from 'node:path';

// Static imports are whole statements as tsc writes them: the name at the end of the line.
const PATTERNS = [
  /\bfrom\s*['"]([^'"]+)['"];?[ \t]*$/gm,
  /^[ \t]*import\s*['"]([^'"]+)['"];?[ \t]*$/gm,
  /\bimport\(\s*['"]([^'"]+)['"]\s*\)/g,
  /\brequire\(\s*['"]([^'"]+)['"]\s*\)/g,
  /\bnew URL\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*,\s*import\.meta\.url\s*\)/g,
];
const BUILTINS = new Set(builtinModules);
/** What a module name can look like; a string that is not one was matched by chance and is skipped. */
const SPEC = /^(\.{1,2}\/[\w./-]*\w|(@[\w-][\w.-]*\/)?\w[\w.-]*(\/[\w./-]*)?)$/;

function packageName(spec: string): string {
  const parts = spec.split('/');
  return spec.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!;
}

/** Node's lookup of a package from a folder: node_modules/NAME in the folder and each one above, up to `top`. */
function findPackage(name: string, from: string, top: string): string | undefined {
  for (let dir = from; ; dir = dirname(dir)) {
    const candidate = join(dir, 'node_modules', name);
    if (existsSync(join(candidate, 'package.json'))) return candidate;
    if (dir === top || dirname(dir) === dir) return undefined;
  }
}

export function closure(root: string, entries: string[]): { files: string[]; packages: string[] } {
  root = resolve(root);
  const files = new Set<string>();
  const packages = new Set<string>();
  const missing: string[] = [];
  const fileQueue = entries.map((e) => resolve(root, e));
  const packageQueue: string[] = [];

  const addPackage = (name: string, from: string, by: string, optional: boolean) => {
    const dir = findPackage(name, from, root);
    if (dir === undefined) {
      if (!optional) missing.push(`${name} (needed by ${relative(root, by)})`);
      return;
    }
    if (!packages.has(dir)) {
      packages.add(dir);
      packageQueue.push(dir);
    }
  };

  while (fileQueue.length > 0) {
    const file = fileQueue.pop()!;
    if (files.has(file)) continue;
    if (!existsSync(file) || !statSync(file).isFile()) {
      missing.push(relative(root, file));
      continue;
    }
    files.add(file);
    const text = readFileSync(file, 'utf8');
    for (const pattern of PATTERNS) {
      for (const match of text.matchAll(pattern)) {
        const spec = match[1]!;
        if (spec.startsWith('node:') || BUILTINS.has(spec) || !SPEC.test(spec)) continue;
        if (spec.startsWith('.')) fileQueue.push(resolve(dirname(file), spec));
        else addPackage(packageName(spec), dirname(file), file, false);
      }
    }
  }
  while (packageQueue.length > 0) {
    const dir = packageQueue.pop()!;
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as Record<string, unknown>;
    const names = (key: string) => Object.keys((pkg[key] as Record<string, string> | undefined) ?? {});
    for (const name of names('dependencies')) addPackage(name, dir, join(dir, 'package.json'), false);
    // Optional dependencies are taken when the release has them, as Node would find them. Peer dependencies are
    // not: a package's peer is one the program itself imports, and that import brings it.
    for (const name of names('optionalDependencies')) {
      addPackage(name, dir, join(dir, 'package.json'), true);
    }
  }
  if (missing.length > 0) throw new Error(`not in the release: ${missing.join(', ')}`);
  // A package inside another's node_modules comes with its parent's folder; list only the outermost.
  const sorted = [...packages].map((p) => relative(root, p)).sort();
  const outer = sorted.filter((p) => !sorted.some((q) => q !== p && p.startsWith(`${q}/`)));
  return { files: [...files].map((f) => relative(root, f)).sort(), packages: outer };
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  const [root, ...entries] = process.argv.slice(2);
  if (!root || entries.length === 0) {
    console.error('usage: tsx scripts/deps-closure.ts RELEASE ENTRY...');
    process.exit(2);
  }
  try {
    const { files, packages } = closure(root, entries);
    process.stdout.write([...files, ...packages].map((p) => `${p}\n`).join(''));
  } catch (err) {
    console.error(`deps-closure: ${(err as Error).message}`);
    process.exit(1);
  }
}
