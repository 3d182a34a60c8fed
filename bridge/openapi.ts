/**
 * The API document: OpenAPI 3.1, served at `GET /0/openapi.json`, generated from the routes the server registered
 * (`http/server.ts`), so that it lists exactly the routes the bridge serves (docs/api.md, GET /0/openapi.json). Each
 * route declares its own description, forms, query and answers beside its handler; this module adds the document's
 * skeleton: the info, servers and tags, the components (the routes' named zod schemas, with this bridge's limits
 * filled in, as JSON Schema through `z.toJSONSchema()`), the path parameters, the `app` parameter, the headers,
 * the `sid` security scheme, and the statuses every route answers (`http/outcomes.ts`).
 */
import { z } from 'zod';
import { VERSION } from '../lib/version.js';
import { DEVICE_ID_RE } from '../protocol/index.js';
import { PRINTABLE_ASCII_RE } from './commands/schemas.js';
import type { BridgeConfig } from './config.js';
import { AUTHCODE_RE, HistoryList, VarNameParam, VarTypeParam, VariableRecord } from './devices/schemas.js';
import { FirmwareImageObject } from './firmware/catalog.js';
import { AppParam } from './frontends/schemas.js';
import { answersOf } from './http/outcomes.js';
import { type NamedSchema, type Outcome, type Route, named } from './http/route.js';
import { ACCESS_TOKEN_RE } from './sessions/accesstokens.js';
import { COOKIE_NAME } from './sessions/cookie.js';

export const OPENAPI_PATH = '/0/openapi.json';

type Json = Record<string, unknown>;

/**
 * A schema as JSON Schema 2020-12 (the dialect of OpenAPI 3.1): `input`, what a client may send; `output`, what the
 * bridge answers (a plain-text body that is not a token).
 */
function jsonSchema(schema: z.ZodType, io: 'input' | 'output' = 'input'): Json {
  const { $schema: _dialect, ...rest } = z.toJSONSchema(schema, { io }) as Json;
  return rest;
}

/**
 * Named schemas as components; a named schema used inside another becomes a `$ref` to its component. `input`
 * for requests (what a client may send), `output` for responses (what the bridge answers).
 */
function components(named: ReadonlyMap<string, z.ZodType>, io: 'input' | 'output'): Record<string, Json> {
  const registry = z.registry<{ id: string }>();
  for (const [id, schema] of named) registry.add(schema, { id });
  const { schemas } = z.toJSONSchema(registry, { io, uri: (id) => `#/components/schemas/${id}` });
  const out: Record<string, Json> = {};
  for (const [id, schema] of Object.entries(schemas)) {
    const { $schema: _dialect, $id: _id, ...rest } = schema as Json;
    out[id] = rest;
  }
  return out;
}

/** Adds a named schema to a set of components; a name names one schema. */
function collect(into: Map<string, z.ZodType>, { name, schema }: NamedSchema): void {
  const known = into.get(name);
  if (known !== undefined && known !== schema) throw new Error(`two schemas are named ${name}`);
  into.set(name, schema);
}

/** The frontend id of the `app` parameter, which every form declares too. */
const INPUT_PARTS: NamedSchema[] = [named('FrontendId', AppParam)];

/** Parts of several answers, named so that the answers `$ref` them. */
const OUTPUT_PARTS: NamedSchema[] = [
  named('VariableRecord', VariableRecord),
  named('HistoryList', HistoryList),
  named('FirmwareImage', FirmwareImageObject),
];

/**
 * Components published as they are instead of generated: this document's own, whose route declares a zod schema
 * for the answer checker that is more than clients need.
 */
const RAW_COMPONENTS: Record<string, Json> = {
  OpenApiDocument: { type: 'object', required: ['openapi', 'info', 'paths'] },
};

/** What the answer checker holds this document to (`http/checker.ts`). */
const OpenApiDocumentObject = z.looseObject({
  openapi: z.literal('3.1.0'),
  info: z.record(z.string(), z.unknown()),
  paths: z.record(z.string(), z.unknown()),
});

