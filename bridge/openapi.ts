/**
 * The API document: OpenAPI 3.1, served at `GET /0/openapi.json`. Request bodies, query and path parameters
 * and JSON answers are generated with `z.toJSONSchema()` from the same zod schemas the routes read their input
 * with (`sessions/schemas.ts`, `accounts/schemas.ts`, `users/schemas.ts`, `devices/schemas.ts`,
 * `commands/schemas.ts`), with this bridge's limits filled in; every status a route can answer is listed with its plain-text token from the
 * catalog (`errors.ts`).
 * `test/bridge/openapi.test.ts` drives every route through its outcomes and checks each against this document.
 */
import { z } from 'zod';
import { VERSION } from '../lib/version.js';
import { DEVICE_ID_RE } from '../protocol/index.js';
import { ConfirmQuery, RecoverPageQuery, accountForms } from './accounts/schemas.js';
import { CommandList, CommandListQuery, CommandObject, PRINTABLE_ASCII_RE, commandForm } from './commands/schemas.js';
import type { BridgeConfig } from './config.js';
import {
  AUTHCODE_RE,
  ClaimForm,
  ClaimResponse,
  DeviceCollection,
  DeviceObject,
  HISTORY_MAX,
  HistoryList,
  HistoryQuery,
  VarNameParam,
  VarTypeParam,
  VariableRecord,
  variableForm,
} from './devices/schemas.js';
import { ERRORS, type ErrorCode } from './errors.js';
import { FirmwareImageObject, FirmwareList } from './firmware/catalog.js';
import { HEALTH_PATH, HealthObject } from './health.js';
import { AppParam } from './frontends/schemas.js';
import { METRICS_FORBIDDEN, METRICS_PATH, METRICS_UNAUTHORIZED } from './metrics.js';
import { COOKIE_NAME } from './sessions/cookie.js';
import { sessionForms } from './sessions/schemas.js';
import { UserDataForm, UserObject } from './users/schemas.js';

export const OPENAPI_PATH = '/0/openapi.json';

type Json = Record<string, unknown>;

/** A request schema as JSON Schema 2020-12 (the dialect of OpenAPI 3.1): what a client may send. */
function jsonSchema(schema: z.ZodType): Json {
  const { $schema: _dialect, ...rest } = z.toJSONSchema(schema, { io: 'input' }) as Json;
  return rest;
}

/**
 * Named schemas as components; a named schema used inside another becomes a `$ref` to its component. `input`
 * for requests (what a client may send), `output` for responses (what the bridge answers).
 */
function components(named: Record<string, z.ZodType>, io: 'input' | 'output'): Record<string, Json> {
  const registry = z.registry<{ id: string }>();
  for (const [id, schema] of Object.entries(named)) registry.add(schema, { id });
  const { schemas } = z.toJSONSchema(registry, { io, uri: (id) => `#/components/schemas/${id}` });
  const out: Record<string, Json> = {};
  for (const [id, schema] of Object.entries(schemas)) {
    const { $schema: _dialect, $id: _id, ...rest } = schema as Json;
    out[id] = rest;
  }
  return out;
}

const token = (code: ErrorCode): string => ERRORS[code].body;

/**
 * What the error handler in `app.ts` answers when Fastify refuses a body (bad JSON, not UTF-8, over
 * `http.bodyLimit`) on a route that has no failure token of its own.
 */
const BAD_REQUEST = 'bad-request';

/** One status of one route. */
interface Outcome {
  description: string;
  /** Plain-text body tokens. */
  tokens?: readonly string[];
  /** A plain-text body that is not a token: its schema. */
  text?: Json;
  /** A JSON body: the name of a component schema. */
  json?: string;
  html?: boolean;
  /** Bytes (`application/octet-stream`). */
  binary?: boolean;
  setsCookie?: boolean;
  retryAfter?: boolean;
  /** A `Content-Range` header (a range of the firmware image, or why none could be served). */
  contentRange?: boolean;
}

interface Route {
  method: 'get' | 'post' | 'delete';
  /**
   * The path as the specification spells it; a trailing slash is optional on every route. A `{name}` segment
   * is a path parameter, described in `PATH_PARAMETERS`.
   */
  path: string;
  operationId: string;
  tag: 'Session' | 'User data' | 'Devices' | 'Commands' | 'Network' | 'Firmware' | 'Meta' | 'Operations';
  summary: string;
  description: string;
  /** required: the route needs a session; optional: the route uses one when there is one. */
  session?: 'required' | 'optional';
  /** The component schema of the form. */
  body?: string;
  /** Query parameters besides `app`. */
  query?: z.ZodObject;
  /**
   * A route devices (or probes and scrapers) call: it reads no frontend, so it has no `app` and no 404 for one.
   */
  device?: boolean;
  responses: Record<number, Outcome>;
}

