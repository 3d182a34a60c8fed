/**
 * A release for another CPU, built on this machine (docs/operations.md, "Building a release"): scripts/release.sh
 * with two architectures, this machine's and arm64 (x64 on an arm64 machine), gives two tarballs that differ only
 * in their compiled code and RELEASE; the other CPU's native modules are cross-compiled with Debian's gcc for it
 * and kept in the cross-compile cache. With that cache warm (the long test and every later run), this takes about
 * 30 s; the first build of a machine cross-compiles better-sqlite3 (about 2 minutes on two cores).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, tempDir } from '../support/agent.js';
import { type Need, missing } from '../support/system.js';

const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
const HOST = process.arch === 'arm' ? 'armhf' : process.arch;
/** The other CPU, with the cross compiler its build needs and what ELF headers say of its code. */
const TARGET =
  HOST === 'arm64'
    ? { arch: 'x64', node: 'x64', needs: ['x86_64-linux-gnu-gcc', 'x86_64-linux-gnu-g++'] as Need[], machine: 62 }
    : {
        arch: 'arm64',
        node: 'arm64',
        needs: ['aarch64-linux-gnu-gcc', 'aarch64-linux-gnu-g++'] as Need[],
        machine: 183,
      };
/** ELF class and machine of this machine's code. */
const HOST_ELF: Record<string, [number, number]> = { x64: [2, 62], arm64: [2, 183], armhf: [1, 40] };

/** Every file under `dir`, as paths relative to it. */
function files(dir: string, base = dir): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    return e.isDirectory() ? files(path, base) : [relative(base, path)];
  });
}

/** ELF class (1: 32-bit, 2: 64-bit) and machine of a compiled file. */
function elf(path: string): [number, number] {
  const b = readFileSync(path);
  expect(b.subarray(0, 4).toString('latin1'), `${path} is an ELF file`).toBe('\x7fELF');
  return [b[4]!, b.readUInt16LE(18)];
}

describe.skipIf(missing(...TARGET.needs, 'make', 'python3'))(
  `a release for ${TARGET.arch}, cross-compiled on this ${HOST} machine`,
  () => {
    let work: string;
    let stderr: string;
    let host: string;
    let target: string;
    // The cache release.sh uses by default, named to it, so that the test can look into it.
    const cache =
      process.env.DEVCLOUD_CROSS_CACHE ??
      join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'devcloud-cross');

    beforeAll(() => {
      work = tempDir('devcloud-release-arch-');
      const r = spawnSync(
        'sh',
        [join(ROOT, 'scripts/release.sh'), '--arch', `${HOST},${TARGET.arch}`, '--out', join(work, 'out')],
        { cwd: ROOT, encoding: 'utf8', env: { ...process.env, DEVCLOUD_CROSS_CACHE: cache } },
      );
      stderr = r.stderr;
      expect(r.status, r.stderr).toBe(0);
      // One tarball a line, in the order asked, each named for its architecture.
      const tarballs = r.stdout.trim().split('\n').slice(-2);
      expect(tarballs).toEqual(
        [HOST, TARGET.arch].map((a) => join(work, 'out', `devcloud-${VERSION}-linux-${a}.tar.gz`)),
      );
      for (const t of tarballs) execFileSync('tar', ['-xzf', t, '-C', work]);
      host = join(work, `devcloud-${VERSION}-linux-${HOST}`);
      target = join(work, `devcloud-${VERSION}-linux-${TARGET.arch}`);
    }, 900_000);

    afterAll(() => {
      if (work) rmSync(work, { recursive: true, force: true });
    });

    it('holds the same JavaScript, packages and docs as the release for this machine', () => {
      /** What both must have alike: all but RELEASE and the native modules' build folders. */
      const shared = (dir: string) => files(dir).filter((f) => f !== 'RELEASE' && !/\/build\//.test(f));
      const names = shared(target);
      expect(names).toEqual(shared(host));
      expect(names).toContain('dist/agent/main.js');
      expect(names).toContain('node_modules/better-sqlite3/lib/index.js');
      for (const f of names) {
        expect(readFileSync(join(target, f)).equals(readFileSync(join(host, f))), f).toBe(true);
      }
    });

    it(`has native modules compiled for ${TARGET.arch} in place of this machine's, and cached`, () => {
      const natives = (dir: string) => files(dir).filter((f) => f.endsWith('.node'));
      const compiled = natives(target);
      expect(compiled).toEqual(
        expect.arrayContaining([
          'node_modules/better-sqlite3/build/Release/better_sqlite3.node',
          'node_modules/unix-dgram/build/Release/unix_dgram.node',
        ]),
      );
      // The same modules, each for its CPU; nothing else of this machine's build.
      expect(compiled.sort()).toEqual(natives(host).sort());
      for (const f of compiled) expect(elf(join(target, f)), f).toEqual([2, TARGET.machine]);
      for (const f of natives(host)) expect(elf(join(host, f)), f).toEqual(HOST_ELF[HOST]);
      expect(readdirSync(join(target, 'node_modules/better-sqlite3/build'))).toEqual(['Release']);

      // Each module's build, kept by module version, CPU, Node.js ABI and compiler; the next release takes it.
      for (const [pkg, file] of [
        ['better-sqlite3', 'better_sqlite3.node'],
        ['unix-dgram', 'unix_dgram.node'],
      ] as const) {
        const { version } = JSON.parse(readFileSync(join(ROOT, 'node_modules', pkg, 'package.json'), 'utf8')) as {
          version: string;
        };
        const prefix = `${pkg}-${version}-linux-${TARGET.arch}-node${process.versions.modules}-gcc`;
        const entry = readdirSync(cache).find((e) => e.startsWith(prefix));
        expect(entry, `${prefix}* in ${cache}`).toBeDefined();
        const built = join(target, 'node_modules', pkg, 'build/Release', file);
        expect(readFileSync(join(cache, entry!, file)).equals(readFileSync(built))).toBe(true);
        expect(stderr).toMatch(new RegExp(`${pkg} ${version} for ${TARGET.arch}: (cached|cross-compiling)`));
      }
    });

    it('says what it was built for in RELEASE', () => {
      const release = readFileSync(join(target, 'RELEASE'), 'utf8');
      expect(release).toContain(`version=${VERSION}\n`);
      expect(release).toContain(`platform=linux-${TARGET.node}\n`);
      // Compiled against this machine's Node.js headers: its ABI.
      expect(release).toContain(`node_abi=${process.versions.modules}\n`);
      expect(readFileSync(join(host, 'RELEASE'), 'utf8')).toContain(`platform=linux-${process.arch}\n`);
    });

    it("is refused by this machine's installer, and installed unchecked with --any-arch for packaging", () => {
      const env = { PATH: process.env.PATH ?? '', DESTDIR: join(work, 'root') };
      const refused = spawnSync('sh', [join(target, 'scripts/install.sh')], { cwd: work, env, encoding: 'utf8' });
      expect(refused.status).toBe(1);
      expect(refused.stderr).toContain(`this release is for linux-${TARGET.node} and this machine is linux-`);
      expect(existsSync(join(work, 'root/opt/devcloud'))).toBe(false);

      const packaged = spawnSync('sh', [join(target, 'scripts/install.sh'), '--any-arch', '--no-user'], {
        cwd: work,
        env,
        encoding: 'utf8',
      });
      expect(packaged.status, packaged.stderr).toBe(0);
      expect(
        elf(join(work, 'root/opt/devcloud/node_modules/better-sqlite3/build/Release/better_sqlite3.node')),
      ).toEqual([2, TARGET.machine]);
    });
  },
);
