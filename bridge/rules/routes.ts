/**
 * The notification routes (docs/notifications.md): a user's rules under `/0/user/event/`, and the log of the events
 * they fired at `/0/user/events/`, as the official client's `getNotifications`, `addNotification`,
 * `updateNotification`, `getNotification`, `testNotification`, `removeNotification` and `getEvents` call them.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { DEVICE_ID_RE } from '../../protocol/index.js';
import { ApiError } from '../errors.js';
import { AppField } from '../frontends/schemas.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send, sendJson } from '../http/reply.js';
import { bodyIsFields, fields, query, readForm } from '../http/request.js';
import { type Route, named } from '../http/route.js';
import { HISTORY_MAX } from '../devices/schemas.js';
import type { StoreTx, User } from '../store/types.js';
import type { RuleEngine } from './engine.js';
import type { Rule, RulePatch } from './store.js';
import {
  type Trigger,
  TRIGGER_MAX_LENGTH,
  formatTrigger,
  forMsOf,
  isLevel,
  parseTrigger,
  watchedVar,
} from './trigger.js';
import { EventList, RuleList, RuleOut, eventJson, ruleJson } from './view.js';
import { MAX_WEBHOOK_URL_LENGTH, checkWebhookUrl } from './webhook.js';

export const RULE_NAME_MAX = 100;
export const RULE_MESSAGE_MAX = 1000;

/** A flag as a form or a JSON body sends it. */
const Flag = z.union([z.boolean(), z.enum(['true', 'false', '1', '0']).transform((s) => s === 'true' || s === '1')]);

export const RuleForm = z.object({
  name: z
    .string()
    .trim()
    .min(1)
    .max(RULE_NAME_MAX)
    .meta({ description: `The rule's name, 1 to ${RULE_NAME_MAX} characters: the subject of its e-mail.` }),
  message: z
    .string()
    .max(RULE_MESSAGE_MAX)
    .meta({ description: `What the event says, up to ${RULE_MESSAGE_MAX} characters.` }),
  trigger: z.string().meta({
    description: `When it fires, in the trigger language (docs/notifications.md), ${TRIGGER_MAX_LENGTH} characters at most.`,
  }),
  deviceid: z
    .string()
    .toLowerCase()
    .regex(DEVICE_ID_RE)
    .meta({ description: 'The device it watches: one the user owns or has shared with them.' }),
  email: Flag.meta({ description: "`true`: each event is also e-mailed to the user's login." }),
  webhook: z
    .string()
    .max(MAX_WEBHOOK_URL_LENGTH)
    .meta({ description: 'A URL each event is POSTed to, signed (docs/notifications.md, "Webhooks"); empty: none.' }),
  app: AppField,
});

/** The fields that make a `POST /0/user/event/<id>` an update; without any of them it is a test. */
const RULE_FIELDS = ['name', 'message', 'trigger', 'deviceid', 'email', 'webhook'] as const;

const EventsQuery = z.object({
  latest: z
    .string()
    .regex(/^\d{1,15}$/)
    .optional()
    .meta({ description: `How many events, newest first: 1 to ${HISTORY_MAX}; 0, more, or none mean ${HISTORY_MAX}.` }),
  from: z
    .string()
    .regex(/^\d{1,15}$/)
    .optional()
    .meta({ description: 'Page backwards: only events with an id below this one.' }),
  app: AppField,
});

export const TriggerErrorOut = z.object({
  error: z.literal('event-fail-trigger'),
  position: z.number().int().meta({ description: 'Where in `trigger` the error is, counted from 0.' }),
  line: z.number().int(),
  column: z.number().int(),
  message: z.string(),
});

const RULE_ID_RE = /^[1-9]\d{0,14}$/;

