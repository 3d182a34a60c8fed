/**
 * The Devices and Network sections of the specification: the user's devices, claim and unregister, variables
 * and their history, and the nearby view.
 *
 * Who may see a device (decisions 14, 18 and 23, written up in docs/api.md):
 * - its owner, through its uuid or its auth code;
 * - a user its owner shared it with (shares.ts), likewise; such a user may do what the owner may but unregister,
 *   share and update its firmware;
 * - while it has no owner, a user whose authcode it heard within the nearby window, when the frontend's
 *   `nearby` is on. Such a user may also read and set its variables (being near an unclaimed device is what
 *   claiming it takes, too). Unregistering needs the owner.
 * A device the caller may not see answers exactly as one that does not exist: `GET` 404 `device-fail`, `POST`
 * and `DELETE` 400 `device-fail`.
 */
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { DEVICE_ID_RE } from '../../protocol/index.js';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send, sendJson as json } from '../http/reply.js';
import { bodyIsFields, fields, query, readForm } from '../http/request.js';
import { type Route, named } from '../http/route.js';
import { DEVICE_NOT_FOUND, deviceAccess } from './access.js';
import { sharing } from './shares.js';
import {
  AUTHCODE_RE,
  ClaimResponse,
  DeviceCollection,
  DeviceObject,
  HISTORY_MAX,
  HistoryQuery,
  VarNameParam,
  VarTypeParam,
  VariableAnswer,
  VariableList,
  claimForm,
  variableForm,
} from './schemas.js';
import type { VarType } from './store.js';
import { renderBare, renderCollection, renderHistory, renderRecord, renderVars } from './view.js';

type Params = { id?: string; type?: string; name?: string };

