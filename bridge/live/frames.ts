/**
 * The live channel's messages (docs/api.md, "Live channel"), built as text:
 *
 * - `{"devices":{<id>:<device object>}}`: a snapshot of every device the user sees;
 * - `{"delta":{<id>:{"d"|"s"|"meta":{<name>:<record>}}}}`: records that changed, each replacing the client's record
 *   of that name whole, with the device's current `meta.lastactivity` and `meta.state` beside them;
 * - `{"events":{<id>:{"type":"device-claimed","device":<device object>}|{"type":"device-removed"}}}`.
 *
 * A device object is the one `GET /0/devices/{id}` answers (decision 9), with `meta.unique` always there (the
 * official client keys its cache by `meta.unique.value`). A deleted variable is sent as a record without `value`
 * and with `"deleted":true` and its stamps (decision 25 in docs/decisions.md).
 */
import type { VarRecord } from '../devices/store.js';
import { renderRecord } from '../devices/view.js';
import type { BridgeStore } from '../store/types.js';

/** One record of a delta: the device object's own record, or a tombstone's. */
export function deltaRecord(v: VarRecord): string {
  const rendered = renderRecord(v);
  if (rendered !== undefined) return rendered;
  if (v.type === 'd') {
    return `{"deleted":true,"time":${v.time},"acked":${v.acked},"synced":${v.synced},"syncacked":${v.syncacked}}`;
  }
  return `{"deleted":true,"time":${v.time}}`;
}

/**
 * The device object of `deviceId` as the live channel sends it: the store's, with `meta.unique` added when the
 * device has not said hello yet (the store then has none).
 */
export async function liveDeviceJson(store: BridgeStore, deviceId: string): Promise<string> {
  const json = await store.devices.deviceJson(deviceId);
  const parsed = JSON.parse(json) as { meta?: Record<string, unknown> };
  if (parsed.meta?.unique !== undefined) return json;
  parsed.meta = { ...parsed.meta, unique: { value: deviceId, time: 0 } };
  return JSON.stringify(parsed);
}

/** `{"devices":{…}}` from pairs of device id and device object. */
export function devicesFrame(objects: ReadonlyArray<readonly [string, string]>): string {
  return `{"devices":{${objects.map(([id, json]) => `${JSON.stringify(id)}:${json}`).join(',')}}}`;
}

export function claimedFrame(deviceId: string, deviceJson: string): string {
  return `{"events":{${JSON.stringify(deviceId)}:{"type":"device-claimed","device":${deviceJson}}}}`;
}

export function removedFrame(deviceId: string): string {
  return `{"events":{${JSON.stringify(deviceId)}:{"type":"device-removed"}}}`;
}

/** `{"delta":{…}}` from each device's records by type and name (already rendered). */
export function deltaFrame(devices: ReadonlyMap<string, Record<'d' | 's' | 'meta', Array<[string, string]>>>): string {
  const parts: string[] = [];
  for (const [id, types] of devices) {
    const typeParts: string[] = [];
    for (const type of ['d', 's', 'meta'] as const) {
      const recs = types[type];
      if (recs.length === 0) continue;
      typeParts.push(`"${type}":{${recs.map(([name, rec]) => `${JSON.stringify(name)}:${rec}`).join(',')}}`);
    }
    parts.push(`${JSON.stringify(id)}:{${typeParts.join(',')}}`);
  }
  return `{"delta":{${parts.join(',')}}}`;
}
