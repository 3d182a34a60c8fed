/**
 * The command form of `POST /0/devices/<id>/` (decisions 12 and 13) and the command object of the status routes.
 */
import { z } from 'zod';
import { AppField } from '../frontends/schemas.js';

/** Printable ASCII: what `command` may hold; anything else travels as `command64`. */
export const PRINTABLE_ASCII_RE = /^[\x20-\x7e]+$/;
const BASE64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** A form field that may come as text (a form) or as a JSON number. */
const intField = (min: number, max: number) =>
  z
    .union([z.string().regex(/^\d{1,16}$/), z.number().int()])
    .transform((v) => Number(v))
    .pipe(z.number().int().min(min).max(max));

export interface CommandLimits {
  maxBytes: number;
  defaultLifetimeMs: number;
  maxLifetimeMs: number;
}

export function commandForm(l: CommandLimits) {
  return z.object({
    command: z
      .string()
      .max(l.maxBytes)
      .regex(PRINTABLE_ASCII_RE)
      .optional()
      .meta({ description: `The command, printable ASCII, at most ${l.maxBytes} bytes.` }),
    command64: z
      .string()
      .min(4)
      .max(Math.ceil(l.maxBytes / 3) * 4)
      .regex(BASE64_RE)
      .optional()
      .meta({
        description: `The command as base64 (any bytes), at most ${l.maxBytes} bytes decoded; wins over command.`,
      }),
    // The document states the range, which zod cannot derive from the transform: digits as text (a form), or a
    // JSON integer.
    priority: intField(0, 2)
      .optional()
      .meta({
        description: '0 (default), 1 urgent, 2 most urgent.',
        anyOf: [
          { type: 'string', pattern: '^0{0,15}[0-2]$' },
          { type: 'integer', minimum: 0, maximum: 2 },
        ],
      }),
    lifetime: intField(1, l.maxLifetimeMs)
      .optional()
      .meta({
        description: `Milliseconds the command may wait before it runs: 1 to ${l.maxLifetimeMs}, default ${l.defaultLifetimeMs}.`,
        anyOf: [
          { type: 'string', pattern: '^(?=\\d{1,16}$)0*[1-9]\\d*$' },
          { type: 'integer', minimum: 1, maximum: l.maxLifetimeMs },
        ],
      }),
    app: AppField,
  });
}

export const CommandListQuery = z.object({
  latest: z
    .string()
    .regex(/^\d{1,15}$/)
    .optional()
    .meta({ description: 'How many commands, newest first: 1 to 1000 (default 100); 0 or more than 1000 means 1000.' }),
  app: AppField,
});

export const CommandObject = z.object({
  id: z.string(),
  command: z.string().optional().meta({ description: 'The command, when it is printable ASCII.' }),
  command64: z.string().optional().meta({ description: 'The command as base64, when it is not printable ASCII.' }),
  priority: z.number().int(),
  state: z.enum(['queued', 'sent', 'running', 'done', 'failed', 'expired']),
  created: z.number().int(),
  expires: z.number().int(),
  sent: z.number().int().nullable(),
  delivered: z.number().int().nullable().meta({ description: 'When the device reported it queued.' }),
  started: z.number().int().nullable(),
  finished: z.number().int().nullable(),
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  output: z.string().nullable().meta({ description: 'The end of the output, at most 4 KiB.' }),
  truncated: z.boolean(),
  reason: z.string().nullable(),
});
export const CommandList = z.array(CommandObject);
