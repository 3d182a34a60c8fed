/**
 * A route as data: what the bridge answers on one method and path, declared beside its handler by the resource
 * it belongs to. The server registers exactly these (`server.ts`), the API document is generated from exactly the
 * registered ones (`bridge/openapi.ts`), and the answer checker holds every answer to its route's `responses`
 * (`checker.ts`), so that a route cannot exist, or answer, without its description (docs/api.md, GET
 * /0/openapi.json).
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import type { ErrorCode } from '../errors.js';

/** A schema with the name it has among the document's components, so that routes that share it `$ref` it. */
export interface NamedSchema {
  name: string;
  schema: z.ZodType;
}

export const named = (name: string, schema: z.ZodType): NamedSchema => ({ name, schema });

/** One status of one route: what its body is, and which headers come with it. */
export interface Outcome {
  description: string;
  /** Plain-text body tokens. */
  tokens?: readonly string[];
  /** A plain-text body that is not a token: its schema. */
  text?: z.ZodType;
  /** A JSON body. */
  json?: NamedSchema;
  html?: boolean;
  /** Bytes (`application/octet-stream`). */
  binary?: boolean;
  setsCookie?: boolean;
  retryAfter?: boolean;
  /** A `Content-Range` header (a range of the firmware image, or why none could be served). */
  contentRange?: boolean;
  /** A file of the web console (docs/console.md): HTML, JavaScript or CSS, gzipped when the client takes it. */
  asset?: boolean;
  /** A stream of Server-Sent Events (`text/event-stream`), written by the handler past the reply (bridge/live/sse.ts). */
  eventStream?: boolean;
}

export type Method = 'GET' | 'POST' | 'DELETE';

export type Tag =
  'Session' | 'User data' | 'Devices' | 'Commands' | 'Network' | 'Firmware' | 'Notifications' | 'Meta' | 'Operations';

export type Handler = (req: FastifyRequest, reply: FastifyReply) => Promise<unknown>;

export interface Route {
  method: Method;
  /**
   * The path as the specification spells it; a trailing slash is optional on every route. A `{name}` segment is a
   * path parameter, described by name in `bridge/openapi.ts`.
   */
  path: string;
  /** The last path parameter takes the rest of the path, slashes included (a firmware image name). */
  rest?: boolean;
  operationId: string;
  tag: Tag;
  summary: string;
  description: string;
  /** required: the route needs a session; optional: the route uses one when there is one. The handler decides. */
  session?: 'required' | 'optional';
  /** An access token as `Authorization: Bearer <token>` (decision 30) may stand for the session (the live channel). */
  bearer?: boolean;
  /** The body token this route answers for missing or malformed input, also when Fastify refuses the body (decision 4). */
  failToken?: ErrorCode;
  /**
   * A route devices (or probes and scrapers) call: it reads no frontend and no session, so it has no `app` and no
   * 404 for an unknown frontend.
   */
  device?: boolean;
  /**
   * Where the frontend of the request is read (decision 15). `request` (the default): the Host header, else `app` in
   * the query or the body. `not-body`: the body's fields are all data, `app` among them (`POST /0/user/`), so the
   * Host header, else `app` in the query, else the frontend of the session the cookie names (decision 25).
   */
  frontendFrom?: 'request' | 'not-body';
  /** The form the body is read with (form fields, or a JSON object). */
  form?: NamedSchema;
  /** Query parameters besides `app`. */
  query?: z.ZodObject;
  /** Its own statuses; those every route answers are added by `outcomes.ts`. */
  responses: Record<number, Outcome>;
  handler: Handler;
}

/**
 * The path as Fastify's router takes it: `:name` for `{name}`, `*` for a parameter that takes the rest of the path,
 * and no trailing slash (the router ignores it).
 */
export function routerPath(route: Pick<Route, 'path' | 'rest'>): string {
  let path = route.path;
  if (route.rest) path = path.replace(/\{\w+\}$/, '*');
  return path.replace(/\{(\w+)\}/g, ':$1').replace(/(.)\/$/, '$1');
}
