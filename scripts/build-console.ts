/**
 * Builds the web console (docs/console.md) into dist/console/: console/src bundled and minified by esbuild into one
 * `app.js`, with `index.html` and `style.css`, and a gzip of each beside it, which the bridge serves to a browser
 * that takes gzip. `npm run build` runs it (and so `npm install`); nothing is fetched from anywhere at run time.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { build } from 'esbuild';

const ROOT = join(import.meta.dirname, '..');
// `--out DIR`: the release builds into its stage (scripts/release.sh).
const at = process.argv.indexOf('--out');
const OUT = at > 0 && process.argv[at + 1] ? process.argv[at + 1]! : join(ROOT, 'dist', 'console');

rmSync(OUT, { recursive: true, force: true });
mkdirSync(OUT, { recursive: true });
await build({
  entryPoints: [join(ROOT, 'console', 'src', 'main.tsx')],
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['es2022'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outfile: join(OUT, 'app.js'),
  legalComments: 'none',
  logLevel: 'warning',
});
for (const file of ['index.html', 'style.css']) {
  writeFileSync(join(OUT, file), readFileSync(join(ROOT, 'console', file)));
}
let total = 0;
for (const file of ['index.html', 'style.css', 'app.js']) {
  const gz = gzipSync(readFileSync(join(OUT, file)), { level: 9 });
  writeFileSync(join(OUT, `${file}.gz`), gz);
  total += gz.length;
}
console.log(`console: ${OUT}, ${(total / 1024).toFixed(1)} KiB gzipped`);
