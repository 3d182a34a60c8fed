/**
 * `GET /0/events`: the live channel as Server-Sent Events (docs/api.md, "GET /0/events"), for clients other than the
 * official one (`curl -N -b jar …/0/events`). The same frames as the WebSocket's, one event each: `event:` names the
 * frame (`devices`, `delta`, `events`), `data:` holds its JSON on one line, `id:` its number on this bridge. A
 * `Last-Event-ID` this bridge still has the frames after resumes there; any other starts with a `devices` snapshot.
 * A `: ping` comment every `live.pingMs` keeps proxies from closing an idle stream. When the bridge ends the stream it
 * says why first: `event: close` with `{"code":…,"reason":…}` (the WebSocket's close codes).
 */
import type { ServerResponse } from 'node:http';
import type { FastifyRequest } from 'fastify';
import type { BridgeConfig } from '../config.js';
import type { Logger } from '../../lib/log.js';
import { isApiError } from '../errors.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import type { Route } from '../http/route.js';
import { type LiveAuthenticator, authenticate, bearerToken, clientAddress } from './auth.js';
import type { FrameKind, LiveHub, Sink } from './hub.js';

export const EVENTS_PATH = '/0/events';

class SseSink implements Sink {
  constructor(private readonly res: ServerResponse) {}
  buffered(): number {
    return this.res.writableLength;
  }
  send(kind: FrameKind, json: string, id?: string): void {
    if (this.res.writableEnded || this.res.destroyed) return;
    this.res.write(`${id === undefined ? '' : `id: ${id}\n`}event: ${kind}\ndata: ${json}\n\n`);
  }
  ping(): boolean {
    if (!this.res.writableEnded && !this.res.destroyed) this.res.write(': ping\n\n');
    return true;
  }
  close(code: number, text: string): void {
    if (this.res.writableEnded || this.res.destroyed) return;
    // A stream that stopped reading would hold its socket open until the end were read: it is cut.
    if (code === 4008 || code === 1006) {
      this.res.destroy();
      return;
    }
    this.res.end(`event: close\ndata: ${JSON.stringify({ code, reason: text })}\n\n`);
  }
  onDrain(fn: () => void): void {
    this.res.once('drain', fn);
  }
}

export interface SseDeps {
  hub: LiveHub;
  config: BridgeConfig;
  authenticators: readonly LiveAuthenticator[];
  log: Logger;
}

function lastEventId(req: FastifyRequest): string | undefined {
  const h = req.headers['last-event-id'];
  return typeof h === 'string' && h.length <= 64 ? h : undefined;
}

export function sseRoutes(deps: SseDeps): Route[] {
  const { hub, config } = deps;
  return [
    {
      method: 'GET',
      path: EVENTS_PATH,
      operationId: 'getEvents',
      tag: 'Devices',
      summary: 'The live channel as Server-Sent Events',
      description:
        'A `text/event-stream` of the changes of the devices the user sees (docs/api.md, Live channel): first ' +
        '`event: devices` with every device object, then `event: delta` with the records that changed and ' +
        '`event: events` with claims and removals, each `data:` one JSON line with an `id:`. `Last-Event-ID` ' +
        `resumes after that frame while this bridge still has it (the last ${config.live.sseReplayFrames} frames ` +
        "of the user); otherwise the stream starts with a snapshot. The user is the session cookie's, or an " +
        "access token's sent as `Authorization: Bearer <token>` (decision 30): the stream ends (`event: close`, " +
        '4001) when the token is revoked. `: ping` every ' +
        `${config.live.pingMs} ms. At most ${config.live.maxPerUser} live channels per user and ` +
        `${config.live.maxPerAddress} per client address.`,
      session: 'required',
      bearer: true,
      responses: {
        200: { description: 'The stream; it stays open.', eventStream: true },
        401: NO_SESSION,
        429: {
          description:
            'The user, or the client address, already holds as many live channels as the bridge allows; or the ' +
            'address presented too many bearer access tokens (`rateLimits.accessToken`).',
          tokens: [token('too-many-requests')],
        },
      },
      handler: async (req, reply) => {
        let who;
        try {
          who = await authenticate(deps.authenticators, req.raw, req.frontend);
        } catch (err) {
          // Too many bearer-token attempts from this address: 429, as the channel limits answer.
          if (!isApiError(err) || err.code !== 'too-many-requests') throw err;
          deps.log.info({ event: 'live.refused', kind: 'sse', status: 429, reason: 'token_rate' });
          return reply.code(429).type('text/plain; charset=utf-8').send(token('too-many-requests'));
        }
        if (!who) {
          if (bearerToken(req.raw) !== undefined) {
            deps.log.info({ event: 'live.refused', kind: 'sse', status: 401, reason: 'token' });
          }
          return reply.code(401).type('text/plain; charset=utf-8').send(token('no-session'));
        }
        // `HEAD` (which every `GET` route answers): the head of the stream, and no stream.
        if (req.method === 'HEAD') return reply.code(200).type('text/event-stream; charset=utf-8').send('');
        const address = clientAddress(req.raw, config);
        const limit = hub.reserve(who.user.id, address);
        if (limit) {
          deps.log.info({
            event: 'live.refused',
            kind: 'sse',
            status: 429,
            reason: limit === 'user' ? 'per_user' : 'per_address',
          });
          return reply.code(429).type('text/plain; charset=utf-8').send(token('too-many-requests'));
        }
        reply.hijack();
        const res = reply.raw;
        res.writeHead(200, {
          'content-type': 'text/event-stream; charset=utf-8',
          'cache-control': 'no-store',
          'x-content-type-options': 'nosniff',
          // nginx passes the stream through unbuffered.
          'x-accel-buffering': 'no',
        });
        // How long an EventSource waits before it reconnects, ms.
        res.write('retry: 2000\n\n');
        const ch = hub.open('sse', who, address, new SseSink(res), lastEventId(req));
        res.once('close', () => hub.closed(ch));
        return reply;
      },
    },
  ];
}
