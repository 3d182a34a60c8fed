/**
 * Cross-site request forgery: a state-changing request (POST, PUT, PATCH, DELETE) that a browser says comes from
 * a page of another site is refused with 403 `origin-fail` before anything is read or done. The session cookie's
 * `SameSite=Lax` already keeps it off most cross-site requests; this check does not depend on the browser
 * applying it (docs/api.md, "Cross-site requests").
 *
 * The page's origin is the `Origin` header, else the origin of the `Referer` header. It passes when its host and
 * port are those the request was addressed to (the Host header, or `X-Forwarded-Host` from a proxy the bridge
 * trusts through `http.trustProxy`), or when it is the origin of `http.publicUrl` or one of
 * `http.allowedOrigins`. A request with neither header is not from a web page (curl, a native app, the official
 * client under Node) and passes. `Origin: null` (a sandboxed frame, a file, a redirect across sites) names no
 * origin that could be checked and is refused.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Logger } from '../../lib/log.js';
import type { BridgeConfig } from '../config.js';
import { ApiError } from '../errors.js';

const STATE_CHANGING: ReadonlySet<string> = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/** Why a request passed or was refused. */
export type OriginVerdict =
  /** Neither `Origin` nor `Referer`: not a browser's request from a page. */
  | 'none'
  /** The page is on the host the request was addressed to. */
  | 'same'
  /** The page's origin is `http.publicUrl`'s or in `http.allowedOrigins`. */
  | 'allowed'
  /** Another site. */
  | 'cross'
  /** `Origin: null`. */
  | 'null'
  /** A header that is not a URL. */
  | 'malformed';

/** The origins a state-changing request may come from besides the bridge's own host, normalised. */
export function allowedOrigins(config: BridgeConfig): ReadonlySet<string> {
  const out = new Set<string>();
  for (const o of config.http.allowedOrigins) out.add(new URL(o).origin);
  if (config.http.publicUrl !== undefined) out.add(new URL(config.http.publicUrl).origin);
  return out;
}

/** The verdict on one request, and the page origin it judged (for the log; never a full Referer). */
export function judgeOrigin(
  req: FastifyRequest,
  allowed: ReadonlySet<string>,
): { verdict: OriginVerdict; origin?: string } {
  const origin = single(req.headers.origin);
  const referer = origin === undefined ? single(req.headers.referer) : undefined;
  const claimed = origin ?? referer;
  if (claimed === undefined) return { verdict: 'none' };
  if (origin !== undefined && origin.trim() === 'null') return { verdict: 'null', origin: 'null' };
  let page: URL;
  try {
    page = new URL(claimed);
  } catch {
    return { verdict: 'malformed' };
  }
  if (page.protocol !== 'http:' && page.protocol !== 'https:') return { verdict: 'cross', origin: page.protocol };
  if (allowed.has(page.origin)) return { verdict: 'allowed', origin: page.origin };
  return { verdict: sameHost(page, req.host) ? 'same' : 'cross', origin: page.origin };
}

/** Whether the page's host and port are the request's, the port read with the page's scheme's default. */
function sameHost(page: URL, requestHost: string | undefined): boolean {
  if (!requestHost) return false;
  try {
    return new URL(`${page.protocol}//${requestHost}`).host === page.host;
  } catch {
    return false;
  }
}

/** One header value; a header sent twice is malformed and reads as the unparseable empty string. */
function single(v: string | string[] | undefined): string | undefined {
  if (Array.isArray(v)) return '';
  return v;
}

/** Refuses cross-site state-changing requests, before their body is read. */
export function registerOriginCheck(app: FastifyInstance, config: BridgeConfig, log: Logger): void {
  const allowed = allowedOrigins(config);
  app.addHook('onRequest', (req, _reply, done) => {
    if (!STATE_CHANGING.has(req.method)) {
      done();
      return;
    }
    const { verdict, origin } = judgeOrigin(req, allowed);
    switch (verdict) {
      case 'none':
      case 'same':
      case 'allowed':
        done();
        return;
      case 'cross':
      case 'null':
      case 'malformed':
        log.info({
          event: 'http.origin_refused',
          method: req.method,
          route: req.routeOptions.url ?? 'unmatched',
          reason: verdict,
          ...(origin === undefined ? {} : { origin: origin.slice(0, 200) }),
        });
        done(new ApiError('origin-fail'));
        return;
    }
  });
}
