/**
 * How request bodies are read. Decision 4 and the specification: bodies are form fields; JSON objects are accepted
 * too (Fastify's own parser). A body of any other type reads as no fields, so that the route answers its own
 * failure token.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { isUtf8 } from 'node:buffer';
import { type Fields, UNREAD_BODY } from './request.js';

export function registerBodyParsers(app: FastifyInstance): void {
  app.addContentTypeParser(
    'application/x-www-form-urlencoded',
    { parseAs: 'buffer' },
    (_req: FastifyRequest, body: Buffer, done: (err: Error | null, value?: unknown) => void) => {
      const text = body.toString('utf8');
      if (!isUtf8(body)) {
        // A 400 like any other malformed input: the route answers its own failure token.
        done(Object.assign(new Error('the body is not UTF-8'), { statusCode: 400 }));
        return;
      }
      const out: Fields = Object.create(null) as Fields;
      for (const [k, v] of new URLSearchParams(text)) out[k] = v;
      done(null, out);
    },
  );
  // Marked, so that a route for which "no fields" means something (a sync of a `d` variable) can tell it from an
  // empty form.
  app.addContentTypeParser(
    '*',
    { parseAs: 'buffer' },
    (_req: FastifyRequest, body: Buffer, done: (err: null, v: unknown) => void) =>
      done(null, body.length === 0 ? {} : UNREAD_BODY),
  );
}
