/**
 * How request bodies are read. Decision 4 and the specification: bodies are form fields; JSON objects are accepted
 * too. A body of any other type reads as no fields, so that the route answers its own failure token.
 *
 * Every field name is a name, `__proto__` too (decision 25): the fields of a form, and the members of a JSON object
 * body, are kept on an object with no prototype, where no name means anything to JavaScript. (Fastify's own JSON
 * parser refuses a body with a `__proto__` member; the specification allows any field name.) What is still refused,
 * as a malformed body, is the shape of an attack on code that merges objects: a `__proto__` member whose value is
 * an object, or a `constructor` member that is an object with a `prototype` member, at any depth.
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
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser(
    'application/json',
    { parseAs: 'string' },
    (_req: FastifyRequest, body: string | Buffer, done: (err: Error | null, value?: unknown) => void) => {
      const text = typeof body === 'string' ? body : body.toString('utf8');
      let value: unknown;
      try {
        if (text === '') throw new Error('the JSON body is empty');
        value = JSON.parse(text);
      } catch (err) {
        // A 400 like any other malformed input: the route answers its own failure token.
        done(Object.assign(err instanceof Error ? err : new Error(String(err)), { statusCode: 400 }));
        return;
      }
      if (poisoned(value)) {
        done(Object.assign(new Error('an object where a prototype would be read'), { statusCode: 400 }));
        return;
      }
      if (typeof value !== 'object' || value === null || Array.isArray(value)) {
        done(null, value);
        return;
      }
      // JSON.parse makes `__proto__` an own member; copied one by one onto an object with no prototype it stays one.
      const out: Fields = Object.create(null) as Fields;
      for (const name of Object.keys(value)) out[name] = (value as Fields)[name];
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

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null;

/**
 * Whether a parsed JSON value holds an object under `__proto__`, or under `constructor.prototype`, at any depth.
 * Walked without recursion: a body may nest as deep as its size allows.
 */
function poisoned(root: unknown): boolean {
  const stack: unknown[] = [root];
  while (stack.length > 0) {
    const v = stack.pop();
    if (!isObject(v)) continue;
    if (Object.hasOwn(v, '__proto__') && isObject(v['__proto__'])) return true;
    const ctor = Object.hasOwn(v, 'constructor') ? v['constructor'] : undefined;
    if (isObject(ctor) && Object.hasOwn(ctor, 'prototype')) return true;
    for (const key of Object.keys(v)) stack.push(v[key]);
  }
  return false;
}
