/**
 * The WebSocket live channel (docs/api.md, "Live channel"), as the official client speaks it: `GET /0/session/` or
 * `/0/session/<app>`, upgraded with the subprotocol `thsq-user`. Everything that can be refused is refused with a
 * plain HTTP answer before the upgrade: another path 404, no `thsq-user` 400 `protocol-fail`, a page of another
 * site 403 `origin-fail`, an unknown frontend 404 `not found`, no logged-in user (no session cookie of one, no valid
 * bearer access token) 401 `no-session`, over a limit 429 `too-many-requests`.
 *
 * Each socket's listeners are shared functions that find their channel on the socket: an idle channel holds no
 * closure of its own.
 */
import { STATUS_CODES, type IncomingMessage, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { type RawData, WebSocket, WebSocketServer } from 'ws';
import type { Logger } from '../../lib/log.js';
import type { BridgeConfig } from '../config.js';
import { allowedOrigins, judgeOrigin } from '../sessions/origin.js';
import type { BridgeStore } from '../store/types.js';
import { isApiError } from '../errors.js';
import {
  type LiveAuthenticator,
  asRoutedRequest,
  authenticate,
  bearerToken,
  clientAddress,
  liveFrontend,
} from './auth.js';
import type { Channel, FrameKind, LiveHub, Sink } from './hub.js';

export const SUBPROTOCOL = 'thsq-user';
/** The answer to an upgrade without the `thsq-user` subprotocol. */
export const PROTOCOL_FAIL = 'protocol-fail';

const PATH_RE = /^\/0\/session(?:\/([^/]*))?\/?$/;

const CHANNEL = Symbol('live channel');
const ALIVE = Symbol('live alive');
type LiveSocket = WebSocket & { [CHANNEL]?: Channel; [ALIVE]?: boolean };

class WsSink implements Sink {
  constructor(private readonly ws: LiveSocket) {}
  buffered(): number {
    return this.ws.bufferedAmount;
  }
  send(_kind: FrameKind, json: string): void {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(json);
  }
  ping(): boolean {
    if (this.ws[ALIVE] === false) return false;
    this.ws[ALIVE] = false;
    if (this.ws.readyState === WebSocket.OPEN) this.ws.ping();
    return true;
  }
  close(code: number, text: string): void {
    if (code === 1006) this.ws.terminate();
    else this.ws.close(code, text);
  }
  onDrain(fn: () => void): void {
    const socket = (this.ws as unknown as { _socket?: Duplex })._socket;
    if (socket) socket.once('drain', fn);
  }
}

export interface WsDeps {
  hub: LiveHub;
  store: BridgeStore;
  config: BridgeConfig;
  log: Logger;
  authenticators: readonly LiveAuthenticator[];
}

/** A message's pieces: ws hands a text message over as one buffer, or a list of them, or an ArrayBuffer. */
function toList(data: RawData): Buffer[] {
  return Array.isArray(data) ? data : [Buffer.from(data as ArrayBuffer)];
}

/** Answers the upgrade with a plain HTTP error, and closes the socket. */
function refuse(socket: Duplex, status: number, body: string): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n` +
      'Content-Type: text/plain; charset=utf-8\r\n' +
      `Content-Length: ${Buffer.byteLength(body)}\r\n` +
      'Connection: close\r\n\r\n' +
      body,
  );
}

/** Serves the live channel's upgrades on `server` (the Fastify app's); returns the function that stops it. */
export function serveWebSockets(server: Server, deps: WsDeps): () => void {
  const { hub, config, log } = deps;
  const allowed = allowedOrigins(config);
  const wss = new WebSocketServer({
    noServer: true,
    perMessageDeflate: false,
    clientTracking: false,
    maxPayload: config.live.maxMessageBytes,
    handleProtocols: (protocols) => (protocols.has(SUBPROTOCOL) ? SUBPROTOCOL : false),
  });

  function onMessage(this: LiveSocket, data: RawData, isBinary: boolean): void {
    const ch = this[CHANNEL];
    if (!ch || isBinary) return;
    // The official client sends its options once, and the text `ping` from its apps' host; anything else is ignored.
    let msg: unknown;
    try {
      msg = JSON.parse(Buffer.isBuffer(data) ? data.toString('utf8') : Buffer.concat(toList(data)).toString('utf8'));
    } catch {
      return;
    }
    if (typeof msg === 'object' && msg !== null && 'throttletime' in msg) {
      const t = msg.throttletime;
      hub.setThrottle(ch, typeof t === 'number' ? t : Number(t ?? 0));
    }
  }
  function onPong(this: LiveSocket): void {
    this[ALIVE] = true;
  }
  function onClose(this: LiveSocket, code: number): void {
    const ch = this[CHANNEL];
    if (ch) hub.closed(ch, code);
  }
  function onError(): void {
    // The close that follows ends the channel.
  }

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on('error', onError);
    const url = new URL(req.url ?? '/', 'http://bridge');
    const m = PATH_RE.exec(url.pathname);
    const why = (status: number, reason: string, body: string) => {
      log.info({ event: 'live.refused', kind: 'ws', status, reason });
      refuse(socket, status, body);
    };
    if (!m || req.method !== 'GET') return why(404, 'path', 'not found');
    const protocols = String(req.headers['sec-websocket-protocol'] ?? '')
      .split(',')
      .map((s) => s.trim());
    if (!protocols.includes(SUBPROTOCOL)) return why(400, 'subprotocol', PROTOCOL_FAIL);
    const origin = judgeOrigin(asRoutedRequest(req), allowed).verdict;
    if (origin === 'cross' || origin === 'null' || origin === 'malformed') return why(403, 'origin', 'origin-fail');
    const app = m[1] ? decodeURIComponent(m[1]) : (url.searchParams.get('app') ?? undefined);
    let who;
    try {
      const frontend = await liveFrontend(req, app, deps.store, config);
      if (!frontend) return why(404, 'frontend', 'not found');
      who = await authenticate(deps.authenticators, req, frontend);
    } catch (err) {
      // Too many bearer-token attempts from this address.
      if (isApiError(err) && err.code === 'too-many-requests') return why(429, 'token_rate', 'too-many-requests');
      log.error({ event: 'live.failed', kind: 'ws', err: String(err) });
      return refuse(socket, 500, 'internal-error');
    }
    if (!who) return why(401, bearerToken(req) === undefined ? 'session' : 'token', 'no-session');
    const userId = who.user.id;
    const address = clientAddress(req, config);
    const limit = hub.reserve(userId, address);
    if (limit) return why(429, limit === 'user' ? 'per_user' : 'per_address', 'too-many-requests');
    // A handshake that fails (ws answers it itself) gives its place back.
    const failed = () => hub.release(userId, address);
    socket.once('close', failed);
    wss.handleUpgrade(req, socket, head, (ws: LiveSocket) => {
      socket.off('close', failed);
      ws.on('message', onMessage);
      ws.on('pong', onPong);
      ws.on('close', onClose);
      ws.on('error', onError);
      ws[ALIVE] = true;
      ws[CHANNEL] = hub.open('ws', who, address, new WsSink(ws));
    });
  }

  const listener = (req: IncomingMessage, socket: Duplex, head: Buffer) => void upgrade(req, socket, head);
  server.on('upgrade', listener);
  return () => {
    server.off('upgrade', listener);
    wss.close();
  };
}
