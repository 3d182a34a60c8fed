/**
 * Encoding and decoding of payloads. Decoding never throws: a payload that is not what its topic carries
 * comes back as a reason, which the receiver logs once and counts (docs/decisions.md §4).
 */
import { isUtf8 } from 'node:buffer';
import { randomUUID } from 'node:crypto';
import { type AckItem, type Payloads, SCHEMAS, type VarItem } from './schemas.js';
import type { TopicName } from './topics.js';

/** Larger payloads are refused before parsing; senders batch well below this. */
export const MAX_PAYLOAD_BYTES = 8 * 1024 * 1024;

/**
 * What an MQTT packet adds around its payload, at most: the fixed header, the topic (`dc/v1/<uuid>/up/hello` is
 * under 64 bytes), the packet id and MQTT 5 properties, rounded up generously.
 */
export const PACKET_HEADROOM_BYTES = 64 * 1024;

/**
 * The largest MQTT packet, whole, that a broker accepts from anyone: the largest legal payload plus headroom. The
 * embedded broker refuses a larger one as soon as its header announces it, and the shipped Mosquitto config sets
 * `max_packet_size` to this (docs/protocol.md, "Sizes").
 */
export const MAX_PACKET_BYTES = MAX_PAYLOAD_BYTES + PACKET_HEADROOM_BYTES;

/**
 * The most a sender puts in one message of items (`up/vars`, `down/vars`): half the receiver's limit, so that
 * {@link varItemBytes} can be a rough upper bound.
 */
export const MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES / 2;

/** An upper bound of a variable item's size in a message: JSON escaping makes a character at most 6 bytes. */
export function varItemBytes(item: VarItem): number {
  const v = item.value ?? item.value64 ?? '';
  return 256 + (v.length < 4096 ? v.length * 6 : Buffer.byteLength(JSON.stringify(v)));
}

/**
 * Splits items into messages of at most `maxItems` items and {@link MAX_MESSAGE_BYTES} (estimated) each; an item
 * alone is always a message of its own, whatever its size.
 */
export function chunkVarItems<T>(items: readonly T[], maxItems: number, itemOf: (t: T) => VarItem): T[][] {
  const chunks: T[][] = [];
  let i = 0;
  while (i < items.length) {
    let end = i;
    let bytes = 0;
    while (end < items.length && end - i < maxItems) {
      bytes += varItemBytes(itemOf(items[end]!));
      if (end > i && bytes > MAX_MESSAGE_BYTES) break;
      end++;
    }
    chunks.push(items.slice(i, end));
    i = end;
  }
  return chunks;
}

export type Decoded<K extends TopicName> = { ok: true; value: Payloads[K] } | { ok: false; reason: string };

export function encode<K extends TopicName>(name: K, payload: Payloads[K]): Buffer {
  if (name === 'state') return Buffer.from(payload as string, 'utf8');
  return Buffer.from(JSON.stringify(payload), 'utf8');
}

export function decode<K extends TopicName>(name: K, payload: Buffer | Uint8Array): Decoded<K> {
  if (payload.byteLength > MAX_PAYLOAD_BYTES) {
    return { ok: false, reason: `payload of ${payload.byteLength} bytes exceeds ${MAX_PAYLOAD_BYTES}` };
  }
  const text = Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength).toString('utf8');
  let raw: unknown = text;
  if (name !== 'state') {
    try {
      raw = JSON.parse(text);
    } catch {
      return { ok: false, reason: 'payload is not JSON' };
    }
  }
  const parsed = SCHEMAS[name].safeParse(raw);
  if (!parsed.success) {
    const first = parsed.error.issues[0];
    const where = first && first.path.length > 0 ? `${first.path.join('.')}: ` : '';
    return { ok: false, reason: `${where}${first?.message ?? 'invalid payload'}` };
  }
  return { ok: true, value: parsed.data };
}

/** A fresh message id. */
export function messageId(): string {
  return randomUUID();
}

/** Text values travel as `value`; bytes that are not valid UTF-8 travel as `value64` (decision 9). */
export function encodeValue(bytes: Buffer): { value: string } | { value64: string } {
  return isUtf8(bytes) ? { value: bytes.toString('utf8') } : { value64: bytes.toString('base64') };
}

/** The bytes of an item's value, or `null` for a tombstone. */
export function decodeValue(item: { value?: string; value64?: string; deleted?: true }): Buffer | null {
  if (item.deleted) return null;
  if (item.value64 !== undefined) return Buffer.from(item.value64, 'base64');
  return Buffer.from(item.value ?? '', 'utf8');
}

/** What both sides keep of a variable version, as far as the wire needs it. */
export interface VersionRecord {
  type: 'd' | 's';
  name: string;
  /** `null` for a tombstone. */
  value: Buffer | null;
  time: number;
  origin: 'device' | 'cloud';
  synced: number;
  /** Stamped by a gateway's own clock before it learnt the cloud's (decision 24): 1 or `true`. */
  unverified?: number | boolean | undefined;
}

/** The wire form of a version: a push, or a sync carrying the sender's `synced` stamp. */
export function varItem(rec: VersionRecord, kind: 'push' | 'sync'): VarItem {
  const item: VarItem = {
    kind,
    type: rec.type,
    name: rec.name,
    ...(rec.value === null ? { deleted: true as const } : encodeValue(rec.value)),
    time: rec.time,
    origin: rec.origin,
  };
  if (kind === 'sync') item.synced = rec.synced;
  if (rec.unverified) item.unverified = true;
  return item;
}

/** The acknowledgement of an item: it names the version and, for a sync, the `synced` stamp it answers. */
export function ackFor(item: VarItem): AckItem {
  const ack: AckItem = { kind: item.kind, type: item.type, name: item.name, time: item.time, origin: item.origin };
  if (item.synced !== undefined) ack.synced = item.synced;
  return ack;
}

/** The version of a value: `(time, origin)` for a given variable (docs/decisions.md §3). */
export interface Version {
  time: number;
  origin: 'device' | 'cloud';
}

/**
 * How far ahead of the cloud's clock a device's version may be stamped before the cloud re-stamps it (decision 24,
 * docs/sync.md#clocks): more than network delay and a clock's drift between two offset samples, far less than
 * the hour a gateway without a real-time clock can be off.
 */
export const CLOCK_TOLERANCE_MS = 60_000;

/** Orders versions: later `time` wins, and on a tie the cloud wins (docs/decisions.md §3). Both sides use it. */
export function compareVersions(a: Version, b: Version): number {
  if (a.time !== b.time) return a.time < b.time ? -1 : 1;
  if (a.origin === b.origin) return 0;
  return a.origin === 'cloud' ? 1 : -1;
}
