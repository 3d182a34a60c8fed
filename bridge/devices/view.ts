/**
 * The JSON the device routes answer (decision 9), built as text: a device object is read far more often than it
 * changes, and the store keeps the text of each one until the device changes.
 *
 * - Every entry of a device object, `d`, `s` and `meta`, is a variable record. `d` records carry the four
 *   stamps; `s` and `meta` records carry `value` and `time`.
 * - A value that is not valid UTF-8 is given as `value64` (base64) instead of `value`.
 * - A deleted variable (a tombstone) is left out of device objects and variable lists.
 */
import { isUtf8 } from 'node:buffer';

export interface RenderableVar {
  type: 'd' | 's' | 'meta';
  name: string;
  /** `null` for a tombstone. */
  value: Buffer | null;
  time: number;
  acked: number;
  synced: number;
  syncacked: number;
}

export interface RenderableHistory {
  id: number;
  type: 'd' | 's' | 'meta';
  name: string;
  value: Buffer | null;
  by: string;
  timestamp: number;
}

/** `"value":"…"` for text, `"value64":"…"` for other bytes. */
function valueMember(value: Buffer): string {
  return isUtf8(value)
    ? `"value":${JSON.stringify(value.toString('utf8'))}`
    : `"value64":"${value.toString('base64')}"`;
}

/** One variable record; `undefined` for a tombstone. */
export function renderRecord(v: RenderableVar): string | undefined {
  if (v.value === null) return undefined;
  if (v.type === 'd') {
    return `{${valueMember(v.value)},"time":${v.time},"acked":${v.acked},"synced":${v.synced},"syncacked":${v.syncacked}}`;
  }
  return `{${valueMember(v.value)},"time":${v.time}}`;
}

/** The bare shape of a value: a JSON string (`meta` reads, decision 9); binary bytes as a base64 string. */
export function renderBare(v: RenderableVar): string {
  if (v.value === null) return 'null';
  return JSON.stringify(isUtf8(v.value) ? v.value.toString('utf8') : v.value.toString('base64'));
}

/** Records keyed by name, tombstones left out. */
export function renderVars(vars: readonly RenderableVar[]): string {
  const parts: string[] = [];
  for (const v of vars) {
    const rec = renderRecord(v);
    if (rec !== undefined) parts.push(`${JSON.stringify(v.name)}:${rec}`);
  }
  return `{${parts.join(',')}}`;
}

/** A device object: `{"d":{…},"s":{…},"meta":{…}}`. */
export function renderDevice(vars: readonly RenderableVar[]): string {
  const byType = { d: [] as RenderableVar[], s: [] as RenderableVar[], meta: [] as RenderableVar[] };
  for (const v of vars) byType[v.type].push(v);
  return `{"d":${renderVars(byType.d)},"s":${renderVars(byType.s)},"meta":${renderVars(byType.meta)}}`;
}

/**
 * History entries (decision 10): `{key, value, by, type, timestamp, id}`, `value` always a string, as the
 * specification's entry has it (docs/api.md, History). A deletion is `"value":""` with `deleted: true`; bytes that
 * are not UTF-8 are `value64` (exact) beside `value` (the bytes read as UTF-8, U+FFFD for what is not: for display).
 */
export function renderHistory(entries: readonly RenderableHistory[]): string {
  const parts = entries.map((e) => {
    let value: string;
    if (e.value === null) value = '"value":"","deleted":true';
    else if (isUtf8(e.value)) value = `"value":${JSON.stringify(e.value.toString('utf8'))}`;
    else value = `"value":${JSON.stringify(e.value.toString('utf8'))},"value64":"${e.value.toString('base64')}"`;
    return `{"key":${JSON.stringify(e.name)},${value},"by":"${e.by}","type":"${e.type}","timestamp":${e.timestamp},"id":${e.id}}`;
  });
  return `[${parts.join(',')}]`;
}

/**
 * A collection of device objects keyed by device id or auth code. Built by one `join`, which makes a flat
 * string: the UTF-8 length of a string concatenated from pieces is computed by walking the pieces, every time
 * the answer is sent, and a user's collection may be megabytes.
 */
export function renderCollection(entries: ReadonlyArray<readonly [key: string, deviceJson: string]>): string | Buffer {
  const keys = entries.map(([k]) => JSON.stringify(k));
  let chars = 2;
  for (const [, json] of entries) chars += json.length;
  if (chars < LARGE_BODY_CHARS) {
    const parts: string[] = ['{'];
    entries.forEach(([, json], i) => parts.push(i > 0 ? ',' : '', keys[i]!, ':', json));
    parts.push('}');
    return parts.join('');
  }
  // A large list (a fleet's megabytes) is written straight into one buffer: as a string it would be joined,
  // measured and encoded again on the way out, each a pass over the whole body.
  let size = 2 + Math.max(0, entries.length - 1);
  const lengths = entries.map(([, json], i) => Buffer.byteLength(json) + Buffer.byteLength(keys[i]!) + 1);
  for (const n of lengths) size += n;
  const out = Buffer.allocUnsafe(size);
  let at = out.write('{', 0);
  entries.forEach(([, json], i) => {
    if (i > 0) at += out.write(',', at);
    at += out.write(keys[i]!, at);
    at += out.write(':', at);
    at += out.write(json, at);
  });
  out.write('}', at);
  return out;
}

/** Characters from which a list body is built as bytes rather than as a string. */
const LARGE_BODY_CHARS = 256 * 1024;
