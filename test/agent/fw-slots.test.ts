/**
 * The A/B slot installer (docs/decisions.md §7) against real files and the system's `tar`: installs land only in the
 * inactive slot, unsafe archives are refused before anything is written, the install script runs with its slot,
 * and switching or rolling back is one atomic rename of the `current` link.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  linkSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  InstallError,
  activeSlot,
  ensureSlots,
  inactiveSlot,
  installImage,
  listInBackground,
  rollbackSlot,
  switchSlot,
} from '../../agent/fw/slots.js';
import { tempDir } from '../support/agent.js';
import { missing, requires } from '../support/system.js';

const root = tempDir('devcloud-fw-slots-');
afterAll(() => rmSync(root, { recursive: true, force: true }));

let counter = 0;
function fresh(name: string): string {
  const dir = join(root, `${name}-${++counter}`);
  mkdirSync(dir, { recursive: true });
  return dir;
}

type Files = Record<string, string | { content: string; mode: number }>;

/** Writes `files` into a fresh folder and packs it with the system tar; `extra` are raw tar arguments. */
function makeImage(files: Files, extra: string[] = []): string {
  const src = fresh('src');
  for (const [name, f] of Object.entries(files)) {
    const path = join(src, name);
    mkdirSync(dirname(path), { recursive: true });
    if (typeof f === 'string') writeFileSync(path, f);
    else writeFileSync(path, f.content, { mode: f.mode });
  }
  const image = join(fresh('img'), 'image.tar.gz');
  execFileSync('tar', ['-czf', image, '-C', src, ...extra, ...Object.keys(files)]);
  return image;
}

function manifest(m: Record<string, unknown>): string {
  return JSON.stringify(m);
}

const script = (body: string) => ({ content: `#!/bin/sh\n${body}\n`, mode: 0o755 });

async function installError(p: Promise<unknown>): Promise<InstallError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(InstallError);
  return err as InstallError;
}

/** A killed process whose parent is gone stays a zombie until init reaps it; that counts as dead here. */
function processAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