const TOO_MANY: Outcome = {
  description: 'Too many attempts from this address or for this login; retry after `Retry-After` seconds.',
  tokens: [token('too-many-requests')],
  retryAfter: true,
};

const BUSY: Outcome = {
  description: 'The password hashing queue is full; retry after `Retry-After` seconds.',
  tokens: [token('busy')],
  retryAfter: true,
};

function routes(config: BridgeConfig): Route[] {
  const bodyLimit = `${config.http.bodyLimit} bytes (\`http.bodyLimit\`)`;
  const recover = (path: string, operationId: string, alias: boolean): Route => ({
    method: 'post',
    path,
    operationId,
    tag: 'Session',
    summary: alias
      ? 'Recovery e-mail or new password (the spelling of the official client)'
      : 'Recovery e-mail or new password',
    description:
      'Decision 5. With `login` alone: e-mails a link to set a new password (valid ' +
      `${config.accounts.recoverTokenHours} h, single use; only the newest link works). With \`login\`, \`token\` ` +
      'and `password`: sets the new password and ends every session of the user. Both `/0/session/recovery` and ' +
      '`/0/session/recover` are accepted.',
    body: 'RecoverForm',
    responses: {
      200: { description: 'Recovery e-mail sent, or password set.', tokens: ['recover-ok'] },
      400: {
        description:
          'Login missing, malformed or unknown; the e-mail could not be sent; token wrong, used or expired; ' +
          'new password missing or out of bounds; or a malformed body.',
        tokens: [token('recover-fail')],
      },
      429: TOO_MANY,
      503: BUSY,
    },
  });
  return [
    {
      method: 'post',
      path: '/0/session/',
      operationId: 'createSession',
      tag: 'Session',
      summary: 'Anonymous session',
      description: 'Creates an anonymous session in the frontend unless the request already has a valid one.',
      session: 'optional',
      body: 'NoForm',
      responses: {
        200: { description: 'The session existed.', tokens: ['user-ok'] },
        201: { description: 'New anonymous session; cookie set.', tokens: ['user-ok'], setsCookie: true },
        400: { description: `A malformed body (bad JSON, not UTF-8, over ${bodyLimit}).`, tokens: [BAD_REQUEST] },
      },
    },
    {
      method: 'post',
      path: '/0/session/login',
      operationId: 'login',
      tag: 'Session',
      summary: 'Log in',
      description:
        'Checks the login and password and starts a new logged-in session (a new cookie; the old session ends).',
      session: 'optional',
      body: 'LoginForm',
      responses: {
        201: { description: 'Logged in; cookie set.', tokens: ['login-ok'], setsCookie: true },
        403: {
          description: 'Wrong or unknown login or password, a missing or malformed field, or a malformed body.',
          tokens: [token('login-fail')],
        },
        429: TOO_MANY,
        503: BUSY,
      },
    },
    {
      method: 'post',
      path: '/0/session/logout',
      operationId: 'logout',
      tag: 'Session',
      summary: 'Log out',
      description:
        'Ends the session of the cookie (its id can no longer be used) and starts a fresh anonymous session.',
      session: 'required',
      body: 'NoForm',
      responses: {
        201: {
          description: 'Session ended; the cookie of a new anonymous session is set.',
          tokens: ['logout-ok'],
          setsCookie: true,
        },
        400: {
          description: 'No valid session for the cookie in this frontend, or a malformed body.',
          tokens: [token('logout-fail')],
        },
      },
    },
    {
      method: 'post',
      path: '/0/session/signup',
      operationId: 'signup',
      tag: 'Session',
      summary: 'Create an account',
      description:
        "Creates the user in the frontend and a logged-in session for it (a new cookie). When the frontend's " +
        '`confirmationEmail` is on, e-mails a confirmation link; the account exists whether or not the e-mail ' +
        'goes out (resend it with `/0/session/resend`).',
      session: 'optional',
      body: 'SignupForm',
      responses: {
        201: { description: 'Account created; logged in; cookie set.', tokens: ['signup-ok'], setsCookie: true },
        400: {
          description:
            '`signup-fail-no-email`: login missing or not an e-mail address. `signup-fail-already-exists`: the ' +
            'login is taken in this frontend. `signup-fail`: password missing or out of bounds, or a malformed body.',
          tokens: [token('signup-fail-no-email'), token('signup-fail-already-exists'), token('signup-fail')],
        },
        429: TOO_MANY,
        503: BUSY,
      },
    },
    {
      method: 'post',
      path: '/0/session/resend',
      operationId: 'resendConfirmation',
      tag: 'Session',
      summary: 'Send the confirmation e-mail again',
      description: 'A new confirmation link for an unconfirmed user; the previous link stops working.',
      body: 'ResendForm',
      responses: {
        200: { description: 'Confirmation e-mail sent.', tokens: ['resend-ok'] },
        400: {
          description:
            'Login missing, malformed or unknown; the user is already confirmed; the e-mail could not be sent; or ' +
            'a malformed body.',
          tokens: [token('resend-fail')],
        },
        429: TOO_MANY,
      },
    },
    recover('/0/session/recovery', 'recover', false),
    recover('/0/session/recover', 'recoverAlias', true),
    {
      method: 'get',
      path: '/0/session/recover',
      operationId: 'recoverPage',
      tag: 'Session',
      summary: 'The page of the recovery link',
      description:
        'A small HTML form, opened from the recovery e-mail, that posts `login`, `token` (and `app`) with the new ' +
        '`password` to `POST /0/session/recover`. `Cache-Control: no-store`, `Referrer-Policy: same-origin`; a Content-Security-Policy that allows no ' +
        'script and no framing, and `X-Frame-Options: DENY`.',
      query: RecoverPageQuery,
      responses: { 200: { description: 'The form.', html: true } },
    },
    {
      method: 'get',
      path: '/0/session/confirm',
      operationId: 'confirm',
      tag: 'Session',
      summary: 'The confirmation link',
      description: `Decision 6: sets the user's \`confirmed\`. Single use, valid ${config.accounts.confirmTokenHours} h.`,
      query: ConfirmQuery,
      responses: {
        200: { description: 'Confirmed.', tokens: ['confirm-ok'] },
        400: { description: 'Token missing, wrong, used or expired.', tokens: [token('confirm-fail')] },
      },
    },
    {
      method: 'get',
      path: '/0/user/',
      operationId: 'getUser',
      tag: 'User data',
      summary: 'The user of the session',
      description:
        'Reading it rotates the authcode when it is older than 24 h (decision 17). `Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The user object.', json: 'User' },
        404: {
          description: 'No logged-in session (the specification), or an unknown frontend.',
          tokens: [token('not-found')],
        },
      },
    },
    {
      method: 'post',
      path: '/0/user/',
      operationId: 'setUserData',
      tag: 'User data',
      summary: 'Merge fields into the user data',
      description:
        'Every field but `app` is merged into `data`; fields not sent are kept. The merged object may take at ' +
        `most ${config.accounts.userDataBytes} bytes as JSON (\`accounts.userDataBytes\`).`,
      session: 'required',
      body: 'UserDataForm',
      responses: {
        200: { description: 'Merged.', tokens: ['user-data-ok'] },
        400: {
          description: 'A field whose value is not a string (JSON bodies), or a malformed body.',
          tokens: [token('user-data-fail')],
        },
        401: { description: 'No logged-in session (decision 3).', tokens: [token('no-session')] },
        413: {
          description: `The merged data would exceed the limit, or the body exceeds ${bodyLimit}.`,
          tokens: [token('user-data-failed')],
        },
      },
    },
    ...deviceRoutes(config),
    ...commandRoutes(config),
    {
      method: 'get',
      path: '/0/firmware/',
      operationId: 'listFirmware',
      tag: 'Firmware',
      summary: 'The firmware catalog',
      description:
        'The images the operator added with `devcloud-bridge firmware add`, ordered by name, then version. ' +
        '`Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The images; `[]` when there are none.', json: 'FirmwareList' },
        401: NO_SESSION,
      },
    },
    ...firmwareJobRoutes(),
    {
      method: 'get',
      path: OPENAPI_PATH,
      operationId: 'getOpenApi',
      tag: 'Meta',
      summary: 'This document',
      description: 'Needs no session.',
      responses: { 200: { description: 'The OpenAPI 3.1 document.', json: 'OpenApiDocument' } },
    },
    ...operationsRoutes(config),
  ];
}

