/**
 * The bridge's firmware catalog (docs/decisions.md §7): each image the operator added with `devcloud-bridge firmware
 * add`, by name, with its platform, version, the platforms it updates from and to, its size, sha256 and the
 * Ed25519 signature over them (protocol/firmware.ts). The records live in the bridge's SQLite database; the images
 * themselves are files named by their sha256 under `<dataDir>/firmware/`, so that two names for the same bytes
 * share one file, and a file is complete whenever a record names it (it is written, fsynced and renamed first).
 */
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, mkdirSync } from 'node:fs';
import { open, rename, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { fsyncPath } from '../../lib/fsutil.js';
import { z } from 'zod';
import type { Db, Migration } from '../../lib/sqlite.js';

export const FIRMWARE_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE firmware (
      name        TEXT    PRIMARY KEY,
      platform    TEXT    NOT NULL,
      version     INTEGER NOT NULL CHECK (version >= 0),
      from_platforms TEXT NOT NULL,
      to_platform TEXT    NOT NULL,
      size        INTEGER NOT NULL CHECK (size >= 0),
      sha256      TEXT    NOT NULL,
      signature   TEXT    NOT NULL,
      added_at    INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX firmware_sha256 ON firmware (sha256);
  `);
};

/** One segment of an image name: no empty segment, no `.` or `..`, nothing but these characters. */
const NAME_SEGMENT = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
export const FIRMWARE_NAME_MAX = 256;

/**
 * An image name: path-like with slashes (the specification), so it appears as is in
 * `POST /0/devices/<id>/fw/<name>`. Each segment starts with a letter or digit, which also rules out `..`, a
 * leading or trailing `/` and an empty segment; no character can break a line of the signed statement.
 */
export const FirmwareName = z
  .string()
  .min(1, 'the name is empty')
  .max(FIRMWARE_NAME_MAX, `the name is longer than ${FIRMWARE_NAME_MAX} characters`)
  .refine(
    (s) => s.split('/').every((seg) => NAME_SEGMENT.test(seg)),
    'each /-separated segment of the name must start with a letter or digit and hold only letters, digits, ".", "_" and "-"',
  );

/** A platform as devices report it in their hello (at most 128 characters), limited to characters safe to list. */
export const FirmwarePlatform = z
  .string()
  .max(128, 'a platform is longer than 128 characters')
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._+-]*$/,
    'a platform must start with a letter or digit and hold only letters, digits, ".", "_", "+" and "-"',
  );

export const FirmwareVersion = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);

export interface FirmwareImage {
  name: string;
  /** The platform the image is built for. */
  platform: string;
  version: number;
  /** The platforms a device may run to take this image. */
  from: string[];
  /** The platform a device reports once it runs this image. */
  toPlatform: string;
  size: number;
  /** Lowercase hex. */
  sha256: string;
  /** Base64 Ed25519 signature of the statement of protocol/firmware.ts. */
  signature: string;
  addedAt: number;
}

/** An element of `GET /0/firmware/` (the specification's firmware image object). */
export const FirmwareImageObject = z
  .object({
    name: z.string(),
    platform: z.string(),
    version: z.number().int().min(0),
    info: z
      .object({
        platforms: z
          .object({
            from: z.array(z.string()),
            to: z.object({ platform: z.string(), name: z.string() }).strict(),
          })
          .strict(),
      })
      .strict(),
  })
  .strict();
export type FirmwareImageJson = z.infer<typeof FirmwareImageObject>;

/** The answer of `GET /0/firmware/`. */
export const FirmwareList = z.array(FirmwareImageObject);

export function firmwareJson(f: FirmwareImage): FirmwareImageJson {
  return {
    name: f.name,
    platform: f.platform,
    version: f.version,
    info: { platforms: { from: [...f.from], to: { platform: f.toPlatform, name: f.name } } },
  };
}

/** A row of `firmware`, as either engine reads it. */
export interface ImageRow {
  name: string;
  platform: string;
  version: number;
  from_platforms: string;
  to_platform: string;
  size: number;
  sha256: string;
  signature: string;
  added_at: number;
}

export const toImage = (r: ImageRow): FirmwareImage => ({
  name: r.name,
  platform: r.platform,
  version: r.version,
  from: JSON.parse(r.from_platforms) as string[],
  toPlatform: r.to_platform,
  size: r.size,
  sha256: r.sha256,
  signature: r.signature,
  addedAt: r.added_at,
});

/** What `add` did: stored the record, found the same image already under that name, or found another one. */
export type AddOutcome =
  { outcome: 'added' | 'exists'; image: FirmwareImage } | { outcome: 'conflict'; image: FirmwareImage };

/** The same image: the same bytes with the same metadata (the signature may differ and is not compared). */
export function sameImage(a: FirmwareImage, b: FirmwareImage): boolean {
  return (
    a.sha256 === b.sha256 &&
    a.size === b.size &&
    a.platform === b.platform &&
    a.version === b.version &&
    a.toPlatform === b.toPlatform &&
    a.from.length === b.from.length &&
    a.from.every((p, i) => p === b.from[i])
  );
}

/** The catalog's records and image files. Reads and writes are synchronous, in the caller's transaction. */
export class FirmwareStore {
  /** Where the image files are, each named by its sha256. */
  readonly imageDir: string;
  private readonly s;

  constructor(
    private readonly db: Db,
    dataDir: string,
  ) {
    this.imageDir = join(dataDir, 'firmware');
    this.s = {
      byName: db.prepare<[string], ImageRow>('SELECT * FROM firmware WHERE name = ?'),
      list: db.prepare<[], ImageRow>('SELECT * FROM firmware ORDER BY name, version'),
      insert: db.prepare(`
        INSERT INTO firmware (name, platform, version, from_platforms, to_platform, size, sha256, signature, added_at)
        VALUES (@name, @platform, @version, @from, @toPlatform, @size, @sha256, @signature, @addedAt)`),
      usesSha: db.prepare<[string], { n: number }>('SELECT count(*) AS n FROM firmware WHERE sha256 = ?'),
    };
  }

  byName(name: string): FirmwareImage | undefined {
    const r = this.s.byName.get(name);
    return r && toImage(r);
  }

  /** Every image, ordered by name, then version. */
  list(): FirmwareImage[] {
    return this.s.list.all().map(toImage);
  }

  /** The file of an image's bytes. */
  imagePath(image: Pick<FirmwareImage, 'sha256'>): string {
    return join(this.imageDir, image.sha256);
  }

  /**
   * Records an image whose file is already in place (`importImage`). A name is given once: adding the same image
   * under it again changes nothing, another image under it is a conflict.
   */
  add(image: FirmwareImage): AddOutcome {
    return this.db.transaction((): AddOutcome => {
      const existing = this.byName(image.name);
      if (existing) return { outcome: sameImage(existing, image) ? 'exists' : 'conflict', image: existing };
      this.s.insert.run({ ...image, from: JSON.stringify(image.from) });
      return { outcome: 'added', image };
    })();
  }

  /** Whether any record names the image file of this sha256. */
  isUsed(sha256: string): boolean {
    return this.s.usesSha.get(sha256)!.n > 0;
  }
}

/** How much of an image is read at a time. */
const CHUNK = 1 << 20;

/**
 * Copies a file into the image directory under its sha256, reading it once in chunks (never whole): into a
 * temporary file, fsynced, renamed, and the directory fsynced (docs/decisions.md §8). Returns its size and sha256.
 */
export async function importImage(imageDir: string, file: string): Promise<{ size: number; sha256: string }> {
  mkdirSync(imageDir, { recursive: true });
  const tmp = join(imageDir, `.tmp-${randomBytes(8).toString('hex')}`);
  const out = await open(tmp, 'wx', 0o644);
  let size = 0;
  const hash = createHash('sha256');
  try {
    try {
      for await (const chunk of createReadStream(file, { highWaterMark: CHUNK }) as AsyncIterable<Buffer>) {
        hash.update(chunk);
        size += chunk.length;
        await out.write(chunk);
      }
      await out.sync();
    } finally {
      await out.close();
    }
    const sha256 = hash.digest('hex');
    await rename(tmp, join(imageDir, sha256));
    await fsyncPath(imageDir);
    return { size, sha256 };
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
}

/** Removes an image file that no record names (after a refused add). */
export async function removeUnusedImage(
  store: Pick<FirmwareStore, 'imageDir' | 'imagePath'> & { isUsed(sha256: string): Promise<boolean> },
  sha256: string,
): Promise<void> {
  if (await store.isUsed(sha256)) return;
  await unlink(store.imagePath({ sha256 })).catch(() => undefined);
  await fsyncPath(store.imageDir);
}
