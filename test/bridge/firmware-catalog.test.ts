/**
 * The firmware catalog as an operator and a user meet it: `devcloud-bridge firmware keygen|add|list` run through
 * `runCli` on a real data directory, image files made here and checked byte for byte, signatures checked with
 * the protocol's verifier, and `GET /0/firmware/` over a listening HTTP server.
 */
import { createHash, createPrivateKey, createPublicKey, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { runCli } from '../../bridge/cli.js';
import type { FirmwareImage } from '../../bridge/firmware/catalog.js';
import { verifyFirmware } from '../../protocol/firmware.js';
import { tempDir } from '../support/agent.js';
import { type TestBridge, startTestBridge } from '../support/bridge.js';

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function dir(prefix = 'devcloud-fw-'): string {
  const d = tempDir(prefix);
  cleanups.push(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

interface Run {
  code: number;
  out: string;
  err: string;
}

/** `devcloud-bridge ARGS` in this process, with an empty configuration folder, its output captured. */
async function cli(args: string[]): Promise<Run> {
  let out = '';
  let err = '';
  const io = { out: (s: string) => (out += `${s}\n`), err: (s: string) => (err += `${s}\n`) };
  const code = await runCli(args, io, { CONFIGURATION_DIRECTORY: dir('devcloud-fw-conf-') });
  return { code, out, err };
}

/** A file of `size` random bytes, written in pieces. */
function imageFile(size: number): string {
  const path = join(dir(), 'image.bin');
  const parts: Buffer[] = [];
  for (let left = size; left > 0; left -= 1 << 20) parts.push(randomBytes(Math.min(left, 1 << 20)));
  writeFileSync(path, Buffer.concat(parts));
  return path;
}

const sha256Of = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');

async function keys(): Promise<{ key: string; pub: string }> {
  const out = dir('devcloud-fw-keys-');
  const r = await cli(['firmware', 'keygen', '--out', out]);
  expect(r.code, r.err).toBe(0);
  return { key: join(out, 'signing.key'), pub: join(out, 'signing.pub') };
}

async function list(dataDir: string): Promise<FirmwareImage[]> {
  const r = await cli(['firmware', 'list', '--json', '--data-dir', dataDir]);
  expect(r.code, r.err).toBe(0);
  return JSON.parse(r.out) as FirmwareImage[];
}

/** The image files in the data directory (temporary files included). */
function imageFiles(dataDir: string): string[] {
  const d = join(dataDir, 'firmware');
  return existsSync(d) ? readdirSync(d).sort() : [];
}

function addArgs(file: string, dataDir: string, key: string, over: Record<string, string> = {}): string[] {
  const flags = {
    '--name': 'acme/sensor/v3.bin',
    '--platform': 'linux-x64',
    '--version': '3',
    '--from': 'linux-x64,linux-arm64',
    '--sign-key': key,
    '--data-dir': dataDir,
    ...over,
  };
  return ['firmware', 'add', file, ...Object.entries(flags).flat()];
}

describe('firmware keygen', () => {
  it('writes an Ed25519 pair, the private key readable by its owner only, and never overwrites it', async () => {
    const out = join(dir(), 'keys');
    const r = await cli(['firmware', 'keygen', '--out', out]);
    expect(r.code, r.err).toBe(0);
    const keyPath = join(out, 'signing.key');
    const pubPath = join(out, 'signing.pub');
    expect(statSync(keyPath).mode & 0o777).toBe(0o600);
    const keyPem = readFileSync(keyPath, 'utf8');
    const pubPem = readFileSync(pubPath, 'utf8');
    expect(keyPem).toMatch(/^-----BEGIN PRIVATE KEY-----\n/);
    expect(pubPem).toMatch(/^-----BEGIN PUBLIC KEY-----\n/);
    expect(createPrivateKey(keyPem).asymmetricKeyType).toBe('ed25519');
    // The public file is the private key's own half.
    expect(createPublicKey(keyPem).export({ type: 'spki', format: 'pem' })).toBe(pubPem);

    const again = await cli(['firmware', 'keygen', '--out', out]);
    expect(again.code).toBe(1);
    expect(again.err).toMatch(/already exist.*not overwriting/);
    expect(readFileSync(keyPath, 'utf8')).toBe(keyPem);
    expect(readFileSync(pubPath, 'utf8')).toBe(pubPem);

    // Either file present is enough to refuse.
    rmSync(keyPath);
    const half = await cli(['firmware', 'keygen', '--out', out]);
    expect(half.code).toBe(1);
    expect(existsSync(keyPath)).toBe(false);
    expect(readFileSync(pubPath, 'utf8')).toBe(pubPem);

    const usage = await cli(['firmware', 'keygen']);
    expect(usage.code).toBe(2);
    expect(usage.err).toMatch(/--out DIR/);
  });
});

describe('firmware add and list', () => {
  it('copies, hashes and signs an image of a few MB, and lists it', async () => {
    const { key, pub } = await keys();
    const dataDir = dir();
    const file = imageFile(5 * 1024 * 1024 + 123);
    const r = await cli(addArgs(file, dataDir, key));
    expect(r.code, r.err).toBe(0);
    expect(r.out).toContain('acme/sensor/v3.bin');

    const [img, ...others] = await list(dataDir);
    expect(others).toEqual([]);
    const sha256 = sha256Of(file);
    expect(img).toMatchObject({
      name: 'acme/sensor/v3.bin',
      platform: 'linux-x64',
      version: 3,
      from: ['linux-x64', 'linux-arm64'],
      toPlatform: 'linux-x64',
      size: statSync(file).size,
      sha256,
    });
    expect(img!.addedAt).toBeGreaterThan(0);
    expect(verifyFirmware(img!, img!.signature, [readFileSync(pub)])).toBe(0);
    // The signature binds the metadata: the same bytes under another version do not verify.
    expect(verifyFirmware({ ...img!, version: 4 }, img!.signature, [readFileSync(pub)])).toBe(-1);

    // The stored copy is the file, under its sha256, with no temporary file left beside it.
    expect(imageFiles(dataDir)).toEqual([sha256]);
    expect(readFileSync(join(dataDir, 'firmware', sha256)).equals(readFileSync(file))).toBe(true);

    const text = await cli(['firmware', 'list', '--data-dir', dataDir]);
    expect(text.code).toBe(0);
    expect(text.out).toContain(`acme/sensor/v3.bin  linux-x64  v3  from=linux-x64,linux-arm64  to=linux-x64`);
    expect(text.out).toContain(sha256);
  });

  it('takes --to-platform, and the firmware flags as --flag=VALUE', async () => {
    const { key } = await keys();
    const dataDir = dir();
    const r = await cli([
      'firmware',
      'add',
      imageFile(1000),
      '--name',
      'rpi/os/1',
      '--platform=rpi-a',
      '--version=0',
      '--from=rpi-a',
      '--to-platform=rpi-b',
      `--sign-key=${key}`,
      '--data-dir',
      dataDir,
      '--json',
    ]);
    expect(r.code, r.err).toBe(0);
    expect(JSON.parse(r.out)).toMatchObject({ name: 'rpi/os/1', platform: 'rpi-a', version: 0, toPlatform: 'rpi-b' });
    expect(await list(dataDir)).toMatchObject([{ name: 'rpi/os/1', version: 0, from: ['rpi-a'], toPlatform: 'rpi-b' }]);
  });

  it.each([
    ['..', 'a/../b'],
    ['a leading /', '/abs/image'],
    ['an empty segment', 'a//b'],
    ['a trailing /', 'a/b/'],
    ['a space', 'my image'],
    ['a segment starting with .', 'a/.hidden'],
    ['a newline', 'a\nsha256=0'],
    ['257 characters', `${'a'.repeat(128)}/${'b'.repeat(128)}`],
    ['nothing', ''],
  ])('refuses a name with %s and stores nothing', async (_what, name) => {
    const { key } = await keys();
    const dataDir = dir();
    const r = await cli(addArgs(imageFile(4096), dataDir, key, { '--name': name }));
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/--name/);
    expect(await list(dataDir)).toEqual([]);
    expect(imageFiles(dataDir)).toEqual([]);
  });

  it('takes a name of exactly 256 characters', async () => {
    const { key } = await keys();
    const dataDir = dir();
    const name = `${'a'.repeat(127)}/${'b'.repeat(128)}`;
    expect(name).toHaveLength(256);
    const r = await cli(addArgs(imageFile(10), dataDir, key, { '--name': name }));
    expect(r.code, r.err).toBe(0);
    expect((await list(dataDir)).map((f) => f.name)).toEqual([name]);
  });

  it.each([
    ['a negative version', { '--version': '-1' }, /--version/],
    ['a fractional version', { '--version': '1.5' }, /--version/],
    ['a version that is not a number', { '--version': 'v2' }, /--version/],
    ['a platform with a space', { '--platform': 'linux x64' }, /--platform/],
    ['an empty from list', { '--from': '' }, /--from/],
    ['a bad from platform', { '--from': 'ok,bad one' }, /--from/],
    ['a bad to platform', { '--to-platform': '../x' }, /--to-platform/],
  ])('refuses %s with a usage error', async (_what, over, message) => {
    const { key } = await keys();
    const dataDir = dir();
    const r = await cli(addArgs(imageFile(10), dataDir, key, over));
    expect(r.code).toBe(2);
    expect(r.err).toMatch(message);
    expect(await list(dataDir)).toEqual([]);
    expect(imageFiles(dataDir)).toEqual([]);
  });

  it('refuses missing flags and arguments with a usage error, and stray ones', async () => {
    const { key } = await keys();
    const dataDir = dir();
    const file = imageFile(10);
    const missing = await cli(['firmware', 'add', file, '--data-dir', dataDir]);
    expect(missing.code).toBe(2);
    for (const flag of ['--name', '--platform', '--version', '--from', '--sign-key'])
      expect(missing.err).toContain(`needs ${flag}`);
    expect((await cli(addArgs(file, dataDir, key).filter((a) => a !== file))).code).toBe(2);
    expect((await cli([...addArgs(file, dataDir, key), 'extra'])).code).toBe(2);
    expect((await cli([...addArgs(file, dataDir, key), '--out', dataDir])).code).toBe(2);
    expect((await cli(['firmware', 'add', file, '--version'])).err).toMatch(/flag --version needs a value/);
    expect((await cli(['frontend', 'list', '--platform', 'x', '--data-dir', dataDir])).code).toBe(2);
    expect((await cli(['firmware', 'frobnicate', '--data-dir', dataDir])).code).toBe(2);
    expect(await list(dataDir)).toEqual([]);
  });

  it('fails on a missing image file or a key that cannot sign, and stores nothing', async () => {
    const { key, pub } = await keys();
    const dataDir = dir();
    const noFile = await cli(addArgs(join(dataDir, 'nope.bin'), dataDir, key));
    expect(noFile.code).toBe(1);
    expect(noFile.err).toMatch(/nope\.bin/);
    const file = imageFile(10);
    const pubAsKey = await cli(addArgs(file, dataDir, pub));
    expect(pubAsKey.code).toBe(1);
    expect(pubAsKey.err).toMatch(/--sign-key/);
    const noKey = await cli(addArgs(file, dataDir, join(dataDir, 'none.key')));
    expect(noKey.code).toBe(1);
    expect(await list(dataDir)).toEqual([]);
    expect(imageFiles(dataDir)).toEqual([]);
  });

  it('gives a name once: the same image again is fine, another image under it is refused', async () => {
    const { key } = await keys();
    const dataDir = dir();
    const file = imageFile(200_000);
    expect((await cli(addArgs(file, dataDir, key))).code).toBe(0);
    const [first] = await list(dataDir);

    const same = await cli(addArgs(file, dataDir, key));
    expect(same.code, same.err).toBe(0);
    expect(await list(dataDir)).toEqual([first]);

    const other = await cli(addArgs(imageFile(200_000), dataDir, key));
    expect(other.code).toBe(1);
    expect(other.err).toMatch(/already in the catalog/);
    const otherVersion = await cli(addArgs(file, dataDir, key, { '--version': '4' }));
    expect(otherVersion.code).toBe(1);
    expect(await list(dataDir)).toEqual([first]);
    // The refused copy does not stay behind.
    expect(imageFiles(dataDir)).toEqual([first!.sha256]);

    // The same bytes under a second name share the file.
    expect((await cli(addArgs(file, dataDir, key, { '--name': 'acme/sensor/v3-copy.bin' }))).code).toBe(0);
    expect((await list(dataDir)).map((f) => f.name)).toEqual(['acme/sensor/v3-copy.bin', 'acme/sensor/v3.bin']);
    expect(imageFiles(dataDir)).toEqual([first!.sha256]);
  });
});

describe('GET /0/firmware/', () => {
  let bridge: TestBridge | undefined;
  afterEach(async () => {
    await bridge?.close();
    bridge = undefined;
  });

  it('lists the catalog to a logged-in user, in the specification shape, by name then version', async () => {
    const b = (bridge = await startTestBridge({ transport: 'http' }));
    const anon = b.client();
    const none = await anon.get('/0/firmware/');
    expect([none.status, none.body]).toEqual([401, 'no-session']);

    const user = b.client();
    const signup = await user.post('/0/session/signup', {
      form: { login: 'fw@example.com', password: 'correct horse battery' },
    });
    expect(signup.status).toBe(201);
    const empty = await user.get('/0/firmware/');
    expect([empty.status, empty.contentType, JSON.parse(empty.body)]).toEqual([
      200,
      'application/json; charset=utf-8',
      [],
    ]);

    // Added by the CLI in the bridge's data directory while the bridge serves it.
    const { key } = await keys();
    const file = imageFile(300_000);
    for (const [name, version, platform, to] of [
      ['zeta/fw', '2', 'linux-arm64', 'linux-arm64'],
      ['alpha/board/fw.img', '10', 'board-a', 'board-b'],
    ] as const) {
      const r = await cli(
        addArgs(file, b.dataDir, key, {
          '--name': name,
          '--version': version,
          '--platform': platform,
          '--from': 'board-a,linux-arm64',
          '--to-platform': to,
        }),
      );
      expect(r.code, r.err).toBe(0);
    }
    const res = await user.get('/0/firmware');
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body)).toEqual([
      {
        name: 'alpha/board/fw.img',
        platform: 'board-a',
        version: 10,
        info: {
          platforms: { from: ['board-a', 'linux-arm64'], to: { platform: 'board-b', name: 'alpha/board/fw.img' } },
        },
      },
      {
        name: 'zeta/fw',
        platform: 'linux-arm64',
        version: 2,
        info: { platforms: { from: ['board-a', 'linux-arm64'], to: { platform: 'linux-arm64', name: 'zeta/fw' } } },
      },
    ]);
    expect(res.body).not.toMatch(/sha256|signature/);

    const loggedOut = await anon.get('/0/firmware/');
    expect(loggedOut.status).toBe(401);
  });
});
