/**
 * An HTTP proxy for firmware downloads: put in front of a bridge (bridge config `firmware.baseUrl` = its URL), it
 * forwards requests and answers as they are, except that a test can plan, request by request, to stall an answer
 * after some bytes (the connection stays open, nothing more arrives) or to cut it (the socket is destroyed). Every
 * request is recorded with its Range header and the body bytes passed on, so a test can check that a resumed
 * download asked only for the bytes it did not have.
 */
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/** What the proxy does with one answer. */
export type ProxyPlan =
  | { kind: 'pass' }
  /** Pass on `after` body bytes, then send nothing more and keep the connection open until `close()`. */
  | { kind: 'stall'; after: number }
  /** Pass on `after` body bytes, then destroy the connection. */
  | { kind: 'cut'; after: number };

export interface ProxiedRequest {
  method: string;
  path: string;
  /** The request's Range header, if it had one. */
  range: string | undefined;
  /** The status the upstream answered (0 while it has not). */
  status: number;
  /** Body bytes passed on to the client so far. */
  bytes: number;
  plan: ProxyPlan;
}

export interface FwProxy {
  /** The base URL to give the bridge as `firmware.baseUrl`. */
  readonly url: string;
  /** Where requests go; may be set after the proxy started (the bridge needs the proxy's URL first). */
  target: string | undefined;
  /** Every request, oldest first. */
  readonly requests: ProxiedRequest[];
  /** Plans for the next requests, in order; a request with no plan left is passed on whole. */
  plan(...plans: ProxyPlan[]): void;
  /** Ends stalled answers and stops listening. */
  close(): Promise<void>;
}

export async function startFwProxy(target?: string): Promise<FwProxy> {
  const requests: ProxiedRequest[] = [];
  const plans: ProxyPlan[] = [];
  const sockets = new Set<Socket>();

  const server = http.createServer((req, res) => {
    const plan = plans.shift() ?? { kind: 'pass' };
    const rec: ProxiedRequest = {
      method: req.method ?? 'GET',
      path: req.url ?? '/',
      range: req.headers.range,
      status: 0,
      bytes: 0,
      plan,
    };
    requests.push(rec);
    if (proxy.target === undefined) {
      res.writeHead(502).end('the proxy has no target');
      return;
    }
    const headers = { ...req.headers };
    delete headers.host;
    const up = http.request(new URL(rec.path, proxy.target), { method: rec.method, headers }, (upRes) => {
      rec.status = upRes.statusCode ?? 0;
      res.writeHead(rec.status, upRes.headers);
      let held = false;
      upRes.on('data', (chunk: Buffer) => {
        if (held) return;
        const limit = plan.kind === 'pass' ? Infinity : plan.after;
        const part = chunk.subarray(0, Math.max(0, limit - rec.bytes));
        if (part.length > 0) {
          rec.bytes += part.length;
          res.write(part);
        }
        if (rec.bytes < limit) return;
        held = true;
        // The rest of the upstream answer is read and dropped, so the upstream is not left waiting on us.
        if (plan.kind === 'cut') res.socket?.destroy();
      });
      upRes.on('end', () => {
        if (!held) res.end();
      });
    });
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  const proxy: FwProxy = {
    url: `http://127.0.0.1:${port}`,
    target,
    requests,
    plan: (...more) => void plans.push(...more),
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return proxy;
}