/** Health and metrics, for probes and Prometheus: no frontend, no session. */
function operationsRoutes(config: BridgeConfig): Route[] {
  const health: Route = {
    method: 'get',
    path: HEALTH_PATH,
    operationId: 'getHealth',
    tag: 'Operations',
    summary: 'Whether the bridge can do its work',
    description:
      'The database answers a read in a write transaction and its folder is writable, and the link to the MQTT ' +
      `broker is up or has been down for less than ${config.health.linkGraceMs} ms (\`health.linkGraceMs\`). ` +
      'No frontend, no session: `app` is not read. `Cache-Control: no-store`.',
    device: true,
    responses: {
      200: { description: 'Healthy.', json: 'Health' },
      503: { description: 'The database fails, or the link has been down too long.', json: 'Health' },
    },
  };
  if (!config.metrics.enabled) return [health];
  const metrics: Route = {
    method: 'get',
    path: METRICS_PATH,
    operationId: 'getMetrics',
    tag: 'Operations',
    summary: 'Prometheus metrics',
    description:
      'The Prometheus text format (`text/plain; version=0.0.4`): HTTP requests by route and status and their ' +
      'durations, MQTT messages received and dropped, the link state, devices known and connected, commands by ' +
      'state, open firmware jobs, and the process figures. ' +
      (config.metrics.tokenFile === undefined
        ? 'No token is set (`metrics.tokenFile`): it answers loopback clients only, and asks them for none. '
        : 'It asks for `Authorization: Bearer <token>` with the token of `metrics.tokenFile`. ') +
      'No frontend, no session: `app` is not read. Switched off with `metrics.enabled: false`.',
    device: true,
    responses: { 200: { description: 'The metrics.', text: { type: 'string' } } },
  };
  if (config.metrics.tokenFile !== undefined) {
    metrics.responses[401] = {
      description: 'No token, or a wrong one (`WWW-Authenticate: Bearer`).',
      tokens: [METRICS_UNAUTHORIZED],
    };
  } else {
    metrics.responses[403] = {
      description:
        'A client that is not on this machine: its address is not a loopback one, or it came through a proxy ' +
        'that `http.trustProxy` does not trust. Set `metrics.tokenFile` to scrape from elsewhere.',
      tokens: [METRICS_FORBIDDEN],
    };
  }
  return [health, metrics];
}

