/**
 * The request forms and queries of the account routes: resend, recovery and password reset (decision 5), the
 * confirmation link (decision 6) and the recovery page. Read by the routes, documented by `bridge/openapi.ts`.
 */
import { z } from 'zod';
import { AppField } from '../frontends/schemas.js';
import { type AccountLimits, LoginField, NewPasswordField } from '../sessions/schemas.js';

/** A token from an e-mailed link. */
const TokenField = z.string().meta({ description: 'The token from the e-mailed link.' });

export function accountForms(a: AccountLimits) {
  return {
    resend: z.object({ login: LoginField(a.loginMax), app: AppField }),
    /**
     * Decision 5: with `login` alone, a recovery e-mail; with `token` as well, the new `password`, which is then
     * required. A `password` without a `token` is ignored.
     */
    recover: z
      .object({
        login: LoginField(a.loginMax),
        token: TokenField.optional(),
        password: NewPasswordField(a).optional(),
        app: AppField,
      })
      .meta({ dependentRequired: { token: ['password'] } }),
  } as const;
}

/** `GET /0/session/confirm?token=…` (decision 6). */
export const ConfirmQuery = z.object({ token: TokenField, app: AppField });

/**
 * `GET /0/session/recover?login=…&token=…`, the page the recovery link opens. It always renders its form and
 * carries these values into it; a wrong value fails when the form is posted.
 */
export const RecoverPageQuery = z.object({
  login: z.string().meta({ description: 'The login, carried into the form.' }).default('').catch(''),
  token: TokenField.default('').catch(''),
  app: AppField,
});
