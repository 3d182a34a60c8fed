/**
 * HTTP load for the REST benchmarks: closed-loop throughput through autocannon, an open-loop probe that sends
 * requests at a steady rate and times each from the moment it was due, and single requests from a chosen
 * loopback source address.
 */
import { Agent, type IncomingHttpHeaders, type OutgoingHttpHeaders, request } from 'node:http';
import autocannon from 'autocannon';

export interface ThroughputRun {
  /** Completed requests per second over the run. */
  perSec: number;
  completed: number;
  durationS: number;
  /** Responses per status code, and connection errors. */
  statuses: Record<string, number>;
  errors: number;
  timeouts: number;
}

export interface ThroughputOptions {
  url: string;
  method: 'GET' | 'POST';
  headers?: Record<string, string>;
  connections: number;
  pipelining: number;
  durationS: number;
}

/** As many requests as `connections` × `pipelining` keep in flight, for `durationS` seconds. */
export async function throughput(opts: ThroughputOptions): Promise<ThroughputRun> {
  const r = await autocannon({
    url: opts.url,
    method: opts.method,
    headers: opts.headers ?? {},
    connections: opts.connections,
    pipelining: opts.pipelining,
    duration: opts.durationS,
  });
  const statuses: Record<string, number> = {};
  for (const [code, v] of Object.entries(r.statusCodeStats ?? {})) statuses[code] = v.count ?? 0;
  return {
    perSec: r.requests.total / r.duration,
    completed: r.requests.total,
    durationS: r.duration,
    statuses,
    errors: r.errors,
    timeouts: r.timeouts,
  };
}

const PROBE_TIMEOUT_MS = 30_000;

export interface ProbeRun {
  /** Latency of each request that completed, from the moment it was due, in ms. */
  latencies: number[];
  sent: number;
  statuses: Record<string, number>;
  errors: number;
}

/**
 * `rate` requests per second for `durationMs`, each sent when it is due whether or not earlier ones have been
 * answered, and timed from that moment: a stall of the server shows in every request that fell due during it
 * (no coordinated omission). Resolves once every request has been answered or has failed.
 */
export function probe(opts: {
  url: string;
  headers?: OutgoingHttpHeaders;
  rate: number;
  durationMs: number;
}): Promise<ProbeRun> {
  const agent = new Agent({ keepAlive: true, maxSockets: 256 });
  const target = new URL(opts.url);
  const interval = 1000 / opts.rate;
  const total = Math.max(1, Math.round((opts.durationMs / 1000) * opts.rate));
  const out: ProbeRun = { latencies: [], sent: 0, statuses: {}, errors: 0 };
  return new Promise((resolve) => {
    let finished = 0;
    const done = () => {
      if (++finished < total) return;
      agent.destroy();
      resolve(out);
    };
    const fire = (due: number) => {
      out.sent++;
      let settled = false;
      const fail = () => {
        if (settled) return;
        settled = true;
        out.errors++;
        done();
      };
      const req = request(target, { method: 'GET', agent, headers: opts.headers ?? {} }, (res) => {
        res.resume();
        res.once('error', fail);
        res.once('end', () => {
          if (settled) return;
          settled = true;
          out.latencies.push(performance.now() - due);
          const code = String(res.statusCode);
          out.statuses[code] = (out.statuses[code] ?? 0) + 1;
          done();
        });
      });
      // A server that stops answering fails the request instead of holding the run forever.
      req.setTimeout(PROBE_TIMEOUT_MS, () => req.destroy(new Error('timed out')));
      req.once('error', fail);
      req.end();
    };
    const start = performance.now();
    let next = 0;
    const tick = () => {
      // Everything that fell due while this process was busy goes now, timed from when it was due.
      const now = performance.now();
      while (next < total && start + next * interval <= now) fire(start + next++ * interval);
      if (next < total) setTimeout(tick, Math.max(0, start + next * interval - performance.now()));
    };
    tick();
  });
}

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/**
 * One request on a connection of its own, optionally from a given local address (any of 127.0.0.0/8), failing
 * after `timeoutMs` without an answer when that is given.
 */
export function send(
  url: string,
  opts: {
    method?: string;
    headers?: OutgoingHttpHeaders;
    body?: string;
    localAddress?: string;
    timeoutMs?: number;
  } = {},
): { done: Promise<Reply>; abort(): void } {
  let req: ReturnType<typeof request> | undefined;
  const done = new Promise<Reply>((resolve, reject) => {
    const headers: OutgoingHttpHeaders = { ...opts.headers };
    if (opts.body !== undefined) {
      headers['content-type'] ??= 'application/x-www-form-urlencoded';
      headers['content-length'] = Buffer.byteLength(opts.body);
    }
    req = request(
      new URL(url),
      {
        method: opts.method ?? 'GET',
        headers,
        agent: false,
        ...(opts.localAddress ? { localAddress: opts.localAddress } : {}),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.once('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }),
        );
        res.once('error', reject);
      },
    );
    if (opts.timeoutMs !== undefined) {
      const ms = opts.timeoutMs;
      req.setTimeout(ms, () => req?.destroy(new Error(`no answer from ${url} within ${ms} ms`)));
    }
    req.once('error', reject);
    req.end(opts.body);
  });
  return { done, abort: () => req?.destroy() };
}

/** The `name=value` of the first Set-Cookie header, for sending back in a Cookie header. */
export function cookieOf(reply: Reply): string | undefined {
  const set = reply.headers['set-cookie']?.[0];
  return set?.split(';', 1)[0];
}