export function ruleRoutes(ctx: RouteContext, engine: RuleEngine): Route[] {
  const { store, config, now, log, events } = ctx;
  const n = config.notifications;

  const userOf = (req: FastifyRequest): User => {
    if (!req.user) throw new ApiError('no-session');
    return req.user;
  };
  const ruleIdOf = (req: FastifyRequest): number | undefined => {
    const raw = (req.params as { id?: string }).id ?? '';
    return RULE_ID_RE.test(raw) ? Number(raw) : undefined;
  };
  /** A stored rule's trigger: stored triggers parse; `undefined` only for one a newer bridge's language wrote. */
  const storedTrigger = (r: Rule): Trigger | undefined => {
    const p = parseTrigger(r.trigger);
    return p.ok ? p.trigger : undefined;
  };
  const levelOf = (r: Rule) => {
    const t = storedTrigger(r);
    return t !== undefined && isLevel(t);
  };
  const show = (r: Rule) => ruleJson(r, levelOf(r));

  /** Whether the user may put a rule on the device: owns it, or has it shared (decision 23). */
  const mayWatch = async (tx: StoreTx, user: User, deviceId: string): Promise<boolean> => {
    const device = await tx.devices.device(deviceId);
    if (!device || device.ownerId === null) return false;
    return device.ownerId === user.id || (await tx.devices.isSharedWith(deviceId, user.id));
  };

  /** The trigger parsed, or the 400 with where it is wrong, answered here. */
  const triggerOf = (text: string, reply: FastifyReply): Trigger | undefined => {
    const p = parseTrigger(text);
    if (p.ok) return p.trigger;
    void sendJson(reply, JSON.stringify({ error: 'event-fail-trigger', ...p.error }), 400);
    return undefined;
  };

  /** What a `changed` rule compares its first change with: the variable's value now. */
  const valueNow = async (tx: StoreTx, deviceId: string, t: Trigger): Promise<Buffer | null> => {
    if (t.kind !== 'changed') return null;
    const ref = watchedVar(t);
    if (!ref) return null;
    return (await tx.devices.getVar(deviceId, ref.type, ref.name))?.value ?? null;
  };

  /**
   * The webhook field's URL (`null`: none), or `event-fail-webhook`. A text too long for the field's schema is
   * refused here too, as a URL the bridge may not POST to (docs/notifications.md, "Rules"); not text is malformed.
   */
  const webhookOf = (value: unknown): string | null => {
    if (typeof value !== 'string') throw new ApiError('event-fail');
    if (value === '') return null;
    const c = checkWebhookUrl(value, n.webhook);
    if (!c.ok) throw new ApiError('event-fail-webhook');
    return c.url.href;
  };

  const changed = (...deviceIds: string[]) => {
    for (const deviceId of new Set(deviceIds)) events.publish({ type: 'rules.changed', deviceId });
  };

  const formDescription =
    '`name`, `message`, `trigger`, `deviceid`, and optionally `email` and `webhook` (docs/notifications.md, "Rules").';

  return [
    {
      method: 'GET',
      path: '/0/user/event/',
      operationId: 'listRules',
      tag: 'Notifications',
      summary: "The user's rules",
      description: "The user's notification rules, oldest first (the official client's `getNotifications`).",
      session: 'required',
      responses: {
        200: { description: 'The rules; `[]` when there are none.', json: named('RuleList', RuleList) },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        return sendJson(reply, JSON.stringify((await store.rules.ofUser(user.id)).map(show)));
      },
    },
    {
      method: 'POST',
      path: '/0/user/event/',
      operationId: 'createRule',
      tag: 'Notifications',
      summary: 'Make a rule',
      description:
        `A new rule (the official client's \`addNotification\`): ${formDescription} It starts armed: it fires at ` +
        'the first change that makes its condition hold. A user holds at most `notifications.rulesPerUser` ' +
        `(${n.rulesPerUser}) rules.`,
      session: 'required',
      failToken: 'event-fail',
      form: named('RuleForm', RuleForm),
      responses: {
        201: { description: "The rule's number, as text.", text: z.string().regex(/^\d+$/) },
        400: {
          description:
            '`event-fail-trigger` (JSON, with where): a trigger that does not parse. `event-fail-device`: no device ' +
            'of that id the user owns or has shared. `event-fail-webhook`: a webhook URL the bridge may not POST to. ' +
            `\`event-fail-limit\`: the user has ${n.rulesPerUser} rules. \`event-fail\`: a field missing or malformed.`,
          tokens: [
            token('event-fail'),
            token('event-fail-device'),
            token('event-fail-webhook'),
            token('event-fail-limit'),
          ],
          json: named('TriggerError', TriggerErrorOut),
        },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        if (!bodyIsFields(req)) throw new ApiError('event-fail');
        const raw = fields(req);
        const f = readForm(raw, RuleForm);
        if (!f.name.ok || !f.trigger.ok || !f.deviceid.ok) throw new ApiError('event-fail');
        const has = (k: string) => Object.hasOwn(raw, k);
        if ((has('message') && !f.message.ok) || (has('email') && !f.email.ok)) throw new ApiError('event-fail');
        if (has('webhook') && typeof raw.webhook !== 'string') throw new ApiError('event-fail');
        const trigger = triggerOf(f.trigger.value, reply);
        if (!trigger) return reply;
        const webhookUrl = has('webhook') ? webhookOf(raw.webhook) : null;
        const deviceId = f.deviceid.value;
        const name = f.name.value;
        const message = f.message.ok ? f.message.value : '';
        const email = f.email.ok ? f.email.value : false;
        const t = now();
        const made = await store.write(async (tx) => {
          // The user's row is locked (PostgreSQL), so that two requests at once cannot both pass the count.
          await tx.userById(user.id, { forUpdate: true });
          if (!(await mayWatch(tx, user, deviceId))) return 'device' as const;
          if ((await tx.rules.countOfUser(user.id)) >= n.rulesPerUser) return 'limit' as const;
          return tx.rules.create({
            userId: user.id,
            deviceId,
            name,
            message,
            trigger: formatTrigger(trigger),
            forMs: forMsOf(trigger),
            email,
            webhookUrl,
            webhookSecret: webhookUrl === null ? null : randomBytes(32).toString('base64url'),
            createdAt: t,
            lastValue: await valueNow(tx, deviceId, trigger),
          });
        });
        if (made === 'device') throw new ApiError('event-fail-device');
        if (made === 'limit') throw new ApiError('event-fail-limit');
        changed(deviceId);
        log.info({ event: 'rules.created', userId: user.id, ruleId: made.id, deviceId });
        return send(reply, 201, String(made.id));
      },
    },
    {
      method: 'GET',
      path: '/0/user/event/{id}',
      operationId: 'getRule',
      tag: 'Notifications',
      summary: 'One rule',
      description: "One of the user's rules (the official client's `getNotification`), with its state.",
      session: 'required',
      responses: {
        200: { description: 'The rule.', json: named('Rule', RuleOut) },
        401: NO_SESSION,
        404: {
          description: '`event-fail`: the user has no rule of that number. `not found`: an unknown frontend.',
          tokens: [token('event-not-found'), token('not-found')],
        },
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        const id = ruleIdOf(req);
        const rule = id === undefined ? undefined : await store.rules.get(user.id, id);
        if (!rule) throw new ApiError('event-not-found');
        return sendJson(reply, JSON.stringify(show(rule)));
      },
    },
    {
      method: 'POST',
      path: '/0/user/event/{id}',
      operationId: 'updateOrTestRule',
      tag: 'Notifications',
      summary: 'Change a rule, or fire it as a test',
      description:
        `With any of ${formDescription.replace(', and optionally', ',')} those fields change (the official ` +
        "client's `updateNotification`); a new trigger or device starts the rule armed again. Without any of " +
        "them (the official client's `testNotification`) the rule fires once as a test, whatever its condition, " +
        'through all its deliveries; the event is marked `test` and counts against the per-user event limit.',
      session: 'required',
      failToken: 'event-fail',
      form: named('RuleForm', RuleForm),
      responses: {
        200: { description: 'Changed.', tokens: ['event-ok'] },
        201: { description: "A test: the new event's number, as text.", text: z.string().regex(/^\d+$/) },
        400: {
          description:
            '`event-fail`: the user has no rule of that number; a field malformed. `event-fail-trigger` (JSON), ' +
            '`event-fail-device`, `event-fail-webhook`: as when making one.',
          tokens: [token('event-fail'), token('event-fail-device'), token('event-fail-webhook')],
          json: named('TriggerError', TriggerErrorOut),
        },
        401: NO_SESSION,
        429: {
          description:
            'A test over the per-user event limit (`notifications.userEventsLimit`); retry after `Retry-After` ' +
            'seconds (the length of `notifications.userEventsWindowMs`).',
          tokens: [token('too-many-requests')],
          retryAfter: true,
        },
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        const id = ruleIdOf(req);
        if (id === undefined || !bodyIsFields(req)) throw new ApiError('event-fail');
        const raw = fields(req);
        const given = RULE_FIELDS.filter((k) => Object.hasOwn(raw, k) && raw[k] !== undefined);
        if (given.length === 0) {
          const rule = await store.rules.get(user.id, id);
          if (!rule) throw new ApiError('event-fail');
          const event = await engine.test(rule);
          if (event === 'limited') throw new ApiError('too-many-requests', n.userEventsWindowMs);
          return send(reply, 201, String(event.id));
        }
        const f = readForm(raw, RuleForm);
        for (const k of given) {
          if (k === 'webhook' ? typeof raw.webhook !== 'string' : !f[k].ok) throw new ApiError('event-fail');
        }
        let trigger: Trigger | undefined;
        if (f.trigger.ok) {
          trigger = triggerOf(f.trigger.value, reply);
          if (!trigger) return reply;
        }
        const webhookUrl = given.includes('webhook') ? webhookOf(raw.webhook) : undefined;
        const t = now();
        const done = await store.write(async (tx) => {
          const rule = await tx.rules.get(user.id, id);
          if (!rule) return 'missing' as const;
          const deviceId = f.deviceid.ok ? f.deviceid.value : undefined;
          if (deviceId !== undefined && deviceId !== rule.deviceId && !(await mayWatch(tx, user, deviceId))) {
            return 'device' as const;
          }
          const patch: RulePatch = { updatedAt: t };
          if (f.name.ok) patch.name = f.name.value;
          if (f.message.ok) patch.message = f.message.value;
          if (f.email.ok) patch.email = f.email.value;
          if (webhookUrl !== undefined) {
            patch.webhookUrl = webhookUrl;
            // A new receiver keeps the key it was given, one that had none gets one; none without a receiver.
            patch.webhookSecret =
              webhookUrl === null ? null : (rule.webhookSecret ?? randomBytes(32).toString('base64url'));
          }
          const newDevice = deviceId !== undefined && deviceId !== rule.deviceId ? deviceId : undefined;
          const newTrigger = trigger !== undefined && formatTrigger(trigger) !== rule.trigger ? trigger : undefined;
          if (newDevice !== undefined || newTrigger !== undefined) {
            const tr = newTrigger ?? storedTrigger(rule);
            if (newDevice !== undefined) patch.deviceId = newDevice;
            if (newTrigger !== undefined) {
              patch.trigger = formatTrigger(newTrigger);
              patch.forMs = forMsOf(newTrigger);
            }
            patch.lastValue = tr ? await valueNow(tx, newDevice ?? rule.deviceId, tr) : null;
          }
          const updated = await tx.rules.update(user.id, id, patch);
          return updated ? { before: rule, after: updated } : ('missing' as const);
        });
        if (done === 'missing') throw new ApiError('event-fail');
        if (done === 'device') throw new ApiError('event-fail-device');
        changed(done.before.deviceId, done.after.deviceId);
        log.info({ event: 'rules.updated', userId: user.id, ruleId: id, deviceId: done.after.deviceId });
        return send(reply, 200, 'event-ok');
      },
    },
    {
      method: 'DELETE',
      path: '/0/user/event/{id}',
      operationId: 'removeRule',
      tag: 'Notifications',
      summary: 'Remove a rule',
      description:
        "The rule goes (the official client's `removeNotification`); the events it fired stay in the log, and " +
        'their webhook deliveries still waiting end as failed.',
      session: 'required',
      failToken: 'event-fail',
      responses: {
        200: { description: 'Removed.', tokens: ['event-ok'] },
        400: { description: 'The user has no rule of that number.', tokens: [token('event-fail')] },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        const id = ruleIdOf(req);
        const gone = id === undefined ? undefined : await store.write((tx) => tx.rules.remove(user.id, id));
        if (!gone) throw new ApiError('event-fail');
        changed(gone.deviceId);
        log.info({ event: 'rules.removed', userId: user.id, ruleId: gone.id, deviceId: gone.deviceId });
        return send(reply, 200, 'event-ok');
      },
    },
    {
      method: 'GET',
      path: '/0/user/events/',
      operationId: 'listEvents',
      tag: 'Notifications',
      summary: 'The event log',
      description:
        "What the user's rules fired (the official client's `getEvents`), newest first: at most `latest` events " +
        `(1 to ${HISTORY_MAX}; 0, more or none mean ${HISTORY_MAX}), with \`from\` only those with an id below it. ` +
        `Events are kept \`notifications.eventRetentionDays\` (${n.eventRetentionDays}) days.`,
      session: 'required',
      query: EventsQuery,
      failToken: 'event-fail',
      responses: {
        200: { description: 'The events; `[]` when there are none.', json: named('EventList', EventList) },
        400: { description: '`latest` or `from` not a non-negative integer.', tokens: [token('event-fail')] },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req);
        const q = readForm(query(req), EventsQuery);
        if (!q.latest.ok || !q.from.ok) throw new ApiError('event-fail');
        const asked = q.latest.value === undefined ? 0 : Number(q.latest.value);
        const limit = asked === 0 || asked > HISTORY_MAX ? HISTORY_MAX : asked;
        const from = q.from.value === undefined ? undefined : Number(q.from.value);
        const list = await store.rules.events(user.id, limit, from);
        return sendJson(reply, JSON.stringify(list.map(eventJson)));
      },
    },
  ];
}
