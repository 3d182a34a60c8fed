/**
 * Outcomes that more than one route answers, and the statuses every route answers besides its own: together with
 * a route's `responses` they are everything it may answer, which the API document lists and the answer checker
 * holds it to. Tokens come from the error catalog (`bridge/errors.ts`).
 */
import { ERRORS, type ErrorCode } from '../errors.js';
import type { Outcome, Route } from './route.js';

export const token = (code: ErrorCode): string => ERRORS[code].body;

/**
 * What the error handler answers when Fastify refuses a body (bad JSON, not UTF-8, over `http.bodyLimit`) on a
 * route that has no failure token of its own (`error-handler.ts`).
 */
export const BAD_REQUEST = 'bad-request';

export const TOO_MANY: Outcome = {
  description: 'Too many attempts from this address or for this login; retry after `Retry-After` seconds.',
  tokens: [token('too-many-requests')],
  retryAfter: true,
};

export const BUSY: Outcome = {
  description: 'The password hashing queue is full; retry after `Retry-After` seconds.',
  tokens: [token('busy')],
  retryAfter: true,
};

export const NO_SESSION: Outcome = { description: 'No logged-in session (decision 3).', tokens: [token('no-session')] };

/** Statuses every route can answer besides its own; a route devices call reads no frontend, so has no 404. */
const COMMON: Record<number, Outcome> = {
  404: {
    description:
      'Unknown frontend: the Host header or `app` names a frontend the bridge does not have, or neither names ' +
      'one and the default frontend is switched off (`frontends.allowDefault: false`).',
    tokens: [token('not-found')],
  },
  500: { description: 'An unexpected failure; it is logged as `http.failed`.', tokens: [token('internal')] },
};

/** The answer of every state-changing route to a request from a page of another site. */
export const CROSS_SITE: Outcome = {
  description:
    'A cross-site request: `Origin` (else `Referer`) names a page on another host than the request was addressed ' +
    'to, not in `http.allowedOrigins`; or `Origin: null`. Requests with neither header are not checked.',
  tokens: [token('origin-fail')],
};

/** What every route that changes something may answer besides its own. */
const STORAGE_FULL: Outcome = {
  description:
    "The disk of the bridge's data directory is full: nothing was changed. Reads still work; the same request " +
    'succeeds once space is freed, without a restart.',
  tokens: [token('storage-full')],
};

/**
 * Every status a route may answer, with its outcome: its own, and those every route answers. The 503 of a bridge
 * that is shutting down is not here: Fastify answers it before any route or hook runs (`bridge/openapi.ts` adds it
 * to the document).
 */
export function answersOf(route: Route): Record<number, Outcome> {
  const { 404: _unknownFrontend, ...noFrontend } = COMMON;
  const changes = route.method !== 'GET';
  const common: Record<number, Outcome> = route.device ? { ...noFrontend } : { ...COMMON };
  if (changes) common[507] = STORAGE_FULL;
  const own: Record<number, Outcome> = { ...route.responses };
  if (changes) {
    // Every state-changing route refuses a request from a page of another site (bridge/sessions/origin.ts).
    const own403 = own[403];
    own[403] = own403
      ? {
          ...own403,
          description: `${own403.description} Or: ${CROSS_SITE.description.charAt(0).toLowerCase()}${CROSS_SITE.description.slice(1)}`,
          tokens: [...(own403.tokens ?? []), ...CROSS_SITE.tokens!],
        }
      : CROSS_SITE;
  }
  return { ...common, ...own };
}
