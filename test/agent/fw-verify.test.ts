/**
 * Image verification before install (docs/decisions.md §7): size and sha256 from the job, then the Ed25519 signature
 * over the statement that binds them to the image's name, platform and version, against the configured keys.
 */
import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { FirmwareKeyError, loadPublicKeys, verifyImage } from '../../agent/fw/verify.js';
import { type FirmwareIdentity, signFirmware } from '../../protocol/index.js';
import { tempDir } from '../support/agent.js';

const dir = tempDir('devcloud-fw-verify-');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function ed25519(): { privatePem: string; publicPem: string } {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    privatePem: privateKey.export({ format: 'pem', type: 'pkcs8' }).toString(),
    publicPem: publicKey.export({ format: 'pem', type: 'spki' }).toString(),
  };
}

const oldKey = ed25519();
const newKey = ed25519();
const unknownKey = ed25519();

// Larger than one read chunk, so the digest really is computed over several.
const image = randomBytes(300_000 + 17);
const imagePath = join(dir, 'image.bin');
writeFileSync(imagePath, image);
const meta: FirmwareIdentity = {
  name: 'gateway-os',
  platform: 'rpi4',
  version: 7,
  size: image.length,
  sha256: createHash('sha256').update(image).digest('hex'),
};
const signature = signFirmware(meta, newKey.privatePem);
const keys = [oldKey.publicPem, newKey.publicPem];

describe('verifyImage', () => {
  it('accepts a good image and names the key that signed it (rotation: the second key)', async () => {
    expect(await verifyImage(imagePath, meta, signature, keys)).toEqual({ ok: true, keyIndex: 1 });
    expect(await verifyImage(imagePath, meta, signFirmware(meta, oldKey.privatePem), keys)).toEqual({
      ok: true,
      keyIndex: 0,
    });
  });

  it('accepts the sha256 in upper case, as hex is hex', async () => {
    const upper = { ...meta, sha256: meta.sha256.toUpperCase() };
    expect(await verifyImage(imagePath, upper, signature, keys)).toEqual({ ok: true, keyIndex: 1 });
  });

  it('reports a flipped byte as a sha256 mismatch', async () => {
    const bad = Buffer.from(image);
    bad[123_456] = bad[123_456]! ^ 0x80;
    const path = join(dir, 'flipped.bin');
    writeFileSync(path, bad);
    const r = await verifyImage(path, meta, signature, keys);
    expect(r).toMatchObject({ ok: false, reason: 'sha256' });
    if (!r.ok) expect(r.detail).toContain(meta.sha256);
  });

  it('reports a short or long file as a size mismatch', async () => {
    const short = join(dir, 'short.bin');
    writeFileSync(short, image.subarray(0, image.length - 1));
    const r = await verifyImage(short, meta, signature, keys);
    expect(r).toMatchObject({ ok: false, reason: 'size' });
    if (!r.ok) expect(r.detail).toBe(`the image is ${image.length - 1} bytes, the job announced ${image.length}`);

    const long = join(dir, 'long.bin');
    writeFileSync(long, Buffer.concat([image, Buffer.from([0])]));
    expect(await verifyImage(long, meta, signature, keys)).toMatchObject({ ok: false, reason: 'size' });
  });

  it('refuses an image signed by a key that is not configured', async () => {
    const forged = signFirmware(meta, unknownKey.privatePem);
    const r = await verifyImage(imagePath, meta, forged, keys);
    expect(r).toMatchObject({ ok: false, reason: 'signature' });
    if (!r.ok) expect(r.detail).toMatch(/does not verify with any of the 2 configured public key/);
  });

  it('refuses a signed image passed off under other metadata', async () => {
    for (const other of [
      { ...meta, name: 'other-os' },
      { ...meta, version: 8 },
      { ...meta, platform: 'rpi5' },
    ]) {
      expect(await verifyImage(imagePath, other, signature, keys)).toMatchObject({ ok: false, reason: 'signature' });
    }
  });

  it('refuses a garbage signature', async () => {
    expect(await verifyImage(imagePath, meta, 'AAAA', keys)).toMatchObject({ ok: false, reason: 'signature' });
  });

  it('trusts nothing without keys', async () => {
    const r = await verifyImage(imagePath, meta, signature, []);
    expect(r).toMatchObject({ ok: false, reason: 'no-keys' });
    if (!r.ok) expect(r.detail).toMatch(/no firmware public key/);
  });

  it('reports a missing file as unreadable', async () => {
    const path = join(dir, 'missing.bin');
    const r = await verifyImage(path, meta, signature, keys);
    expect(r).toMatchObject({ ok: false, reason: 'unreadable' });
    if (!r.ok) expect(r.detail).toContain(path);
  });
});

describe('loadPublicKeys', () => {
  function write(name: string, text: string): string {
    const path = join(dir, name);
    writeFileSync(path, text);
    return path;
  }

  it('reads the keys in order, so that an index maps back to a file', async () => {
    const files = [write('old.pem', oldKey.publicPem), write('new.pem', newKey.publicPem)];
    const pems = await loadPublicKeys(files);
    expect(pems).toEqual([oldKey.publicPem, newKey.publicPem]);
    expect(await verifyImage(imagePath, meta, signature, pems)).toEqual({ ok: true, keyIndex: 1 });
    expect(await loadPublicKeys([])).toEqual([]);
  });

  async function keyError(files: string[]): Promise<FirmwareKeyError> {
    try {
      await loadPublicKeys(files);
    } catch (err) {
      expect(err).toBeInstanceOf(FirmwareKeyError);
      return err as FirmwareKeyError;
    }
    throw new Error('expected a FirmwareKeyError');
  }

  it('names the file that is missing', async () => {
    const good = write('good.pem', oldKey.publicPem);
    const missing = join(dir, 'nope.pem');
    const err = await keyError([good, missing]);
    expect(err.file).toBe(missing);
    expect(err.message).toContain(missing);
  });

  it('names the file that is not a PEM key', async () => {
    const bad = write('bad.pem', 'hello\n');
    const err = await keyError([bad]);
    expect(err.file).toBe(bad);
    expect(err.message).toMatch(/bad\.pem is not a PEM public key/);
  });

  it('refuses a key that is not Ed25519', async () => {
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const file = write('rsa.pem', rsa.publicKey.export({ format: 'pem', type: 'spki' }).toString());
    const err = await keyError([file]);
    expect(err.message).toMatch(/rsa\.pem holds a rsa key; firmware keys must be Ed25519/);
  });

  it('refuses a private key in place of the public one', async () => {
    const file = write('private.pem', newKey.privatePem);
    const err = await keyError([file]);
    expect(err.message).toMatch(/private\.pem holds a private key/);
    // The file is left as it was.
    expect(readFileSync(file, 'utf8')).toBe(newKey.privatePem);
  });
});
