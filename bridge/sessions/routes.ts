/**
 * Sessions: `POST /0/session/`, `login`, `logout` and `signup`, with the statuses and tokens of the
 * specification's Session table and state table, and decisions 1 to 4, 12 and 25 (a session from an access token).
 */
import { address, guarded, limit } from '../accounts/limits.js';
import { linkOrigin, sendConfirmation } from '../accounts/service.js';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { BAD_REQUEST, BUSY, TOO_MANY, token } from '../http/outcomes.js';
import { send } from '../http/reply.js';
import { fields, readForm } from '../http/request.js';
import { type Route, named } from '../http/route.js';
import { newAuthcode } from '../users/authcode.js';
import { accessTokenOwner } from './accesstokens.js';
import { replaceSession, startSession } from './cookie.js';
import { sessionForms } from './schemas.js';

export function sessionRoutes(ctx: RouteContext): Route[] {
  const { store, config, hasher, now, limits, events } = ctx;
  const forms = sessionForms(config.accounts);
  const NoForm = named('NoForm', forms.none);
  const bodyLimit = `${config.http.bodyLimit} bytes (\`http.bodyLimit\`)`;

  return [
    {
      method: 'POST',
      path: '/0/session/',
      operationId: 'createSession',
      tag: 'Session',
      summary: 'Anonymous session, or the session of an access token',
      description:
        'Without `token`: creates an anonymous session in the frontend unless the request already has a valid ' +
        "one. With `token` (decision 30): replaces the request's session with a new one (a new cookie) of the " +
        "token's user, or, when the token is not valid here, with a new anonymous one.",
      session: 'optional',
      form: named('SessionForm', forms.session),
      responses: {
        200: { description: 'No `token`: the session existed.', tokens: ['user-ok'] },
        201: {
          description: "No `token`: a new anonymous session. With `token`: a new session of the token's user.",
          tokens: ['user-ok'],
          setsCookie: true,
        },
        400: { description: `A malformed body (bad JSON, not UTF-8, over ${bodyLimit}).`, tokens: [BAD_REQUEST] },
        401: {
          description:
            'The token is malformed, unknown or revoked, or its user is of another frontend: the session is a new ' +
            'anonymous one (cookie set), whatever it was before.',
          tokens: [token('token-fail')],
          setsCookie: true,
        },
        429: TOO_MANY,
      },
      handler: async (req, reply) => {
        const form = readForm(fields(req), forms.session);
        // Absent or empty (the official client sends `token` with no value when it has none): as without it.
        const tokenGiven = !form.token.ok || (form.token.value !== undefined && form.token.value !== '');
        if (!tokenGiven) {
          if (req.session) return send(reply, 200, 'user-ok');
          await startSession(req, reply, store, config, null, now(), events);
          return send(reply, 201, 'user-ok');
        }
        await limit([[limits.accessTokenByAddress, address(req)]]);
        const text = form.token.ok ? (form.token.value ?? '') : '';
        const t = now();
        const started = await replaceSession(req, reply, store, config, t, events, async (tx) => {
          const owner = await accessTokenOwner(tx, text, req.frontend.id, t);
          return owner ? { userId: owner.user.id, accessTokenId: owner.token.id } : { userId: null };
        });
        if (started.userId === null) {
          ctx.log.info({ event: 'session.token_failed', frontend: req.frontend.id });
          return send(reply, 401, 'token-fail');
        }
        ctx.log.info({
          event: 'session.token_login',
          frontend: req.frontend.id,
          userId: started.userId,
          tokenId: started.accessTokenId,
        });
        return send(reply, 201, 'user-ok');
      },
    },
    {
      method: 'POST',
      path: '/0/session/login',
      operationId: 'login',
      tag: 'Session',
      summary: 'Log in',
      description:
        'Checks the login and password and starts a new logged-in session (a new cookie; the old session ends).',
      session: 'optional',
      failToken: 'login-fail',
      form: named('LoginForm', forms.login),
      responses: {
        201: { description: 'Logged in; cookie set.', tokens: ['login-ok'], setsCookie: true },
        403: {
          description: 'Wrong or unknown login or password, a missing or malformed field, or a malformed body.',
          tokens: [token('login-fail')],
        },
        429: TOO_MANY,
        503: BUSY,
      },
      handler: async (req, reply) => {
        const form = readForm(fields(req), forms.login);
        await limit([[limits.loginByAddress, address(req)]]);
        // Decision 4: missing fields are a failed login, not a malformed request.
        if (!form.login.ok || !form.password.ok) throw new ApiError('login-fail');
        const login = form.login.value;
        const password = form.password.value;
        // Per login and address first: an address that has used up its guesses at this login is refused without
        // using up the login's shared allowance, which other addresses (its owner's) still need.
        const pair = `${req.frontend.id} ${login} ${address(req)}`;
        await limit([
          [limits.loginByLoginAndAddress, pair],
          [limits.loginByLogin, `${req.frontend.id} ${login}`],
        ]);
        const user = await store.userByLogin(req.frontend.id, login);
        const ok = user
          ? await guarded(hasher.verify(password, user.passwordHash))
          : await guarded(hasher.verifyNothing(password));
        if (!user || !ok) {
          ctx.log.info({ event: 'session.login_failed', frontend: req.frontend.id });
          throw new ApiError('login-fail');
        }
        // The login's shared count is not reset: a success from one address says nothing about guesses from others.
        await limits.loginByLoginAndAddress.reset(pair);
        await startSession(req, reply, store, config, user.id, now(), events);
        ctx.log.info({ event: 'session.login', frontend: req.frontend.id, userId: user.id });
        if (hasher.needsRehash(user.passwordHash)) {
          // Stronger parameters since this hash was made: upgrade it now that the password is at hand.
          void hasher
            .hash(password)
            .then((passwordHash) => store.write((tx) => tx.updateUser(user.id, { passwordHash })))
            .catch(() => undefined);
        }
        return send(reply, 201, 'login-ok');
      },
    },
    {
      method: 'POST',
      path: '/0/session/logout',
      operationId: 'logout',
      tag: 'Session',
      summary: 'Log out',
      description:
        'Ends the session of the cookie (its id can no longer be used) and starts a fresh anonymous session.',
      session: 'required',
      // A body the parser refuses (too large, not UTF-8) is answered with the route's own token (decision 4).
      failToken: 'logout-fail',
      form: NoForm,
      responses: {
        201: {
          description: 'Session ended; the cookie of a new anonymous session is set.',
          tokens: ['logout-ok'],
          setsCookie: true,
        },
        400: {
          description: 'No valid session for the cookie in this frontend, or a malformed body.',
          tokens: [token('logout-fail')],
        },
      },
      handler: async (req, reply) => {
        if (!req.session) return send(reply, 400, 'logout-fail');
        // Decision 1: a new id on logout too. The logged-in session ends (its cookie is useless from now on) and
        // the client carries on in a fresh anonymous one.
        await startSession(req, reply, store, config, null, now(), events);
        return send(reply, 201, 'logout-ok');
      },
    },
    {
      method: 'POST',
      path: '/0/session/signup',
      operationId: 'signup',
      tag: 'Session',
      summary: 'Create an account',
      description:
        "Creates the user in the frontend and a logged-in session for it (a new cookie). When the frontend's " +
        '`confirmationEmail` is on, e-mails a confirmation link; the account exists whether or not the e-mail ' +
        'goes out (resend it with `/0/session/resend`).',
      session: 'optional',
      failToken: 'signup-fail',
      form: named('SignupForm', forms.signup),
      responses: {
        201: { description: 'Account created; logged in; cookie set.', tokens: ['signup-ok'], setsCookie: true },
        400: {
          description:
            '`signup-fail-no-email`: login missing or not an e-mail address. `signup-fail-already-exists`: the ' +
            'login is taken in this frontend. `signup-fail`: password missing or out of bounds, or a malformed body.',
          tokens: [token('signup-fail-no-email'), token('signup-fail-already-exists'), token('signup-fail')],
        },
        429: TOO_MANY,
        503: BUSY,
      },
      handler: async (req, reply) => {
        await limit([[limits.signupByAddress, address(req)]]);
        const form = readForm(fields(req), forms.signup);
        if (!form.login.ok) throw new ApiError('signup-fail-no-email');
        if (!form.password.ok) throw new ApiError('signup-fail');
        const login = form.login.value;
        const password = form.password.value;
        // Cheap check first, so that a taken login costs no hash; the unique index decides races.
        if (await store.userByLogin(req.frontend.id, login)) throw new ApiError('signup-fail-already-exists');
        const passwordHash = await guarded(hasher.hash(password));
        const t = now();
        const user = await store.write((tx) =>
          tx.createUser({ frontendId: req.frontend.id, login, passwordHash, authcode: newAuthcode(), now: t }),
        );
        if (!user) throw new ApiError('signup-fail-already-exists');
        await startSession(req, reply, store, config, user.id, t, events);
        ctx.log.info({ event: 'account.created', frontend: req.frontend.id, userId: user.id });
        if (req.frontend.config.confirmationEmail) {
          // The account exists whatever the mail does; a failed mail can be sent again with resend.
          await sendConfirmation(ctx, linkOrigin(config, req), user).catch((err: unknown) =>
            ctx.log.warn({ event: 'mail.failed', kind: 'confirm', userId: user.id, err: String(err) }),
          );
        }
        return send(reply, 201, 'signup-ok');
      },
    },
  ];
}
