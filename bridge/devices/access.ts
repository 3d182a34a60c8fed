/**
 * Who may see a device (decisions 14 and 18; docs/api.md): its owner, through its uuid or its auth code; and,
 * while it has no owner, a user whose authcode it heard within the nearby window, when the frontend's `nearby`
 * is on. Every device route asks here, so that the rule is written once.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { RouteContext } from '../app.js';
import { ApiError } from '../errors.js';
import type { User } from '../store/types.js';
import { parseDeviceRef } from './schemas.js';
import type { Device } from './store.js';

export interface DeviceAccess {
  /** The logged-in user, or 401 `no-session` (decision 3). */
  userOf: (req: FastifyRequest) => User;
  /** The device the path's `id` names, if this user may see it; `owner` tells whether the user owns it. */
  visible: (req: FastifyRequest, user: User) => { device: Device; owner: boolean } | undefined;
}

export function deviceAccess(ctx: RouteContext): DeviceAccess {
  const devices = ctx.store.devices;
  const windowMs = ctx.config.devices.nearbyWindowMs;
  return {
    userOf(req) {
      if (!req.user) throw new ApiError('no-session');
      return req.user;
    },
    visible(req, user) {
      const raw = (req.params as { id?: string }).id ?? '';
      const ref = parseDeviceRef(raw);
      if (!ref) return undefined;
      const device = ref.kind === 'uuid' ? devices.device(ref.id) : devices.deviceByAuthcode(ref.authcode);
      if (!device) return undefined;
      if (device.ownerId === user.id) return { device, owner: true };
      if (device.ownerId !== null || !req.frontend.config.nearby) return undefined;
      return devices.heardBy(device.id, user.id, ctx.now() - windowMs) ? { device, owner: false } : undefined;
    },
  };
}

const JSON_TYPE = 'application/json; charset=utf-8';

/** A JSON answer that no cache keeps. */
export function sendJson(reply: FastifyReply, body: string | Buffer, status = 200): FastifyReply {
  return reply.code(status).header('cache-control', 'no-store').type(JSON_TYPE).send(body);
}
