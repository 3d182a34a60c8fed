/**
 * The little of MQTT 3.1.1 a simulated device needs, written by hand so that one process can hold thousands of
 * connections at a few hundred bytes each: the packets an agent sends (CONNECT with its last will, SUBSCRIBE,
 * PUBLISH at QoS 0 and 1, PUBACK, PINGREQ, DISCONNECT) and a parser that cuts a byte stream into packets.
 */

/** Packet types (the high nibble of the first byte). */
export const CONNACK = 2;
export const PUBLISH = 3;
export const PUBACK = 4;
export const SUBACK = 9;
export const PINGRESP = 13;

function varLengthBytes(n: number): number {
  return n < 128 ? 1 : n < 16_384 ? 2 : n < 2_097_152 ? 3 : 4;
}

/** Writes the remaining length at `at`; returns the offset after it. */
function writeVarLength(buf: Buffer, at: number, n: number): number {
  do {
    let byte = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    buf[at++] = byte;
  } while (n > 0);
  return at;
}

/** Writes a length-prefixed string or bytes at `at`; returns the offset after it. */
function writeField(buf: Buffer, at: number, field: Buffer): number {
  buf.writeUInt16BE(field.length, at);
  field.copy(buf, at + 2);
  return at + 2 + field.length;
}

function packet(first: number, body: number, fill: (buf: Buffer, at: number) => void): Buffer {
  const buf = Buffer.allocUnsafe(1 + varLengthBytes(body) + body);
  buf[0] = first;
  fill(buf, writeVarLength(buf, 1, body));
  return buf;
}

const PROTOCOL_NAME = Buffer.from('MQTT');

export interface ConnectOptions {
  clientId: string;
  username: string;
  password: string;
  keepaliveSec: number;
  /** Retained, QoS 0, as the agent's (docs/protocol.md, "Connecting"). */
  will: { topic: string; payload: Buffer };
}

/** CONNECT with a clean session, a username, a password and a retained QoS 0 will. */
export function connectPacket(o: ConnectOptions): Buffer {
  const id = Buffer.from(o.clientId);
  const user = Buffer.from(o.username);
  const pass = Buffer.from(o.password);
  const willTopic = Buffer.from(o.will.topic);
  const fields = [id, willTopic, o.will.payload, user, pass];
  const body = 2 + PROTOCOL_NAME.length + 4 + fields.reduce((s, f) => s + 2 + f.length, 0);
  // username, password, will retain, will (QoS 0), clean session
  const flags = 0x80 | 0x40 | 0x20 | 0x04 | 0x02;
  return packet(0x10, body, (buf, at) => {
    at = writeField(buf, at, PROTOCOL_NAME);
    buf[at++] = 4;
    buf[at++] = flags;
    buf.writeUInt16BE(o.keepaliveSec, at);
    at += 2;
    for (const f of fields) at = writeField(buf, at, f);
  });
}

/** SUBSCRIBE to one filter at QoS 1. */
export function subscribePacket(packetId: number, filter: string): Buffer {
  const f = Buffer.from(filter);
  return packet(0x82, 2 + 2 + f.length + 1, (buf, at) => {
    buf.writeUInt16BE(packetId, at);
    at = writeField(buf, at + 2, f);
    buf[at] = 1;
  });
}

/** PUBLISH at QoS 0 (`packetId` 0) or QoS 1. */
export function publishPacket(topic: Buffer, payload: Buffer, qos: 0 | 1, packetId: number, retain = false): Buffer {
  const body = 2 + topic.length + (qos === 1 ? 2 : 0) + payload.length;
  return packet(0x30 | (qos << 1) | (retain ? 1 : 0), body, (buf, at) => {
    at = writeField(buf, at, topic);
    if (qos === 1) {
      buf.writeUInt16BE(packetId, at);
      at += 2;
    }
    payload.copy(buf, at);
  });
}

export function pubackPacket(packetId: number): Buffer {
  const buf = Buffer.allocUnsafe(4);
  buf[0] = 0x40;
  buf[1] = 2;
  buf.writeUInt16BE(packetId, 2);
  return buf;
}

export const PINGREQ_PACKET = Buffer.from([0xc0, 0]);
export const DISCONNECT_PACKET = Buffer.from([0xe0, 0]);

/**
 * Cuts what a socket delivers into packets: `feed` calls `onPacket(type, flags, buf, start, length)` for every
 * whole packet (the body is `buf[start, start + length)`), and keeps an incomplete tail for the next chunk.
 */
export class PacketReader {
  private rest: Buffer | undefined;

  constructor(
    private readonly onPacket: (type: number, flags: number, buf: Buffer, start: number, len: number) => void,
  ) {}

  feed(chunk: Buffer): void {
    const buf = this.rest ? Buffer.concat([this.rest, chunk]) : chunk;
    this.rest = undefined;
    let off = 0;
    while (buf.length - off >= 2) {
      let len = 0;
      let mult = 1;
      let i = off + 1;
      let complete = false;
      for (let k = 0; k < 4 && i < buf.length; k++) {
        const b = buf[i++]!;
        len += (b & 0x7f) * mult;
        mult *= 128;
        if ((b & 0x80) === 0) {
          complete = true;
          break;
        }
      }
      if (!complete || i + len > buf.length) break;
      const first = buf[off]!;
      this.onPacket(first >> 4, first & 0x0f, buf, i, len);
      off = i + len;
    }
    // A copy, so that a small tail does not keep a whole read buffer alive.
    if (off < buf.length) this.rest = Buffer.from(buf.subarray(off));
  }
}
