/**
 * Who may see a device (decisions 14, 18 and 23; docs/api.md): its owner, through its uuid or its auth code; the
 * users its owner shared it with, likewise; and, while it has no owner, a user whose authcode it heard within the
 * nearby window, when the frontend's `nearby` is on. Every device route asks here, so that the rule is written
 * once; the routes only the owner may use (unregister, share, firmware) look at `role`.
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
  /** The device the path's `id` names, if this user may see it, and as what. */
  visible: (req: FastifyRequest, user: User) => Promise<Seen | undefined>;
}

/** Why a user sees a device: owns it, it is shared with them (decision 23), or it has no owner and heard them. */
export type Role = 'owner' | 'shared' | 'nearby';

export interface Seen {
  device: Device;
  role: Role;
  /** `role === 'owner'`. */
  owner: boolean;
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
      if (device.ownerId === user.id) return { device, role: 'owner', owner: true };
      if (device.ownerId !== null) {
        // Decision 23: shares count only while the device has an owner (an unregister ends them all).
        return (await devices.isSharedWith(device.id, user.id)) ? { device, role: 'shared', owner: false } : undefined;
      }
      if (!req.frontend.config.nearby) return undefined;
      const near = await devices.heardBy(device.id, user.id, deps.now() - windowMs);
      return near ? { device, role: 'nearby', owner: false } : undefined;
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