const NO_SESSION: Outcome = { description: 'No logged-in session (decision 3).', tokens: [token('no-session')] };

/** Starting and cancelling a firmware update (DESIGN section 7), and the image a device downloads. */
function firmwareJobRoutes(): Route[] {
  const who = 'For the owner of the device, or a user it heard nearby while it has no owner.';
  const start = (prefix: string, operationId: string, alias: boolean): Route => ({
    method: 'post',
    path: `/0/devices/{id}/${prefix}/{image}`,
    operationId,
    tag: 'Firmware',
    summary: alias ? "Start a firmware update (the official client's spelling)" : 'Start a firmware update',
    description:
      '`{image}` is the image name as in `GET /0/firmware/`, slashes included. The device must be `connected` in ' +
      "`d` `mode` and in `meta` `state`, its `meta` `platform` must be in the image's `info.platforms.from`, and " +
      'no update of it may be running. The job goes to the device on `down/fw`; its progress shows as `meta` ' +
      `\`fwstate\`, \`fwprogress\`, \`fwname\`, \`fwerror\`, \`fwerrorcode\`. ${who}`,
    session: 'required',
    responses: {
      200: { description: 'The update started.', tokens: ['device-ok'] },
      400: {
        description:
          '`device-fwup-name-fail`: no image of that name. `device-fwup-start-fail`: the device is not connected ' +
          'in mode and state, its platform is not one the image updates from, an update is running, the job ' +
          'could not be handed to the broker, or a malformed body. `device-fail`: no device the user may see.',
        tokens: [token('device-fwup-name-fail'), token('device-fwup-start-fail'), token('device-fail')],
      },
      401: NO_SESSION,
    },
  });
  const cancel = (prefix: string, operationId: string, alias: boolean): Route => ({
    method: 'delete',
    path: `/0/devices/{id}/${prefix}`,
    operationId,
    tag: 'Firmware',
    summary: alias ? "Cancel a firmware update (the official client's spelling)" : 'Cancel a firmware update',
    description:
      'Cancels the running update before the switch of the active slot (decision 7): `firmware-ok`, and a cancel ' +
      `on \`down/fw\`; the device reports \`fwstate\` \`cancelled\`. ${who}`,
    session: 'required',
    responses: {
      200: { description: 'The cancel went to the device.', tokens: ['firmware-ok'] },
      400: {
        description:
          'No update is running, it is past the switch (`fwstate` `switching`, `restarting`, `committing`, ' +
          '`rollingback`), the device is not one the user may see, the cancel could not be handed over, or a ' +
          'malformed body.',
        tokens: [token('firmware-fail')],
      },
      401: NO_SESSION,
    },
  });
  return [
    start('fw', 'startFirmwareUpdate', false),
    start('firmware', 'startFirmwareUpdateAlias', true),
    cancel('fw', 'cancelFirmwareUpdate', false),
    cancel('firmware', 'cancelFirmwareUpdateAlias', true),
    {
      method: 'get',
      path: '/0/firmware/jobs/{job}/image',
      operationId: 'downloadFirmwareImage',
      tag: 'Firmware',
      summary: "A job's image, for its device",
      description:
        'What the device downloads, with `Authorization: Bearer <token>` from its `down/fw` job; the token is valid ' +
        'until the job ends or `firmware.tokenHours` pass. One HTTP range (`Range: bytes=N-`, `bytes=N-M` or `bytes=-N`) is ' +
        'answered 206 with `Content-Range`, so a download resumes where it stopped. No frontend, no session: ' +
        '`app` is not read. `Accept-Ranges: bytes`, `Cache-Control: no-store`.',
      device: true,
      responses: {
        200: { description: 'The whole image (also for a `Range` in a unit other than bytes).', binary: true },
        206: { description: 'The range asked for.', binary: true, contentRange: true },
        401: {
          description: 'No valid token: none, a wrong one, an expired one, or one for a job that is not open.',
          tokens: [token('fw-token-fail')],
        },
        416: {
          description:
            'A `bytes` range that is not one range within the image (`Content-Range: bytes */size`); ' + 'no body.',
          contentRange: true,
        },
      },
    },
  ];
}

