/**
 * Access tokens (decision 30; docs/api.md, "Access tokens"): long-lived secrets a logged-in user makes for a kiosk
 * or a script, which `POST /0/session/` with `token` turns into a logged-in session of the user (the official
 * client's `init({token})`). A token is 256 random bits, shown once when made, stored only as its sha256 with a
 * short prefix to recognise it by, its creation and its last use. A user holds at most
 * `accounts.accessTokensPerUser`. Revoking one ends the sessions it started (each announced as `session.ended`) and
 * the live channels opened with it as a bearer token (one more `session.ended`, with its `tokenId`); a password
 * reset revokes them all. A session started with a token may not make more tokens, so that revoking a
 * leaked token is the end of it.
 */
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { ApiError } from '../errors.js';
import type { RouteContext } from '../http/context.js';
import { NO_SESSION, token } from '../http/outcomes.js';
import { send, sendJson } from '../http/reply.js';
import { type Route, named } from '../http/route.js';
import type { AccessToken, StoreTx, User } from '../store/types.js';
import { hashSecretValue } from './cookie.js';

/** 32 bytes in base64url, as a session id. */
export const ACCESS_TOKEN_RE = /^[A-Za-z0-9_-]{43}$/;
/** How many of its first characters a token is listed by: a hint for its owner, nothing to log in with. */
export const ACCESS_TOKEN_PREFIX = 6;

/** One token as `GET /0/user/accesstoken` lists it: never its secret. */
export const AccessTokenInfo = z.object({
  id: z.number().int().meta({ description: 'Its number: `DELETE /0/user/accesstoken/<id>` revokes it.' }),
  prefix: z.string().meta({ description: `Its first ${ACCESS_TOKEN_PREFIX} characters.` }),
  created: z.number().int().meta({ description: 'When it was made, ms since the epoch.' }),
  lastUsed: z
    .number()
    .int()
    .nullable()
    .meta({ description: 'When it last started a session, ms since the epoch; `null` if never.' }),
});
export const AccessTokenList = z.array(AccessTokenInfo);

const TokenText = z.string().regex(ACCESS_TOKEN_RE);

const info = (t: AccessToken) => ({ id: t.id, prefix: t.prefix, created: t.createdAt, lastUsed: t.lastUsedAt });

/**
 * The user a token text names in a frontend, its last use stamped; `undefined` for a malformed, unknown or revoked
 * token, or one of a user of another frontend. Works on the store or inside a transaction: `POST /0/session/`
 * calls it in the one that makes the session, so that the token cannot be revoked between the two (a revocation
 * waits for the stamp's row lock on PostgreSQL, and then ends that session too). For the live channel as well.
 */
export async function accessTokenOwner(
  tx: StoreTx,
  text: string,
  frontendId: string,
  now: number,
): Promise<{ user: User; token: AccessToken } | undefined> {
  if (!ACCESS_TOKEN_RE.test(text)) return undefined;
  const t = await tx.accessTokenByHash(hashSecretValue(text));
  if (!t) return undefined;
  const user = await tx.userById(t.userId);
  if (!user || user.frontendId !== frontendId) return undefined;
  if (!(await tx.touchAccessToken(t.id, now))) return undefined;
  return { user, token: { ...t, lastUsedAt: now } };
}

