/**
 * Decision 15: the frontend of a request comes from the `Host` header (`<uuid>.<server>`), else from an `app`
 * query or form parameter, else the default frontend (which production can switch off). On a route whose body is
 * all data (`POST /0/user/`, decision 25) the body's `app` is not read: the session the cookie names tells the
 * frontend before the default one does.
 */
import type { FastifyRequest } from 'fastify';
import type { BridgeStore, Frontend } from '../store/types.js';

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export type FrontendSource = 'host' | 'app' | 'session' | 'default';

export function isFrontendId(value: string): boolean {
  return UUID_RE.test(value);
}

/**
 * The `app` parameter: a string, absent, or `null` when it is there but not one string (repeated, or not text
 * in JSON). A parameter that cannot name one frontend must not fall through to the default one.
 */
function appParam(req: FastifyRequest, readBody: boolean): string | null | undefined {
  const query = req.query as Record<string, unknown> | undefined;
  const body = req.body as Record<string, unknown> | undefined;
  const fromBody = readBody && typeof body === 'object' && body !== null && !Array.isArray(body) ? body.app : undefined;
  const v = query?.app ?? fromBody;
  if (v === undefined) return undefined;
  return typeof v === 'string' ? v : null;
}

/**
 * The frontend, or `undefined` when the request names an unknown one or none while there is no default.
 * `sessionFrontend`, on a route whose body is all data: the frontend id of the session the cookie names, if any.
 */
export async function resolveFrontend(
  req: FastifyRequest,
  store: BridgeStore,
  allowDefault: boolean,
  sessionFrontend?: () => Promise<string | undefined>,
): Promise<{ frontend: Frontend; source: FrontendSource } | undefined> {
  const host = (req.headers.host ?? '').toLowerCase();
  const label = host.split('.')[0] ?? '';
  if (host.includes('.') && isFrontendId(label)) {
    const f = await store.frontend(label);
    return f ? { frontend: f, source: 'host' } : undefined;
  }
  const app = appParam(req, sessionFrontend === undefined);
  if (app === null) return undefined;
  if (app !== undefined) {
    const f = isFrontendId(app.toLowerCase()) ? await store.frontend(app.toLowerCase()) : undefined;
    return f ? { frontend: f, source: 'app' } : undefined;
  }
  const ofSession = sessionFrontend ? await sessionFrontend() : undefined;
  if (ofSession !== undefined) {
    const f = await store.frontend(ofSession);
    if (f) return { frontend: f, source: 'session' };
  }
  if (!allowDefault) return undefined;
  const f = await store.defaultFrontend();
  return f ? { frontend: f, source: 'default' } : undefined;
}
