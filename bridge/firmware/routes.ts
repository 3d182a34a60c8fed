/**
 * The Firmware section of the specification and docs/decisions.md §7, on the bridge:
 *
 * - `GET /0/firmware/`: the catalog as a JSON array of firmware image objects, ordered by name, then version. Any
 *   logged-in user may list it; the sha256 and signature of each image go to devices with their jobs, not here.
 * - `POST /0/devices/<id>/fw/<name>` (and the official client's `/firmware/<name>`): starts an update. The name
 *   must be in the catalog (`device-fwup-name-fail`); the device must be `connected` in `d` `mode` and in `meta`
 *   `state`, its platform in the image's `from`, and no update of it running (`device-fwup-start-fail`). The job
 *   goes to the device on `down/fw` with a token for the image, valid `firmware.tokenHours`.
 * - `DELETE /0/devices/<id>/fw` (and `/firmware`): cancels an update before the switch of the active slot,
 *   200 `firmware-ok` (decision 7); after it, or with nothing running, 400 `firmware-fail`.
 * - `GET /0/firmware/jobs/<job>/image`: the image, for the device of the job, with `Authorization: Bearer <token>`
 *   and HTTP Range requests (a download resumes where it stopped). Not a user route: no frontend, no session.
 *
 * Who may start and cancel: whoever may change the device's variables (devices/access.ts), but a user the device is
 * only shared with (decision 23).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import type { FastifyRequest } from 'fastify';
import { FW_AFTER_SWITCH, FW_FINAL_STATES } from '../../protocol/index.js';
import { deviceAccess } from '../devices/access.js';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send, sendJson } from '../http/reply.js';
import { type Route, named } from '../http/route.js';
import type { StoreTx } from '../store/types.js';
import { FirmwareList, FirmwareName, firmwareJson } from './catalog.js';

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** The current value of a device's variable, as text. */
const metaValue = async (tx: StoreTx, deviceId: string, type: 'd' | 'meta', name: string) =>
  (await tx.devices.getVar(deviceId, type, name))?.value?.toString('utf8');

/**
 * `bytes=N-`, `bytes=N-M` or `bytes=-N` (the last N bytes), one range; `undefined` when there is none or it is in
 * a unit other than bytes (ignored, as RFC 9110 section 14.2 asks: the whole image is sent), `null` when unusable.
 */
function parseRange(header: string | undefined, size: number): { start: number; end: number } | null | undefined {
  if (header === undefined || !/^\s*bytes=/i.test(header)) return undefined;
  const suffix = /^bytes=-(\d{1,15})$/i.exec(header.trim());
  if (suffix) {
    const n = Number(suffix[1]);
    if (n === 0 || size === 0) return null;
    return { start: Math.max(0, size - n), end: size - 1 };
  }
  const m = /^bytes=(\d{1,15})-(\d{0,15})$/i.exec(header.trim());
  if (!m) return null;
  const start = Number(m[1]);
  const end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (start >= size || end < start) return null;
  return { start, end };
}