/** The path parameters of the routes, by name (the device routes read theirs with `devices/schemas.ts`). */
function pathParameters(path: string): Json[] {
  const described: Record<string, Json> = {
    id: {
      description:
        "The device uuid, or the device's auth code (a nearby id: hex, as in `GET /0/network/`); " +
        'case-insensitive.',
      schema: {
        anyOf: [
          { type: 'string', pattern: DEVICE_ID_RE.source },
          { type: 'string', pattern: AUTHCODE_RE.source },
        ],
      },
    },
    type: {
      description: '`d` (device variables), `s` (server variables) or `meta` (read-only).',
      schema: jsonSchema(VarTypeParam),
    },
    name: { description: 'The variable name.', schema: jsonSchema(VarNameParam) },
    command: {
      description: 'The command, printable ASCII, percent-encoded.',
      schema: { type: 'string', pattern: PRINTABLE_ASCII_RE.source },
    },
    cmd: {
      description: 'The command uuid, as `POST /0/devices/{id}/` answered it; case-insensitive.',
      schema: { type: 'string', format: 'uuid' },
    },
    image: {
      description: 'The image name, as in `GET /0/firmware/`; it holds slashes, which are part of the path.',
      schema: { type: 'string', maxLength: 256 },
    },
    job: { description: 'The job uuid, from the `down/fw` start message.', schema: { type: 'string', format: 'uuid' } },
    token: {
      description: 'The access token itself, or its number from `GET /0/user/accesstoken` (decision 30).',
      schema: {
        anyOf: [
          { type: 'string', pattern: ACCESS_TOKEN_RE.source },
          { type: 'string', pattern: '^[1-9][0-9]{0,14}$' },
        ],
      },
    },
    login: {
      description: 'The login of a user the device is shared with (decision 23), percent-encoded; case-insensitive.',
      schema: { type: 'string', format: 'email' },
    },
  };
  return [...path.matchAll(/\{(\w+)\}/g)].map(([, name]) => ({
    name,
    in: 'path',
    required: true,
    ...described[name!],
  }));
}

/** Fastify's own answer to a request that arrives while the bridge shuts down. */
const SHUTTING_DOWN = {
  type: 'object',
  properties: { error: { type: 'string' }, message: { type: 'string' }, statusCode: { const: 503 } },
  required: ['error', 'message', 'statusCode'],
};

function response(o: Outcome): Json {
  const content: Json = {};
  if (o.tokens) content['text/plain'] = { schema: { type: 'string', enum: [...new Set(o.tokens)] } };
  if (o.text) content['text/plain'] = { schema: jsonSchema(o.text, 'output') };
  if (o.json) content['application/json'] = { schema: { $ref: `#/components/schemas/${o.json.name}` } };
  if (o.html) content['text/html'] = { schema: { type: 'string' } };
  if (o.eventStream) content['text/event-stream'] = { schema: { type: 'string' } };
  if (o.asset) {
    for (const type of ['text/html', 'text/javascript', 'text/css']) content[type] = { schema: { type: 'string' } };
  }
  if (o.binary)
    content['application/octet-stream'] = { schema: { type: 'string', contentMediaType: 'application/octet-stream' } };
  const headers: Json = {};
  if (o.setsCookie) headers['Set-Cookie'] = { $ref: '#/components/headers/SetSessionCookie' };
  if (o.retryAfter) headers['Retry-After'] = { $ref: '#/components/headers/RetryAfter' };
  if (o.contentRange) headers['Content-Range'] = { $ref: '#/components/headers/ContentRange' };
  return {
    description: o.description,
    ...(Object.keys(headers).length > 0 ? { headers } : {}),
    ...(Object.keys(content).length > 0 ? { content } : {}),
  };
}

function responses(route: Route): Json {
  const out: Record<string, Json> = {};
  for (const [status, o] of Object.entries(answersOf(route))) out[status] = response(o);
  const own503 = route.responses[503];
  const shutdown = 'The bridge is shutting down (a JSON body from the HTTP server).';
  out['503'] = {
    description: own503
      ? `${own503.description} Or: ${shutdown.charAt(0).toLowerCase()}${shutdown.slice(1)}`
      : shutdown,
    ...(own503?.retryAfter ? { headers: { 'Retry-After': { $ref: '#/components/headers/RetryAfter' } } } : {}),
    content: {
      ...(own503?.tokens ? { 'text/plain': { schema: { type: 'string', enum: own503.tokens } } } : {}),
      'application/json': {
        schema: own503?.json
          ? { anyOf: [{ $ref: `#/components/schemas/${own503.json.name}` }, SHUTTING_DOWN] }
          : SHUTTING_DOWN,
      },
    },
  };
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => Number(a) - Number(b)));
}