export function accessTokenRoutes(ctx: RouteContext): Route[] {
  const { store, config, now, log, events } = ctx;
  const max = config.accounts.accessTokensPerUser;

  /** The logged-in user, or 401 `no-session`. */
  const userOf = (user: User | undefined): User => {
    if (!user) throw new ApiError('no-session');
    return user;
  };

  return [
    {
      method: 'POST',
      path: '/0/user/accesstoken',
      operationId: 'createAccessToken',
      tag: 'Session',
      summary: 'Make an access token',
      description:
        'Decision 30. A new long-lived token for the user: 256 random bits in base64url (43 characters), in the ' +
        'answer only (the bridge keeps its sha256). `POST /0/session/` with `token=<it>` starts a session of the ' +
        `user. A user holds at most \`accounts.accessTokensPerUser\` (${max}) tokens. A session that was itself ` +
        'started with a token may not make more.',
      session: 'required',
      failToken: 'accesstoken-fail',
      responses: {
        201: { description: 'The token, as text: shown this once.', text: TokenText },
        400: {
          description:
            `\`accesstoken-fail-limit\`: the user already has ${max} tokens (revoke one). \`accesstoken-fail\`: a ` +
            'malformed body.',
          tokens: [token('accesstoken-fail-limit'), token('accesstoken-fail')],
        },
        401: NO_SESSION,
        403: {
          description: 'The session was started with an access token.',
          tokens: [token('accesstoken-fail-token-session')],
        },
      },
      handler: async (req, reply) => {
        const user = userOf(req.user);
        if ((req.session?.accessTokenId ?? null) !== null) throw new ApiError('accesstoken-fail-token-session');
        const text = randomBytes(32).toString('base64url');
        const t = now();
        const made = await store.write(async (tx) => {
          // The user's row is locked (PostgreSQL), so that two requests at once cannot both pass the count.
          await tx.userById(user.id, { forUpdate: true });
          if ((await tx.accessTokensOf(user.id)).length >= max) return undefined;
          return tx.createAccessToken({
            hash: hashSecretValue(text),
            userId: user.id,
            prefix: text.slice(0, ACCESS_TOKEN_PREFIX),
            createdAt: t,
          });
        });
        if (!made) throw new ApiError('accesstoken-fail-limit');
        log.info({ event: 'accesstoken.created', userId: user.id, tokenId: made.id });
        return send(reply, 201, text);
      },
    },
    {
      method: 'GET',
      path: '/0/user/accesstoken',
      operationId: 'listAccessTokens',
      tag: 'Session',
      summary: "The user's access tokens",
      description:
        'Decision 30. The tokens of the user, oldest first, without their secret: number, first characters, when ' +
        'made, when last used. `Cache-Control: no-store`.',
      session: 'required',
      responses: {
        200: { description: 'The tokens; `[]` when there are none.', json: named('AccessTokenList', AccessTokenList) },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req.user);
        return sendJson(reply, JSON.stringify((await store.accessTokensOf(user.id)).map(info)));
      },
    },
    {
      method: 'DELETE',
      path: '/0/user/accesstoken/{token}',
      operationId: 'revokeAccessToken',
      tag: 'Session',
      summary: 'Revoke an access token',
      description:
        'Decision 30. `{token}` is the token itself, or its number from `GET /0/user/accesstoken`. The token stops ' +
        'working, every session it started ends, and the live channels on them or opened with the token as ' +
        '`Authorization: Bearer` close (4001).',
      session: 'required',
      failToken: 'accesstoken-fail',
      responses: {
        200: { description: 'Revoked.', tokens: ['accesstoken-ok'] },
        400: {
          description: 'The user has no such token (never had, or already revoked), or a malformed body.',
          tokens: [token('accesstoken-fail')],
        },
        401: NO_SESSION,
      },
      handler: async (req, reply) => {
        const user = userOf(req.user);
        const raw = (req.params as { token?: string }).token ?? '';
        let which: { hash: string } | { id: number };
        if (ACCESS_TOKEN_RE.test(raw)) which = { hash: hashSecretValue(raw) };
        else if (/^[1-9]\d{0,14}$/.test(raw)) which = { id: Number(raw) };
        else throw new ApiError('accesstoken-fail');
        const gone = await store.write((tx) => tx.deleteAccessToken(user.id, which));
        if (!gone) throw new ApiError('accesstoken-fail');
        for (const idHash of gone.sessions) events.publish({ type: 'session.ended', idHash, userId: user.id });
        // And the live channels opened with it as a bearer token (decision 31).
        events.publish({ type: 'session.ended', userId: user.id, tokenId: gone.token.id });
        log.info({
          event: 'accesstoken.revoked',
          userId: user.id,
          tokenId: gone.token.id,
          sessions: gone.sessions.length,
        });
        return send(reply, 200, 'accesstoken-ok');
      },
    },
  ];
}
