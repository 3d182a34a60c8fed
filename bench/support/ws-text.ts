import type WebSocket from 'ws';

/** A WebSocket message as text, whichever of its forms `ws` hands over. */
export function wsText(data: WebSocket.RawData): string {
  if (Buffer.isBuffer(data)) return data.toString('utf8');
  if (Array.isArray(data)) return Buffer.concat(data).toString('utf8');
  return Buffer.from(data).toString('utf8');
}