/** A device route's `GET` answer for a device the user may not see, which is the answer for no device at all. */
const DEVICE_NOT_FOUND: Outcome = {
  description:
    '`device-fail`: the device does not exist or the user may not see it (decision 14: the two are the same ' +
    'answer). `not found`: an unknown frontend.',
  tokens: [token('device-not-found'), token('not-found')],
};

function deviceRoutes(config: BridgeConfig): Route[] {
  const d = config.devices;
  const window = `\`devices.nearbyWindowMs\` (${d.nearbyWindowMs} ms)`;
  const who =
    'The device is named by its uuid or its auth code. The user may see a device it owns; and, while a device ' +
    `has no owner and the frontend's \`nearby\` is on, a device that heard one of the user's authcodes within ` +
    `${window} (decisions 14 and 18), whose variables the user may then read, set and delete too. Any other ` +
    'device answers exactly as one that does not exist.';
  const malformed = 'or a malformed body';
  return [
    {
      method: 'get',
      path: '/0/devices/',
      operationId: 'listDevices',
      tag: 'Devices',
      summary: 'The devices registered to the user',
      description:
        'Device objects keyed by device uuid, in the order they were claimed. A device object (decision 9) has ' +
        '`d`, `s` and `meta`, each a map from variable name to variable record; deleted variables are left out. ' +
        '`Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The devices; `{}` when there are none.', json: 'DeviceCollection' },
        401: NO_SESSION,
      },
    },
    {
      method: 'post',
      path: '/0/devices/',
      operationId: 'claimDevice',
      tag: 'Devices',
      summary: 'Claim a device',
      description:
        "Registers the device with this auth code to the user (decision 8; one owner). Needs the frontend's " +
        "`registration`; with its `claimRequiresProximity`, the device must have heard one of the user's " +
        `authcodes within ${window} (decision 16). Claiming a device the user already owns answers 201 again ` +
        'with the same id. The answer is the device uuid as text, or `{"id": "<uuid>"}` to a request with ' +
        '`Accept: application/json`.',
      session: 'required',
      body: 'ClaimForm',
      responses: {
        201: {
          description: "Claimed, or already the user's: the device uuid.",
          text: { type: 'string', pattern: DEVICE_ID_RE.source },
          json: 'ClaimResponse',
        },
        400: {
          description:
            '`auth` missing or malformed; no device has this auth code; another user owns the device; the ' +
            "frontend's `registration` is off; `claimRequiresProximity` is on and the device has not heard the " +
            `user within the window; ${malformed}.`,
          tokens: [token('claim-fail')],
        },
        401: NO_SESSION,
      },
    },
    {
      method: 'get',
      path: '/0/devices/{id}',
      operationId: 'getDevice',
      tag: 'Devices',
      summary: 'One device',
      description: `The device object (decision 9). ${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      responses: {
        200: { description: 'The device object.', json: 'DeviceObject' },
        401: NO_SESSION,
        404: DEVICE_NOT_FOUND,
      },
    },
    {
      method: 'delete',
      path: '/0/devices/{id}',
      operationId: 'unregisterDevice',
      tag: 'Devices',
      summary: 'Unregister a device',
      description:
        'Only the owner may. The device loses its owner, and with it what the owner kept on the server about ' +
        'it: its `s` variables, the history of all its variables, and the record of who it heard nearby. Its ' +
        '`d` and `meta` variables stay: they belong to the device. It can be claimed again.',
      session: 'required',
      responses: {
        200: { description: 'Unregistered.', tokens: ['device-ok'] },
        400: {
          description: `No such device, one the user may not see, or one the user does not own; ${malformed}.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
    },
    {
      method: 'get',
      path: '/0/devices/{id}/{type}',
      operationId: 'listVariables',
      tag: 'Devices',
      summary: 'The variables of one type',
      description:
        `Variable records keyed by name (rule 5); deleted variables are left out. ${who} ` +
        '`Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The variables; `{}` when there are none.', json: 'VariableList' },
        401: NO_SESSION,
        404: {
          ...DEVICE_NOT_FOUND,
          description:
            '`device-fail`: no device the user may see, or a type other than `d`, `s` and `meta`. `not found`: an ' +
            'unknown frontend.',
        },
      },
    },
    {
      method: 'get',
      path: '/0/devices/{id}/{type}/{name}',
      operationId: 'getVariable',
      tag: 'Devices',
      summary: 'One variable, or its history',
      description:
        'Without `latest` and `from`: the variable (decision 9): a variable record for `d` and `s` (`d` with ' +
        'the four stamps `time`, `acked`, `synced`, `syncacked`), the bare value as a JSON string for `meta`. ' +
        'With `latest` or `from`: its history, newest first (decisions 10 and 11): at most `latest` entries ' +
        `(absent, 0 or more than ${HISTORY_MAX}: ${HISTORY_MAX}), only those with an id below \`from\` when ` +
        'given. Each entry is `{key, value | value64 | deleted: true, by, type, timestamp, id}`; `by` is ' +
        '`device`, `user` or `server`. A variable with no history answers `[]`. History older than ' +
        `\`devices.historyDays\` (${d.historyDays}) days, and past the newest \`devices.historyPerVariable\` ` +
        `(${d.historyPerVariable}) entries of the variable, is removed. ${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      query: HistoryQuery,
      responses: {
        200: {
          description: 'The variable record, the bare `meta` value, or the history entries.',
          json: 'VariableAnswer',
        },
        400: {
          description: '`latest` or `from` is not a non-negative integer (or is given twice).',
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
        404: {
          ...DEVICE_NOT_FOUND,
          description:
            '`device-fail`: no device the user may see; a malformed type or name; without `latest` and `from`, a ' +
            'variable that does not exist or was deleted. `not found`: an unknown frontend.',
        },
      },
    },
    {
      method: 'post',
      path: '/0/devices/{id}/{type}/{name}',
      operationId: 'setVariable',
      tag: 'Devices',
      summary: 'Set a variable, or synchronise one',
      description:
        'Rules 1 to 3 of the specification. `type` is `d` or `s`; a variable that does not exist is created. ' +
        '`value64` wins over `value` when both are sent. A `d` value is pushed to the device: the call returns ' +
        'once the bridge has committed it, and `acked` stays 0 until the device acknowledges the version. A `d` ' +
        'variable posted with no value is synchronised: its `synced` stamp advances and the current value is ' +
        'sent again; `syncacked` follows when the device acknowledges. An `s` value is kept on the server only ' +
        `and is never sent to the device. ${who}`,
      session: 'required',
      body: 'VariableForm',
      responses: {
        200: { description: 'Set, or synchronisation started.', tokens: ['device-ok'] },
        400: {
          description:
            'No device the user may see; `type` `meta` (decision 22: meta variables are read-only) or not a ' +
            `type; a malformed name; \`value64\` not base64; a value over \`devices.maxValueBytes\` ` +
            `(${d.maxValueBytes}) bytes; no value for an \`s\` variable, or for a \`d\` variable that does not ` +
            'exist or was deleted; a body that is not a set of fields (a JSON value that is not an object, a ' +
            `non-empty body of another content type), which would otherwise read as a sync; ${malformed}.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
    },
    {
      method: 'delete',
      path: '/0/devices/{id}/{type}/{name}',
      operationId: 'deleteVariable',
      tag: 'Devices',
      summary: 'Delete a variable',
      description:
        'Deletes a `d` or `s` variable: a new version with no value (a tombstone), recorded in the history as ' +
        '`deleted: true`. A `d` deletion is pushed to the device and acknowledged like any other version ' +
        `(rule 4). ${who}`,
      session: 'required',
      responses: {
        200: { description: 'Deleted.', tokens: ['device-ok'] },
        400: {
          description:
            'No device the user may see; `type` `meta` or not a type; a malformed name; a variable that does not ' +
            `exist or is already deleted; ${malformed}.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
    },
    {
      method: 'get',
      path: '/0/network/',
      operationId: 'getNetwork',
      tag: 'Network',
      summary: 'The devices near the user',
      description:
        "Decision 18: the devices that heard one of the user's authcodes (broadcast by the user's phone on UDP " +
        `590) within ${window}, keyed by device auth code, as device objects. A device owned by another user is ` +
        "left out. With the frontend's `nearby` off, `{}`. `Cache-Control: no-store`.",
      session: 'required',
      responses: {
        200: { description: 'The nearby devices; `{}` when there are none.', json: 'DeviceCollection' },
        401: NO_SESSION,
      },
    },
  ];
}

