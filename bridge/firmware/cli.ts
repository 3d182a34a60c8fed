/**
 * `devcloud-bridge firmware ...`: the operator's signing key pair, and the images of the catalog.
 *
 * - `keygen --out DIR`: an Ed25519 pair, `signing.key` (PKCS#8 PEM, mode 0600) and `signing.pub` (SPKI PEM, for
 *   the agents' configuration); existing files are never overwritten.
 * - `add FILE --name NAME --platform P --version N --from P1,P2 [--to-platform P] --sign-key KEY`: copies the
 *   image into the data directory, signs it and records it; `--to-platform` defaults to `--platform`.
 * - `list [--json]`.
 *
 * Exit codes as the rest of the CLI: 0 success; 1 the operation failed; 2 usage.
 */
import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import {
  closeSync,
  existsSync,
  fchmodSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  statSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import type { z } from 'zod';
import { signFirmware } from '../../protocol/firmware.js';
import type { BridgeConfig } from '../config.js';
import { commandLog } from '../command-log.js';
import { openStore } from '../store/open.js';
import {
  type FirmwareImage,
  FirmwareName,
  FirmwarePlatform,
  FirmwareVersion,
  importImage,
  removeUnusedImage,
} from './catalog.js';

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
}

/** The flags only the firmware commands take, as `runCli` collects them before the option parser. */
export const FIRMWARE_FLAGS = ['--platform', '--version', '--from', '--to-platform', '--sign-key', '--out'] as const;
export type FirmwareFlag = (typeof FIRMWARE_FLAGS)[number];

export interface FirmwareArgs {
  json: boolean;
  name: string | undefined;
  flags: Partial<Record<FirmwareFlag, string>>;
}

export const FIRMWARE_USAGE = `  devcloud-bridge firmware keygen --out DIR
  devcloud-bridge firmware add FILE --name NAME --platform P --version N --from P1[,P2...]
                                    --sign-key KEY [--to-platform P]
  devcloud-bridge firmware list [--json]`;

const KEY_FILE = 'signing.key';
const PUB_FILE = 'signing.pub';

export async function firmwareCommand(
  config: BridgeConfig,
  params: string[],
  args: FirmwareArgs,
  io: Io,
): Promise<number> {
  const [sub, ...rest] = params;
  const allowed: Record<string, readonly FirmwareFlag[]> = {
    keygen: ['--out'],
    add: ['--platform', '--version', '--from', '--to-platform', '--sign-key'],
    list: [],
  };
  if (sub === undefined || !Object.hasOwn(allowed, sub)) {
    io.err('devcloud-bridge: firmware needs one of keygen, add, list');
    return 2;
  }
  const stray = Object.keys(args.flags).find((f) => !allowed[sub]!.includes(f as FirmwareFlag));
  if (stray !== undefined) {
    io.err(`devcloud-bridge: firmware ${sub} does not take ${stray}`);
    return 2;
  }
  if (args.name !== undefined && sub !== 'add') {
    io.err(`devcloud-bridge: firmware ${sub} does not take --name`);
    return 2;
  }
  const extra = sub === 'add' ? rest.slice(1) : rest;
  if (extra.length > 0) {
    io.err(`devcloud-bridge: unexpected argument ${extra[0]}`);
    return 2;
  }
  switch (sub) {
    case 'keygen':
      return keygen(args.flags['--out'], io);
    case 'add':
      return add(config, rest[0], args, io);
    default:
      return list(config, args.json, io);
  }
}

