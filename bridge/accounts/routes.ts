/**
 * Account flows around the session routes: confirmation e-mail and link, resend, recovery and password reset
 * (decisions 5 and 6). Tokens are 256 random bits, e-mailed once, stored only as hashes, and single use.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type RouteContext, fields, query, readForm, send } from '../app.js';
import { ApiError } from '../errors.js';
import { hashSecretValue } from '../sessions/cookie.js';
import { address, guarded, limit } from '../sessions/routes.js';
import type { TokenKind, User } from '../store/types.js';
import { ConfirmQuery, RecoverPageQuery, accountForms } from './schemas.js';

const HOUR_MS = 3_600_000;

/** The base of e-mailed links: the configured public URL, else what the request was addressed to. */
function linkFor(ctx: RouteContext, req: FastifyRequest, path: string, params: Record<string, string>): string {
  const base = ctx.config.http.publicUrl?.replace(/\/+$/, '') ?? `${req.protocol}://${req.host}`;
  const q = new URLSearchParams(params);
  // A frontend not named by the host travels in the link, so that the link reaches the same frontend.
  if (req.frontendSource !== 'host') q.set('app', req.frontend.id);
  return `${base}${path}?${q.toString()}`;
}

async function issueToken(ctx: RouteContext, user: User, kind: TokenKind, hours: number): Promise<string> {
  const token = randomBytes(32).toString('base64url');
  const t = ctx.now();
  await ctx.store.write(() => {
    // Only the newest link of a kind works.
    ctx.store.deleteTokensOfUser(user.id, kind);
    ctx.store.createToken({ hash: hashSecretValue(token), kind, userId: user.id, expiresAt: t + hours * HOUR_MS });
  });
  return token;
}

export async function sendConfirmation(ctx: RouteContext, req: FastifyRequest, user: User): Promise<void> {
  const token = await issueToken(ctx, user, 'confirm', ctx.config.accounts.confirmTokenHours);
  const link = linkFor(ctx, req, '/0/session/confirm', { token });
  await ctx.mailer.send({
    kind: 'confirm',
    to: user.login,
    subject: 'Confirm your e-mail address',
    text: `Open this link to confirm the e-mail address of your account:\n\n${link}\n\nIt works once, for ${Math.round(ctx.config.accounts.confirmTokenHours / 24)} days.\n`,
    link,
  });
}

async function sendRecovery(ctx: RouteContext, req: FastifyRequest, user: User): Promise<void> {
  const token = await issueToken(ctx, user, 'recover', ctx.config.accounts.recoverTokenHours);
  const link = linkFor(ctx, req, '/0/session/recover', { login: user.login, token });
  await ctx.mailer.send({
    kind: 'recover',
    to: user.login,
    subject: 'Set a new password',
    text: `Open this link to set a new password for your account:\n\n${link}\n\nIt works once, within ${ctx.config.accounts.recoverTokenHours} hour(s). If you did not ask for it, ignore this mail.\n`,
    link,
  });
}

const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