function queryParameters(query: z.ZodObject | undefined, device: boolean): Json[] {
  const params: Json[] = device ? [] : [{ $ref: '#/components/parameters/app' }];
  if (!query) return params;
  const schema = jsonSchema(query) as { properties?: Record<string, Json>; required?: string[] };
  for (const [name, s] of Object.entries(schema.properties ?? {})) {
    if (name === 'app') continue;
    const { description, ...rest } = s;
    params.push({
      name,
      in: 'query',
      required: schema.required?.includes(name) ?? false,
      ...(typeof description === 'string' ? { description } : {}),
      schema: rest,
    });
  }
  return params;
}

function operation(route: Route): Json {
  const bearer = route.bearer ? [{ bearer: [] }] : [];
  const security =
    route.session === 'required'
      ? [{ sid: [] }, ...bearer]
      : route.session === 'optional'
        ? [{}, { sid: [] }, ...bearer]
        : undefined;
  const body = route.form
    ? {
        requestBody: {
          // Every field is optional to the HTTP layer: a missing one answers the route's failure token.
          required: false,
          content: {
            'application/x-www-form-urlencoded': { schema: { $ref: `#/components/schemas/${route.form.name}` } },
            'application/json': { schema: { $ref: `#/components/schemas/${route.form.name}` } },
          },
        },
      }
    : {};
  return {
    operationId: route.operationId,
    tags: [route.tag],
    summary: route.summary,
    description: route.description,
    ...(security ? { security } : {}),
    parameters: [...pathParameters(route.path), ...queryParameters(route.query, route.device === true)],
    ...body,
    responses: responses(route),
  };
}

/** This document's own route. `document` is the document as served, made once all routes are registered. */
export function openApiRoutes(document: () => string): Route[] {
  return [
    {
      method: 'GET',
      path: OPENAPI_PATH,
      operationId: 'getOpenApi',
      tag: 'Meta',
      summary: 'This document',
      description: 'Needs no session.',
      responses: {
        200: { description: 'The OpenAPI 3.1 document.', json: named('OpenApiDocument', OpenApiDocumentObject) },
      },
      handler: async (_req, reply) => reply.type('application/json; charset=utf-8').send(document()),
    },
  ];
}

/**
 * The document of the routes a bridge running with `config` registered: the limits in the schemas and descriptions
 * are this bridge's own.
 */
