/**
 * What a firmware signature covers (DESIGN section 7), shared by the bridge that signs and the agent that
 * verifies. Ed25519 signs a short statement, not the image itself: the image is checked against the sha256 the
 * statement names, so neither side ever holds an image in memory, and the statement binds the image to its name,
 * platform, version and size, so that a signed image cannot be passed off under other metadata.
 */
import { createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';

export interface FirmwareIdentity {
  name: string;
  platform: string;
  version: number;
  size: number;
  /** Lowercase hex. */
  sha256: string;
}

/** The bytes that are signed: one `key=value` line each, in this order, after a line naming the scheme. */
export function firmwareStatement(f: FirmwareIdentity): Buffer {
  return Buffer.from(
    [
      'devcloud firmware v1',
      `name=${f.name}`,
      `platform=${f.platform}`,
      `version=${f.version}`,
      `size=${f.size}`,
      `sha256=${f.sha256}`,
      '',
    ].join('\n'),
    'utf8',
  );
}

/** Signs with an Ed25519 private key (PEM, PKCS#8); returns the signature as base64. */
export function signFirmware(f: FirmwareIdentity, privateKeyPem: string | Buffer): string {
  const key = createPrivateKey(privateKeyPem);
  if (key.asymmetricKeyType !== 'ed25519') throw new Error('the signing key is not an Ed25519 key');
  return sign(null, firmwareStatement(f), key).toString('base64');
}

/**
 * Checks a signature against several public keys (PEM, SPKI), so that keys can be rotated. Returns the index of
 * the key that verifies it, or -1. A key that is not Ed25519 verifies nothing.
 */
export function verifyFirmware(
  f: FirmwareIdentity,
  signature: string,
  publicKeysPem: ReadonlyArray<string | Buffer>,
): number {
  const sig = Buffer.from(signature, 'base64');
  const statement = firmwareStatement(f);
  for (let i = 0; i < publicKeysPem.length; i++) {
    try {
      const key = createPublicKey(publicKeysPem[i]!);
      if (key.asymmetricKeyType === 'ed25519' && verify(null, statement, key, sig)) return i;
    } catch {
      // A malformed key verifies nothing.
    }
  }
  return -1;
}
