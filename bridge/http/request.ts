/**
 * Reading a request's form fields and query parameters. Bodies are form fields (decision 4 and the specification);
 * JSON objects are accepted too (`body.ts`). Each route reads its fields through its own zod form, one field at a
 * time, so that it answers the failure token of the field at fault.
 */
import type { FastifyRequest } from 'fastify';
import type { z } from 'zod';

/** Form fields (and JSON objects) as a flat map; a repeated field keeps its last value. */
export type Fields = Record<string, unknown>;

/** The body of a request whose content type the bridge does not read: no fields. */
export const UNREAD_BODY: Fields = Object.freeze({});

/**
 * Whether the request body is a set of fields: a form, a JSON object, or no body at all. A JSON array, string,
 * number or null, or a body of another content type, is not.
 */
export function bodyIsFields(req: FastifyRequest): boolean {
  const body = req.body;
  if (body === undefined) return true;
  return typeof body === 'object' && body !== null && !Array.isArray(body) && body !== UNREAD_BODY;
}

export function fields(req: FastifyRequest): Fields {
  const body = req.body;
  return typeof body === 'object' && body !== null && !Array.isArray(body) ? (body as Fields) : {};
}

/** The query parameters as a flat map; a repeated parameter is an array. */
export function query(req: FastifyRequest): Fields {
  const q = req.query;
  return typeof q === 'object' && q !== null ? (q as Fields) : {};
}

/** One field read through its schema: its value, or `ok: false` when it is missing or malformed. */
export type FieldResult<T> = { ok: true; value: T } | { ok: false };

/**
 * Reads fields through a form schema one field at a time, so that a route answers the failure token of the field
 * at fault, in its own order (decision 4), and ignores a field it does not use on the path it takes.
 */
export function readForm<S extends Record<string, z.ZodType>>(
  values: Fields,
  form: z.ZodObject<S>,
): { [K in keyof S]: FieldResult<z.output<S[K]>> } {
  const out: Record<string, FieldResult<unknown>> = {};
  for (const [name, schema] of Object.entries(form.shape)) {
    const r = schema.safeParse(Object.hasOwn(values, name) ? values[name] : undefined);
    out[name] = r.success ? { ok: true, value: r.data } : { ok: false };
  }
  return out as { [K in keyof S]: FieldResult<z.output<S[K]>> };
}
