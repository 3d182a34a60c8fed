/**
 * Who may see a device (decisions 14 and 18; docs/api.md): its owner, through its uuid or its auth code; and,
 * while it has no owner, a user whose authcode it heard within the nearby window, when the frontend's `nearby`
 * is on. Every device route asks here, so that the rule is written once.
 */
import type { FastifyRequest } from 'fastify';
import type { BridgeConfig } from '../config.js';
import { ApiError } from '../errors.js';
import { token } from '../http/outcomes.js';
import type { Outcome } from '../http/route.js';
import type { BridgeStore, User } from '../store/types.js';
import { parseDeviceRef } from './schemas.js';
import type { Device } from './store.js';

export interface DeviceAccess {
  /** The logged-in user, or 401 `no-session` (decision 3). */
  userOf: (req: FastifyRequest) => User;
  /** The device the path's `id` names, if this user may see it; `owner` tells whether the user owns it. */
  visible: (req: FastifyRequest, user: User) => Promise<{ device: Device; owner: boolean } | undefined>;
}

export interface AccessDeps {
  store: BridgeStore;
  config: BridgeConfig;
  now: () => number;
}

export function deviceAccess(deps: AccessDeps): DeviceAccess {
  const devices = deps.store.devices;
  const windowMs = deps.config.devices.nearbyWindowMs;
  return {
    userOf(req) {
      if (!req.user) throw new ApiError('no-session');
      return req.user;
    },
    async visible(req, user) {
      const raw = (req.params as { id?: string }).id ?? '';
      const ref = parseDeviceRef(raw);
      if (!ref) return undefined;
      const device = ref.kind === 'uuid' ? await devices.device(ref.id) : await devices.deviceByAuthcode(ref.authcode);
      if (!device) return undefined;
      if (device.ownerId === user.id) return { device, owner: true };
      if (device.ownerId !== null || !req.frontend.config.nearby) return undefined;
      return (await devices.heardBy(device.id, user.id, deps.now() - windowMs)) ? { device, owner: false } : undefined;
    },
  };
}

/** A device route's `GET` answer for a device the user may not see, which is the answer for no device at all. */
export const DEVICE_NOT_FOUND: Outcome = {
  description:
    '`device-fail`: the device does not exist or the user may not see it (decision 14: the two are the same ' +
    'answer). `not found`: an unknown frontend.',
  tokens: [token('device-not-found'), token('not-found')],
};
