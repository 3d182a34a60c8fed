/**
 * Firmware fixtures: signing keys, images in the slot installer's format, catalog entries on a bridge, and the
 * `fwstate` sequence a device reported, as the bridge recorded it.
 */
import { execFileSync } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { importImage } from '../../bridge/firmware/catalog.js';
import type { BridgeStore } from '../../bridge/store/types.js';
import { signFirmware } from '../../protocol/index.js';
import { tempDir } from './agent.js';

export interface SigningKeys {
  privatePem: string;
  /** A PEM file with the public key, for `firmware.publicKeys`. */
  publicFile: string;
}

export function makeKeys(dir: string = tempDir('devcloud-keys-')): SigningKeys {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const publicFile = join(dir, `signing-${Math.random().toString(36).slice(2)}.pub`);
  writeFileSync(publicFile, publicKey.export({ type: 'spki', format: 'pem' }));
  return { privatePem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), publicFile };
}

export interface ImageSpec {
  name: string;
  version: number;
  /** Files of the slot, by relative path. */
  files?: Record<string, string | Buffer>;
  /** An install script (shell), stored as `install.sh` and named in the manifest. */
  install?: string;
}

/** Builds a slot image (tar.gz with `manifest.json`) and returns its path. */
export function buildImage(spec: ImageSpec, dir: string = tempDir('devcloud-image-')): string {
  const root = join(dir, 'build');
  mkdirSync(root, { recursive: true });
  const manifest: Record<string, unknown> = { name: spec.name, version: spec.version };
  for (const [path, content] of Object.entries(spec.files ?? {})) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), content);
  }
  if (spec.install !== undefined) {
    writeFileSync(join(root, 'install.sh'), `#!/bin/sh\n${spec.install}\n`);
    chmodSync(join(root, 'install.sh'), 0o755);
    manifest.install = 'install.sh';
  }
  writeFileSync(join(root, 'manifest.json'), JSON.stringify(manifest));
  const file = join(dir, 'image.tar.gz');
  execFileSync('tar', ['-czf', file, '-C', root, '.']);
  return file;
}

export interface CatalogEntry {
  name: string;
  platform?: string;
  version: number;
  from?: string[];
  /** Sign with this key (default: `keys`); lets a test sign with a key the agent does not know. */
  signWith?: string;
  /** Lie about the sha256 in the signed statement and the job. */
  sha256?: string;
}

/** Adds an image to the bridge's catalog as `devcloud-bridge firmware add` does, signed. */
export async function addToCatalog(
  store: BridgeStore,
  file: string,
  entry: CatalogEntry,
  keys: SigningKeys,
): Promise<{ size: number; sha256: string }> {
  const copied = await importImage(store.firmware.imageDir, file);
  const platform = entry.platform ?? 'linux-x64';
  const identity = {
    name: entry.name,
    platform,
    version: entry.version,
    size: copied.size,
    sha256: entry.sha256 ?? copied.sha256,
  };
  const r = await store.firmware.add({
    ...identity,
    from: entry.from ?? [platform],
    toPlatform: platform,
    signature: signFirmware(identity, entry.signWith ?? keys.privatePem),
    addedAt: Date.now(),
  });
  if (r.outcome === 'conflict') throw new Error(`catalog conflict for ${entry.name}`);
  return copied;
}

/**
 * The `fwstate` values the bridge recorded for a device, oldest first (the bridge keeps `meta` history and adds
 * nothing for an unchanged value, so repeats in a row appear once).
 */
export async function fwStates(store: BridgeStore, deviceId: string): Promise<string[]> {
  return (await store.devices.history(deviceId, 'meta', 'fwstate', 1000))
    .reverse()
    .map((e) => e.value?.toString('utf8') ?? '(deleted)');
}

/** A `meta` variable of a device as the bridge holds it. */
export async function metaOf(store: BridgeStore, deviceId: string, name: string): Promise<string | undefined> {
  return (await store.devices.getVar(deviceId, 'meta', name))?.value?.toString('utf8');
}
