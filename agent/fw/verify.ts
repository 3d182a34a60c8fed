/**
 * Checks a downloaded firmware image before it is installed (docs/decisions.md §7): its size and sha256 against the
 * job's metadata, then the Ed25519 signature over the statement that binds those to the image's name, platform
 * and version. The image is read a piece at a time, so its size is bounded by the disk, not by memory.
 */
import { createHash, createPublicKey } from 'node:crypto';
import { open, readFile } from 'node:fs/promises';
import { type FirmwareIdentity, verifyFirmware } from '../../protocol/firmware.js';

export type VerifyFailure = 'size' | 'sha256' | 'signature' | 'no-keys' | 'unreadable';

/** `keyIndex` names the key that verified, so a log can show which one of a rotation is in use. */
export type VerifyResult = { ok: true; keyIndex: number } | { ok: false; reason: VerifyFailure; detail: string };

interface Digest {
  size: number;
  sha256: string;
}

/** Bytes read at a time while hashing; one buffer, reused for the whole image. */
const READ_CHUNK = 1024 * 1024;

/**
 * Hashes the file through one reused buffer: a read stream allocates a new buffer per chunk, and V8 collects
 * that garbage only once tens of megabytes of it have piled up, which showed in the agent's resident size.
 */
async function digestFile(path: string): Promise<Digest> {
  const hash = createHash('sha256');
  let size = 0;
  const file = await open(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(READ_CHUNK);
    for (;;) {
      const { bytesRead } = await file.read(buf, 0, buf.length, null);
      if (bytesRead === 0) break;
      size += bytesRead;
      hash.update(buf.subarray(0, bytesRead));
    }
  } finally {
    await file.close();
  }
  return { size, sha256: hash.digest('hex') };
}

/**
 * Verifies the image at `path`. Never throws: every failure comes back as a reason code with a sentence a field
 * engineer can read in the job's error.
 */
export async function verifyImage(
  path: string,
  meta: FirmwareIdentity,
  signatureB64: string,
  publicKeyPems: ReadonlyArray<string | Buffer>,
): Promise<VerifyResult> {
  if (publicKeyPems.length === 0) {
    return { ok: false, reason: 'no-keys', detail: 'no firmware public key is configured, so no image can be trusted' };
  }
  let digest: Digest;
  try {
    digest = await digestFile(path);
  } catch (err) {
    return { ok: false, reason: 'unreadable', detail: `cannot read the image ${path}: ${(err as Error).message}` };
  }
  if (digest.size !== meta.size) {
    return {
      ok: false,
      reason: 'size',
      detail: `the image is ${digest.size} bytes, the job announced ${meta.size}`,
    };
  }
  const expected = meta.sha256.toLowerCase();
  if (digest.sha256 !== expected) {
    return {
      ok: false,
      reason: 'sha256',
      detail: `the image's sha256 is ${digest.sha256}, the job announced ${expected}`,
    };
  }
  // The statement is built from the digest actually computed, so what is verified is the bytes on disk.
  const keyIndex = verifyFirmware({ ...meta, size: digest.size, sha256: digest.sha256 }, signatureB64, publicKeyPems);
  if (keyIndex < 0) {
    return {
      ok: false,
      reason: 'signature',
      detail:
        `the signature over ${meta.name} ${meta.platform} version ${meta.version} ` +
        `does not verify with any of the ${publicKeyPems.length} configured public key(s)`,
    };
  }
  return { ok: true, keyIndex };
}

export class FirmwareKeyError extends Error {
  override name = 'FirmwareKeyError';
  constructor(
    readonly file: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Reads the configured firmware public keys (PEM, SPKI, Ed25519), in order, so that the index a verification
 * returns maps back to a file. A missing or wrong file is a configuration error that names the file.
 */
export async function loadPublicKeys(files: readonly string[]): Promise<string[]> {
  const pems: string[] = [];
  for (const file of files) {
    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch (err) {
      throw new FirmwareKeyError(file, `cannot read the firmware public key ${file}: ${(err as Error).message}`);
    }
    // Node derives a public key from a private one; a private key in this place is a mistake worth stopping for.
    if (/-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(text)) {
      throw new FirmwareKeyError(file, `${file} holds a private key; the agent needs only the public key`);
    }
    let type: string | undefined;
    try {
      type = createPublicKey(text).asymmetricKeyType;
    } catch (err) {
      throw new FirmwareKeyError(file, `${file} is not a PEM public key: ${(err as Error).message}`);
    }
    if (type !== 'ed25519') {
      throw new FirmwareKeyError(file, `${file} holds a ${type ?? 'unknown'} key; firmware keys must be Ed25519`);
    }
    pems.push(text);
  }
  return pems;
}
