/**
 * What a firmware signature covers (docs/decisions.md §7), shared by the bridge that signs and the agent that
 * verifies. Ed25519 signs a short statement, not the image itself: the image is checked against the sha256 the
 * statement names, so neither side ever holds an image in memory, and the statement binds the image to its name,
 * platform, version and size, so that a signed image cannot be passed off under other metadata.
 */
import { createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import { z } from 'zod';

/**
 * Every value of `meta` `fwstate` (docs/firmware.md, "On the gateway: the state machine"). The agent's state
 * machine (agent/fw/machine.ts) moves between them; the bridge reads them to end its jobs and to refuse a cancel.
 */
export const FW_STATES = [
  'idle',
  'downloading',
  'verifying',
  'installing',
  'switching',
  'restarting',
  'committing',
  'done',
  'rollingback',
  'rolledback',
  'failed',
  'cancelled',
] as const;
export const FwState = z.enum(FW_STATES);
export type FwState = z.infer<typeof FwState>;

/** The states that end an update: the bridge closes the device's job when one is reported. */
export const FW_FINAL_STATE_LIST = ['done', 'rolledback', 'failed', 'cancelled'] as const satisfies readonly FwState[];
export type FwFinalState = (typeof FW_FINAL_STATE_LIST)[number];

/**
 * The states after the switch of the active slot and before the update ends: the new image may be the one that
 * runs, so a cancel is refused (decision 7); the only way back is a rollback.
 */
export const FW_AFTER_SWITCH_LIST = [
  'switching',
  'restarting',
  'committing',
  'rollingback',
] as const satisfies readonly FwState[];
export type FwAfterSwitchState = (typeof FW_AFTER_SWITCH_LIST)[number];

/** {@link FW_FINAL_STATE_LIST} as a set; `has` takes any string, as a reported `fwstate` is one. */
export const FW_FINAL_STATES: ReadonlySet<string> = new Set<string>(FW_FINAL_STATE_LIST);
/** {@link FW_AFTER_SWITCH_LIST} as a set; `has` takes any string, as a reported `fwstate` is one. */
export const FW_AFTER_SWITCH: ReadonlySet<string> = new Set<string>(FW_AFTER_SWITCH_LIST);

export function isFwState(s: string): s is FwState {
  return (FW_STATES as readonly string[]).includes(s);
}

export function isFwFinalState(s: string): s is FwFinalState {
  return FW_FINAL_STATES.has(s);
}

/**
 * Why an update failed, ended or was rolled back, reported as `meta` `fwerrorcode` beside the text of `fwerror`
 * (docs/firmware.md, "Failure codes", has what each means and what to do). A code names what went wrong, so that
 * a program can act on it without reading the text; the text says the details.
 */
export const FW_FAILURE_CODES = [
  // Downloading.
  // The image could not be fetched through every retry: the network, the server, a URL that is not http(s).
  'download',
  // The bridge refused the job's download token (HTTP 401 or 403): it expired or was replaced.
  'download-denied',
  // Verifying.
  // The image's size is not the one the job and its signature name.
  'verify-size',
  // The image's sha256 is not the one the job and its signature name.
  'verify-sha256',
  // No configured public key verifies the signature.
  'signature',
  // No public key is configured (`firmware.publicKeys`), so no image can be trusted.
  'no-keys',
  // A file of `firmware.publicKeys` cannot be read, or is not an Ed25519 public key.
  'bad-key',
  // The downloaded image cannot be read back.
  'image-unreadable',
  // The verification failed otherwise.
  'verify',
  // Installing (the built-in slots installer names these; the command installer fails with `install`).
  // The slots folder is not as the installer left it (`current` or `previous` point elsewhere).
  'bad-layout',
  // The image is not a valid archive, or holds a member outside its root or a link leaving it.
  'bad-archive',
  // The image holds a device node, a FIFO, a socket, or a hard link to something outside it.
  'bad-member',
  // The image unpacks to more bytes or files than `firmware.maxUnpackedBytes` or `firmware.maxFiles`.
  'too-large',
  // `tar` failed to list or unpack the image.
  'unpack-failed',
  // The image's `manifest.json` is missing or invalid, or names an install script it does not hold.
  'bad-manifest',
  // The image's install script failed.
  'script-failed',
  // The image's install script ran longer than `firmware.installTimeoutMs`.
  'script-timeout',
  // The install failed otherwise: `installCommand install`, or an error of the file system.
  'install',
  // After the install.
  // Making the new slot active failed.
  'switch',
  // The restart after the switch failed (`restartCommand`, or `commands.rebootCommand`).
  'restart',
  // The new image did not pass the health check within `firmware.health.commitTimeoutMs` of the switch.
  'health',
  // Committing the healthy image failed (`installCommand commit`).
  'commit',
  // The rollback itself failed; it is tried again at the next start of the agent, or by hand.
  'rollback',
  // The agent started more than `firmware.maxAttempts` times in one stretch of the update (a crash loop).
  'crash-loop',
  // Ended on purpose.
  // Cancelled from the cloud (`DELETE /0/devices/<id>/fw`).
  'cancelled',
  // A job for another image replaced it before the switch.
  'replaced',
  // Cancelled or rolled back by hand (`devcloud-agent fw rollback`).
  'by-hand',
] as const;
export const FwFailureCode = z.enum(FW_FAILURE_CODES);
export type FwFailureCode = z.infer<typeof FwFailureCode>;

/**
 * What a bridge accepts as `fwerrorcode`: the form of a code, not the list, so that a newer agent with a code this
 * bridge does not know yet still has its firmware state kept (docs/protocol.md, `up/meta`).
 */
export const FW_FAILURE_CODE_RE = /^[a-z][a-z0-9-]{0,39}$/;

export function isFwFailureCode(s: string): s is FwFailureCode {
  return (FW_FAILURE_CODES as readonly string[]).includes(s);
}

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