/** Creates a file that must not exist yet, with its mode, on disk before this returns. */
function writeNewFile(path: string, data: string, mode: number): void {
  const fd = openSync(path, 'wx', mode);
  try {
    fchmodSync(fd, mode);
    writeSync(fd, data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function keygen(out: string | undefined, io: Io): number {
  if (out === undefined) {
    io.err('devcloud-bridge: firmware keygen needs --out DIR');
    return 2;
  }
  const keyPath = join(out, KEY_FILE);
  const pubPath = join(out, PUB_FILE);
  const present = [keyPath, pubPath].filter((p) => existsSync(p));
  if (present.length > 0) {
    io.err(`devcloud-bridge: ${present.join(' and ')} already exist${present.length > 1 ? '' : 's'}; not overwriting`);
    return 1;
  }
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  try {
    mkdirSync(out, { recursive: true, mode: 0o700 });
    writeNewFile(keyPath, privateKey.export({ type: 'pkcs8', format: 'pem' }) as string, 0o600);
    writeNewFile(pubPath, publicKey.export({ type: 'spki', format: 'pem' }) as string, 0o644);
  } catch (err) {
    io.err(`devcloud-bridge: cannot write the key pair: ${(err as Error).message}`);
    return 1;
  }
  io.out(`${keyPath}\n${pubPath}`);
  return 0;
}

/** A flag's value through its schema, or a message naming the flag. */
function parseFlag<T>(flag: string, raw: unknown, schema: z.ZodType<T>): { value: T } | { problem: string } {
  const r = schema.safeParse(raw);
  if (r.success) return { value: r.data };
  return { problem: `${flag} ${JSON.stringify(raw)}: ${r.error.issues.map((i) => i.message).join('; ')}` };
}

async function add(config: BridgeConfig, file: string | undefined, args: FirmwareArgs, io: Io): Promise<number> {
  const f = args.flags;
  const problems: string[] = [];
  if (file === undefined) problems.push('firmware add needs the image FILE');
  for (const [flag, v] of [
    ['--name', args.name],
    ['--platform', f['--platform']],
    ['--version', f['--version']],
    ['--from', f['--from']],
    ['--sign-key', f['--sign-key']],
  ] as const)
    if (v === undefined) problems.push(`firmware add needs ${flag}`);
  const name = args.name === undefined ? undefined : parseFlag('--name', args.name, FirmwareName);
  const platform =
    f['--platform'] === undefined ? undefined : parseFlag('--platform', f['--platform'], FirmwarePlatform);
  const rawVersion = f['--version'];
  const version =
    rawVersion === undefined
      ? undefined
      : /^\d+$/.test(rawVersion)
        ? parseFlag('--version', Number(rawVersion), FirmwareVersion)
        : { problem: `--version ${JSON.stringify(rawVersion)}: must be a whole number, 0 or more` };
  // Each platform once, in the order given.
  const from =
    f['--from'] === undefined
      ? []
      : [...new Set(f['--from'].split(',').map((p) => p.trim()))].map((p) => parseFlag('--from', p, FirmwarePlatform));
  const to =
    f['--to-platform'] === undefined ? undefined : parseFlag('--to-platform', f['--to-platform'], FirmwarePlatform);
  for (const r of [name, platform, version, to, ...from]) if (r && 'problem' in r) problems.push(r.problem);
  if (
    problems.length > 0 ||
    !name ||
    !platform ||
    !version ||
    'problem' in name ||
    'problem' in platform ||
    'problem' in version
  ) {
    for (const p of problems) io.err(`devcloud-bridge: ${p}`);
    return 2;
  }
  const fromPlatforms = from.flatMap((r) => ('value' in r ? [r.value] : []));
  const toPlatform = to && 'value' in to ? to.value : platform.value;

  let signKey: Buffer;
  try {
    signKey = readFileSync(f['--sign-key']!);
    if (createPrivateKey(signKey).asymmetricKeyType !== 'ed25519') throw new Error('not an Ed25519 private key');
  } catch (err) {
    io.err(`devcloud-bridge: --sign-key ${f['--sign-key']}: ${(err as Error).message}`);
    return 1;
  }
  try {
    if (!statSync(file!).isFile()) throw new Error('not a regular file');
  } catch (err) {
    io.err(`devcloud-bridge: ${file}: ${(err as Error).message}`);
    return 1;
  }

  const store = await openStore(config, commandLog(config));
  try {
    const catalog = store.firmware;
    let copied: { size: number; sha256: string };
    try {
      copied = await importImage(catalog.imageDir, file!);
    } catch (err) {
      io.err(`devcloud-bridge: cannot copy ${file}: ${(err as Error).message}`);
      return 1;
    }
    const identity = { name: name.value, platform: platform.value, version: version.value, ...copied };
    const image: FirmwareImage = {
      ...identity,
      from: fromPlatforms,
      toPlatform,
      signature: signFirmware(identity, signKey),
      addedAt: Date.now(),
    };
    const r = await catalog.add(image);
    if (r.outcome === 'conflict') {
      await removeUnusedImage(catalog, copied.sha256);
      io.err(
        `devcloud-bridge: firmware ${name.value} is already in the catalog as another image (sha256 ${r.image.sha256}, platform ${r.image.platform}, version ${r.image.version}); choose another name`,
      );
      return 1;
    }
    io.out(args.json ? JSON.stringify(r.image) : describe(r.image));
    return 0;
  } finally {
    await store.close();
  }
}

function describe(f: FirmwareImage): string {
  return [
    f.name,
    f.platform,
    `v${f.version}`,
    `from=${f.from.join(',') || '-'}`,
    `to=${f.toPlatform}`,
    `${f.size}B`,
    `sha256=${f.sha256}`,
  ].join('  ');
}

async function list(config: BridgeConfig, json: boolean, io: Io): Promise<number> {
  const store = await openStore(config, commandLog(config));
  try {
    const all = await store.firmware.list();
    if (json) io.out(JSON.stringify(all));
    else for (const f of all) io.out(describe(f));
    return 0;
  } finally {
    await store.close();
  }
}
