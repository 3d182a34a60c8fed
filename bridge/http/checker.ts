/**
 * The answer checker: every answer a route gives is held to what its route declares (`answersOf`), which is what the
 * API document lists. The status must be documented; a plain-text answer must be one of the tokens listed under it
 * (or match its text schema); a JSON answer must validate against the JSON Schema the document publishes for it,
 * so unknown keys fail as they would for a client that reads the document; an HTML page, bytes, or no body must be
 * what the status lists; and `Set-Cookie`, `Retry-After` (whole seconds, at least 1) and `Content-Range` must be
 * sent exactly where they are documented.
 *
 * An answer that is not documented is replaced by 500 `undocumented-answer` and logged as `http.undocumented_answer`
 * (docs/operations.md), so that a test that drives a route fails where the route and its description part. It is an
 * option of the server for tests (`AppDeps.checkAnswers`), off in `devcloud-bridge run`.
 *
 * Requests no route matched are not checked: the not-found handler's 404 `not found` belongs to no route, and the
 * router's own refusals of a path it cannot read (`routingFailed`) run no hook at all.
 */
import type { FastifyInstance, FastifyReply } from 'fastify';
import { z } from 'zod';
import type { Logger } from '../../lib/log.js';
import { answersOf } from './outcomes.js';
import type { Outcome, Route } from './route.js';

export const UNDOCUMENTED = 'undocumented-answer';

/** The headers whose presence an outcome documents. */
const DOCUMENTED_HEADERS: Array<[string, keyof Outcome]> = [
  ['set-cookie', 'setsCookie'],
  ['retry-after', 'retryAfter'],
  ['content-range', 'contentRange'],
];

/** A JSON answer's schema as the document publishes it, read back: what a client holding the document checks. */
const published = new WeakMap<z.ZodType, z.ZodType>();
function asPublished(schema: z.ZodType): z.ZodType {
  let s = published.get(schema);
  if (!s) {
    const json = z.toJSONSchema(schema, { io: 'output' }) as Parameters<typeof z.fromJSONSchema>[0];
    s = z.fromJSONSchema(json);
    published.set(schema, s);
  }
  return s;
}

const isStream = (payload: unknown): payload is NodeJS.ReadableStream & { destroy?: () => void } =>
  typeof payload === 'object' && payload !== null && typeof (payload as { pipe?: unknown }).pipe === 'function';

function bodyText(payload: unknown): string | undefined {
  if (payload === undefined || payload === null) return '';
  if (typeof payload === 'string') return payload;
  if (Buffer.isBuffer(payload)) return payload.toString('utf8');
  return undefined;
}

/** What is wrong with an answer, or `undefined` when its route documents it. */
export function judgeAnswer(route: Route, reply: FastifyReply, payload: unknown): string | undefined {
  const status = reply.statusCode;
  const outcome = answersOf(route)[status];
  if (!outcome) return `status ${status} is not documented`;
  for (const [header, flag] of DOCUMENTED_HEADERS) {
    const sent = reply.hasHeader(header);
    if (sent && !outcome[flag]) return `${header} is not documented for ${status}`;
    if (!sent && outcome[flag]) return `${header} is documented for ${status} but not sent`;
  }
  const retryAfter = reply.getHeader('retry-after');
  if (retryAfter !== undefined && !/^[1-9]\d*$/.test(String(retryAfter))) return `Retry-After ${String(retryAfter)}`;
  const text = bodyText(payload);
  const hasContent = Boolean(
    outcome.tokens ||
    outcome.text ||
    outcome.json ||
    outcome.html ||
    outcome.binary ||
    outcome.eventStream ||
    outcome.asset,
  );
  if (!hasContent) return text === '' ? undefined : `${status} documents no body`;
  const type = String(reply.getHeader('content-type') ?? '')
    .split(';')[0]!
    .trim();
  switch (type) {
    case 'text/plain':
      if (text === undefined) return `a text/plain stream for ${status}`;
      if (outcome.tokens?.includes(text)) return undefined;
      if (outcome.text?.safeParse(text).success) return undefined;
      return `${JSON.stringify(text.slice(0, 80))} is not documented for ${status}`;
    case 'application/json': {
      if (!outcome.json) return `no JSON documented for ${status}`;
      if (text === undefined) return `a JSON stream for ${status}`;
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch {
        return `the JSON for ${status} does not parse`;
      }
      const r = asPublished(outcome.json.schema).safeParse(value);
      return r.success ? undefined : `the JSON for ${status} is not a ${outcome.json.name}: ${r.error.message}`;
    }
    case 'text/html':
      return outcome.html || outcome.asset ? undefined : `no HTML documented for ${status}`;
    case 'text/javascript':
    case 'text/css':
      return outcome.asset ? undefined : `no console file documented for ${status}`;
    case 'text/event-stream':
      return outcome.eventStream ? undefined : `no event stream documented for ${status}`;
    case 'application/octet-stream':
      return outcome.binary ? undefined : `no bytes documented for ${status}`;
    default:
      return `${type || 'no content type'} is not documented for ${status}`;
  }
}

export function registerAnswerChecker(app: FastifyInstance, log: Logger): void {
  app.addHook('onSend', (req, reply, payload, done) => {
    const route = req.routeOptions.config?.route;
    const fault = route ? judgeAnswer(route, reply, payload) : undefined;
    if (fault === undefined) {
      done(null, payload);
      return;
    }
    log.error({
      event: 'http.undocumented_answer',
      route: req.routeOptions.url,
      method: req.method,
      status: reply.statusCode,
      detail: fault,
    });
    if (isStream(payload)) payload.destroy?.();
    for (const [header] of DOCUMENTED_HEADERS) reply.removeHeader(header);
    reply.removeHeader('content-length');
    reply.code(500).type('text/plain; charset=utf-8');
    done(null, UNDOCUMENTED);
  });
}