async function until(cond: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error('condition not met before the deadline');
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('slot layout', () => {
  it('treats a missing current link as slot a and creates both slot folders', async () => {
    const d = fresh('slots');
    expect(await activeSlot(d)).toBe('a');
    expect(await inactiveSlot(d)).toBe('b');
    await ensureSlots(d);
    expect(readdirSync(d).sort()).toEqual(['a', 'b']);
  });
});

describe('installImage', () => {
  it('installs into the inactive slot and leaves the active one untouched', async () => {
    const d = fresh('slots');
    await ensureSlots(d);
    writeFileSync(join(d, 'a', 'running.txt'), 'live');
    const image = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 2 }), 'bin/app': 'v2' });
    const result = await installImage(d, image);
    expect(result).toEqual({ slot: 'b', manifest: { name: 'gw', version: 2 } });
    expect(readFileSync(join(d, 'b', 'bin/app'), 'utf8')).toBe('v2');
    expect(readdirSync(join(d, 'a'))).toEqual(['running.txt']);
    expect(await activeSlot(d)).toBe('a');

    // After a switch the next install goes to the other slot, and the new active one stays as it is.
    await switchSlot(d, 'b');
    const again = await installImage(d, makeImage({ 'manifest.json': manifest({ name: 'gw', version: 3 }) }));
    expect(again.slot).toBe('a');
    expect(readFileSync(join(d, 'b', 'bin/app'), 'utf8')).toBe('v2');
    expect(existsSync(join(d, 'a', 'running.txt'))).toBe(false);
  });

  it('replaces the inactive slot completely when installing twice in a row', async () => {
    const d = fresh('slots');
    await installImage(d, makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), 'stale.txt': 'old' }));
    expect(existsSync(join(d, 'b', 'stale.txt'))).toBe(true);
    await installImage(d, makeImage({ 'manifest.json': manifest({ name: 'gw', version: 2 }), 'fresh.txt': 'new' }));
    expect(readdirSync(join(d, 'b')).sort()).toEqual(['fresh.txt', 'manifest.json']);
  });

  it('rejects an image without manifest.json', async () => {
    const d = fresh('slots');
    const err = await installError(installImage(d, makeImage({ 'app.bin': 'x' })));
    expect(err.code).toBe('bad-manifest');
    expect(err.message).toMatch(/no manifest\.json/);
  });

  it('rejects a manifest that is not JSON or misses its fields', async () => {
    const d = fresh('slots');
    const notJson = await installError(installImage(d, makeImage({ 'manifest.json': '{nope' })));
    expect(notJson.code).toBe('bad-manifest');
    expect(notJson.message).toMatch(/not valid JSON/);

    const noName = await installError(installImage(d, makeImage({ 'manifest.json': manifest({ version: 1 }) })));
    expect(noName.code).toBe('bad-manifest');
    expect(noName.message).toMatch(/name/);

    const escaping = await installError(
      installImage(d, makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1, install: '../x.sh' }) })),
    );
    expect(escaping.code).toBe('bad-manifest');
    expect(escaping.message).toMatch(/install/);
  });

  it('refuses an archive with a ../ member and writes nothing', async () => {
    const d = fresh('slots');
    await ensureSlots(d);
    const image = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), evil: 'pwned' }, [
      '-P',
      '--transform=s,^evil,../evil,',
    ]);
    expect(execFileSync('tar', ['-tzf', image], { encoding: 'utf8' })).toContain('../evil');
    writeFileSync(join(d, 'b', 'marker'), 'before');
    const err = await installError(installImage(d, image));
    expect(err.code).toBe('bad-archive');
    expect(err.message).toContain('../evil');
    expect(existsSync(join(d, 'evil'))).toBe(false);
    // Refused before the slot was emptied.
    expect(readdirSync(join(d, 'b'))).toEqual(['marker']);
  });

  it('refuses an archive with an absolute member and writes nothing outside the slot', async () => {
    const d = fresh('slots');
    const target = join(fresh('outside'), 'abs-evil');
    const image = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), 'abs-evil': 'pwned' }, [
      '-P',
      `--transform=s,^abs-evil,${target},`,
    ]);
    expect(execFileSync('tar', ['-tzf', image], { encoding: 'utf8' })).toContain(target);
    const err = await installError(installImage(d, image));
    expect(err.code).toBe('bad-archive');
    expect(existsSync(target)).toBe(false);
  });

  it('accepts a link that climbs with .. but stays inside the image', async () => {
    const d = fresh('slots');
    const src = fresh('src');
    mkdirSync(join(src, 'lib'));
    writeFileSync(join(src, 'manifest.json'), manifest({ name: 'gw', version: 1 }));
    execFileSync('ln', ['-s', '../manifest.json', join(src, 'lib', 'm')]);
    const image = join(fresh('img'), 'image.tar.gz');
    execFileSync('tar', ['-czf', image, '-C', src, 'manifest.json', 'lib']);
    expect((await installImage(d, image)).slot).toBe('b');
    expect(readlinkSync(join(d, 'b', 'lib', 'm'))).toBe('../manifest.json');
  });

  it('refuses an archive with a symlink that leaves the image', async () => {
    const d = fresh('slots');
    const src = fresh('src');
    writeFileSync(join(src, 'manifest.json'), manifest({ name: 'gw', version: 1 }));
    execFileSync('ln', ['-s', '../../outside', join(src, 'link')]);
    const image = join(fresh('img'), 'image.tar.gz');
    execFileSync('tar', ['-czf', image, '-C', src, 'manifest.json', 'link']);
    const err = await installError(installImage(d, image));
    expect(err.code).toBe('bad-archive');
  });

  it('refuses an image that unpacks to more bytes or members than allowed, before writing anything', async () => {
    const d = fresh('slots');
    await ensureSlots(d);
    writeFileSync(join(d, 'b', 'marker'), 'before');
    // 2 MB of zeros compress to a few kilobytes: the limit is on what the image unpacks to.
    const image = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), big: '\0'.repeat(2_000_000) });
    const big = await installError(installImage(d, image, { maxBytes: 1_000_000 }));
    expect([big.code, big.message]).toEqual(['too-large', 'the image unpacks to more than 1000000 bytes']);
    const many = await installError(installImage(d, image, { maxFiles: 1 }));
    expect(many.code).toBe('too-large');
    expect(many.message).toMatch(/^the image holds \d+ members, more than 1$/);
    expect(readdirSync(join(d, 'b'))).toEqual(['marker']);
    // Within the limits, the same image installs.
    expect((await installImage(d, image, { maxBytes: 3_000_000, maxFiles: 10 })).slot).toBe('b');
  });

  it('checks a listing made beforehand in the background instead of listing again', async () => {
    const d = fresh('slots');
    const image = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), 'bin/app': 'v1' });
    const listing = await listInBackground(image).finish();
    expect(listing).toMatch(/ bin\/app$/m);
    // The installer trusts the listing it is given: one naming a member outside the image refuses the image.
    const forged = `${listing}-rw-r--r-- root/root 1 2026-01-01 00:00 ../evil\n`;
    expect((await installError(installImage(d, image, { listing: forged }))).code).toBe('bad-archive');
    expect((await installImage(d, image, { listing })).slot).toBe('b');
    // A listing of something that is not an image fails like tar does.
    const junk = join(fresh('junk'), 'junk.tar.gz');
    writeFileSync(junk, 'not gzip');
    expect((await installError(listInBackground(junk).finish())).code).toBe('unpack-failed');
  });

  it('runs the install script in the slot with DEVCLOUD_SLOT', async () => {
    const d = fresh('slots');
    const image = makeImage({
      'manifest.json': manifest({ name: 'gw', version: '1.2', install: 'scripts/install.sh' }),
      'scripts/install.sh': script('echo "$DEVCLOUD_SLOT" > slot.txt\npwd -P > cwd.txt'),
    });
    const { slot, manifest: m } = await installImage(d, image);
    expect(m.install).toBe('scripts/install.sh');
    const slotDir = join(d, slot);
    expect(readFileSync(join(slotDir, 'slot.txt'), 'utf8').trim()).toBe(slotDir);
    expect(readFileSync(join(slotDir, 'cwd.txt'), 'utf8').trim()).toBe(
      execFileSync('realpath', [slotDir], { encoding: 'utf8' }).trim(),
    );
  });

  it('reports a failing install script with its exit status', async () => {
    const d = fresh('slots');
    const image = makeImage({
      'manifest.json': manifest({ name: 'gw', version: 1, install: 'install.sh' }),
      'install.sh': script('echo "disk full" >&2\nexit 1'),
    });
    const err = await installError(installImage(d, image));
    expect(err.code).toBe('script-failed');
    expect(err.message).toContain('exit status 1');
    expect(err.message).toContain('disk full');
  });

  it('kills a hanging install script, and what it started, at the timeout', async () => {
    const d = fresh('slots');
    const image = makeImage({
      'manifest.json': manifest({ name: 'gw', version: 1, install: 'install.sh' }),
      'install.sh': script('sleep 60 &\necho $! > sleep.pid\nwait'),
    });
    const started = Date.now();
    const err = await installError(installImage(d, image, { scriptTimeoutMs: 300 }));
    expect(err.code).toBe('script-timeout');
    expect(Date.now() - started).toBeLessThan(10_000);
    const pid = Number(readFileSync(join(d, 'b', 'sleep.pid'), 'utf8'));
    await until(() => !processAlive(pid), 5_000);
  });
});

