/**
 * User data: the form of `POST /0/user/` and the user object of `GET /0/user/` (the specification's User
 * object; decision 17 for the authcode). Read by the routes, documented by `bridge/openapi.ts`.
 */
import { z } from 'zod';

/**
 * Any field with a string value, merged into the user's `data`: every name is data, `app`, `__proto__`,
 * `constructor` and `prototype` among them (decision 25; the frontend of this route is not read from its body).
 * A value that is not a string answers 400 `user-data-failed`. The route reads the body with `userDataFields`,
 * which keeps every name; this schema documents it.
 */
export const UserDataForm = z.object({}).catchall(z.string());

/**
 * The fields of a `POST /0/user/` body, or `undefined` when it is not a set of string fields. A map with no
 * prototype, so that no name (`__proto__` above all) is anything but a key: a schema or an object literal would
 * treat `__proto__` as the object's prototype and drop it.
 */
export function userDataFields(body: unknown): Map<string, string> | undefined {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const out = new Map<string, string>();
  for (const name of Object.keys(body)) {
    const value = (body as Record<string, unknown>)[name];
    if (typeof value !== 'string') return undefined;
    out.set(name, value);
  }
  return out;
}

/**
 * The stored data with `incoming` merged over it, as JSON text. Built on an object with no prototype, so that a
 * field named `__proto__` is an own key like any other and `JSON.stringify` writes it.
 */
export function mergeUserData(stored: string, incoming: ReadonlyMap<string, string>): string {
  const data = Object.create(null) as Record<string, unknown>;
  const old = JSON.parse(stored) as Record<string, unknown>;
  for (const name of Object.keys(old)) data[name] = old[name];
  for (const [name, value] of incoming) data[name] = value;
  return JSON.stringify(data);
}

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
