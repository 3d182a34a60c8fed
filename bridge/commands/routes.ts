/**
 * Commands: `POST /0/devices/<id>/` (the specification, decision 13), the older clients' spelling
 * `POST /0/devices/<id>/<command>` with no body, and the status extension `GET /0/devices/<id>/commands/` and
 * `GET /0/devices/<id>/commands/<uuid>` (docs/decisions.md §6).
 *
 * Who may send commands and read their status: whoever may change the device's variables (access.ts).
 */
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { DEVICE_ID_RE } from '../../protocol/index.js';
import { DEVICE_NOT_FOUND, deviceAccess } from '../devices/access.js';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send, sendJson } from '../http/reply.js';
import { bodyIsFields, fields, query, readForm } from '../http/request.js';
import { type Outcome, type Route, named } from '../http/route.js';
import { CommandList, CommandListQuery, CommandObject, PRINTABLE_ASCII_RE, commandForm } from './schemas.js';
import type { StoredCommand } from './store.js';

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Path segments under a device that are not commands of the older clients' spelling. */
const RESERVED_SEGMENTS: ReadonlySet<string> = new Set(['d', 's', 'meta', 'fw', 'firmware', 'commands', 'users']);

export function renderCommand(c: StoredCommand): string {
  const text = c.command.toString('latin1');
  const body = {
    id: c.id,
    ...(PRINTABLE_ASCII_RE.test(text) ? { command: text } : { command64: c.command.toString('base64') }),
    priority: c.priority,
    state: c.state,
    created: c.createdAt,
    expires: c.expiresAt,
    sent: c.sentAt,
    delivered: c.deliveredAt,
    started: c.startedAt,
    finished: c.finishedAt,
    exitCode: c.exitCode,
    signal: c.signal,
    output: c.output,
    truncated: c.truncated,
    reason: c.reason,
  };
  return JSON.stringify(body);
}