export function registerAccountRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { store, config, hasher, limits } = ctx;
  const forms = accountForms(config.accounts);

  app.post('/0/session/resend', { config: { failToken: 'resend-fail' } }, async (req, reply) => {
    limit([[limits.resendByAddress, address(req)]]);
    const form = readForm(fields(req), forms.resend);
    if (!form.login.ok) throw new ApiError('resend-fail');
    const login = form.login.value;
    limit([[limits.resendByLogin, `${req.frontend.id} ${login}`]]);
    const user = store.userByLogin(req.frontend.id, login);
    if (!user || user.confirmed) throw new ApiError('resend-fail');
    try {
      await sendConfirmation(ctx, req, user);
    } catch (err) {
      ctx.log.warn({ event: 'mail.failed', kind: 'confirm', userId: user.id, err: String(err) });
      throw new ApiError('resend-fail');
    }
    return send(reply, 200, 'resend-ok');
  });

  // Decision 5: both spellings. With only `login`, a recovery mail; with `login`, `token` and `password`, the
  // new password.
  const recover = async (req: FastifyRequest): Promise<void> => {
    const form = readForm(fields(req), forms.recover);
    limit([[limits.recoverByAddress, address(req)]]);
    if (!form.login.ok) throw new ApiError('recover-fail');
    const login = form.login.value;
    limit([[limits.recoverByLogin, `${req.frontend.id} ${login}`]]);
    const user = store.userByLogin(req.frontend.id, login);
    if (form.token.ok && form.token.value === undefined) {
      if (!user) throw new ApiError('recover-fail');
      try {
        await sendRecovery(ctx, req, user);
      } catch (err) {
        ctx.log.warn({ event: 'mail.failed', kind: 'recover', userId: user.id, err: String(err) });
        throw new ApiError('recover-fail');
      }
      return;
    }
    // A token that is not a string is malformed input (decision 4), not a request for a recovery e-mail.
    const token = form.token.ok ? form.token.value : undefined;
    const password = form.password.ok ? form.password.value : undefined;
    if (!user || token === undefined || password === undefined) throw new ApiError('recover-fail');
    const passwordHash = await guarded(hasher.hash(password));
    const done = await store.write(() => {
      const t = store.takeToken(hashSecretValue(token), 'recover', ctx.now(), user.id);
      if (!t || t.userId !== user.id) return false;
      store.updateUser(user.id, { passwordHash });
      // Whoever knew the old password is logged out everywhere.
      store.deleteSessionsOfUser(user.id);
      return true;
    });
    if (!done) throw new ApiError('recover-fail');
    ctx.log.info({ event: 'account.password_reset', userId: user.id });
  };
  for (const path of ['/0/session/recovery', '/0/session/recover']) {
    app.post(path, { config: { failToken: 'recover-fail' } }, async (req, reply) => {
      await recover(req);
      return send(reply, 200, 'recover-ok');
    });
  }

  // The e-mailed recovery link opens a small form that posts the new password back.
  app.get('/0/session/recover', async (req, reply) => {
    const { login, token } = RecoverPageQuery.parse(query(req));
    const appId =
      req.frontendSource === 'host' ? '' : `<input type="hidden" name="app" value="${escapeHtml(req.frontend.id)}">`;
    // The token in this page's URL goes to no other site. Not `no-referrer`: with it, browsers send `Origin: null`
    // with the form, which the cross-site check must refuse (docs/api.md, Cross-site requests).
    return reply
      .type('text/html; charset=utf-8')
      .header('cache-control', 'no-store')
      .header('referrer-policy', 'same-origin')
      .send(
        `<!doctype html><meta charset="utf-8"><title>New password</title>` +
          `<form method="post" action="/0/session/recover">` +
          `<input type="hidden" name="login" value="${escapeHtml(login)}">` +
          `<input type="hidden" name="token" value="${escapeHtml(token)}">${appId}` +
          `<label>New password <input type="password" name="password" minlength="${config.accounts.passwordMin}" required></label>` +
          `<button>Set password</button></form>`,
      );
  });

  // Decision 6: the confirmation link.
  app.get('/0/session/confirm', { config: { failToken: 'confirm-fail' } }, async (req, reply) => {
    const q = readForm(query(req), ConfirmQuery);
    if (!q.token.ok) throw new ApiError('confirm-fail');
    const token = q.token.value;
    const userId = await store.write(() => {
      const t = store.takeToken(hashSecretValue(token), 'confirm', ctx.now());
      if (!t) return undefined;
      store.updateUser(t.userId, { confirmed: true });
      return t.userId;
    });
    if (userId === undefined) throw new ApiError('confirm-fail');
    ctx.log.info({ event: 'account.confirmed', userId });
    return send(reply, 200, 'confirm-ok');
  });
}
