/**
 * Webhook delivery of fired events (docs/notifications.md, "Webhooks"): one signed HTTPS POST of the event's JSON
 * per attempt, to a URL the user gave. That URL is untrusted input that makes the bridge open connections, so an
 * attempt resolves the host itself, refuses private addresses (SSRF) unless the operator allows them, and connects to
 * exactly the address it checked: no second DNS answer can point it elsewhere. Retries and their bookkeeping are the
 * worker's (bridge/rules/webhook-worker.ts); this file is one attempt and the pieces receivers share with us.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { type LookupAddress, promises as dns } from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { BlockList, type LookupFunction, isIP } from 'node:net';
import { performance } from 'node:perf_hooks';
import tls from 'node:tls';
import { z } from 'zod';

export const WebhookConfigSchema = z
  .object({
    /**
     * One attempt's time limit, milliseconds: resolving the host, connecting, TLS, sending the event and reading the
     * receiver's answer.
     */
    timeoutMs: z.number().int().min(1000).max(60_000).default(10_000),
    /** How long after the event fired its delivery is tried again, milliseconds; then it is given up (`failed`). */
    retryForMs: z
      .number()
      .int()
      .min(60_000)
      .max(7 * 86_400_000)
      .default(86_400_000),
    /** Accept plain `http://` receiver URLs. For tests and labs: the event and its signature travel in clear. */
    allowHttp: z.boolean().default(false),
    /**
     * Deliver to loopback, private (RFC 1918, ULA), link-local, CGNAT, unspecified, multicast and other non-public
     * addresses. Off, such receivers are refused, so that users cannot make the bridge reach its own network.
     */
    allowPrivateAddresses: z.boolean().default(false),
    /** PEM file of a CA trusted for receivers' certificates, besides the ones Node.js trusts by default. */
    caFile: z.string().min(1).optional(),
    /** Webhook attempts in flight at once, per bridge. */
    concurrency: z.number().int().min(1).max(256).default(8),
    /** How often the bridge looks for deliveries that are due, milliseconds; a new event is sent without waiting. */
    pollMs: z.number().int().min(100).max(60_000).default(1000),
    /** Bytes of a receiver's answer read at most; the rest is not read (only the status counts). */
    maxResponseBytes: z
      .number()
      .int()
      .min(1024)
      .max(16 * 1024 * 1024)
      .default(64 * 1024),
  })
  .strict();

export type WebhookConfig = z.infer<typeof WebhookConfigSchema>;

/** `t=<unix ms>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>` (docs/notifications.md, "Verifying a delivery"). */
export const SIGNATURE_HEADER = 'devcloud-signature';
/** The event's id: the same on every attempt of one event, so receivers deduplicate by it. */
export const EVENT_HEADER = 'devcloud-event';
export const USER_AGENT = 'devcloud-bridge';
export const MAX_WEBHOOK_URL_LENGTH = 2048;

/** Backoff between attempts: the first retry after 1 s, doubling up to 10 min, each ±20 %. */
const BACKOFF_FIRST_MS = 1000;
const BACKOFF_CAP_MS = 600_000;
const BACKOFF_JITTER = 0.2;
/** Error texts are recorded in the event the user reads, and logged: a line, not a dump. */
const ERROR_TEXT_MAX = 200;

function hmacHex(secret: string, t: number, body: string): string {
  return createHmac('sha256', secret).update(`${t}.${body}`).digest('hex');
}

/** The value of {@link SIGNATURE_HEADER} for `body` sent at `t` (unix milliseconds). */
export function signWebhook(secret: string, t: number, body: string): string {
  return `t=${t},v1=${hmacHex(secret, t, body)}`;
}

/**
 * Whether `header` is a valid signature of `body` with `secret`, made within `toleranceMs` of `now` (both unix
 * milliseconds). Several `v1=` values are accepted (any one matching), so that a signer may send two while a secret
 * is being replaced. The comparison takes the same time whatever the bytes.
 */
