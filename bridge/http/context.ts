/**
 * What every resource's route table is built with: the bridge's config, store and services, the clock, and the
 * attempt limits of the account routes.
 */
import type { Logger } from '../../lib/log.js';
import type { Limits } from '../accounts/limits.js';
import type { PasswordHasher } from '../accounts/password.js';
import type { CommandService } from '../commands/service.js';
import type { BridgeConfig } from '../config.js';
import type { DeviceService } from '../devices/service.js';
import type { EventBus } from '../events/bus.js';
import type { Mailer } from '../mail/mailer.js';
import type { BridgeStore } from '../store/types.js';

export interface RouteContext {
  config: BridgeConfig;
  store: BridgeStore;
  hasher: PasswordHasher;
  mailer: Mailer;
  log: Logger;
  now: () => number;
  devices: DeviceService;
  commands: CommandService;
  limits: Limits;
  /** Where committed changes are announced (docs/scaling.md, "The event bus"). */
  events: EventBus;
}