export function commandRoutes(ctx: RouteContext): Route[] {
  const { config, store, commands } = ctx;
  const { userOf, visible } = deviceAccess(ctx);
  const limits = config.commands;
  // Every field is optional on its own, but one of the two must come: the document says so.
  const Form = commandForm(limits).meta({ anyOf: [{ required: ['command'] }, { required: ['command64'] }] });

  async function submit(req: FastifyRequest, command: Buffer, priority: 0 | 1 | 2, lifetime: number) {
    const user = userOf(req);
    const seen = await visible(req, user);
    if (!seen) throw new ApiError('device-fail');
    const outcome = await commands.submit(seen.device.id, user.id, command, priority, lifetime);
    if (!outcome.ok) throw new ApiError('device-fail');
    return outcome.id;
  }

  const who =
    'Who may: whoever may set the variables of the device, that is its owner, a user it is shared with, or, while ' +
    'it has no owner, a user it heard nearby (decisions 14, 18 and 23). Any other device answers exactly as one ' +
    'that does not exist.';
  const full =
    `the device already has \`commands.maxOpen\` (${limits.maxOpen}) commands that are not finished (queued, sent or ` +
    'running; decision 13)';
  const accepted: Outcome = {
    description:
      'Stored, with its expiry, before this answer: the command uuid. It goes to the device now if the device is ' +
      'connected, else at its next connection.',
    text: z.string().regex(DEVICE_ID_RE),
  };

  return [
    {
      method: 'POST',
      path: '/0/devices/{id}',
      operationId: 'sendCommand',
      tag: 'Commands',
      summary: 'Send a command to a device',
      description:
        'The specification and decisions 12 and 13. `command` is printable ASCII; `command64` carries any bytes ' +
        `and wins when both are sent; either way at most \`commands.maxBytes\` (${limits.maxBytes}) bytes. \`priority\` ` +
        `0, 1 or 2 (default 0): the device runs the highest first. \`lifetime\`: milliseconds from now, 1 to ` +
        `\`commands.maxLifetimeMs\` (${limits.maxLifetimeMs}), default \`commands.defaultLifetimeMs\` ` +
        `(${limits.defaultLifetimeMs}); a command that has not started by then never runs. In a JSON body \`priority\` ` +
        'and `lifetime` may be numbers. Follow it with `GET /0/devices/{id}/commands/{cmd}`. ' +
        who,
      session: 'required',
      failToken: 'device-fail',
      form: named('CommandForm', Form),
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
      handler: async (req, reply) => {
        userOf(req);
        if (!bodyIsFields(req)) throw new ApiError('device-fail');
        const f = readForm(fields(req), Form);
        if (!f.command.ok || !f.command64.ok || !f.priority.ok || !f.lifetime.ok) throw new ApiError('device-fail');
        let bytes: Buffer | undefined;
        if (f.command64.value !== undefined) bytes = Buffer.from(f.command64.value, 'base64');
        else if (f.command.value !== undefined) bytes = Buffer.from(f.command.value, 'latin1');
        if (!bytes || bytes.length === 0 || bytes.length > limits.maxBytes) throw new ApiError('device-fail');
        const priority = (f.priority.value ?? 0) as 0 | 1 | 2;
        const id = await submit(req, bytes, priority, f.lifetime.value ?? limits.defaultLifetimeMs);
        return send(reply, 200, id);
      },
    },
    {
      method: 'POST',
      path: '/0/devices/{id}/{command}',
      operationId: 'sendCommandInPath',
      tag: 'Commands',
      summary: 'Send a command, named in the path (the spelling of older clients)',
      description:
        'The command is the last path segment (percent-encoded); the body is not read. Default priority and ' +
        `lifetime. A segment that names a part of the device (\`d\`, \`s\`, \`meta\`, \`fw\`, \`firmware\`, ` +
        `\`commands\`, \`users\`) is not a command. ${who}`,
      session: 'required',
      failToken: 'device-fail',
      responses: {
        200: accepted,
        400: {
          description:
            'No device the user may see; a segment that is not printable ASCII once decoded, longer than ' +
            `\`commands.maxBytes\` (${limits.maxBytes}) bytes (or 256 characters as sent), or one of the reserved ` +
            `names; ${full}; or a malformed body.`,
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
      },
      // The older clients' spelling: the command as the last path segment, no body, default priority and lifetime.
      handler: async (req, reply) => {
        userOf(req);
        const command = (req.params as { command?: string }).command ?? '';
        if (
          RESERVED_SEGMENTS.has(command) ||
          !PRINTABLE_ASCII_RE.test(command) ||
          Buffer.byteLength(command, 'latin1') > limits.maxBytes
        ) {
          throw new ApiError('device-fail');
        }
        const id = await submit(req, Buffer.from(command, 'latin1'), 0, limits.defaultLifetimeMs);
        return send(reply, 200, id);
      },
    },
    {
      method: 'GET',
      path: '/0/devices/{id}/commands/',
      operationId: 'listCommands',
      tag: 'Commands',
      summary: "The device's commands and their states",
      description:
        'An extension (docs/decisions.md §6): command objects, newest first. States: `queued` (on the bridge), ' +
        '`sent` (handed to the broker; `delivered` is set once the device has stored it), `running`, `done`, ' +
        '`failed`, `expired`. Commands are kept until the device is unregistered. ' +
        `${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      failToken: 'device-fail',
      query: CommandListQuery,
      responses: {
        200: { description: 'The commands; `[]` when there are none.', json: named('CommandList', CommandList) },
        400: {
          description: '`latest` is not a non-negative integer (or is given twice).',
          tokens: [token('device-fail')],
        },
        401: NO_SESSION,
        404: DEVICE_NOT_FOUND,
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        if (!seen) throw new ApiError('device-not-found');
        const q = readForm(query(req), CommandListQuery);
        if (!q.latest.ok) throw new ApiError('device-fail');
        const asked = q.latest.value === undefined ? 100 : Number(q.latest.value);
        const limit = asked === 0 || asked > 1000 ? 1000 : asked;
        const list = await store.commands.ofDevice(seen.device.id, limit);
        return sendJson(reply, `[${list.map(renderCommand).join(',')}]`);
      },
    },
    {
      method: 'GET',
      path: '/0/devices/{id}/commands/{cmd}',
      operationId: 'getCommand',
      tag: 'Commands',
      summary: 'One command and its state',
      description:
        'An extension (docs/decisions.md §6): the command object. A finished command has `finished`, and, when the ' +
        'device ran a program, `exitCode` or `signal` and the end of its output (`output`, `truncated` when cut); ' +
        `\`reason\` says why it failed or expired. ${who} \`Cache-Control: no-store\`.`,
      session: 'required',
      responses: {
        200: { description: 'The command object.', json: named('Command', CommandObject) },
        401: NO_SESSION,
        404: {
          ...DEVICE_NOT_FOUND,
          description:
            '`device-fail`: no device the user may see, or no command with this uuid on this device. `not found`: ' +
            'an unknown frontend.',
        },
      },
      handler: async (req, reply) => {
        const seen = await visible(req, userOf(req));
        const id = ((req.params as { cmd?: string }).cmd ?? '').toLowerCase();
        const c = seen && UUID_RE.test(id) ? await store.commands.get(id) : undefined;
        if (!c || c.deviceId !== seen?.device.id) throw new ApiError('device-not-found');
        return sendJson(reply, renderCommand(c));
      },
    },
  ];
}
