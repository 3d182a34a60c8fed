/**
 * Sharing a device (decision 23; docs/api.md, "Sharing a device"). A device has one owner, who may share it with
 * any number of users of the same frontend: they see it in their device list, read it and its history, set and
 * delete its variables and send it commands, and follow it on the live channel; they may not unregister it, share
 * it further or update its firmware. The owner grants with `POST /0/devices/` (`auth` and `user`, the official
 * client's `shareDevice`; handled here for the claim route of routes.ts), lists with `GET /0/devices/<id>/users/`
 * and revokes with `DELETE /0/devices/<id>/users/<login>`; a shared user may drop their own share with the latter,
 * or with `DELETE /0/devices/<id>`. Unregistering the device ends every share. Each grant and revocation is
 * announced as `device.shared` once committed.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send, sendJson } from '../http/reply.js';
import { fields, readForm } from '../http/request.js';
import { type Route, named } from '../http/route.js';
import { LoginField } from '../sessions/schemas.js';
import type { User } from '../store/types.js';
import { DEVICE_NOT_FOUND, deviceAccess } from './access.js';
import { ShareList, claimForm, parseDeviceRef } from './schemas.js';

export interface Sharing {
  /** `POST /0/devices/` with `user`: the owner shares the device `auth` names (200 `share-ok`, else `share-fail`). */
  share(req: FastifyRequest, reply: FastifyReply, owner: User): Promise<FastifyReply>;
  /** Ends one share, announces it and logs it; `false` when there was none. */
  unshare(deviceId: string, userId: number, by: number): Promise<boolean>;
  routes: Route[];
}

export function sharing(ctx: RouteContext): Sharing {
  const { store, config, now, log, events } = ctx;
  const devices = store.devices;
  const ClaimForm = claimForm(config.accounts.loginMax);
  const Login = LoginField(config.accounts.loginMax);
  const { userOf, visible } = deviceAccess(ctx);

  async function unshare(deviceId: string, userId: number, by: number): Promise<boolean> {
    if (!(await store.write((tx) => tx.devices.unshare(deviceId, userId)))) return false;
    log.info({ event: 'device.unshared', deviceId, userId, by });
    events.publish({ type: 'device.shared', deviceId, userId, shared: false });
    return true;
  }

  return {
    unshare,
    async share(req, reply, owner) {
      const form = readForm(fields(req), ClaimForm);
      if (!form.auth.ok || !form.user.ok || form.user.value === undefined) throw new ApiError('share-fail');
      const ref = parseDeviceRef(form.auth.value);
      if (!ref) throw new ApiError('share-fail');
      const device = ref.kind === 'uuid' ? await devices.device(ref.id) : await devices.deviceByAuthcode(ref.authcode);
      // Only the owner shares: a user the device is shared with may not share it further.
      if (!device || device.ownerId !== owner.id) throw new ApiError('share-fail');
      const target = await store.userByLogin(req.frontend.id, form.user.value);
      // The owner has the device already; sharing with themselves would make them a shared user of their own.
      if (!target || target.id === owner.id) throw new ApiError('share-fail');
      const outcome = await store.write((tx) => tx.devices.share(device.id, owner.id, target.id, now()));
      if (outcome === 'not-owner') throw new ApiError('share-fail');
      if (outcome === 'shared') {
        log.info({ event: 'device.shared', deviceId: device.id, userId: target.id, by: owner.id });
        events.publish({ type: 'device.shared', deviceId: device.id, userId: target.id, shared: true });
      }
      return send(reply, 200, 'share-ok');
    },
    routes: [
      {
        method: 'GET',
        path: '/0/devices/{id}/users/',
        operationId: 'listDeviceShares',
        tag: 'Devices',
        summary: 'The users a device is shared with',
        description:
          'Decision 23: for the owner of the device, the users it is shared with, in the order they were shared: ' +
          '`[{"login", "granted"}]`. `Cache-Control: no-store`.',
        session: 'required',
        responses: {
          200: { description: 'The shares; `[]` when there are none.', json: named('ShareList', ShareList) },
          401: NO_SESSION,
          403: {
            description: 'The user sees the device but does not own it (it is shared with them, or nearby).',
            tokens: [token('share-list-fail')],
          },
          404: DEVICE_NOT_FOUND,
        },
        handler: async (req, reply) => {
          const seen = await visible(req, userOf(req));
          if (!seen) throw new ApiError('device-not-found');
          if (!seen.owner) throw new ApiError('share-list-fail');
          const shares = await devices.sharesOf(seen.device.id);
          return sendJson(reply, JSON.stringify(shares.map((s) => ({ login: s.login, granted: s.grantedAt }))));
        },
      },
      {
        method: 'DELETE',
        path: '/0/devices/{id}/users/{login}',
        operationId: 'revokeDeviceShare',
        tag: 'Devices',
        summary: 'Take a share back',
        description:
          'Decision 23: the owner ends the share of the device with the user of `{login}`; or a user the device is ' +
          'shared with ends their own (`{login}` their own login). The device stays registered to its owner.',
        session: 'required',
        failToken: 'share-fail',
        responses: {
          200: { description: 'The share ended.', tokens: ['share-ok'] },
          400: {
            description:
              'No device the user may see; the user is neither its owner nor, for their own login, a user it is ' +
              'shared with; a malformed login or one of no user; the device is not shared with that user; or a ' +
              'malformed body.',
            tokens: [token('share-fail')],
          },
          401: NO_SESSION,
        },
        handler: async (req, reply) => {
          const user = userOf(req);
          const seen = await visible(req, user);
          const login = Login.safeParse((req.params as { login?: string }).login);
          if (!seen || !login.success) throw new ApiError('share-fail');
          let target: User | undefined;
          if (seen.role === 'owner') target = await store.userByLogin(req.frontend.id, login.data);
          else if (seen.role === 'shared' && login.data === user.login) target = user;
          if (!target || !(await unshare(seen.device.id, target.id, user.id))) throw new ApiError('share-fail');
          return send(reply, 200, 'share-ok');
        },
      },
    ],
  };
}