export function firmwareRoutes(ctx: RouteContext): Route[] {
  const { userOf, visible } = deviceAccess(ctx);
  const { store, config, now, log } = ctx;
  const catalog = store.firmware;
  const jobs = store.fwJobs;

  async function start(req: FastifyRequest) {
    const user = userOf(req);
    const seen = await visible(req, user);
    if (!seen) throw new ApiError('device-fail');
    // Decision 23: a user the device is shared with may not update its firmware.
    if (seen.role === 'shared') throw new ApiError('device-fwup-start-fail');
    const raw = (req.params as { '*'?: string })['*'] ?? '';
    const name = FirmwareName.safeParse(raw);
    const image = name.success ? await catalog.byName(name.data) : undefined;
    if (!image) throw new ApiError('device-fwup-name-fail');
    const id = seen.device.id;
    const t = now();
    const token = randomBytes(32).toString('base64url');
    const jobId = randomUUID();
    const base = config.firmware.baseUrl ?? config.http.publicUrl ?? `${req.protocol}://${req.headers.host ?? ''}`;
    const url = `${base.replace(/\/+$/, '')}/0/firmware/jobs/${jobId}/image`;
    const outcome = await store.write(async (tx) => {
      if ((await metaValue(tx, id, 'd', 'mode')) !== 'connected') return 'not-connected-mode' as const;
      if ((await metaValue(tx, id, 'meta', 'state')) !== 'connected') return 'not-connected' as const;
      const platform = await metaValue(tx, id, 'meta', 'platform');
      if (platform === undefined || !image.from.includes(platform)) return 'platform' as const;
      const open = await tx.fwJobs.openOf(id);
      const fwstate = (await metaValue(tx, id, 'meta', 'fwstate')) ?? 'idle';
      const running = fwstate !== 'idle' && !FW_FINAL_STATES.has(fwstate);
      if (open) {
        // A job whose token has expired while the device reports nothing running is over.
        if (open.tokenExpires > t || running) return 'running' as const;
        await tx.fwJobs.end(open.id, 'abandoned', t);
      } else if (running) return 'running' as const;
      await tx.fwJobs.add({
        id: jobId,
        deviceId: id,
        name: image.name,
        sha256: image.sha256,
        size: image.size,
        token,
        tokenExpires: t + config.firmware.tokenHours * 3_600_000,
        createdAt: t,
        url,
      });
      return 'started' as const;
    });
    if (outcome !== 'started') {
      log.info({ event: 'fw.start_refused', deviceId: id, name: image.name, reason: outcome });
      throw new ApiError('device-fwup-start-fail');
    }
    const sent = ctx.devices.sendDown(id, 'down/fw', {
      id: randomUUID(),
      action: 'start',
      job: jobId,
      name: image.name,
      version: image.version,
      // The platform the image was signed for: the agent checks the signature over exactly these fields.
      platform: image.platform,
      url,
      token,
      size: image.size,
      sha256: image.sha256,
      signature: image.signature,
    });
    if (!sent) {
      await store.write((tx) => tx.fwJobs.end(jobId, 'undelivered', now()));
      throw new ApiError('device-fwup-start-fail');
    }
    log.info({ event: 'fw.started', deviceId: id, job: jobId, name: image.name, version: image.version });
  }

  const who =
    'For the owner of the device, or a user it heard nearby while it has no owner; not for a user it is shared with ' +
    '(decision 23).';
  const startRoute = (prefix: string, operationId: string, alias: boolean): Route => ({
    method: 'POST',
    path: `/0/devices/{id}/${prefix}/{image}`,
    rest: true,
    operationId,
    tag: 'Firmware',
    summary: alias ? "Start a firmware update (the official client's spelling)" : 'Start a firmware update',
    description:
      '`{image}` is the image name as in `GET /0/firmware/`, slashes included. The device must be `connected` in ' +
      "`d` `mode` and in `meta` `state`, its `meta` `platform` must be in the image's `info.platforms.from`, and " +
      'no update of it may be running. The job goes to the device on `down/fw`; its progress shows as `meta` ' +
      `\`fwstate\`, \`fwprogress\`, \`fwname\`, \`fwerror\`, \`fwerrorcode\`. ${who}`,
    session: 'required',
    failToken: 'device-fwup-start-fail',
    responses: {
      200: { description: 'The update started.', tokens: ['device-ok'] },
      400: {
        description:
          '`device-fwup-name-fail`: no image of that name. `device-fwup-start-fail`: the device is not connected ' +
          'in mode and state, its platform is not one the image updates from, an update is running, the job ' +
          'could not be handed to the broker, the device is only shared with the user (decision 23), or a malformed ' +
          'body. `device-fail`: no device the user may see.',
        tokens: [token('device-fwup-name-fail'), token('device-fwup-start-fail'), token('device-fail')],
      },
      401: NO_SESSION,
    },
    handler: async (req, reply) => {
      await start(req);
      return send(reply, 200, 'device-ok');
    },
  });
  const cancelRoute = (prefix: string, operationId: string, alias: boolean): Route => ({
    method: 'DELETE',
    path: `/0/devices/{id}/${prefix}`,
    operationId,
    tag: 'Firmware',
    summary: alias ? "Cancel a firmware update (the official client's spelling)" : 'Cancel a firmware update',
    description:
      'Cancels the running update before the switch of the active slot (decision 7): `firmware-ok`, and a cancel ' +
      `on \`down/fw\`; the device reports \`fwstate\` \`cancelled\`. ${who}`,
    session: 'required',
    failToken: 'firmware-fail',
    responses: {
      200: { description: 'The cancel went to the device.', tokens: ['firmware-ok'] },
      400: {
        description:
          'No update is running, it is past the switch (`fwstate` `switching`, `restarting`, `committing`, ' +
          '`rollingback`), the device is not one the user may see or is only shared with the user (decision 23), ' +
          'the cancel could not be handed over, or a malformed body.',
        tokens: [token('firmware-fail')],
      },
      401: NO_SESSION,
    },
    handler: async (req, reply) => {
      const user = userOf(req);
      const seen = await visible(req, user);
      if (!seen || seen.role === 'shared') throw new ApiError('firmware-fail');
      const id = seen.device.id;
      const job = await jobs.openOf(id);
      const fwstate = (await metaValue(store, id, 'meta', 'fwstate')) ?? 'idle';
      if (!job || FW_AFTER_SWITCH.has(fwstate)) throw new ApiError('firmware-fail');
      if (!ctx.devices.sendDown(id, 'down/fw', { id: randomUUID(), action: 'cancel', job: job.id })) {
        throw new ApiError('firmware-fail');
      }
      await store.write((tx) => tx.fwJobs.markCancelled(job.id));
      log.info({ event: 'fw.cancel_sent', deviceId: id, job: job.id });
      return send(reply, 200, 'firmware-ok');
    },
  });

  return [
    {
      method: 'GET',
      path: '/0/firmware/',
      operationId: 'listFirmware',
      tag: 'Firmware',
      summary: 'The firmware catalog',
      description:
        'The images the operator added with `devcloud-bridge firmware add`, ordered by name, then version. ' +
        '`Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The images; `[]` when there are none.', json: named('FirmwareList', FirmwareList) },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        userOf(req);
        return sendJson(reply, JSON.stringify((await catalog.list()).map(firmwareJson)));
      },
    },
    startRoute('fw', 'startFirmwareUpdate', false),
    startRoute('firmware', 'startFirmwareUpdateAlias', true),
    cancelRoute('fw', 'cancelFirmwareUpdate', false),
    cancelRoute('firmware', 'cancelFirmwareUpdateAlias', true),
    {
      method: 'GET',
      path: '/0/firmware/jobs/{job}/image',
      operationId: 'downloadFirmwareImage',
      tag: 'Firmware',
      summary: "A job's image, for its device",
      description:
        'What the device downloads, with `Authorization: Bearer <token>` from its `down/fw` job; the token is valid ' +
        'until the job ends or `firmware.tokenHours` pass. One HTTP range (`Range: bytes=N-`, `bytes=N-M` or `bytes=-N`) is ' +
        'answered 206 with `Content-Range`, so a download resumes where it stopped. No frontend, no session: ' +
        '`app` is not read. `Accept-Ranges: bytes`, `Cache-Control: no-store`.',
      device: true,
      responses: {
        200: { description: 'The whole image (also for a `Range` in a unit other than bytes).', binary: true },
        206: { description: 'The range asked for.', binary: true, contentRange: true },
        401: {
          description: 'No valid token: none, a wrong one, an expired one, or one for a job that is not open.',
          tokens: [token('fw-token-fail')],
        },
        404: {
          description:
            "This bridge does not have the image's file (with several bridges, each needs it: `firmware add` on " +
            'each host).',
          tokens: [token('fw-image-missing')],
        },
        416: {
          description:
            'A `bytes` range that is not one range within the image (`Content-Range: bytes */size`); ' + 'no body.',
          contentRange: true,
        },
      },
      handler: async (req, reply) => {
        const jobId = ((req.params as { job?: string }).job ?? '').toLowerCase();
        const auth = /^Bearer ([A-Za-z0-9_-]{1,128})$/.exec(req.headers.authorization ?? '');
        const job = UUID_RE.test(jobId) && auth ? await jobs.tokenValid(jobId, auth[1]!, now()) : undefined;
        if (!job) throw new ApiError('fw-token-fail');
        const path = catalog.imagePath(job);
        // Another bridge may have added the image (docs/scaling.md): this one may lack its file.
        const present = await stat(path).then(
          (s) => s.isFile(),
          () => false,
        );
        if (!present) {
          log.warn({ event: 'fw.image_missing', job: job.id, sha256: job.sha256 });
          throw new ApiError('fw-image-missing');
        }
        const range = parseRange(req.headers.range, job.size);
        reply.header('accept-ranges', 'bytes').header('cache-control', 'no-store').type('application/octet-stream');
        if (range === null) {
          return reply.code(416).header('content-range', `bytes */${job.size}`).send();
        }
        if (range === undefined) {
          return reply.code(200).header('content-length', job.size).send(createReadStream(path));
        }
        return reply
          .code(206)
          .header('content-range', `bytes ${range.start}-${range.end}/${job.size}`)
          .header('content-length', range.end - range.start + 1)
          .send(createReadStream(path, { start: range.start, end: range.end }));
      },
    },
  ];
}
