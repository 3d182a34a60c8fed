/**
 * Decision 15: the frontend of a request comes from the `Host` header (`<uuid>.<server>`), else from an `app`
 * query or form parameter, else the default frontend (which production can switch off).
 */
import type { FastifyRequest } from 'fastify';
import type { BridgeStore, Frontend } from '../store/types.js';

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export type FrontendSource = 'host' | 'app' | 'default';

export function isFrontendId(value: string): boolean {
  return UUID_RE.test(value);
}

function appParam(req: FastifyRequest): string | undefined {
  const q = (req.query as Record<string, unknown> | undefined)?.app;
  if (typeof q === 'string') return q;
  const body = req.body as Record<string, unknown> | undefined;
  const b = typeof body === 'object' && body !== null ? body.app : undefined;
  return typeof b === 'string' ? b : undefined;
}

/** The frontend, or `undefined` when the request names an unknown one or none while there is no default. */
export function resolveFrontend(
  req: FastifyRequest,
  store: BridgeStore,
  allowDefault: boolean,
): { frontend: Frontend; source: FrontendSource } | undefined {
  const host = (req.headers.host ?? '').toLowerCase();
  const label = host.split('.')[0] ?? '';
  if (host.includes('.') && isFrontendId(label)) {
    const f = store.frontend(label);
    return f ? { frontend: f, source: 'host' } : undefined;
  }
  const app = appParam(req);
  if (app !== undefined) {
    const f = isFrontendId(app.toLowerCase()) ? store.frontend(app.toLowerCase()) : undefined;
    return f ? { frontend: f, source: 'app' } : undefined;
  }
  if (!allowDefault) return undefined;
  const f = store.defaultFrontend();
  return f ? { frontend: f, source: 'default' } : undefined;
}
