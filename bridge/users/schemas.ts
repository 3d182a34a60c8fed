/**
 * User data: the form of `POST /0/user/` and the user object of `GET /0/user/` (the specification's User
 * object; decision 17 for the authcode). Read by the routes, documented by `bridge/openapi.ts`.
 */
import { z } from 'zod';
import { AppField } from '../frontends/schemas.js';

/**
 * Any field with a string value, merged into the user's `data`. `app` names the frontend (decision 15) and is
 * not data; any other value that is not a string answers 400 `user-data-fail`.
 */
export const UserDataForm = z
  .object({ app: AppField })
  .catchall(z.string())
  .transform(({ app: _app, ...data }): Record<string, string> => data);

export const UserObject = z.object({
  login: z.string().meta({ description: 'The login, in lower case.' }),
  confirmed: z.boolean().meta({ description: 'Whether the e-mail address was confirmed through its link.' }),
  authcode: z
    .string()
    .regex(/^[0-9a-f]{32}$/)
    .meta({
      description: '128 random bits in lowercase hex; rotated every 24 h, the previous one still matches for 1 h.',
    }),
  data: z.record(z.string(), z.string()).meta({ description: 'The fields set with `POST /0/user/`, merged.' }),
});
export type UserObject = z.infer<typeof UserObject>;