export function deviceRoutes(ctx: RouteContext): Route[] {
  const { store, config, now, devices: service } = ctx;
  const devices = store.devices;
  const d = config.devices;
  const windowMs = d.nearbyWindowMs;
  const maxValueBytes = d.maxValueBytes;
  const VariableForm = variableForm(maxValueBytes);
  const Collection = named('DeviceCollection', DeviceCollection);

  const { userOf, visible } = deviceAccess(ctx);
  const shares = sharing(ctx);
  const ClaimForm = claimForm(config.accounts.loginMax);

  /** The variable type and name of the path; `undefined` when either is malformed. */
  function variable(req: FastifyRequest): { type: VarType; name: string } | undefined {
    const p = req.params as Params;
    const type = VarTypeParam.safeParse(p.type);
    const name = VarNameParam.safeParse(p.name);
    return type.success && name.success ? { type: type.data, name: name.data } : undefined;
  }

  const window = `\`devices.nearbyWindowMs\` (${windowMs} ms)`;
  const who =
    'The device is named by its uuid or its auth code. The user may see a device it owns or that its owner ' +
    'shared with the user (decision 23); and, while a device ' +
    `has no owner and the frontend's \`nearby\` is on, a device that heard one of the user's authcodes within ` +
    `${window} (decisions 14 and 18), whose variables the user may then read, set and delete too. Any other ` +
    'device answers exactly as one that does not exist.';
  const malformed = 'or a malformed body';

  return [
    // ---- devices ----
    {
      method: 'GET',
      path: '/0/devices/',
      operationId: 'listDevices',
      tag: 'Devices',
      summary: 'The devices registered to the user, and those shared with the user',
      description:
        'Device objects keyed by device uuid: those the user owns, in the order they were claimed, then those ' +
        'shared with the user (decision 23), in the order they were shared. A device object (decision 9) has ' +
        '`d`, `s` and `meta`, each a map from variable name to variable record; deleted variables are left out. ' +
        '`Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The devices; `{}` when there are none.', json: Collection },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        const ids = await devices.deviceIdsOf(user.id);
        const objects = await Promise.all(ids.map(async (id) => [id, await devices.deviceJson(id)] as const));
        return json(reply, renderCollection(objects));
      },
    },
    {
      method: 'POST',
      path: '/0/devices/',
      operationId: 'claimDevice',
      tag: 'Devices',
      summary: 'Claim a device, or share one',
      description:
        "Registers the device with this auth code to the user (decision 8; one owner). Needs the frontend's " +
        "`registration`; with its `claimRequiresProximity`, the device must have heard one of the user's " +
        `authcodes within ${window} (decision 16). Claiming a device the user already owns answers 201 again ` +
        'with the same id. The answer is the device uuid as text, or `{"id": "<uuid>"}` to a request with ' +
        '`Accept: application/json`. With `user` (decision 23): the owner shares the device named by `auth` (its ' +
        'auth code or its uuid) with the user of that login in this frontend; sharing again is idempotent. The ' +
        "frontend's `registration` does not govern shares.",
      session: 'required',
      failToken: 'claim-fail',
      form: named('ClaimForm', ClaimForm),
      responses: {
        201: {
          description: "Claimed, or already the user's: the device uuid.",
          text: z.string().regex(DEVICE_ID_RE),
          json: named('ClaimResponse', ClaimResponse),
        },
        200: { description: 'With `user`: shared (or it was already).', tokens: ['share-ok'] },
        400: {
          description:
            '`claim-fail`: `auth` missing or malformed (or a uuid); no device has this auth code; another user ' +
            "owns the device; the frontend's `registration` is off; `claimRequiresProximity` is on and the device " +
            `has not heard the user within the window; ${malformed}. \`share-fail\` (with \`user\`): \`auth\` or ` +
            '`user` malformed; no such device, or the user does not own it; no user of that login in this ' +
            "frontend; the login is the owner's own.",
          tokens: [token('claim-fail'), token('share-fail')],
        },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        // Decision 23: `user` makes the request a share (the official client's `shareDevice`).
        if (Object.hasOwn(fields(req), 'user')) return shares.share(req, reply, user);
        const form = readForm(fields(req), ClaimForm);
        if (!req.frontend.config.registration || !form.auth.ok || !AUTHCODE_RE.test(form.auth.value)) {
          throw new ApiError('claim-fail');
        }
        const device = await devices.deviceByAuthcode(form.auth.value);
        if (!device) throw new ApiError('claim-fail');
        const product = req.frontend.config;
        if (product.claimRequiresProximity && device.ownerId !== user.id) {
          if (!(await devices.heardBy(device.id, user.id, now() - windowMs))) throw new ApiError('claim-fail');
        }
        const outcome = await store.write((tx) => tx.devices.claim(device.id, user.id, now()));
        if (outcome === 'taken') throw new ApiError('claim-fail');
        if (outcome === 'claimed') {
          ctx.log.info({ event: 'device.claimed', deviceId: device.id, userId: user.id });
          service.registrationChanged(device.id, true, user.id);
        }
        // Decision 8: the uuid as text, or `{"id": …}` to a client that asks for JSON.
        const accept = req.headers.accept ?? '';
        if (/\bapplication\/json\b/i.test(accept)) return json(reply, JSON.stringify({ id: device.id }), 201);
        return send(reply, 201, device.id);
      },
    },
    {
      method: 'GET',
      path: '/0/devices/{id}',
      operationId: 'getDevice',
      tag: 'Devices',
      summary: 'One device',
      description: `The device object (decision 9). ${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      responses: {
        200: { description: 'The device object.', json: named('DeviceObject', DeviceObject) },
        401: NO_SESSION,
        404: DEVICE_NOT_FOUND,
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        if (!seen) throw new ApiError('device-not-found');
        return json(reply, await devices.deviceJson(seen.device.id));
      },
    },
    {
      method: 'DELETE',
      path: '/0/devices/{id}',
      operationId: 'unregisterDevice',
      tag: 'Devices',
      summary: 'Unregister a device',
      description:
        'Only the owner may. The device loses its owner, and with it what the owner kept on the server about ' +
        'it: its `s` variables, the history of all its variables, the record of who it heard nearby, and its ' +
        'shares (decision 23). Its `d` and `meta` variables stay: they belong to the device. It can be claimed ' +
        "again. Called by a user the device is shared with, it ends only that user's share.",
      session: 'required',
      failToken: 'device-fail',
      responses: {
        200: {
          description: "Unregistered; or, for a user it is shared with, that user's share ended.",
          tokens: ['device-ok'],
        },
        400: {
          description: `No such device, one the user may not see, or one the user sees only nearby; ${malformed}.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        const seen = await visible(req, user);
        if (seen?.role === 'shared') {
          // Decision 23: a shared user removes the device from their own list; its owner keeps it.
          if (!(await shares.unshare(seen.device.id, user.id, user.id))) throw new ApiError('device-fail');
          return send(reply, 200, 'device-ok');
        }
        if (!seen?.owner) throw new ApiError('device-fail');
        const id = seen.device.id;
        const done = await store.write(async (tx) => {
          if (!(await tx.devices.unregister(id, user.id))) return false;
          // The former owner's commands go with the registration.
          await tx.commands.deleteOfDevice(id);
          return true;
        });
        if (!done) throw new ApiError('device-fail');
        ctx.log.info({ event: 'device.unregistered', deviceId: id, userId: user.id });
        service.registrationChanged(id, false, user.id);
        return send(reply, 200, 'device-ok');
      },
    },
    // ---- variables ----
    {
      method: 'GET',
      path: '/0/devices/{id}/{type}',
      operationId: 'listVariables',
      tag: 'Devices',
      summary: 'The variables of one type',
      description:
        `Variable records keyed by name (rule 5); deleted variables are left out. ${who} ` +
        '`Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The variables; `{}` when there are none.', json: named('VariableList', VariableList) },
        401: NO_SESSION,
        404: {
          ...DEVICE_NOT_FOUND,
          description:
            '`device-fail`: no device the user may see, or a type other than `d`, `s` and `meta`. `not found`: an ' +
            'unknown frontend.',
        },
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        const type = VarTypeParam.safeParse((req.params as Params).type);
        if (!seen || !type.success) throw new ApiError('device-not-found');
        return json(reply, renderVars(await devices.vars(seen.device.id, type.data)));
      },
    },
    {
      method: 'GET',
      path: '/0/devices/{id}/{type}/{name}',
      operationId: 'getVariable',
      tag: 'Devices',
      summary: 'One variable, or its history',
      description:
        'Without `latest`, `from` and `startid`: the variable (decision 9): a variable record for `d` and `s` ' +
        '(`d` with the four stamps `time`, `acked`, `synced`, `syncacked`), the bare value as a JSON string for ' +
        '`meta`. With any of them: its history, newest first (decisions 10 and 11): at most `latest` entries ' +
        `(absent, 0 or more than ${HISTORY_MAX}: ${HISTORY_MAX}); with \`from\`, the newest of those with an id ` +
        'below it; with `startid`, the oldest of those with an id at or above it (decision 27). Each entry is ' +
        '`{key, value, by, type, timestamp, id}`, `value` always a string: `""` with `deleted: true` for a ' +
        'deletion, and beside `value64` (the exact bytes) for bytes that are not UTF-8. `by` is ' +
        '`device`, `user` or `server`. A variable with no history answers `[]`. History older than ' +
        `\`devices.historyDays\` (${d.historyDays}) days, and past the newest \`devices.historyPerVariable\` ` +
        `(${d.historyPerVariable}) entries of the variable, is removed. ${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      failToken: 'device-fail',
      query: HistoryQuery,
      responses: {
        200: {
          description: 'The variable record, the bare `meta` value, or the history entries.',
          json: named('VariableAnswer', VariableAnswer),
        },
        400: {
          description:
            '`latest`, `from` or `startid` is not a non-negative integer (or is given twice); `from` and `startid` ' +
            'together.',
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
        404: {
          ...DEVICE_NOT_FOUND,
          description:
            '`device-fail`: no device the user may see; a malformed type or name; without `latest`, `from` and ' +
            '`startid`, a variable that does not exist or was deleted. `not found`: an unknown frontend.',
        },
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        const v = variable(req);
        if (!seen || !v) throw new ApiError('device-not-found');
        const q = query(req);
        if (q.latest !== undefined || q.from !== undefined || q.startid !== undefined) {
          const h = readForm(q, HistoryQuery);
          if (!h.latest.ok || !h.from.ok || !h.startid.ok) throw new ApiError('device-fail');
          // One direction at a time: `from` pages backwards, `startid` forwards (decision 27).
          if (h.from.value !== undefined && h.startid.value !== undefined) throw new ApiError('device-fail');
          const asked = h.latest.value === undefined ? 0 : Number(h.latest.value);
          const limit = asked === 0 || asked > HISTORY_MAX ? HISTORY_MAX : asked;
          const id = seen.device.id;
          if (h.startid.value !== undefined) {
            const since = Number(h.startid.value);
            return json(reply, renderHistory(await devices.historySince(id, v.type, v.name, limit, since)));
          }
          const before = h.from.value === undefined ? undefined : Number(h.from.value);
          return json(reply, renderHistory(await devices.history(id, v.type, v.name, limit, before)));
        }
        const rec = await devices.getVar(seen.device.id, v.type, v.name);
        if (!rec || rec.value === null) throw new ApiError('device-not-found');
        // Decision 9: a meta variable reads as its bare value; `d` and `s` as records.
        return json(reply, v.type === 'meta' ? renderBare(rec) : renderRecord(rec)!);
      },
    },
    {
      method: 'POST',
      path: '/0/devices/{id}/{type}/{name}',
      operationId: 'setVariable',
      tag: 'Devices',
      summary: 'Set a variable, or synchronise one',
      description:
        'Rules 1 to 3 of the specification. `type` is `d` or `s`; a variable that does not exist is created. ' +
        '`value64` wins over `value` when both are sent. A `d` value is pushed to the device: the call returns ' +
        'once the bridge has committed it, and `acked` stays 0 until the device acknowledges the version. A `d` ' +
        'variable posted with no value is synchronised: its `synced` stamp advances and the current value is ' +
        'sent again; `syncacked` follows when the device acknowledges. An `s` value is kept on the server only ' +
        'and is never sent to the device. `timestamp` (ms since the epoch, as the official client sends it) ' +
        `stamps the version instead of the bridge's clock: at most \`devices.timestampPastMs\` (${d.timestampPastMs}) ` +
        `ms before it and \`devices.timestampFutureMs\` (${d.timestampFutureMs}) ms after it; a stamp at or before ` +
        `the held version's time is refused with 409 (decision 26). ${who}`,
      session: 'required',
      failToken: 'device-fail',
      form: named('VariableForm', VariableForm),
      responses: {
        200: { description: 'Set, or synchronisation started.', tokens: ['device-ok'] },
        400: {
          description:
            'No device the user may see; `type` `meta` (decision 22: meta variables are read-only) or not a ' +
            `type; a malformed name; \`value64\` not base64; a value over \`devices.maxValueBytes\` ` +
            `(${maxValueBytes}) bytes; no value for an \`s\` variable, or for a \`d\` variable that does not ` +
            'exist or was deleted; a body that is not a set of fields (a JSON value that is not an object, a ' +
            `non-empty body of another content type), which would otherwise read as a sync; \`timestamp\` not ` +
            `a whole number of ms, outside the tolerance, or with no value (a sync); ${malformed}.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
        409: {
          description:
            "`timestamp` is at or before the time of the variable's current version, which would win over it " +
            '(last writer wins, decision 26): nothing was changed.',
          tokens: [token('device-fail-older')],
        },
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        const v = variable(req);
        // Decision 22: meta variables are read-only.
        // A body that is not a set of fields is malformed, not "no value" (which would be a sync).
        if (!seen || !v || v.type === 'meta' || !bodyIsFields(req)) throw new ApiError('device-fail');
        const form = readForm(fields(req), VariableForm);
        if (!form.value.ok || !form.value64.ok || !form.timestamp.ok) throw new ApiError('device-fail');
        let stamp: number | undefined;
        if (form.timestamp.value !== undefined) {
          stamp = Number(form.timestamp.value);
          const at = now();
          if (stamp < at - d.timestampPastMs || stamp > at + d.timestampFutureMs) throw new ApiError('device-fail');
        }
        let value: Buffer | undefined;
        if (form.value64.value !== undefined) value = Buffer.from(form.value64.value, 'base64');
        else if (form.value.value !== undefined) value = Buffer.from(form.value.value, 'utf8');
        if (value !== undefined && value.length > maxValueBytes) throw new ApiError('device-fail');
        const id = seen.device.id;
        let ok: boolean;
        if (value === undefined) {
          // Rule 3: a `d` variable with no value is synchronised; an `s` variable has nothing to sync.
          // A sync makes no version, so it has nothing to stamp.
          if (v.type !== 'd' || stamp !== undefined) throw new ApiError('device-fail');
          ok = await service.syncVar(id, v.name);
        } else {
          const outcome = await service.setVarAt(id, v.type, v.name, value, stamp);
          if (outcome === 'older') throw new ApiError('device-fail-older');
          ok = outcome === 'set';
        }
        if (!ok) throw new ApiError('device-fail');
        return send(reply, 200, 'device-ok');
      },
    },
    {
      method: 'DELETE',
      path: '/0/devices/{id}/{type}/{name}',
      operationId: 'deleteVariable',
      tag: 'Devices',
      summary: 'Delete a variable',
      description:
        'Deletes a `d` or `s` variable: a new version with no value (a tombstone), recorded in the history as ' +
        '`deleted: true`. A `d` deletion is pushed to the device and acknowledged like any other version ' +
        `(rule 4). ${who}`,
      session: 'required',
      failToken: 'device-fail',
      responses: {
        200: { description: 'Deleted.', tokens: ['device-ok'] },
        400: {
          description:
            'No device the user may see; `type` `meta` or not a type; a malformed name; a variable that does not ' +
            `exist or is already deleted; ${malformed}.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        const v = variable(req);
        if (!seen || !v || v.type === 'meta') throw new ApiError('device-fail');
        // Rule 4: deleting a `d` variable is a version too (a tombstone), synchronised with the device.
        if (!(await service.setVar(seen.device.id, v.type, v.name, null))) throw new ApiError('device-fail');
        return send(reply, 200, 'device-ok');
      },
    },
    ...shares.routes,
    // ---- network ----
    {
      method: 'GET',
      path: '/0/network/',
      operationId: 'getNetwork',
      tag: 'Network',
      summary: 'The devices near the user',
      description:
        "Decision 18: the devices that heard one of the user's authcodes (broadcast by the user's phone on UDP " +
        `590) within ${window}, keyed by device auth code, as device objects. A device owned by another user is ` +
        "left out. With the frontend's `nearby` off, `{}`. `Cache-Control: no-store`.",
      session: 'required',
      responses: {
        200: { description: 'The nearby devices; `{}` when there are none.', json: Collection },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        // Decision 18, subject to the product's `nearby`: a product without it shows an empty network.
        if (!req.frontend.config.nearby) return json(reply, '{}');
        const near = (await devices.nearbyOf(user.id, now() - windowMs)).filter(
          (dev) => dev.authcode !== null && (dev.ownerId === null || dev.ownerId === user.id),
        );
        const objects = await Promise.all(
          near.map(async (dev) => [dev.authcode!, await devices.deviceJson(dev.id)] as const),
        );
        return json(reply, renderCollection(objects));
      },
    },
  ];
}