export function verifyWebhook(secret: string, header: string, body: string, now: number, toleranceMs: number): boolean {
  let t: number | undefined;
  const signatures: string[] = [];
  for (const part of header.split(',')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    const key = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (key === 't') {
      if (t !== undefined || !/^\d{1,16}$/.test(value)) return false;
      t = Number(value);
    } else if (key === 'v1') {
      signatures.push(value);
    }
  }
  if (t === undefined || signatures.length === 0) return false;
  if (!(Math.abs(now - t) <= toleranceMs)) return false;
  const expected = Buffer.from(hmacHex(secret, t, body), 'utf8');
  let ok = false;
  for (const s of signatures) {
    const got = Buffer.from(s, 'utf8');
    // Lengths are not secret (always 64 hex digits); the bytes are compared in constant time.
    if (got.length === expected.length && timingSafeEqual(got, expected)) ok = true;
  }
  return ok;
}

/**
 * Syntax only (no DNS): absolute https URL (http when allowHttp), no user:password, no fragment, ≤ 2048 chars, a
 * host. The reasons are for the user who typed the URL.
 */
export function checkWebhookUrl(
  text: string,
  cfg: Pick<WebhookConfig, 'allowHttp'>,
): { ok: true; url: URL } | { ok: false; reason: string } {
  const fail = (reason: string) => ({ ok: false as const, reason });
  if (text.length > MAX_WEBHOOK_URL_LENGTH) return fail(`longer than ${MAX_WEBHOOK_URL_LENGTH} characters`);
  // The URL parser would quietly drop or encode these; a URL that is not what it shows is refused instead.
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u0020\u007f]/.test(text)) return fail('contains spaces or control characters');
  // `scheme://` then a host: the parser would also take `https:host` or `https:///host` and guess the rest.
  if (!/^[a-z][a-z0-9+.-]*:\/\/[^/\\?#]/i.test(text)) return fail('not an absolute URL (https://host/path)');
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return fail('not a URL');
  }
  if (url.protocol === 'http:') {
    if (!cfg.allowHttp) return fail('plain http:// is not accepted: use https://');
  } else if (url.protocol !== 'https:') {
    return fail(`the scheme ${url.protocol}// is not accepted: use https://`);
  }
  if (url.username !== '' || url.password !== '') return fail('a user name or password in the URL is not accepted');
  if (text.includes('#')) return fail('a fragment (#…) is not accepted');
  if (url.hostname === '') return fail('no host');
  return { ok: true, url };
}

export interface AttemptResult {
  ok: boolean;
  status?: number;
  error?: string;
  /** never worth retrying (URL refused: scheme, private address) */
  permanent?: boolean;
}

/**
 * Addresses no webhook goes to unless `allowPrivateAddresses`: every range of the IANA special-purpose registries
 * that is not globally reachable, plus multicast and the reserved 240/4. RFC 6890, RFC 6598 (CGNAT), RFC 4193 (ULA).
 */
const PRIVATE = new BlockList();
for (const [net, prefix] of [
  ['0.0.0.0', 8], // "this network", 0.0.0.0 included: Linux connects it to the host itself
  ['10.0.0.0', 8],
  ['100.64.0.0', 10], // CGNAT
  ['127.0.0.0', 8],
  ['169.254.0.0', 16], // link-local, where clouds answer metadata requests (169.254.169.254)
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.88.99.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4], // multicast
  ['240.0.0.0', 4], // reserved, 255.255.255.255 included
] as const) {
  PRIVATE.addSubnet(net, prefix, 'ipv4');
}
for (const [net, prefix] of [
  ['::', 96], // unspecified, loopback and the deprecated IPv4-compatible addresses
  ['64:ff9b:1::', 48], // local-use NAT64
  ['100::', 64], // discard
  ['2001:db8::', 32], // documentation
  ['fc00::', 7], // unique local (ULA)
  ['fe80::', 10], // link-local
  ['fec0::', 10], // the former site-local
  ['ff00::', 8], // multicast
] as const) {
  PRIVATE.addSubnet(net, prefix, 'ipv6');
}

