/**
 * User data: `GET /0/user/` (login, confirmed, authcode, data) and `POST /0/user/` merging string fields into
 * `data`, 413 `user-data-failed` over the limit. The authcode rotates every 24 hours; the previous one still
 * matches for an hour (decision 17).
 */
import type { FastifyInstance } from 'fastify';
import { type RouteContext, send } from '../app.js';
import { ApiError } from '../errors.js';
import { newAuthcode } from '../sessions/routes.js';
import type { BridgeStore, User } from '../store/types.js';
import { UserDataForm } from './schemas.js';

export const AUTHCODE_ROTATE_MS = 24 * 3_600_000;
export const AUTHCODE_GRACE_MS = 3_600_000;

/** The user's authcode now, rotating it first when it is older than a day. */
export async function currentAuthcode(store: BridgeStore, user: User, now: number): Promise<string> {
  if (now - user.authcodeRotatedAt < AUTHCODE_ROTATE_MS) return user.authcode;
  return store.write(() => {
    // Read again inside the transaction: a concurrent request may have rotated it already.
    const fresh = store.userById(user.id);
    if (!fresh || now - fresh.authcodeRotatedAt < AUTHCODE_ROTATE_MS) return fresh?.authcode ?? user.authcode;
    const authcode = newAuthcode();
    store.updateUser(user.id, { authcode, authcodePrev: fresh.authcode, authcodeRotatedAt: now });
    return authcode;
  });
}

/** The user an authcode heard from a phone belongs to: the current one, or the previous one within its hour. */
export function userOfAuthcode(store: BridgeStore, authcode: string, now: number): User | undefined {
  const user = store.userByAuthcode(authcode);
  if (!user) return undefined;
  if (user.authcode === authcode) return user;
  return now - user.authcodeRotatedAt < AUTHCODE_GRACE_MS ? user : undefined;
}

export function registerUserRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { store, config, now } = ctx;

  app.get('/0/user', async (req, reply) => {
    const user = req.user;
    // The specification: 404 when there is no user session.
    if (!user) throw new ApiError('not-found');
    const authcode = await currentAuthcode(store, user, now());
    return reply
      .code(200)
      .header('cache-control', 'no-store')
      .type('application/json; charset=utf-8')
      .send(
        `{"login":${JSON.stringify(user.login)},"confirmed":${user.confirmed},"authcode":"${authcode}","data":${user.data}}`,
      );
  });

  app.post('/0/user', { config: { failToken: 'user-data-fail' } }, async (req, reply) => {
    const user = req.user;
    if (!user) throw new ApiError('no-session');
    // The body itself, not `fields(req)`: a JSON body that is not an object (an array, a string, a number,
    // null) or a text/plain body is not a set of fields (decision 4), where `fields` would read it as none.
    const form = UserDataForm.safeParse(req.body === undefined ? {} : req.body);
    if (!form.success) throw new ApiError('user-data-fail');
    const incoming = form.data;
    const limit = config.accounts.userDataBytes;
    const outcome = await store.write(() => {
      // Merged inside the transaction, so that concurrent posts do not lose each other's fields.
      const fresh = store.userById(user.id);
      if (!fresh) return 'gone' as const;
      const data = { ...(JSON.parse(fresh.data) as Record<string, unknown>), ...incoming };
      const text = JSON.stringify(data);
      if (Buffer.byteLength(text, 'utf8') > limit) return 'too-large' as const;
      store.updateUser(user.id, { data: text });
      return 'ok' as const;
    });
    if (outcome === 'too-large') throw new ApiError('user-data-failed');
    if (outcome === 'gone') throw new ApiError('no-session');
    return send(reply, 200, 'user-data-ok');
  });
}
