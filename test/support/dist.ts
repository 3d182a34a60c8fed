/**
 * Vitest's global setup (vitest.config.ts): `dist/` is current before any test starts. The tests that need a real
 * process (a `kill -9`, a signal, an exit status, systemd's notify socket) spawn the built JavaScript, as the
 * installed service runs it, rather than the TypeScript source through tsx, which takes longer to start. So that
 * no test ever runs stale JavaScript, `dist/` is built here (`tsc -p tsconfig.build.json`, what `npm run build`
 * runs) whenever a source under agent/, bridge/, lib/ or protocol/ (or a tsconfig) is newer than its output. The web
 * console, which the bridge serves from dist/console, likewise: it is bundled again (scripts/build-console.ts, what
 * `npm run build` runs after tsc) whenever a file under console/, or the build script, is newer than its bundle, so
 * that the browser tests never drive a stale console.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, relative } from 'node:path';

const ROOT = join(import.meta.dirname, '../..');
/** What tsconfig.build.json compiles. */
const SOURCE_DIRS = ['agent', 'bridge', 'lib', 'protocol'];
const CONFIGS = ['tsconfig.json', 'tsconfig.build.json'];

/** What scripts/build-console.ts reads: every file under console/, and the script itself. */
const CONSOLE_DIR = 'console';
const CONSOLE_SCRIPT = join('scripts', 'build-console.ts');
/** The bundle: the build writes every file of dist/console each time, this one first. */
const CONSOLE_BUNDLE = join('dist', 'console', 'app.js');

function allFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory() ? allFiles(join(dir, entry.name)) : [join(dir, entry.name)],
  );
}

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...sources(path));
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) out.push(path);
  }
  return out;
}

const mtime = (path: string) => statSync(path).mtimeMs;

/** The first source whose output is missing or older than it (or than a tsconfig), or undefined when all are current. */
export function staleSource(): string | undefined {
  const configTime = Math.max(...CONFIGS.map((c) => mtime(join(ROOT, c))));
  for (const src of SOURCE_DIRS.flatMap((d) => sources(join(ROOT, d)))) {
    const out = join(ROOT, 'dist', relative(ROOT, src).replace(/\.ts$/, '.js'));
    if (!existsSync(out)) return relative(ROOT, src);
    const built = mtime(out);
    if (built < mtime(src) || built < configTime) return relative(ROOT, src);
  }
  return undefined;
}

/** The first file of the console newer than its bundle (or the bundle missing), or undefined when it is current. */
export function staleConsole(): string | undefined {
  const bundle = join(ROOT, CONSOLE_BUNDLE);
  const built = existsSync(bundle) ? mtime(bundle) : -1;
  for (const src of [...allFiles(join(ROOT, CONSOLE_DIR)), join(ROOT, CONSOLE_SCRIPT)]) {
    if (built < mtime(src)) return relative(ROOT, src);
  }
  return undefined;
}

/** Bundles the console again when it is stale (its build fails on an error in the console's code: then so do the tests). */
function ensureConsole(): void {
  const stale = staleConsole();
  if (stale === undefined) return;
  const started = Date.now();
  const tsx = createRequire(import.meta.url).resolve('tsx/cli');
  const build = spawnSync(process.execPath, [tsx, CONSOLE_SCRIPT], { cwd: ROOT, encoding: 'utf8' });
  if (build.status !== 0 || staleConsole() !== undefined) {
    throw new Error(`${CONSOLE_SCRIPT} did not build dist/console (${stale}):\n${build.stdout}${build.stderr}`);
  }
  console.error(`dist/console was older than ${stale}: rebuilt in ${Date.now() - started} ms`);
}

export default function ensureDist(): void {
  ensureConsole();
  const stale = staleSource();
  if (stale === undefined) return;
  const started = Date.now();
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const build = spawnSync(process.execPath, [tsc, '-p', 'tsconfig.build.json'], { cwd: ROOT, encoding: 'utf8' });
  const left = staleSource();
  if (left !== undefined) {
    throw new Error(`tsc -p tsconfig.build.json did not build dist/ (${left}):\n${build.stdout}${build.stderr}`);
  }
  // Type errors do not stop the emit; the tests run what was emitted (`npm run typecheck` is the check for them).
  const errors = build.status === 0 ? '' : `, with type errors:\n${build.stdout}${build.stderr}`;
  console.error(`dist/ was older than ${stale}: rebuilt in ${Date.now() - started} ms${errors}`);
}
