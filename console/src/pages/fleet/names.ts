/** How a device is named in the fleet views: its `meta` `name` when it has one, else its uuid. */
import type { DeviceObject } from '../../live.js';
import { valueText } from '../../live.js';

export function deviceName(id: string, d: DeviceObject | undefined): string {
  return valueText(d?.meta?.name) || id;
}
