/**
 * The request forms of the session routes (docs/decisions.md, principle 3: parse at the edge). Each route reads its fields
 * through these schemas, and `bridge/openapi.ts` turns the same schemas into the API document, so that what is
 * documented is what is enforced. The bounds come from the `accounts` config (decision 12).
 */
import { z } from 'zod';
import type { BridgeConfig } from '../config.js';
import { AppField } from '../frontends/schemas.js';

export type AccountLimits = Pick<BridgeConfig['accounts'], 'loginMax' | 'passwordMin' | 'passwordMax'>;

/**
 * Decision 12: a login is an e-mail address of at most `max` characters. Surrounding spaces are dropped and
 * logins compare in lower case, so the parsed value is the normalised login.
 */
export function LoginField(max: number) {
  return z
    .string()
    .trim()
    .toLowerCase()
    .max(max)
    .regex(z.regexes.email)
    .meta({ format: 'email', description: `An e-mail address, at most ${max} characters; case-insensitive.` });
}

/** Decision 12: a new password (signup, reset). */
export function NewPasswordField(a: AccountLimits) {
  return z
    .string()
    .min(a.passwordMin)
    .max(a.passwordMax)
    .meta({ description: `Cleartext, ${a.passwordMin} to ${a.passwordMax} characters.` });
}

export function sessionForms(a: AccountLimits) {
  return {
    /** `POST /0/session/logout` takes no parameters but the frontend. */
    none: z.object({ app: AppField }),
    /** `POST /0/session/`: with `token`, the session of an access token's user (decision 30). */
    session: z.object({
      token: z
        .string()
        .max(1024)
        .optional()
        .meta({
          description:
            "An access token (`POST /0/user/accesstoken`): the new session is its user's. Absent or empty: an " +
            'anonymous session, unless the request has a valid one.',
        }),
      app: AppField,
    }),
    login: z.object({
      login: LoginField(a.loginMax),
      // No lower bound: a password set under an older, lower minimum still logs in.
      password: z
        .string()
        .max(a.passwordMax)
        .meta({ description: `Cleartext, at most ${a.passwordMax} characters.` }),
      app: AppField,
    }),
    signup: z.object({ login: LoginField(a.loginMax), password: NewPasswordField(a), app: AppField }),
  } as const;
}
