/**
 * The device service as the bridge composes it, with what hangs off a device's hello: commands handed over again
 * and an open firmware job sent again. One place, for the bridge (bridge/bridge.ts) and for an app built on its
 * own (bridge/app.ts, tests).
 */
import type { Logger } from '../../lib/log.js';
import type { CommandService } from '../commands/service.js';
import type { BridgeConfig } from '../config.js';
import type { EventBus } from '../events/bus.js';
import { resendFirmwareJob } from '../firmware/resend.js';
import type { BridgeStore } from '../store/types.js';
import { DeviceService } from './service.js';

export function createDeviceService(
  config: BridgeConfig,
  store: BridgeStore,
  log: Logger,
  now: () => number,
  commands: CommandService,
  events?: EventBus,
): DeviceService {
  const devices: DeviceService = new DeviceService({
    store,
    log,
    now,
    nearbyWindowMs: config.devices.nearbyWindowMs,
    lastActivityMs: config.devices.lastActivityMs,
    resend: { firstMs: config.devices.resendFirstMs, maxMs: config.devices.resendMaxMs },
    retention: { maxAgeDays: config.devices.historyDays, maxPerVariable: config.devices.historyPerVariable },
    commands,
    ...(events && { events }),
    firmware: {
      onHello: (deviceId: string): Promise<void> =>
        resendFirmwareJob(
          {
            store,
            sendDown: (id, name, payload): boolean => devices.sendDown(id, name, payload),
            tokenHours: config.firmware.tokenHours,
            now,
            log,
          },
          deviceId,
        ),
    },
  });
  return devices;
}
