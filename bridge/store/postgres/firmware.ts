/**
 * The firmware catalog and firmware jobs in PostgreSQL: `FirmwareStore` (bridge/firmware/catalog.ts) and
 * `FirmwareJobStore` (bridge/firmware/jobs.ts) translated. The image files stay in `<dataDir>/firmware/`, named by
 * their sha256, as with SQLite: every bridge sharing the database needs them there.
 */
import { timingSafeEqual } from 'node:crypto';
import { join } from 'node:path';
import { type AddOutcome, type FirmwareImage, type ImageRow, sameImage, toImage } from '../../firmware/catalog.js';
import { type FirmwareJob, type JobOutcome, type JobRow, type NewJob, hashToken, toJob } from '../../firmware/jobs.js';
import type { FirmwareRepo, FwJobRepo } from '../types.js';
import type { Conn } from './conn.js';

/** How often `add` tries again when the record in its way is gone by the time it reads it. */
const ADD_ATTEMPTS = 3;

export class PgFirmwareRepo implements FirmwareRepo {
  readonly imageDir: string;

  constructor(
    private readonly c: Conn,
    dataDir: string,
  ) {
    this.imageDir = join(dataDir, 'firmware');
  }

  async byName(name: string): Promise<FirmwareImage | undefined> {
    const r = await this.c.query<ImageRow>('SELECT * FROM firmware WHERE name = $1', [name]);
    return r.rows[0] && toImage(r.rows[0]);
  }

  async list(): Promise<FirmwareImage[]> {
    const r = await this.c.query<ImageRow>('SELECT * FROM firmware ORDER BY name, version');
    return r.rows.map(toImage);
  }

  imagePath(image: Pick<FirmwareImage, 'sha256'>): string {
    return join(this.imageDir, image.sha256);
  }

  /**
   * The insert decides (`ON CONFLICT DO NOTHING` waits for another bridge adding the same name, then yields);
   * only when it did not insert is the record in its way read and compared.
   */
  async add(image: FirmwareImage): Promise<AddOutcome> {
    for (let attempt = 1; ; attempt++) {
      const inserted = await this.c.query(
        `INSERT INTO firmware (name, platform, version, from_platforms, to_platform, size, sha256, signature, added_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (name) DO NOTHING`,
        [
          image.name,
          image.platform,
          image.version,
          JSON.stringify(image.from),
          image.toPlatform,
          image.size,
          image.sha256,
          image.signature,
          image.addedAt,
        ],
      );
      if ((inserted.rowCount ?? 0) > 0) return { outcome: 'added', image };
      const existing = await this.byName(image.name);
      if (existing) return { outcome: sameImage(existing, image) ? 'exists' : 'conflict', image: existing };
      if (attempt >= ADD_ATTEMPTS) throw new Error(`firmware ${image.name} keeps vanishing while added`);
    }
  }

  async isUsed(sha256: string): Promise<boolean> {
    const r = await this.c.query('SELECT 1 FROM firmware WHERE sha256 = $1 LIMIT 1', [sha256]);
    return r.rows.length > 0;
  }
}

/** SQLSTATE `unique_violation`. */
const UNIQUE_VIOLATION = '23505';

export class PgFwJobRepo implements FwJobRepo {
  constructor(private readonly c: Conn) {}

  async get(id: string): Promise<FirmwareJob | undefined> {
    const r = await this.c.query<JobRow>('SELECT * FROM fw_jobs WHERE id = $1', [id]);
    return r.rows[0] && toJob(r.rows[0]);
  }

  async openCount(): Promise<number> {
    const r = await this.c.query<{ n: number }>('SELECT count(*) AS n FROM fw_jobs WHERE open');
    return r.rows[0]?.n ?? 0;
  }

  async openOf(deviceId: string): Promise<FirmwareJob | undefined> {
    const r = await this.c.query<JobRow>('SELECT * FROM fw_jobs WHERE device_id = $1 AND open', [deviceId]);
    return r.rows[0] && toJob(r.rows[0]);
  }

  /**
   * The unique index `fw_jobs_open` keeps one open job per device, also between bridges: a second one rejects
   * (and, as any failed statement, fails the transaction it is in).
   */
  async add(j: NewJob): Promise<void> {
    try {
      await this.c.query(
        `INSERT INTO fw_jobs (id, device_id, name, sha256, size, token_hash, token_expires, created_at, url)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
        [j.id, j.deviceId, j.name, j.sha256, j.size, hashToken(j.token), j.tokenExpires, j.createdAt, j.url],
      );
    } catch (err) {
      const e = err as { code?: unknown; constraint?: unknown };
      if (e.code === UNIQUE_VIOLATION && e.constraint === 'fw_jobs_open') {
        throw new Error(`device ${j.deviceId} has an open firmware job already`, { cause: err });
      }
      throw err;
    }
  }

  async end(id: string, outcome: JobOutcome, now: number): Promise<boolean> {
    const r = await this.c.query(
      'UPDATE fw_jobs SET open = false, ended_at = $1, outcome = $2 WHERE id = $3 AND open',
      [now, outcome, id],
    );
    return (r.rowCount ?? 0) > 0;
  }

  async renewToken(id: string, token: string, expires: number): Promise<void> {
    await this.c.query(
      'UPDATE fw_jobs SET prev_token_hash = token_hash, token_hash = $1, token_expires = $2 WHERE id = $3 AND open',
      [hashToken(token), expires, id],
    );
  }

  async markCancelled(id: string): Promise<void> {
    await this.c.query('UPDATE fw_jobs SET cancelled = true WHERE id = $1 AND open', [id]);
  }

  async tokenValid(id: string, token: string, now: number): Promise<FirmwareJob | undefined> {
    const r = (await this.c.query<JobRow>('SELECT * FROM fw_jobs WHERE id = $1', [id])).rows[0];
    if (!r || !r.open || r.token_expires <= now) return undefined;
    const a = Buffer.from(hashToken(token), 'hex');
    const matches = (hash: string | null): boolean => {
      if (hash === null) return false;
      const b = Buffer.from(hash, 'hex');
      return a.length === b.length && timingSafeEqual(a, b);
    };
    return matches(r.token_hash) || matches(r.prev_token_hash) ? toJob(r) : undefined;
  }
}