function commandRoutes(config: BridgeConfig): Route[] {
  const c = config.commands;
  const who =
    'Who may: whoever may set the variables of the device, that is its owner, or, while it has no owner, a user ' +
    'it heard nearby (decisions 14 and 18). Any other device answers exactly as one that does not exist.';
  const uuid = { type: 'string', pattern: DEVICE_ID_RE.source };
  const full =
    `the device already has \`commands.maxOpen\` (${c.maxOpen}) commands that are not finished (queued, sent or ` +
    'running; decision 13)';
  const accepted: Outcome = {
    description:
      'Stored, with its expiry, before this answer: the command uuid. It goes to the device now if the device is ' +
      'connected, else at its next connection.',
    text: uuid,
  };
  return [
    {
      method: 'post',
      path: '/0/devices/{id}',
      operationId: 'sendCommand',
      tag: 'Commands',
      summary: 'Send a command to a device',
      description:
        'The specification and decisions 12 and 13. `command` is printable ASCII; `command64` carries any bytes ' +
        `and wins when both are sent; either way at most \`commands.maxBytes\` (${c.maxBytes}) bytes. \`priority\` ` +
        `0, 1 or 2 (default 0): the device runs the highest first. \`lifetime\`: milliseconds from now, 1 to ` +
        `\`commands.maxLifetimeMs\` (${c.maxLifetimeMs}), default \`commands.defaultLifetimeMs\` ` +
        `(${c.defaultLifetimeMs}); a command that has not started by then never runs. In a JSON body \`priority\` ` +
        'and `lifetime` may be numbers. Follow it with `GET /0/devices/{id}/commands/{cmd}`. ' +
        who,
      session: 'required',
      body: 'CommandForm',
      responses: {
        200: accepted,
        400: {
          description:
            'No device the user may see; neither `command` nor `command64`; `command` not printable ASCII, empty ' +
            'or too long; `command64` not base64 or too long; `priority` or `lifetime` out of range or not an ' +
            `integer; ${full}; a body that is not a set of fields; or a malformed body.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
    },
    {
      method: 'post',
      path: '/0/devices/{id}/{command}',
      operationId: 'sendCommandInPath',
      tag: 'Commands',
      summary: 'Send a command, named in the path (the spelling of older clients)',
      description:
        'The command is the last path segment (percent-encoded); the body is not read. Default priority and ' +
        `lifetime. A segment that names a part of the device (\`d\`, \`s\`, \`meta\`, \`fw\`, \`firmware\`, ` +
        `\`commands\`) is not a command. ${who}`,
      session: 'required',
      responses: {
        200: accepted,
        400: {
          description:
            'No device the user may see; a segment that is not printable ASCII once decoded, longer than ' +
            `\`commands.maxBytes\` (${c.maxBytes}) bytes (or 256 characters as sent), or one of the reserved ` +
            `names; ${full}; or a malformed body.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
    },
    {
      method: 'get',
      path: '/0/devices/{id}/commands/',
      operationId: 'listCommands',
      tag: 'Commands',
      summary: "The device's commands and their states",
      description:
        'An extension (DESIGN section 6): command objects, newest first. States: `queued` (on the bridge), ' +
        '`sent` (handed to the broker; `delivered` is set once the device has stored it), `running`, `done`, ' +
        '`failed`, `expired`. Commands are kept until the device is unregistered. ' +
        `${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      query: CommandListQuery,
      responses: {
        200: { description: 'The commands; `[]` when there are none.', json: 'CommandList' },
        400: {
          description: '`latest` is not a non-negative integer (or is given twice).',
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
        404: DEVICE_NOT_FOUND,
      },
    },
    {
      method: 'get',
      path: '/0/devices/{id}/commands/{cmd}',
      operationId: 'getCommand',
      tag: 'Commands',
      summary: 'One command and its state',
      description:
        'An extension (DESIGN section 6): the command object. A finished command has `finished`, and, when the ' +
        'device ran a program, `exitCode` or `signal` and the end of its output (`output`, `truncated` when cut); ' +
        `\`reason\` says why it failed or expired. ${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      responses: {
        200: { description: 'The command object.', json: 'Command' },
        401: NO_SESSION,
        404: {
          ...DEVICE_NOT_FOUND,
          description:
            '`device-fail`: no device the user may see, or no command with this uuid on this device. `not found`: ' +
            'an unknown frontend.',
        },
      },
    },
  ];
}

/** The path parameters of the device routes, by name (the routes read them with `devices/schemas.ts`). */
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
  };
  return [...path.matchAll(/\{(\w+)\}/g)].map(([, name]) => ({
    name,
    in: 'path',
    required: true,
    ...described[name!],
  }));
}

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
const CROSS_SITE: Outcome = {
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

/** Fastify's own answer to a request that arrives while the bridge shuts down. */
const SHUTTING_DOWN = {
  type: 'object',
  properties: { error: { type: 'string' }, message: { type: 'string' }, statusCode: { const: 503 } },
  required: ['error', 'message', 'statusCode'],
};

function response(o: Outcome): Json {
  const content: Json = {};
  if (o.tokens) content['text/plain'] = { schema: { type: 'string', enum: [...new Set(o.tokens)] } };
  if (o.text) content['text/plain'] = { schema: o.text };
  if (o.json) content['application/json'] = { schema: { $ref: `#/components/schemas/${o.json}` } };
  if (o.html) content['text/html'] = { schema: { type: 'string' } };
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
  // A route that reads no frontend has no answer for an unknown one.
  const { 404: _unknownFrontend, ...noFrontend } = COMMON;
  const common = { ...(route.device ? noFrontend : COMMON), ...(route.method === 'get' ? {} : { 507: STORAGE_FULL }) };
  const own: Record<number, Outcome> = { ...route.responses };
  if (route.method !== 'get') {
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
  for (const [status, o] of Object.entries({ ...common, ...own })) out[status] = response(o);
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
          ? { anyOf: [{ $ref: `#/components/schemas/${own503.json}` }, SHUTTING_DOWN] }
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
  const security =
    route.session === 'required' ? [{ sid: [] }] : route.session === 'optional' ? [{}, { sid: [] }] : undefined;
  const body = route.body
    ? {
        requestBody: {
          // Every field is optional to the HTTP layer: a missing one answers the route's failure token.
          required: false,
          content: {
            'application/x-www-form-urlencoded': { schema: { $ref: `#/components/schemas/${route.body}` } },
            'application/json': { schema: { $ref: `#/components/schemas/${route.body}` } },
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

/** The document for a bridge running with `config`: the limits in the schemas are this bridge's own. */
export function buildOpenApi(config: BridgeConfig): Json {
  const session = sessionForms(config.accounts);
  const account = accountForms(config.accounts);
  const paths: Record<string, Json> = {};
  for (const route of routes(config)) {
    paths[route.path] = { ...paths[route.path], [route.method]: operation(route) };
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
        'parameter, else the default frontend. Each frontend has its own users and sessions.\n\n' +
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
        ...components(
          {
            FrontendId: AppParam,
            NoForm: session.none,
            LoginForm: session.login,
            SignupForm: session.signup,
            ResendForm: account.resend,
            RecoverForm: account.recover,
            UserDataForm,
            ClaimForm,
            VariableForm: variableForm(config.devices.maxValueBytes),
            // Every field is optional on its own, but one of the two must come.
            CommandForm: commandForm(config.commands).meta({
              anyOf: [{ required: ['command'] }, { required: ['command64'] }],
            }),
          },
          'input',
        ),
        ...components(
          {
            User: UserObject,
            VariableRecord,
            VariableList: z.record(z.string(), VariableRecord),
            DeviceObject,
            DeviceCollection,
            HistoryList,
            VariableAnswer: z.union([VariableRecord, z.string(), HistoryList]),
            ClaimResponse,
            Command: CommandObject,
            CommandList,
            FirmwareImage: FirmwareImageObject,
            FirmwareList,
            Health: HealthObject,
          },
          'output',
        ),
        OpenApiDocument: { type: 'object', required: ['openapi', 'info', 'paths'] },
      },
    },
  };
}
