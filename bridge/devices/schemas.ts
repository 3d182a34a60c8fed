/**
 * The request forms and path parameters of the device and network routes (docs/decisions.md, principle 3: parse at the
 * edge). The routes read their input through these schemas and `bridge/openapi.ts` documents the same ones.
 */
import { z } from 'zod';
import { DEVICE_ID_RE, VAR_NAME_RE } from '../../protocol/index.js';
import { AppField } from '../frontends/schemas.js';
import { LoginField } from '../sessions/schemas.js';

/** A device auth code: its claim token and its key in `GET /0/network/` (hex, case-insensitive). */
export const AUTHCODE_RE = /^[0-9a-f]{16,128}$/;

/** Decision 10: `latest` at most 1000; `latest=0` and larger values mean 1000. */
export const HISTORY_MAX = 1000;

/** A path's device id: a device uuid, or (a nearby id) a device auth code. Lower-cased. */
export type DeviceRef = { kind: 'uuid'; id: string } | { kind: 'authcode'; authcode: string };

export function parseDeviceRef(raw: string): DeviceRef | undefined {
  const s = raw.toLowerCase();
  if (DEVICE_ID_RE.test(s)) return { kind: 'uuid', id: s };
  if (AUTHCODE_RE.test(s)) return { kind: 'authcode', authcode: s };
  return undefined;
}

export const VarTypeParam = z.enum(['d', 's', 'meta']);
export const VarNameParam = z.string().regex(VAR_NAME_RE);

/** A device auth code, or (to share a device, decision 23) a device uuid. */
const AUTH_OR_ID_RE = new RegExp(`^(?:${AUTHCODE_RE.source.slice(1, -1)}|${DEVICE_ID_RE.source.slice(1, -1)})$`);

/**
 * `POST /0/devices/`: claim a device by its auth code (decision 8), or, with `user`, share a device the user owns,
 * named by its auth code or its uuid (decision 23).
 */
export function claimForm(loginMax: number) {
  return z.object({
    auth: z
      .string()
      .trim()
      .toLowerCase()
      .regex(AUTH_OR_ID_RE)
      .meta({
        description:
          "The device's auth code (hex), as in `GET /0/network/` or from a proximity beacon. With `user`, the " +
          'auth code or the device uuid.',
      }),
    user: LoginField(loginMax)
      .optional()
      .meta({ description: 'Share the device (which the user owns) with the user of this login, in this frontend.' }),
    app: AppField,
  });
}

/** `GET /0/devices/<id>/users/`: the users a device is shared with (decision 23). */
export const ShareList = z.array(
  z.object({
    login: z.string(),
    granted: z.number().int().meta({ description: 'When the device was shared with the user, ms since the epoch.' }),
  }),
);

/**
 * `POST /0/devices/<id>/<type>/<name>`: `value` (text) or `value64` (base64 bytes); `value64` wins when both
 * are sent. Neither, on a `d` variable: a sync (rule 3). Sizes are checked against `devices.maxValueBytes`.
 */
export function variableForm(maxValueBytes: number) {
  return z.object({
    value: z
      .string()
      .optional()
      .meta({ description: `The new value as text, at most ${maxValueBytes} bytes of UTF-8.` }),
    value64: z
      .string()
      .regex(/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/)
      .refine((s) => s.length % 4 === 0, 'not base64')
      .optional()
      .meta({ description: `The new value as base64 (binary values), at most ${maxValueBytes} bytes decoded.` }),
    timestamp: z
      .string()
      .regex(/^\d{1,15}$/)
      .optional()
      .meta({
        description:
          "The version's time, ms since the epoch, instead of the bridge's clock; within `devices.timestampPastMs` " +
          "before and `devices.timestampFutureMs` after the bridge's clock, and after the held version's time.",
      }),
    app: AppField,
  });
}

/** The query of `GET /0/devices/<id>/<type>/<name>`: history with `latest` and `from` (decision 10). */
export const HistoryQuery = z.object({
  latest: z
    .string()
    .regex(/^\d{1,15}$/)
    .optional()
    .meta({ description: 'How many history entries, newest first: 1 to 1000; 0 or more than 1000 means 1000.' }),
  from: z
    .string()
    .regex(/^\d{1,15}$/)
    .optional()
    .meta({ description: 'Page backwards: only entries with an id below this one.' }),
  startid: z
    .string()
    .regex(/^\d{1,15}$/)
    .optional()
    .meta({
      description:
        'Page forwards, as the official client does: the oldest `latest` entries with an id at or above this one ' +
        '(answered newest first). Not together with `from`.',
    }),
  app: AppField,
});

export const ClaimResponse = z.object({ id: z.string().regex(DEVICE_ID_RE) });

const VarRecordOut = z.object({
  value: z.string().optional(),
  value64: z.string().optional().meta({ description: 'Instead of `value` when the value is not valid UTF-8.' }),
  time: z.number().int(),
  acked: z.number().int().optional().meta({ description: '`d` only.' }),
  synced: z.number().int().optional().meta({ description: '`d` only.' }),
  syncacked: z.number().int().optional().meta({ description: '`d` only.' }),
});

export const VariableRecord = VarRecordOut;
export const DeviceObject = z.object({
  d: z.record(z.string(), VarRecordOut),
  s: z.record(z.string(), VarRecordOut),
  meta: z.record(z.string(), VarRecordOut),
});
export const DeviceCollection = z.record(z.string(), DeviceObject);
export const HistoryEntry = z.object({
  key: z.string(),
  value: z.string().meta({
    description:
      'The value as text: `""` for a deletion; for bytes that are not UTF-8, the bytes read as UTF-8 with U+FFFD ' +
      'for each invalid sequence (for display only: `value64` holds the exact bytes).',
  }),
  value64: z.string().optional().meta({ description: 'The exact bytes in base64, when they are not valid UTF-8.' }),
  deleted: z.literal(true).optional().meta({ description: 'The variable was deleted at this point.' }),
  by: z.enum(['device', 'user', 'server']),
  type: VarTypeParam,
  timestamp: z.number().int(),
  id: z.number().int(),
});
export const HistoryList = z.array(HistoryEntry);

/** `GET /0/devices/<id>/<type>`: the variables of one type, keyed by name (rule 5). */
export const VariableList = z.record(z.string(), VariableRecord);
/** `GET /0/devices/<id>/<type>/<name>`: a record (`d`, `s`), a bare value (`meta`), or the history. */
export const VariableAnswer = z.union([VariableRecord, z.string(), HistoryList]);