/**
 * Special members (docs/firmware.md, the image format). The images are made with the real tools: `mknod` (as root)
 * and `mkfifo`, a 4755 file owned by another user (as root), and hard links (one made with Python's tarfile); each
 * is checked with GNU tar and with BusyBox tar as the installer's `tar`.
 */
type Special = 'chr' | 'blk' | 'fifo';
function specialImage(kind: Special): string {
  const src = fresh('src');
  writeFileSync(join(src, 'manifest.json'), manifest({ name: 'gw', version: 1 }));
  mkdirSync(join(src, 'a'));
  mkdirSync(join(src, 'b'));
  const made = {
    chr: () => execFileSync('mknod', [join(src, 'a', 'null2'), 'c', '1', '3']),
    blk: () => execFileSync('mknod', [join(src, 'a', 'sda'), 'b', '8', '0']),
    fifo: () => execFileSync('mkfifo', [join(src, 'b', 'pipe')]),
  };
  made[kind]();
  const image = join(fresh('img'), 'image.tar.gz');
  execFileSync('tar', ['-czf', image, '-C', src, '.']);
  return image;
}

/** A 4755 file and a 2755 folder owned by uid 4321, a sticky folder, and a hard link between two files. */
function privilegedImage(): string {
  const src = fresh('src');
  writeFileSync(join(src, 'manifest.json'), manifest({ name: 'gw', version: 1 }));
  mkdirSync(join(src, 'bin'));
  writeFileSync(join(src, 'bin', 'su2'), '#!/bin/sh\nid\n');
  chownSync(join(src, 'bin', 'su2'), 4321, 4321);
  chmodSync(join(src, 'bin', 'su2'), 0o4755);
  chownSync(join(src, 'bin'), 4321, 4321);
  chmodSync(join(src, 'bin'), 0o2755);
  mkdirSync(join(src, 'tmp'));
  chmodSync(join(src, 'tmp'), 0o1777);
  writeFileSync(join(src, 'data'), 'shared');
  linkSync(join(src, 'data'), join(src, 'data-link'));
  const image = join(fresh('img'), 'image.tar.gz');
  execFileSync('tar', ['-czf', image, '-C', src, '.']);
  return image;
}

