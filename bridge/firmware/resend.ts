/**
 * A firmware job the bridge has answered `device-ok` for must reach its device even when the `down/fw` message
 * was lost (the device went away, the bridge restarted). On every hello of a device with an open job the bridge
 * sends the job again: a `cancel` when it was cancelled, otherwise the `start` with a fresh token (only the
 * token's hash is kept, so a resend needs a new one). The agent runs a job it already knows once, takes the new
 * token for a download still under way, and reports its state again.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import type { Logger } from '../../lib/log.js';
import type { FwMessage } from '../../protocol/index.js';
import type { BridgeStore } from '../store/types.js';

export interface FirmwareResendDeps {
  store: BridgeStore;
  /** Publishes to a device; `false` when the link is down. */
  sendDown: (deviceId: string, name: 'down/fw', payload: FwMessage) => boolean;
  tokenHours: number;
  now: () => number;
  log: Logger;
}

export async function resendFirmwareJob(deps: FirmwareResendDeps, deviceId: string): Promise<void> {
  const { store, log } = deps;
  const job = await store.fwJobs.openOf(deviceId);
  if (!job) return;
  if (job.cancelled) {
    deps.sendDown(deviceId, 'down/fw', { id: randomUUID(), action: 'cancel', job: job.id });
    return;
  }
  const image = await store.firmware.byName(job.name);
  if (!image || image.sha256 !== job.sha256 || job.url === null) {
    // The image left the catalog (or the job predates stored URLs): the device cannot fetch it any more.
    await store.write((tx) => tx.fwJobs.end(job.id, 'image-gone', deps.now()));
    log.warn({ event: 'fw.job_ended', deviceId, job: job.id, reason: 'the image is no longer in the catalog' });
    return;
  }
  const token = randomBytes(32).toString('base64url');
  const now = deps.now();
  await store.write((tx) => tx.fwJobs.renewToken(job.id, token, now + deps.tokenHours * 3_600_000));
  const sent = deps.sendDown(deviceId, 'down/fw', {
    id: randomUUID(),
    action: 'start',
    job: job.id,
    name: image.name,
    version: image.version,
    platform: image.platform,
    url: job.url,
    token,
    size: image.size,
    sha256: image.sha256,
    signature: image.signature,
  });
  if (sent) log.info({ event: 'fw.resent', deviceId, job: job.id });
}
