/**
 * Clients of the live channel for tests (docs/api.md, "Live channel"): a WebSocket client (`ws`) that keeps every
 * message it got, parsed, and a Server-Sent Events reader over node's `http` that keeps every event.
 */
import http from 'node:http';
import { WebSocket } from 'ws';
import { until } from './wait.js';

export type LiveMessage = {
  devices?: Record<string, DeviceObject>;
  delta?: Record<string, Partial<Record<'d' | 's' | 'meta', Record<string, LiveRecord>>>>;
  events?: Record<string, { type: string; device?: DeviceObject }>;
};
export type LiveRecord = { value?: string; time: number; acked?: number; deleted?: boolean };
export type DeviceObject = Record<'d' | 's' | 'meta', Record<string, LiveRecord>>;

/** `http://…` → `ws://…`. */
export function wsBase(url: string): string {
  return url.replace(/^http/, 'ws');
}

export interface OpenOptions {
  /** The Cookie header (`sid=…`); none when undefined. */
  cookie?: string;
  path?: string;
  protocol?: string | null;
  headers?: Record<string, string>;
  /** Answer pings (the default); false: a peer that never does. */
  autoPong?: boolean;
  /** Send `{"delta":true,"throttletime":N}` once open, as the official client does. */
  throttletime?: number;
}

export class LiveSocket {
  readonly messages: LiveMessage[] = [];
  readonly closed: Promise<{ code: number; reason: string }>;
  private constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer) => this.messages.push(JSON.parse(data.toString('utf8')) as LiveMessage));
    this.closed = new Promise((resolve) =>
      ws.once('close', (code, reason) => resolve({ code, reason: reason.toString() })),
    );
  }

  /** Opens a channel; rejects with the HTTP status (`Error.message` = `status <n> <body>`) when it is refused. */
  static open(base: string, opts: OpenOptions = {}): Promise<LiveSocket> {
    const protocol = opts.protocol === undefined ? 'thsq-user' : opts.protocol;
    const ws = new WebSocket(`${wsBase(base)}${opts.path ?? '/0/session/'}`, protocol === null ? [] : [protocol], {
      headers: { ...(opts.cookie ? { cookie: opts.cookie } : {}), ...opts.headers },
      autoPong: opts.autoPong ?? true,
    });
    const socket = new LiveSocket(ws);
    return new Promise((resolve, reject) => {
      ws.once('open', () => {
        if (opts.throttletime !== undefined) ws.send(JSON.stringify({ delta: true, throttletime: opts.throttletime }));
        resolve(socket);
      });
      ws.once('unexpected-response', (_req, res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => reject(new Error(`status ${res.statusCode} ${body}`)));
      });
      ws.once('error', reject);
    });
  }

  /** Waits for a message `pick` accepts (from `from` on), and returns what it returned. */
  next<T>(pick: (m: LiveMessage) => T | undefined, what: string, from = 0, ms = 20_000): Promise<T> {
    return until(
      () => {
        for (const m of this.messages.slice(from)) {
          const v = pick(m);
          if (v !== undefined) return v;
        }
        return undefined;
      },
      what,
      ms,
    );
  }

  /** Every record of one variable the deltas carried, in order. */
  records(deviceId: string, type: 'd' | 's' | 'meta', name: string): LiveRecord[] {
    const out: LiveRecord[] = [];
    for (const m of this.messages) {
      const r = m.delta?.[deviceId]?.[type]?.[name];
      if (r) out.push(r);
    }
    return out;
  }

  close(): Promise<{ code: number; reason: string }> {
    this.ws.close();
    return this.closed;
  }
}

export interface SseEvent {
  id?: string;
  event?: string;
  data: string;
}

/** A `GET /0/events` stream, read as it comes. */
export class SseStream {
  readonly events: SseEvent[] = [];
  /** Comment lines (`: ping`). */
  comments = 0;
  status = 0;
  contentType = '';
  body = '';
  readonly ended: Promise<void>;
  private buffer = '';
  private endedResolve!: () => void;
  private constructor(private readonly req: http.ClientRequest) {
    this.ended = new Promise((resolve) => (this.endedResolve = resolve));
  }

  /** Opens the stream; resolves once the answer's head is in. */
  static open(base: string, headers: Record<string, string> = {}, path = '/0/events'): Promise<SseStream> {
    return new Promise((resolve, reject) => {
      const req = http.get(new URL(path, base), { headers });
      const stream = new SseStream(req);
      req.on('response', (res) => {
        stream.status = res.statusCode ?? 0;
        stream.contentType = String(res.headers['content-type'] ?? '');
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => stream.feed(chunk));
        res.on('end', () => stream.endedResolve());
        res.on('close', () => stream.endedResolve());
        resolve(stream);
      });
      req.on('error', (err) => {
        stream.endedResolve();
        reject(err);
      });
    });
  }

  private feed(chunk: string): void {
    this.body += chunk;
    this.buffer += chunk;
    let end: number;
    while ((end = this.buffer.indexOf('\n\n')) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const ev: SseEvent = { data: '' };
      let any = false;
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) {
          this.comments++;
          continue;
        }
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'id') ev.id = value;
        else if (field === 'event') ev.event = value;
        else if (field === 'data') ev.data += value;
        else continue;
        if (field !== 'id' || value !== '') any = true;
      }
      if (any && ev.data !== '') this.events.push(ev);
    }
  }

  /** The parsed data of the events named `event`. */
  data(event: string): LiveMessage[] {
    return this.events.filter((e) => e.event === event).map((e) => JSON.parse(e.data) as LiveMessage);
  }

  next<T>(pick: (e: SseEvent) => T | undefined, what: string, from = 0, ms = 20_000): Promise<T> {
    return until(
      () => {
        for (const e of this.events.slice(from)) {
          const v = pick(e);
          if (v !== undefined) return v;
        }
        return undefined;
      },
      what,
      ms,
    );
  }

  close(): void {
    this.req.destroy();
  }
}