/** An image whose hard link names `target` (not a member of it), made with Python's tarfile as tar will not. */
function hardLinkImage(target: string): string {
  const image = join(fresh('img'), 'image.tar.gz');
  const py = `
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w:gz') as t:
    m = b'{"name": "gw", "version": 1}'
    i = tarfile.TarInfo('manifest.json'); i.size = len(m); t.addfile(i, io.BytesIO(m))
    l = tarfile.TarInfo('passwd'); l.type = tarfile.LNKTYPE; l.linkname = sys.argv[2]; t.addfile(l)
`;
  execFileSync('python3', ['-c', py, image, target]);
  return image;
}

/** The checks every tar must pass; `run` is the installer with the tar under test. */
function specialMemberTests(run: <T>(work: () => Promise<T>) => Promise<T>): void {
  it.for([
    ['chr', /character device, "\.\/a\/null2"/],
    ['blk', /block device, "\.\/a\/sda"/],
    ['fifo', /FIFO, "\.\/b\/pipe"/],
  ] as const)(
    'refuses an image with a %s member before writing anything (bad-member)',
    async ([kind, message], ctx) => {
      // Only root makes device nodes.
      if (kind !== 'fifo') requires(ctx, 'root');
      const d = fresh('slots');
      await ensureSlots(d);
      writeFileSync(join(d, 'b', 'marker'), 'before');
      const err = await installError(run(() => installImage(d, specialImage(kind))));
      expect(err.code).toBe('bad-member');
      expect(err.message).toMatch(message);
      expect(readdirSync(join(d, 'b'))).toEqual(['marker']);
    },
  );

  it('refuses a special member that the listing did not show, after unpacking, and empties the slot', async () => {
    const d = fresh('slots');
    const image = specialImage('fifo');
    // A listing that hides the FIFO (as a name tar printed in a misleading way could): the unpacked slot is
    // checked again on the file system.
    const listing = (await run(() => listInBackground(image).finish()))
      .split('\n')
      .filter((l) => !l.includes('pipe'))
      .join('\n');
    const err = await installError(run(() => installImage(d, image, { listing })));
    expect(err.code).toBe('bad-member');
    expect(err.message).toMatch(/FIFO, "b\/pipe"/);
    expect(readdirSync(join(d, 'b'))).toEqual([]);
  });

  it('installs setuid, setgid and sticky members without those bits, owned by the installing user', async (ctx) => {
    // Only root gives a file to another user.
    requires(ctx, 'root');
    const d = fresh('slots');
    const r = await run(() => installImage(d, privilegedImage()));
    expect(r.slot).toBe('b');
    const st = (p: string) => statSync(join(d, 'b', p));
    expect(st('bin/su2').mode & 0o7777).toBe(0o755);
    expect(st('bin').mode & 0o7777).toBe(0o755);
    expect(st('tmp').mode & 0o7777).toBe(0o777);
    for (const p of ['bin/su2', 'bin', 'tmp', 'data']) {
      expect([p, st(p).uid, st(p).gid]).toEqual([p, process.getuid!(), process.getgid!()]);
    }
    // A hard link between two files of the image is kept as one.
    expect(readFileSync(join(d, 'b', 'data-link'), 'utf8')).toBe('shared');
    expect(st('data-link').ino).toBe(st('data').ino);
  });

  it.for(['/etc/passwd', 'missing'])(
    'refuses a hard link to %s, which is not a file of the image',
    async (target, ctx) => {
      requires(ctx, 'python3');
      const d = fresh('slots');
      await ensureSlots(d);
      writeFileSync(join(d, 'b', 'marker'), 'before');
      const err = await installError(run(() => installImage(d, hardLinkImage(target))));
      expect(['bad-member', 'bad-archive']).toContain(err.code);
      expect(readdirSync(join(d, 'b'))).toEqual(['marker']);
    },
  );
}

describe('installImage with special members, GNU tar', () => {
  it('is GNU tar that answers as tar', () => {
    expect(execFileSync('tar', ['--version'], { encoding: 'utf8' })).toMatch(/GNU tar/);
  });
  specialMemberTests((work) => work());
});

