/**
 * Commands: `POST /0/devices/<id>/` (the specification, decision 13), the older clients' spelling
 * `POST /0/devices/<id>/<command>` with no body, and the status extension `GET /0/devices/<id>/commands/` and
 * `GET /0/devices/<id>/commands/<uuid>` (DESIGN section 6).
 *
 * Who may send commands and read their status: whoever may change the device's variables (access.ts).
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type RouteContext, bodyIsFields, fields, query, readForm, send } from '../app.js';
import { deviceAccess, sendJson } from '../devices/access.js';
import { ApiError } from '../errors.js';
import { CommandListQuery, PRINTABLE_ASCII_RE, commandForm } from './schemas.js';
import type { StoredCommand } from './store.js';

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Path segments under a device that are not commands of the older clients' spelling. */
const RESERVED_SEGMENTS: ReadonlySet<string> = new Set(['d', 's', 'meta', 'fw', 'firmware', 'commands']);

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

export function registerCommandRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { config, store, commands } = ctx;
  const { userOf, visible } = deviceAccess(ctx);
  const limits = config.commands;
  const Form = commandForm(limits);

  async function submit(req: FastifyRequest, command: Buffer, priority: 0 | 1 | 2, lifetime: number) {
    const user = userOf(req);
    const seen = visible(req, user);
    if (!seen) throw new ApiError('device-fail');
    const outcome = await commands.submit(seen.device.id, user.id, command, priority, lifetime);
    if (!outcome.ok) throw new ApiError('device-fail');
    return outcome.id;
  }

  app.post('/0/devices/:id', { config: { failToken: 'device-fail' } }, async (req, reply) => {
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
  });

  // The older clients' spelling: the command as the last path segment, no body, default priority and lifetime.
  app.post('/0/devices/:id/:command', { config: { failToken: 'device-fail' } }, async (req, reply) => {
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
  });

  app.get('/0/devices/:id/commands', { config: { failToken: 'device-fail' } }, async (req, reply) => {
    const seen = visible(req, userOf(req));
    if (!seen) throw new ApiError('device-not-found');
    const q = readForm(query(req), CommandListQuery);
    if (!q.latest.ok) throw new ApiError('device-fail');
    const asked = q.latest.value === undefined ? 100 : Number(q.latest.value);
    const limit = asked === 0 || asked > 1000 ? 1000 : asked;
    const list = store.commands.ofDevice(seen.device.id, limit);
    return sendJson(reply, `[${list.map(renderCommand).join(',')}]`);
  });

  app.get('/0/devices/:id/commands/:cmd', async (req, reply) => {
    const seen = visible(req, userOf(req));
    const id = ((req.params as { cmd?: string }).cmd ?? '').toLowerCase();
    const c = seen && UUID_RE.test(id) ? store.commands.get(id) : undefined;
    if (!c || c.deviceId !== seen?.device.id) throw new ApiError('device-not-found');
    return sendJson(reply, renderCommand(c));
  });
}
