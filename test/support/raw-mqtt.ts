/**
 * MQTT 3.1.1 spoken by hand over a TCP socket, for tests that play a hostile device: a packet's header can
 * announce any length, and its body can then be streamed as slowly or as far as the test likes.
 */
import { readFileSync } from 'node:fs';
import { type Socket, connect } from 'node:net';

/** The remaining-length field of an MQTT fixed header. */
export function varLength(n: number): Buffer {
  const out: number[] = [];
  do {
    let byte = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out.push(byte);
  } while (n > 0);
  return Buffer.from(out);
}

function str(s: string): Buffer {
  const b = Buffer.from(s, 'utf8');
  const len = Buffer.alloc(2);
  len.writeUInt16BE(b.length);
  return Buffer.concat([len, b]);
}

/** A CONNECT packet (clean session, keepalive 60 s) with a username and password. */
export function connectPacket(clientId: string, username: string, password: string): Buffer {
  const body = Buffer.concat([str('MQTT'), Buffer.from([4, 0xc2, 0, 60]), str(clientId), str(username), str(password)]);
  return Buffer.concat([Buffer.from([0x10]), varLength(body.length), body]);
}

/** The header of a QoS 0 PUBLISH whose payload will be `payloadBytes` long, topic included. */
export function publishHeader(topic: string, payloadBytes: number): Buffer {
  const t = str(topic);
  return Buffer.concat([Buffer.from([0x30]), varLength(t.length + payloadBytes), t]);
}

/** A whole QoS 0 PUBLISH. */
export function publishPacket(topic: string, payload: Buffer): Buffer {
  return Buffer.concat([publishHeader(topic, payload.length), payload]);
}

export interface RawClient {
  socket: Socket;
  /** Whether the peer closed the connection (or it failed). */
  closed(): boolean;
  /** Bytes written so far. */
  written(): number;
  /** Writes, waiting for the socket to drain; `false` once the connection is gone. */
  write(data: Buffer): Promise<boolean>;
  close(): void;
}

/** Connects and logs in; resolves once the broker accepted the login (CONNACK 0). */
export async function rawConnect(
  port: number,
  login: { clientId: string; username: string; password: string },
  localAddress?: string,
): Promise<RawClient> {
  const socket = connect({ port, host: '127.0.0.1', ...(localAddress ? { localAddress } : {}) });
  let closed = false;
  let written = 0;
  socket.on('close', () => (closed = true));
  socket.on('error', () => (closed = true));
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  socket.write(connectPacket(login.clientId, login.username, login.password));
  const connack = await new Promise<Buffer>((resolve, reject) => {
    socket.once('data', resolve);
    socket.once('close', () => reject(new Error('the broker closed the connection before CONNACK')));
  });
  if (connack[0] !== 0x20 || connack[3] !== 0) throw new Error(`login refused: ${connack.toString('hex')}`);
  // Anything the broker sends later is read and thrown away, so that its writes never block.
  socket.on('data', () => undefined);
  return {
    socket,
    closed: () => closed,
    written: () => written,
    async write(data: Buffer): Promise<boolean> {
      if (closed) return false;
      written += data.length;
      if (socket.write(data)) return true;
      await new Promise<void>((resolve) => {
        const done = () => {
          socket.off('drain', done);
          socket.off('close', done);
          resolve();
        };
        socket.on('drain', done);
        socket.on('close', done);
      });
      return !closed;
    },
    close: () => socket.destroy(),
  };
}

/** Resident memory of a process, in bytes (Linux). */
export function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(status);
  if (!m) throw new Error(`no VmRSS for process ${pid}`);
  return Number(m[1]) * 1024;
}
