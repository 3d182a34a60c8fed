import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The version in the project's package.json, found from this file whether it runs from source or `dist/`. */
function findVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'devcloud' && typeof pkg.version === 'string') return pkg.version;
    } catch {
      // not here; look one folder up
    }
    dir = dirname(dir);
  }
  return '0.0.0';
}

export const VERSION = findVersion();
