/**
 * The firmware signature contract (docs/decisions.md §7). The statement's bytes are what a bridge signs and every
 * agent in the field verifies, so they are pinned here byte for byte: a change breaks every deployed agent.
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, verify } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  FW_AFTER_SWITCH,
  FW_AFTER_SWITCH_LIST,
  FW_FAILURE_CODES,
  FW_FINAL_STATES,
  FW_FINAL_STATE_LIST,
  FW_STATES,
  type FirmwareIdentity,
  FwFailureCode,
  FwState,
  firmwareStatement,
  isFwFailureCode,
  isFwFinalState,
  isFwState,
  signFirmware,
  verifyFirmware,
} from '../../protocol/index.js';

const META: FirmwareIdentity = {
  name: 'gateway-os',
  platform: 'rpi4',
  version: 42,
  size: 1048576,
  sha256: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
};

/** An Ed25519 key from a fixed seed (PKCS#8 DER is a fixed prefix and the seed), so signatures are repeatable. */
function seededKey(seedByte: number): { privatePem: string; publicPem: string } {
  const der = Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), Buffer.alloc(32, seedByte)]);
  const key = createPrivateKey({ key: der, format: 'der', type: 'pkcs8' });
  return {
    privatePem: key.export({ format: 'pem', type: 'pkcs8' }).toString(),
    publicPem: createPublicKey(key).export({ format: 'pem', type: 'spki' }).toString(),
  };
}

describe('firmwareStatement', () => {
  it('is the scheme line and one key=value line per field, in a fixed order', () => {
    const expected =
      'devcloud firmware v1\n' +
      'name=gateway-os\n' +
      'platform=rpi4\n' +
      'version=42\n' +
      'size=1048576\n' +
      'sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n';
    expect(firmwareStatement(META).equals(Buffer.from(expected, 'utf8'))).toBe(true);
  });

  it('encodes names as UTF-8', () => {
    const s = firmwareStatement({ ...META, name: 'fw-é' });
    expect(s.includes(Buffer.from('name=fw-\u00e9\n', 'utf8'))).toBe(true);
  });
});

describe('signFirmware and verifyFirmware', () => {
  const a = seededKey(1);
  const b = seededKey(2);

  it('signs the statement itself, so any Ed25519 implementation can check it', () => {
    const sig = signFirmware(META, a.privatePem);
    expect(Buffer.from(sig, 'base64')).toHaveLength(64);
    expect(verify(null, firmwareStatement(META), createPublicKey(a.publicPem), Buffer.from(sig, 'base64'))).toBe(true);
    // Ed25519 is deterministic: the same key and statement give the same signature.
    expect(signFirmware(META, a.privatePem)).toBe(sig);
  });

  it('round-trips and names the key that verifies, for key rotation', () => {
    const sig = signFirmware(META, b.privatePem);
    expect(verifyFirmware(META, sig, [b.publicPem])).toBe(0);
    expect(verifyFirmware(META, sig, [a.publicPem, b.publicPem])).toBe(1);
    expect(verifyFirmware(META, sig, [a.publicPem])).toBe(-1);
    expect(verifyFirmware(META, sig, [])).toBe(-1);
  });

  it('binds every field: a signature does not carry over to other metadata', () => {
    const sig = signFirmware(META, a.privatePem);
    const others: FirmwareIdentity[] = [
      { ...META, name: 'other' },
      { ...META, platform: 'rpi5' },
      { ...META, version: 43 },
      { ...META, size: META.size + 1 },
      { ...META, sha256: META.sha256.replace(/^e3/, 'e4') },
    ];
    for (const other of others) expect(verifyFirmware(other, sig, [a.publicPem])).toBe(-1);
  });

  it('rejects a tampered signature', () => {
    const sig = Buffer.from(signFirmware(META, a.privatePem), 'base64');
    sig[10] = sig[10]! ^ 0x01;
    expect(verifyFirmware(META, sig.toString('base64'), [a.publicPem])).toBe(-1);
    expect(verifyFirmware(META, 'not base64 at all', [a.publicPem])).toBe(-1);
  });

  it('refuses to sign with a key that is not Ed25519', () => {
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const pem = rsa.privateKey.export({ format: 'pem', type: 'pkcs8' }).toString();
    expect(() => signFirmware(META, pem)).toThrow(/not an Ed25519 key/);
  });

  it('lets a malformed or non-Ed25519 public key verify nothing, without hiding the good keys', () => {
    const sig = signFirmware(META, a.privatePem);
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const rsaPem = rsa.publicKey.export({ format: 'pem', type: 'spki' }).toString();
    const garbage = '-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n';
    expect(verifyFirmware(META, sig, [garbage])).toBe(-1);
    expect(verifyFirmware(META, sig, ['not pem'])).toBe(-1);
    expect(verifyFirmware(META, sig, [rsaPem])).toBe(-1);
    expect(verifyFirmware(META, sig, [garbage, rsaPem, a.publicPem])).toBe(2);
  });
});

describe('firmware states and failure codes', () => {
  it('names every fwstate an agent reports, in the order of an update', () => {
    expect(FW_STATES).toEqual([
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
    ]);
    expect(FW_STATES.every((s) => FwState.safeParse(s).success && isFwState(s))).toBe(true);
    expect(FwState.safeParse('rebooting').success).toBe(false);
    expect(isFwState('')).toBe(false);
  });

  it('the final states end an update; the states after the switch are neither final nor before it', () => {
    expect([...FW_FINAL_STATES]).toEqual(['done', 'rolledback', 'failed', 'cancelled']);
    expect([...FW_FINAL_STATES]).toEqual([...FW_FINAL_STATE_LIST]);
    expect([...FW_AFTER_SWITCH]).toEqual(['switching', 'restarting', 'committing', 'rollingback']);
    expect([...FW_AFTER_SWITCH]).toEqual([...FW_AFTER_SWITCH_LIST]);
    expect(FW_AFTER_SWITCH_LIST.some((s) => FW_FINAL_STATES.has(s))).toBe(false);
    for (const s of FW_STATES) expect(isFwFinalState(s), s).toBe(FW_FINAL_STATES.has(s));
    // What a device reports is a string: the sets answer for any string.
    expect(FW_FINAL_STATES.has('idle') || FW_AFTER_SWITCH.has('') || isFwFinalState('Done')).toBe(false);
  });

  it('failure codes are distinct lower-case words joined by dashes', () => {
    expect(new Set(FW_FAILURE_CODES).size).toBe(FW_FAILURE_CODES.length);
    for (const code of FW_FAILURE_CODES) {
      expect(code).toMatch(/^[a-z]+(-[a-z0-9]+)*$/);
      expect(FwFailureCode.safeParse(code).success && isFwFailureCode(code)).toBe(true);
    }
    for (const bad of ['', 'Download', 'download ', 'verify (signature)']) {
      expect(FwFailureCode.safeParse(bad).success || isFwFailureCode(bad)).toBe(false);
    }
  });

  it('docs/firmware.md explains every failure code, and no other', () => {
    const doc = readFileSync(new URL('../../docs/firmware.md', import.meta.url), 'utf8');
    const section = doc.slice(
      doc.indexOf('## Failure codes'),
      doc.indexOf('\n## ', doc.indexOf('## Failure codes') + 1),
    );
    const documented = [...section.matchAll(/^\| `([a-z0-9-]+)` +\|/gm)].map((m) => m[1]);
    expect(documented.sort()).toEqual([...FW_FAILURE_CODES].sort());
  });
});
