/**
 * Small file systems that fill up, for the full-disk tests: a tmpfs of a given size mounted on a fresh folder
 * (root only), filled with one preallocated file and given back by removing it.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync, statfsSync, truncateSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lacking, skipOrFail } from './system.js';

export interface SmallDisk {
  dir: string;
  /** Takes every free block but `leaveBytes` with one file. */
  fill(leaveBytes?: number): void;
  /** Removes what `fill` wrote. */
  free(): void;
  freeBytes(): number;
  unmount(): void;
}

/** Mounts a tmpfs of `bytes`; the reason as a string when this machine cannot. */
export function mountSmallDisk(bytes: number): SmallDisk | string {
  const lack = lacking('mount', 'root');
  if (lack !== undefined) return `${lack} to mount a tmpfs`;
  const dir = mkdtempSync(join(tmpdir(), 'devcloud-disk-'));
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${bytes}`, 'tmpfs', dir], { stdio: 'pipe' });
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    return `cannot mount a tmpfs (${stderr || (err as Error).message}): needs root with CAP_SYS_ADMIN`;
  }
  const filler = join(dir, 'filler');
  const freeBytes = () => {
    const s = statfsSync(dir);
    return s.bavail * s.bsize;
  };
  return {
    dir,
    freeBytes,
    fill(leaveBytes = 0) {
      // Written until the file system refuses (a process may write meanwhile), then cut back by `leaveBytes`.
      try {
        execFileSync('dd', ['if=/dev/zero', `of=${filler}`, 'bs=65536'], { stdio: 'pipe' });
      } catch {
        // ENOSPC: full, as wanted
      }
      if (leaveBytes > 0) truncateSync(filler, Math.max(0, statSync(filler).size - leaveBytes));
    },
    free() {
      try {
        unlinkSync(filler);
      } catch {
        // not filled
      }
    },
    unmount() {
      try {
        execFileSync('umount', ['-l', dir], { stdio: 'pipe' });
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

/**
 * A small disk for a test file, or `undefined` when this machine cannot mount one: then one line says why and
 * the tests that need it are skipped, except under `CI=true`, where that is a failure (test/support/system.ts).
 */
export function smallDiskOrSkip(bytes: number, what: string): SmallDisk | undefined {
  const disk = mountSmallDisk(bytes);
  if (typeof disk !== 'string') return disk;
  skipOrFail(`${what}: ${disk}`);
  return undefined;
}
