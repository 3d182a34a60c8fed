/**
 * What a test needs of the machine besides Node.js and npm: system programs, each from a Debian package, and root.
 * A `describe` or a test that needs one says so where vitest collects it, or a test at its start:
 *
 *   describe.skipIf(missing('busybox'))('installImage with BusyBox tar', () => { ... });
 *   it.skipIf(missing('root'))('refuses a device node', ...);
 *   it('through Mosquitto', async (ctx) => { requires(ctx, 'mosquitto'); ... });
 *
 * When something is missing, one line on stderr names it and the `apt-get install` that brings it, and those tests
 * are skipped; under `CI=true` the file fails instead, so that CI never passes by skipping. What only trying shows
 * (a tmpfs mount, a network namespace) goes through {@link skipOrFail}, and so does a PostgreSQL server that does not
 * answer (test/support/postgres.ts). README.md's test line lists the packages that give the full suite; `.ci/run`
 * installs them.
 */
import { accessSync, constants, existsSync, readdirSync } from 'node:fs';
import { delimiter, join, relative } from 'node:path';
import { expect } from 'vitest';

/** The programs tests run, each with the Debian package that has it. */
export const PACKAGES = {
  'aarch64-linux-gnu-g++': 'g++-aarch64-linux-gnu',
  'aarch64-linux-gnu-gcc': 'gcc-aarch64-linux-gnu',
  'arm-linux-gnueabihf-g++': 'g++-arm-linux-gnueabihf',
  'arm-linux-gnueabihf-gcc': 'gcc-arm-linux-gnueabihf',
  busybox: 'busybox',
  chromium: 'chromium',
  debootstrap: 'debootstrap',
  dpkg: 'dpkg',
  'dpkg-deb': 'dpkg',
  faketime: 'faketime',
  gzip: 'gzip',
  ip: 'iproute2',
  lintian: 'lintian',
  make: 'make',
  mkfifo: 'coreutils',
  mknod: 'coreutils',
  mosquitto: 'mosquitto',
  mosquitto_ctrl: 'mosquitto',
  mosquitto_passwd: 'mosquitto',
  mount: 'mount',
  nsenter: 'util-linux',
  openssl: 'openssl',
  python3: 'python3',
  'qemu-aarch64-static': 'qemu-user-static',
  'qemu-arm-static': 'qemu-user-static',
  setpriv: 'util-linux',
  sha256sum: 'coreutils',
  sqlite3: 'sqlite3',
  'systemd-analyze': 'systemd',
  'systemd-nspawn': 'systemd-container',
  'systemd-run': 'systemd',
  'systemd-sysusers': 'systemd',
  systemctl: 'systemd',
  tar: 'tar',
  unshare: 'util-linux',
  'x86_64-linux-gnu-g++': 'g++-x86-64-linux-gnu',
  'x86_64-linux-gnu-gcc': 'gcc-x86-64-linux-gnu',
} as const;

export type Program = keyof typeof PACKAGES;
/** A program, libfaketime (the library the clock tests preload), or root. */
export type Need = Program | 'libfaketime' | 'root';

/** Where Debian puts programs for root, which another user's PATH may lack (mosquitto, ip). */
const SBIN = ['/usr/local/sbin', '/usr/sbin', '/sbin'];

/** The file `program` runs from: the first on PATH, else in an sbin folder; undefined when there is none. */
export function which(program: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter).filter(Boolean), ...SBIN];
  for (const dir of dirs) {
    const path = join(dir, program);
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** libfaketime as Debian installs it, under the multiarch folder of /usr/lib; undefined when it is not there. */
export function libfaketime(): string | undefined {
  return ['', ...readdirSync('/usr/lib')]
    .map((dir) => join('/usr/lib', dir, 'faketime/libfaketime.so.1'))
    .find((path) => existsSync(path));
}

/** Debian's Chromium, which the console's browser tests drive (test/support/browser.ts); only this one is used. */
export const CHROMIUM = '/usr/bin/chromium';

function has(need: Need): boolean {
  if (need === 'root') return process.getuid?.() === 0;
  if (need === 'chromium') {
    try {
      accessSync(CHROMIUM, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  }
  if (need === 'libfaketime') return libfaketime() !== undefined;
  return which(need) !== undefined;
}

/** What is missing of `needs`, with the packages to install, as one phrase; undefined when nothing is. */
export function lacking(...needs: Need[]): string | undefined {
  const gone = [...new Set(needs)].filter((n) => !has(n));
  if (gone.length === 0) return undefined;
  const programs = gone.filter((n): n is Program | 'libfaketime' => n !== 'root');
  const packages = [...new Set(programs.map((p) => (p === 'libfaketime' ? 'faketime' : PACKAGES[p])))];
  const parts = [
    ...(programs.length > 0 ? [`${programs.join(', ')} (apt-get install ${packages.join(' ')})`] : []),
    ...(gone.includes('root') ? ['root'] : []),
  ];
  return `needs ${parts.join(' and ')}`;
}

/** Lines already printed (each names its test file), so that each is said once per worker. */
const said = new Set<string>();

/**
 * Says that the tests of this file that need something are skipped, and why, in one line; under `CI=true` throws
 * instead. `why` is a phrase like "needs root (CAP_SYS_ADMIN) to mount a tmpfs".
 */
export function skipOrFail(why: string): void {
  const testPath = expect.getState().testPath;
  const file = testPath ? relative(process.cwd(), testPath) : 'a test file';
  if (process.env.CI === 'true') throw new Error(`${file}: ${why}; under CI=true that fails rather than skips`);
  const line = `skipped in ${file}: ${why}`;
  if (!said.has(line)) process.stderr.write(`${line}\n`);
  said.add(line);
}

/**
 * For `describe.skipIf` and `it.skipIf`: false when the machine has everything in `needs`; otherwise the line of
 * {@link skipOrFail} (an error under `CI=true`), and true.
 */
export function missing(...needs: Need[]): boolean {
  const why = lacking(...needs);
  if (why === undefined) return false;
  skipOrFail(why);
  return true;
}

/** Inside a test: when something in `needs` is missing, the line of {@link skipOrFail}, and the test skipped. */
export function requires(ctx: { skip: (note?: string) => void }, ...needs: Need[]): void {
  const why = lacking(...needs);
  if (why === undefined) return;
  skipOrFail(why);
  ctx.skip(why);
}
