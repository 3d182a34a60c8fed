/**
 * User data: `GET /0/user/` (login, confirmed, authcode, data) and `POST /0/user/` merging string fields into
 * `data`, 413 `user-data-failed` over the limit. Reading the user rotates its authcode when it is due (decision 17,
 * `authcode.ts`).
 */
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send } from '../http/reply.js';
import { type Route, named } from '../http/route.js';
import { currentAuthcode } from './authcode.js';
import { UserDataForm, UserObject, mergeUserData, userDataFields } from './schemas.js';

export function userRoutes(ctx: RouteContext): Route[] {
  const { store, config, now } = ctx;
  const bodyLimit = `${config.http.bodyLimit} bytes (\`http.bodyLimit\`)`;

  return [
    {
      method: 'GET',
      path: '/0/user/',
      operationId: 'getUser',
      tag: 'User data',
      summary: 'The user of the session',
      description:
        'Reading it rotates the authcode when it is older than 24 h (decision 17). `Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The user object.', json: named('User', UserObject) },
        404: {
          description: 'No logged-in session (the specification), or an unknown frontend.',
          tokens: [token('not-found')],
        },
      },
      handler: async (req, reply) => {
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
      },
    },
    {
      method: 'POST',
      path: '/0/user/',
      operationId: 'setUserData',
      tag: 'User data',
      summary: 'Merge fields into the user data',
      description:
        'Every field is merged into `data`, whatever its name (`app`, `__proto__` too); fields not sent are kept. ' +
        `The merged object may take at most ${config.accounts.userDataBytes} bytes as JSON ` +
        '(`accounts.userDataBytes`). The frontend of this route is named by the Host header, else by `app` in ' +
        'the query string, else it is the frontend of the session the cookie names, else the default one: a ' +
        'field `app` in the body is user data (decision 25).',
      session: 'required',
      failToken: 'user-data-malformed',
      frontendFrom: 'not-body',
      form: named('UserDataForm', UserDataForm),
      responses: {
        200: { description: 'Merged.', tokens: ['user-data-ok'] },
        400: {
          description: 'A field whose value is not a string (JSON bodies), or a malformed body (decision 29).',
          tokens: [token('user-data-malformed')],
        },
        401: NO_SESSION,
        413: {
          description: `The merged data would exceed the limit, or the body exceeds ${bodyLimit}.`,
          tokens: [token('user-data-failed')],
        },
      },
      handler: async (req, reply) => {
        const user = req.user;
        if (!user) throw new ApiError('no-session');
        // The body itself, not `fields(req)`: a JSON body that is not an object (an array, a string, a number,
        // null) or a text/plain body is not a set of fields (decision 4), where `fields` would read it as none.
        const incoming = userDataFields(req.body === undefined ? {} : req.body);
        if (!incoming) throw new ApiError('user-data-malformed');
        const limit = config.accounts.userDataBytes;
        const outcome = await store.write(async (tx) => {
          // Merged inside the transaction, so that concurrent posts do not lose each other's fields.
          const fresh = await tx.userById(user.id, { forUpdate: true });
          if (!fresh) return 'gone' as const;
          const text = mergeUserData(fresh.data, incoming);
          if (Buffer.byteLength(text, 'utf8') > limit) return 'too-large' as const;
          await tx.updateUser(user.id, { data: text });
          return 'ok' as const;
        });
        if (outcome === 'too-large') throw new ApiError('user-data-failed');
        if (outcome === 'gone') throw new ApiError('no-session');
        return send(reply, 200, 'user-data-ok');
      },
    },
  ];
}