/** The eight 16-bit groups of a valid IPv6 address (a zone `%eth0` dropped, a dotted IPv4 tail converted). */
function ipv6Groups(address: string): number[] {
  let text = address.replace(/%.*$/, '');
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const parse = (s: string) => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const left = parse(head);
  if (tail === undefined) return left;
  const right = parse(tail);
  return [...left, ...new Array<number>(8 - left.length - right.length).fill(0), ...right];
}

const v4 = (hi: number, lo: number) => `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`;

/** Whether a webhook may not go to `address` (an IPv4 or IPv6 address) unless private addresses are allowed. */
export function isPrivateAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return PRIVATE.check(address, 'ipv4');
  if (family !== 6) return true;
  const g = ipv6Groups(address);
  if (g.length !== 8) return true;
  // An IPv4 address inside an IPv6 one reaches that IPv4 address: judge it as such. IPv4-mapped (::ffff:0:0/96),
  // well-known NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
  const zeros = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  if (zeros(0, 5) && g[5] === 0xffff) return PRIVATE.check(v4(g[6]!, g[7]!), 'ipv4');
  if (g[0] === 0x64 && g[1] === 0xff9b && zeros(2, 6)) return PRIVATE.check(v4(g[6]!, g[7]!), 'ipv4');
  if (g[0] === 0x2002) return PRIVATE.check(v4(g[1]!, g[2]!), 'ipv4');
  return PRIVATE.check(address.replace(/%.*$/, ''), 'ipv6');
}

type Resolved = { ok: true; addresses: LookupAddress[] } | { ok: false; error: string; permanent: boolean };

/** The addresses to connect to: the literal one, or what DNS answers; each checked unless private ones are allowed. */
async function resolveHost(host: string, allowPrivate: boolean): Promise<Resolved> {
  const family = isIP(host);
  const addresses = family !== 0 ? [{ address: host, family }] : await dns.lookup(host, { all: true });
  if (addresses.length === 0) return { ok: false, error: `no address for ${host}`, permanent: false };
  // One private address among public ones is refused too: which one a connection would take is not ours to know.
  // The address is not named: the reason is shown to the user, who should not learn the bridge's network from it.
  if (!allowPrivate && addresses.some((a) => isPrivateAddress(a.address))) {
    const what = family !== 0 ? 'the address' : 'the host resolves to an address that';
    return { ok: false, error: `${what} is private or reserved: refused`, permanent: true };
  }
  return { ok: true, addresses };
}

/** A `lookup` for the request that answers the addresses already checked, never asking DNS again. */
function pinnedLookup(addresses: LookupAddress[]): LookupFunction {
  return (_hostname, options, callback) => {
    const fit =
      options.family === 4 || options.family === 6 ? addresses.filter((a) => a.family === options.family) : addresses;
    if (fit.length === 0) {
      const err: NodeJS.ErrnoException = new Error(`no IPv${options.family} address`);
      err.code = 'ENOTFOUND';
      callback(err, '', 0);
    } else if (options.all) {
      callback(null, fit);
    } else {
      callback(null, fit[0]!.address, fit[0]!.family);
    }
  };
}

/** TLS contexts with the extra CA, made once per CA: a context with every root costs milliseconds to build. */
const contexts = new WeakMap<Buffer, tls.SecureContext>();

function contextWith(ca: Buffer): tls.SecureContext {
  let context = contexts.get(ca);
  if (!context) {
    // A `ca` replaces Node's roots: they are given too, so the extra CA is trusted besides them.
    context = tls.createSecureContext({ ca: [...tls.rootCertificates, ca.toString('utf8')] });
    contexts.set(ca, context);
  }
  return context;
}

function describe(err: unknown): string {
  let text: string;
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code;
    text = code && !err.message.includes(code) ? `${code}: ${err.message}` : err.message;
  } else {
    text = String(err);
  }
  return text.length > ERROR_TEXT_MAX ? `${text.slice(0, ERROR_TEXT_MAX)}…` : text;
}