describe('switchSlot and rollbackSlot', () => {
  it('switches atomically, leaves no temporary link and is idempotent', async () => {
    const d = fresh('slots');
    await switchSlot(d, 'b');
    expect(readlinkSync(join(d, 'current'))).toBe('b');
    expect(await activeSlot(d)).toBe('b');
    await switchSlot(d, 'b');
    expect(readlinkSync(join(d, 'current'))).toBe('b');
    expect(readdirSync(d).filter((n) => n.includes('.tmp-'))).toEqual([]);
    expect(readlinkSync(join(d, 'previous'))).toBe('a');
  });

  it('rolls back to the slot that was active before the switch, idempotently', async () => {
    const d = fresh('slots');
    expect(await rollbackSlot(d)).toBe('a');
    await switchSlot(d, 'a');
    await switchSlot(d, 'b');
    expect(await rollbackSlot(d)).toBe('a');
    expect(readlinkSync(join(d, 'current'))).toBe('a');
    expect(await rollbackSlot(d)).toBe('a');
    expect(readlinkSync(join(d, 'current'))).toBe('a');
    expect(readdirSync(d).filter((n) => n.includes('.tmp-'))).toEqual([]);
  });
});

/**
 * Gateways often have BusyBox's tar rather than GNU's. The installer reads `tar -tv` listings to check members
 * and links; with BusyBox as `tar` (a shim first on PATH while the installer runs) it must decide the same.
 */
describe.skipIf(missing('busybox'))('installImage with BusyBox tar', () => {
  const shim = fresh('busybox-shim');
  writeFileSync(join(shim, 'tar'), '#!/bin/sh\nexec busybox tar "$@"\n', { mode: 0o755 });
  async function withBusybox<T>(work: () => Promise<T>): Promise<T> {
    const path = process.env.PATH;
    process.env.PATH = `${shim}:${path ?? ''}`;
    try {
      return await work();
    } finally {
      process.env.PATH = path;
    }
  }

  it('is BusyBox that answers as tar', async () => {
    const r = await withBusybox(() => Promise.resolve(spawnSync('tar', ['--help'], { encoding: 'utf8' })));
    expect(`${r.stdout}${r.stderr}`).toMatch(/BusyBox/);
  });

  it('installs an image with a link that stays inside it', async () => {
    const d = fresh('slots');
    const src = fresh('src');
    mkdirSync(join(src, 'bin'));
    writeFileSync(join(src, 'manifest.json'), manifest({ name: 'gw', version: 3 }));
    writeFileSync(join(src, 'bin', 'app'), 'v3');
    execFileSync('ln', ['-s', '../manifest.json', join(src, 'bin', 'manifest-link')]);
    const image = join(fresh('img'), 'image.tar.gz');
    execFileSync('tar', ['-czf', image, '-C', src, '.']);
    const r = await withBusybox(() => installImage(d, image));
    expect(r).toMatchObject({ slot: 'b', manifest: { name: 'gw', version: 3 } });
    expect(readFileSync(join(d, 'b', 'bin', 'app'), 'utf8')).toBe('v3');
    expect(readlinkSync(join(d, 'b', 'bin', 'manifest-link'))).toBe('../manifest.json');
  });

  it('keeps a ../ member inside the slot, and refuses a link that leaves the image or an image over the limits', async () => {
    const d = fresh('slots');
    await ensureSlots(d);
    // BusyBox strips a leading ../ when it lists and when it unpacks: the member lands inside the slot.
    const dotdot = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), evil: 'pwned' }, [
      '-P',
      '--transform=s,^evil,../evil,',
    ]);
    expect((await withBusybox(() => installImage(d, dotdot))).slot).toBe('b');
    expect(readFileSync(join(d, 'b', 'evil'), 'utf8')).toBe('pwned');
    expect(existsSync(join(d, 'evil'))).toBe(false);
    writeFileSync(join(d, 'b', 'marker'), 'before');
    rmSync(join(d, 'b', 'evil'));
    rmSync(join(d, 'b', 'manifest.json'));

    const src = fresh('src');
    mkdirSync(join(src, 'bin'));
    writeFileSync(join(src, 'manifest.json'), manifest({ name: 'gw', version: 1 }));
    execFileSync('ln', ['-s', '../../outside', join(src, 'bin', 'escape')]);
    const link = join(fresh('img'), 'image.tar.gz');
    execFileSync('tar', ['-czf', link, '-C', src, '.']);
    expect((await installError(withBusybox(() => installImage(d, link)))).code).toBe('bad-archive');

    const big = makeImage({ 'manifest.json': manifest({ name: 'gw', version: 1 }), big: '\0'.repeat(2_000_000) });
    const err = await installError(withBusybox(() => installImage(d, big, { maxBytes: 1_000_000 })));
    expect(err.code).toBe('too-large');
    expect(readdirSync(join(d, 'b'))).toEqual(['marker']);
  });

  describe('special members', () => {
    specialMemberTests(withBusybox);
  });
});
