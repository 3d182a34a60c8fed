/**
 * Account flows around the session routes: confirmation e-mail and link, resend, recovery and password reset
 * (decisions 5 and 6). The links and their tokens are made in `service.ts`.
 */
import { isStorageFull } from '../../lib/sqlite.js';
import type { FastifyRequest } from 'fastify';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { BUSY, TOO_MANY, token } from '../http/outcomes.js';
import { send } from '../http/reply.js';
import { fields, query, readForm } from '../http/request.js';
import { type Route, named } from '../http/route.js';
import { hashSecretValue } from '../sessions/cookie.js';
import { address, guarded, limit } from './limits.js';
import { ConfirmQuery, RecoverPageQuery, accountForms } from './schemas.js';
import { linkOrigin, sendConfirmation, sendRecovery } from './service.js';

const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

export function accountRoutes(ctx: RouteContext): Route[] {
  const { store, config, hasher, limits } = ctx;
  const forms = accountForms(config.accounts);
  const RecoverForm = named('RecoverForm', forms.recover);

  // Decision 5: both spellings. With only `login`, a recovery mail; with `login`, `token` and `password`, the
  // new password.
  const recover = async (req: FastifyRequest): Promise<void> => {
    const form = readForm(fields(req), forms.recover);
    await limit([[limits.recoverByAddress, address(req)]]);
    if (!form.login.ok) throw new ApiError('recover-fail');
    const login = form.login.value;
    await limit([[limits.recoverByLogin, `${req.frontend.id} ${login}`]]);
    const user = await store.userByLogin(req.frontend.id, login);
    if (form.token.ok && form.token.value === undefined) {
      if (!user) throw new ApiError('recover-fail');
      try {
        await sendRecovery(ctx, linkOrigin(config, req), user);
      } catch (err) {
        // The link's token could not be stored: the disk's failure, not the mail's (507).
        if (isStorageFull(err)) throw err;
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
    const done = await store.write(async (tx) => {
      const t = await tx.takeToken(hashSecretValue(token), 'recover', ctx.now(), user.id);
      if (!t || t.userId !== user.id) return false;
      await tx.updateUser(user.id, { passwordHash });
      // Whoever knew the old password is logged out everywhere, and the access tokens made with it stop working
      // (decision 30).
      await tx.deleteSessionsOfUser(user.id);
      await tx.deleteAccessTokensOfUser(user.id);
      return true;
    });
    if (!done) throw new ApiError('recover-fail');
    ctx.events.publish({ type: 'session.ended', userId: user.id });
    ctx.log.info({ event: 'account.password_reset', userId: user.id });
  };
  const recoverRoute = (path: string, operationId: string, alias: boolean): Route => ({
    method: 'POST',
    path,
    operationId,
    tag: 'Session',
    summary: alias
      ? 'Recovery e-mail or new password (the spelling of the official client)'
      : 'Recovery e-mail or new password',
    description:
      'Decision 5. With `login` alone: e-mails a link to set a new password (valid ' +
      `${config.accounts.recoverTokenHours} h, single use; only the newest link works). With \`login\`, \`token\` ` +
      'and `password`: sets the new password, ends every session of the user and revokes its access tokens. Both `/0/session/recovery` and ' +
      '`/0/session/recover` are accepted.',
    failToken: 'recover-fail',
    form: RecoverForm,
    responses: {
      200: { description: 'Recovery e-mail sent, or password set.', tokens: ['recover-ok'] },
      400: {
        description:
          'Login missing, malformed or unknown; the e-mail could not be sent; token wrong, used or expired; ' +
          'new password missing or out of bounds; or a malformed body.',
        tokens: [token('recover-fail')],
      },
      429: TOO_MANY,
      503: BUSY,
    },
    handler: async (req, reply) => {
      await recover(req);
      return send(reply, 200, 'recover-ok');
    },
  });

  return [
    {
      method: 'POST',
      path: '/0/session/resend',
      operationId: 'resendConfirmation',
      tag: 'Session',
      summary: 'Send the confirmation e-mail again',
      description: 'A new confirmation link for an unconfirmed user; the previous link stops working.',
      failToken: 'resend-fail',
      form: named('ResendForm', forms.resend),
      responses: {
        200: { description: 'Confirmation e-mail sent.', tokens: ['resend-ok'] },
        400: {
          description:
            'Login missing, malformed or unknown; the user is already confirmed; the e-mail could not be sent; or ' +
            'a malformed body.',
          tokens: [token('resend-fail')],
        },
        429: TOO_MANY,
      },
      handler: async (req, reply) => {
        await limit([[limits.resendByAddress, address(req)]]);
        const form = readForm(fields(req), forms.resend);
        if (!form.login.ok) throw new ApiError('resend-fail');
        const login = form.login.value;
        await limit([[limits.resendByLogin, `${req.frontend.id} ${login}`]]);
        const user = await store.userByLogin(req.frontend.id, login);
        if (!user || user.confirmed) throw new ApiError('resend-fail');
        try {
          await sendConfirmation(ctx, linkOrigin(config, req), user);
        } catch (err) {
          if (isStorageFull(err)) throw err;
          ctx.log.warn({ event: 'mail.failed', kind: 'confirm', userId: user.id, err: String(err) });
          throw new ApiError('resend-fail');
        }
        return send(reply, 200, 'resend-ok');
      },
    },
    recoverRoute('/0/session/recovery', 'recover', false),
    recoverRoute('/0/session/recover', 'recoverAlias', true),
    {
      method: 'GET',
      path: '/0/session/recover',
      operationId: 'recoverPage',
      tag: 'Session',
      summary: 'The page of the recovery link',
      description:
        'A small HTML form, opened from the recovery e-mail, that posts `login`, `token` (and `app`) with the new ' +
        '`password` to `POST /0/session/recover`. `Cache-Control: no-store`, `Referrer-Policy: same-origin`; a Content-Security-Policy that allows no ' +
        'script and no framing, and `X-Frame-Options: DENY`.',
      query: RecoverPageQuery,
      responses: { 200: { description: 'The form.', html: true } },
      // The e-mailed recovery link opens a small form that posts the new password back.
      handler: async (req, reply) => {
        const { login, token } = RecoverPageQuery.parse(query(req));
        const appId =
          req.frontendSource === 'host'
            ? ''
            : `<input type="hidden" name="app" value="${escapeHtml(req.frontend.id)}">`;
        // The token in this page's URL goes to no other site. Not `no-referrer`: with it, browsers send
        // `Origin: null` with the form, which the cross-site check must refuse (docs/api.md, Cross-site requests).
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
      },
    },
    {
      method: 'GET',
      path: '/0/session/confirm',
      operationId: 'confirm',
      tag: 'Session',
      summary: 'The confirmation link',
      description: `Decision 6: sets the user's \`confirmed\`. Single use, valid ${config.accounts.confirmTokenHours} h.`,
      failToken: 'confirm-fail',
      query: ConfirmQuery,
      responses: {
        200: { description: 'Confirmed.', tokens: ['confirm-ok'] },
        400: { description: 'Token missing, wrong, used or expired.', tokens: [token('confirm-fail')] },
      },
      handler: async (req, reply) => {
        const q = readForm(query(req), ConfirmQuery);
        if (!q.token.ok) throw new ApiError('confirm-fail');
        const token = q.token.value;
        const userId = await store.write(async (tx) => {
          const t = await tx.takeToken(hashSecretValue(token), 'confirm', ctx.now());
          if (!t) return undefined;
          await tx.updateUser(t.userId, { confirmed: true });
          return t.userId;
        });
        if (userId === undefined) throw new ApiError('confirm-fail');
        ctx.log.info({ event: 'account.confirmed', userId });
        return send(reply, 200, 'confirm-ok');
      },
    },
  ];
}
