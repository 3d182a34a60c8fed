/**
 * How rules and events are shown (docs/notifications.md): the JSON of `GET /0/user/event/`, of `GET
 * /0/user/events/`, of the live channel's `user-event` and of a webhook's body, and their schemas for the API
 * document.
 */
import { z } from 'zod';
import type { Rule, UserEvent } from './store.js';

/** A value as text when it is UTF-8, else as base64 (as variables are shown, decision 9). */
function valueFields(value: Buffer | null): { value: string | null; value64?: string } {
  if (value === null) return { value: null };
  const text = value.toString('utf8');
  if (Buffer.from(text, 'utf8').equals(value)) return { value: text };
  return { value: null, value64: value.toString('base64') };
}

/** A rule's state as its user sees it: `armed` (waiting for its condition), `pending` (a `for` runs), `fired`. */
export function ruleState(r: Rule, level: boolean): 'armed' | 'pending' | 'fired' {
  if (!level || !r.active) return 'armed';
  return r.pendingSince === null ? 'fired' : 'pending';
}

export function ruleJson(r: Rule, level: boolean) {
  return {
    id: r.id,
    name: r.name,
    message: r.message,
    trigger: r.trigger,
    deviceid: r.deviceId,
    email: r.email,
    webhook: r.webhookUrl,
    webhookSecret: r.webhookSecret,
    state: ruleState(r, level),
    created: r.createdAt,
    updated: r.updatedAt,
    lastFired: r.firedAt,
  };
}

export function eventJson(e: UserEvent) {
  return {
    id: e.id,
    type: 'user-event' as const,
    rule: e.ruleId,
    name: e.name,
    message: e.message,
    deviceid: e.deviceId,
    trigger: e.trigger,
    variable: e.varType === null || e.varName === null ? null : { type: e.varType, name: e.varName },
    ...valueFields(e.value),
    time: e.at,
    test: e.test,
    email: e.emailState,
    webhook:
      e.webhookUrl === null
        ? null
        : {
            url: e.webhookUrl,
            state: e.webhookState,
            attempts: e.webhookAttempts,
            status: e.webhookStatus,
            error: e.webhookError,
            at: e.webhookAt,
          },
  };
}

/** A webhook's body: the event without its own delivery outcomes. */
export function webhookBody(e: UserEvent): string {
  const { webhook, email, ...rest } = eventJson(e);
  void webhook;
  void email;
  return JSON.stringify(rest);
}

/** The live channel's frame of one fired rule, keyed by the event's number (docs/api.md, "Frames"), as the official client reads it. */
export function userEventFrame(e: UserEvent): string {
  return JSON.stringify({ events: { [String(e.id)]: eventJson(e) } });
}

const ms = (what: string) =>
  z
    .number()
    .int()
    .meta({ description: `${what}, ms since the epoch.` });

export const RuleOut = z.object({
  id: z.number().int().meta({ description: 'Its number, in `/0/user/event/<id>`.' }),
  name: z.string(),
  message: z.string(),
  trigger: z.string().meta({ description: 'The trigger in its canonical spelling (docs/notifications.md).' }),
  deviceid: z.string(),
  email: z.boolean().meta({ description: "Each event is also e-mailed to the user's login." }),
  webhook: z.string().nullable().meta({ description: 'The URL each event is POSTed to; `null`: none.' }),
  webhookSecret: z
    .string()
    .nullable()
    .meta({ description: 'The key the webhook bodies are signed with (HMAC-SHA256); `null` without a webhook.' }),
  state: z.enum(['armed', 'pending', 'fired']).meta({
    description:
      '`armed`: waiting for the condition; `pending`: it holds and its `for` runs; `fired`: it fired and waits for ' +
      'the condition to end.',
  }),
  created: ms('When it was made'),
  updated: ms('When it last changed'),
  lastFired: ms('When it last delivered an event').nullable(),
});
export const RuleList = z.array(RuleOut);

export const EventOut = z.object({
  id: z.number().int(),
  type: z.literal('user-event'),
  rule: z.number().int().nullable().meta({ description: 'The rule that fired (it may have been removed since).' }),
  name: z.string(),
  message: z.string(),
  deviceid: z.string(),
  trigger: z.string(),
  variable: z
    .object({ type: z.enum(['d', 's', 'meta']), name: z.string() })
    .nullable()
    .meta({ description: 'The variable the trigger watches; `null` for `command failed` and tests of one.' }),
  value: z.string().nullable().meta({ description: "The variable's value when the rule fired; `null`: none." }),
  value64: z.string().optional().meta({ description: 'Instead of `value` when the value is not valid UTF-8.' }),
  time: ms('When it fired'),
  test: z.boolean().meta({ description: 'Fired by `POST /0/user/event/<id>` without fields.' }),
  email: z
    .enum(['pending', 'sent', 'failed', 'skipped'])
    .nullable()
    .meta({ description: 'The e-mail: `null` when the rule sends none.' }),
  webhook: z
    .object({
      url: z.string(),
      state: z.enum(['pending', 'delivered', 'failed']).nullable(),
      attempts: z.number().int(),
      status: z.number().int().nullable().meta({ description: "The receiver's last HTTP status." }),
      error: z.string().nullable().meta({ description: 'Why the last attempt failed.' }),
      at: ms('The last attempt').nullable(),
    })
    .nullable(),
});
export const EventList = z.array(EventOut);