function byStatus(status: number): AttemptResult {
  if (status >= 200 && status < 300) return { ok: true, status };
  if (status >= 300 && status < 400) return { ok: false, status, error: 'redirect not followed' };
  return { ok: false, status };
}

/**
 * One POST of `body` (JSON) with Content-Type application/json, the two headers and User-Agent devcloud-bridge.
 * Resolves the host itself and refuses private addresses unless allowed, connecting to the address it checked (no
 * DNS-rebinding window); follows no redirect (3xx is a failure); reads at most maxResponseBytes of the answer; 2xx is
 * ok; never throws.
 */
export async function sendWebhook(
  req: { url: string; body: string; secret: string; eventId: string; now: number },
  cfg: WebhookConfig,
  ca?: Buffer,
): Promise<AttemptResult> {
  const timeoutError = `no answer within ${cfg.timeoutMs} ms`;
  try {
    const checked = checkWebhookUrl(req.url, cfg);
    if (!checked.ok) return { ok: false, error: checked.reason, permanent: true };
    const url = checked.url;
    const started = performance.now();
    const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
    let timer: NodeJS.Timeout | undefined;
    const resolved = await Promise.race([
      resolveHost(host, cfg.allowPrivateAddresses),
      new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), cfg.timeoutMs))),
    ]).finally(() => clearTimeout(timer));
    if (resolved === 'timeout') return { ok: false, error: timeoutError };
    if (!resolved.ok) return { ok: false, error: resolved.error, permanent: resolved.permanent };
    const left = Math.max(1, cfg.timeoutMs - (performance.now() - started));
    return await post(url, host, resolved.addresses, req, cfg, left, timeoutError, ca);
  } catch (err) {
    return { ok: false, error: describe(err) };
  }
}

function post(
  url: URL,
  host: string,
  addresses: LookupAddress[],
  req: { body: string; secret: string; eventId: string; now: number },
  cfg: WebhookConfig,
  timeoutMs: number,
  timeoutError: string,
  ca: Buffer | undefined,
): Promise<AttemptResult> {
  return new Promise<AttemptResult>((resolve) => {
    const options: https.RequestOptions = {
      method: 'POST',
      hostname: host,
      port: url.port === '' ? undefined : Number(url.port),
      path: `${url.pathname}${url.search}`,
      headers: {
        host: url.host,
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(req.body),
        'user-agent': USER_AGENT,
        [EVENT_HEADER]: req.eventId,
        [SIGNATURE_HEADER]: signWebhook(req.secret, req.now, req.body),
      },
      // A fresh connection per attempt: a pooled one could be to an address checked for another URL.
      agent: false,
      lookup: pinnedLookup(addresses),
      ...(ca && url.protocol === 'https:' ? { secureContext: contextWith(ca) } : {}),
    };
    let settled = false;
    const finish = (result: AttemptResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      request.destroy();
      resolve(result);
    };
    const timer = setTimeout(() => finish({ ok: false, error: timeoutError }), timeoutMs);
    const send = url.protocol === 'https:' ? https.request : http.request;
    const request = send(options, (res) => {
      const done = () => finish(byStatus(res.statusCode ?? 0));
      let read = 0;
      res.on('data', (chunk: Buffer) => {
        read += chunk.length;
        // Enough read: the status is what counts, and a receiver that never stops talking must not hold us.
        if (read >= cfg.maxResponseBytes) done();
      });
      res.on('end', done);
      res.on('error', done);
      res.on('aborted', done);
    });
    request.on('error', (err) => finish({ ok: false, error: describe(err) }));
    request.end(req.body);
  });
}

/** Delay before attempt n+1 after n failed attempts (n ≥ 1): 1 s doubling, capped at 10 min, ±20 % jitter from `random`. */
export function backoffMs(n: number, random: () => number = Math.random): number {
  const failed = Math.max(1, Math.floor(n));
  const base = Math.min(BACKOFF_FIRST_MS * 2 ** Math.min(failed - 1, 30), BACKOFF_CAP_MS);
  return Math.round(base * (1 + BACKOFF_JITTER * (2 * random() - 1)));
}