export function buildOpenApi(config: BridgeConfig, routes: readonly Route[]): Json {
  const paths: Record<string, Json> = {};
  const input = new Map<string, z.ZodType>();
  const output = new Map<string, z.ZodType>();
  for (const part of INPUT_PARTS) collect(input, part);
  for (const part of OUTPUT_PARTS) collect(output, part);
  for (const route of routes) {
    paths[route.path] = { ...paths[route.path], [route.method.toLowerCase()]: operation(route) };
    if (route.form) collect(input, route.form);
    for (const o of Object.values(route.responses))
      if (o.json && !(o.json.name in RAW_COMPONENTS)) collect(output, o.json);
  }
  const maxAge = Math.floor(config.sessions.absoluteDays * 86_400);
  return {
    openapi: '3.1.0',
    info: {
      title: 'devcloud bridge: sessions, user data, devices, commands and network',
      version: VERSION,
      description:
        'The Session, User data, Devices (with commands) and Network endpoints of the device cloud REST API, and ' +
        'the status of commands (an extension). Bodies are form fields ' +
        '(`application/x-www-form-urlencoded`); JSON objects are accepted too. Answers are plain-text tokens ' +
        'unless stated as JSON. Every route also answers `HEAD` for `GET`, and takes its path with or without a ' +
        'trailing slash.\n\n' +
        'Frontend (decision 15): the Host header `<frontend uuid>.<server>`, else the `app` query or form ' +
        'parameter, else the default frontend. Each frontend has its own users and sessions. On `POST /0/user/` ' +
        'the body is all data, `app` too: there the query parameter, else the session the cookie names, tells ' +
        'the frontend (decision 25).\n\n' +
        `Session: the cookie \`${COOKIE_NAME}\` (HttpOnly, SameSite=Lax, Path=/, Secure over TLS), idle timeout ` +
        `${config.sessions.idleDays} days, absolute lifetime ${config.sessions.absoluteDays} days. A route that ` +
        'needs a session answers 401 `no-session` without one, except `GET /0/user/`, which answers 404 ' +
        '`not found`.\n\n' +
        'Cross-site requests: a `POST` or `DELETE` whose `Origin` header (else `Referer`) names a page on another ' +
        'host than the one it was addressed to answers 403 `origin-fail`, unless that origin is in ' +
        '`http.allowedOrigins`; `Origin: null` too. A request with neither header (not sent from a web page) is ' +
        'not checked.\n\n' +
        'Devices (decision 14): a device the user may not see answers exactly as one that does not exist: 404 ' +
        '`device-fail` to `GET`, 400 `device-fail` to `POST` and `DELETE`.',
    },
    servers: [
      config.http.publicUrl
        ? { url: config.http.publicUrl.replace(/\/+$/, ''), description: 'This bridge.' }
        : { url: '/', description: 'This bridge; the frontend from `app`, else the default one.' },
      {
        url: '{scheme}://{frontend}.{server}',
        description: 'A frontend named by its host (decision 15).',
        variables: {
          scheme: { enum: ['https', 'http'], default: 'https' },
          frontend: { default: '00000000-0000-0000-0000-000000000000', description: 'The frontend uuid.' },
          server: { default: 'devcloud.example.com', description: 'The domain the bridge serves.' },
        },
      },
    ],
    tags: [
      { name: 'Session', description: 'Sessions, accounts, confirmation and recovery.' },
      { name: 'User data', description: 'The user object.' },
      { name: 'Devices', description: 'Claimed and nearby devices, their variables and history.' },
      { name: 'Commands', description: 'Commands to a device, and their states.' },
      { name: 'Network', description: 'The devices near the user.' },
      {
        name: 'Firmware',
        description: 'The firmware catalog, updates of a device, and the image a device downloads for its update.',
      },
      {
        name: 'Notifications',
        description: "Rules on a device's variables and state, and the log of the events they fired.",
      },
      { name: 'Meta', description: 'About the API.' },
      { name: 'Operations', description: 'Health and metrics, for probes and Prometheus.' },
    ],
    paths,
    components: {
      securitySchemes: {
        sid: {
          type: 'apiKey',
          in: 'cookie',
          name: COOKIE_NAME,
          description:
            'Set by `POST /0/session/`, `login` and `signup`: 256 random bits, base64url. A new value on login, ' +
            'signup and logout.',
        },
        bearer: {
          type: 'http',
          scheme: 'bearer',
          description:
            'An access token (`POST /0/user/accesstoken`, decision 30), where a route says so (the live channel): ' +
            'the user it was made for.',
        },
      },
      parameters: {
        app: { name: 'app', in: 'query', required: false, schema: { $ref: '#/components/schemas/FrontendId' } },
      },
      headers: {
        SetSessionCookie: {
          description: `\`${COOKIE_NAME}=<value>; Max-Age=${maxAge}; Path=/; HttpOnly; SameSite=Lax\`, plus \`; Secure\` over TLS.`,
          schema: { type: 'string' },
        },
        RetryAfter: { description: 'Seconds to wait.', schema: { type: 'integer', minimum: 1 } },
        ContentRange: {
          description: '`bytes <first>-<last>/<size>` for a range served, `bytes */<size>` for one refused.',
          schema: { type: 'string' },
        },
      },
      schemas: {
        ...components(input, 'input'),
        ...components(output, 'output'),
        ...RAW_COMPONENTS,
      },
    },
  };
}
