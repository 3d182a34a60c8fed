/**
 * Sessions: `POST /0/session/`, `login`, `logout` and `signup`, with the statuses and tokens of the
 * specification's Session table and state table, and decisions 1 to 4 and 12.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { HasherBusyError } from '../accounts/password.js';
import { sendConfirmation } from '../accounts/routes.js';
import { type RouteContext, fields, readForm, send } from '../app.js';
import { ApiError } from '../errors.js';
import type { RateLimiter } from '../accounts/ratelimit.js';
import { startSession } from './cookie.js';
import { LoginField, sessionForms } from './schemas.js';

/** Decision 12: a valid e-mail address of at most `max` characters; logins compare case-insensitively. */
export function normaliseLogin(login: string | undefined, max: number): string | undefined {
  const r = LoginField(max).safeParse(login);
  return r.success ? r.data : undefined;
}

/** Counts an attempt against each limiter; throws 429 when one is exhausted. */
export function limit(pairs: Array<[RateLimiter, string]>): void {
  for (const [limiter, key] of pairs) {
    const r = limiter.take(key);
    if (!r.ok) throw new ApiError('too-many-requests', r.retryAfterMs);
  }
}

export function newAuthcode(): string {
  return randomBytes(16).toString('hex');
}

/** Hashing that never queues without bound: a full queue answers 503 `busy`. */
export async function guarded<T>(work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (err) {
    if (err instanceof HasherBusyError) throw new ApiError('busy', 1000);
    throw err;
  }
}

/**
 * The client's address, the key of the per-address limits. Node clears it once the client has hung up, which
 * can happen before the handler runs; such a request still counts, under one shared key.
 */
export function address(req: FastifyRequest): string {
  const ip: string | undefined = req.ip;
  return ip ?? 'gone';
}

export function registerSessionRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { store, config, hasher, now, limits } = ctx;
  const forms = sessionForms(config.accounts);

  app.post('/0/session', async (req, reply) => {
    if (req.session) return send(reply, 200, 'user-ok');
    await startSession(req, reply, store, config, null, now());
    return send(reply, 201, 'user-ok');
  });

  app.post('/0/session/login', { config: { failToken: 'login-fail' } }, async (req, reply) => {
    const form = readForm(fields(req), forms.login);
    limit([[limits.loginByAddress, address(req)]]);
    // Decision 4: missing fields are a failed login, not a malformed request.
    if (!form.login.ok || !form.password.ok) throw new ApiError('login-fail');
    const login = form.login.value;
    const password = form.password.value;
    // Per login and address first: an address that has used up its guesses at this login is refused without
    // using up the login's shared allowance, which other addresses (its owner's) still need.
    const pair = `${req.frontend.id} ${login} ${address(req)}`;
    limit([
      [limits.loginByLoginAndAddress, pair],
      [limits.loginByLogin, `${req.frontend.id} ${login}`],
    ]);
    const user = store.userByLogin(req.frontend.id, login);
    const ok = user
      ? await guarded(hasher.verify(password, user.passwordHash))
      : await guarded(hasher.verifyNothing(password));
    if (!user || !ok) {
      ctx.log.info({ event: 'session.login_failed', frontend: req.frontend.id });
      throw new ApiError('login-fail');
    }
    // The login's shared count is not reset: a success from one address says nothing about guesses from others.
    limits.loginByLoginAndAddress.reset(pair);
    await startSession(req, reply, store, config, user.id, now());
    ctx.log.info({ event: 'session.login', frontend: req.frontend.id, userId: user.id });
    if (hasher.needsRehash(user.passwordHash)) {
      // Stronger parameters since this hash was made: upgrade it now that the password is at hand.
      void hasher
        .hash(password)
        .then((passwordHash) => store.write(() => store.updateUser(user.id, { passwordHash })))
        .catch(() => undefined);
    }
    return send(reply, 201, 'login-ok');
  });

  // A body the parser refuses (too large, not UTF-8) is answered with the route's own token (decision 4).
  app.post('/0/session/logout', { config: { failToken: 'logout-fail' } }, async (req, reply) => {
    if (!req.session) return send(reply, 400, 'logout-fail');
    // Decision 1: a new id on logout too. The logged-in session ends (its cookie is useless from now on) and the
    // client carries on in a fresh anonymous one.
    await startSession(req, reply, store, config, null, now());
    return send(reply, 201, 'logout-ok');
  });

  app.post('/0/session/signup', { config: { failToken: 'signup-fail' } }, async (req, reply) => {
    limit([[limits.signupByAddress, address(req)]]);
    const form = readForm(fields(req), forms.signup);
    if (!form.login.ok) throw new ApiError('signup-fail-no-email');
    if (!form.password.ok) throw new ApiError('signup-fail');
    const login = form.login.value;
    const password = form.password.value;
    // Cheap check first, so that a taken login costs no hash; the unique index decides races.
    if (store.userByLogin(req.frontend.id, login)) throw new ApiError('signup-fail-already-exists');
    const passwordHash = await guarded(hasher.hash(password));
    const t = now();
    const user = await store.write(() =>
      store.createUser({ frontendId: req.frontend.id, login, passwordHash, authcode: newAuthcode(), now: t }),
    );
    if (!user) throw new ApiError('signup-fail-already-exists');
    await startSession(req, reply, store, config, user.id, t);
    ctx.log.info({ event: 'account.created', frontend: req.frontend.id, userId: user.id });
    if (req.frontend.config.confirmationEmail) {
      // The account exists whatever the mail does; a failed mail can be sent again with resend.
      await sendConfirmation(ctx, req, user).catch((err: unknown) =>
        ctx.log.warn({ event: 'mail.failed', kind: 'confirm', userId: user.id, err: String(err) }),
      );
    }
    return send(reply, 201, 'signup-ok');
  });
}
