/** The part of `unix-dgram` (a native module without types) that the sd_notify client and its tests use. */
declare module 'unix-dgram' {
  import type { EventEmitter } from 'node:events';

  export interface UnixDgramSocket extends EventEmitter {
    bind(path: string): void;
    /** Sends synchronously; the callback, when given, runs before `send` returns. */
    send(buf: Buffer, offset: number, length: number, path: string, callback?: (err?: Error) => void): void;
    close(): void;
  }

  export function createSocket(
    type: 'unix_dgram',
    listener?: (msg: Buffer, rinfo: { size: number; path?: string }) => void,
  ): UnixDgramSocket;
}
