/**
 * The e-mailed links of the account flows (decisions 5 and 6): the confirmation of a new account's address and the
 * recovery of a forgotten password. Tokens are 256 random bits, e-mailed once, stored only as hashes, single use,
 * and only the newest of a kind works.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import type { BridgeConfig } from '../config.js';
import type { Mailer } from '../mail/mailer.js';
import { hashSecretValue } from '../sessions/cookie.js';
import type { BridgeStore, TokenKind, User } from '../store/types.js';

const HOUR_MS = 3_600_000;

export interface AccountDeps {
  config: BridgeConfig;
  store: BridgeStore;
  mailer: Mailer;
  now: () => number;
}

/** Where an e-mailed link leads: the bridge's base URL, and the frontend when the link's host does not name it. */
export interface LinkOrigin {
  base: string;
  app: string | undefined;
}

/** The configured public URL, else what the request was addressed to; its frontend unless its host named it. */
export function linkOrigin(config: BridgeConfig, req: FastifyRequest): LinkOrigin {
  const base = config.http.publicUrl?.replace(/\/+$/, '') ?? `${req.protocol}://${req.host}`;
  // A frontend not named by the host travels in the link, so that the link reaches the same frontend.
  return { base, app: req.frontendSource === 'host' ? undefined : req.frontend.id };
}

function linkTo(origin: LinkOrigin, path: string, params: Record<string, string>): string {
  const q = new URLSearchParams(params);
  if (origin.app !== undefined) q.set('app', origin.app);
  return `${origin.base}${path}?${q.toString()}`;
}

/** A new token of a kind for the user, replacing any earlier one; durable before it is returned. */
export async function issueToken(deps: AccountDeps, user: User, kind: TokenKind, hours: number): Promise<string> {
  const { store } = deps;
  const token = randomBytes(32).toString('base64url');
  const t = deps.now();
  await store.write(async (tx) => {
    // Only the newest link of a kind works.
    await tx.deleteTokensOfUser(user.id, kind);
    await tx.createToken({ hash: hashSecretValue(token), kind, userId: user.id, expiresAt: t + hours * HOUR_MS });
  });
  return token;
}

export async function sendConfirmation(deps: AccountDeps, origin: LinkOrigin, user: User): Promise<void> {
  const hours = deps.config.accounts.confirmTokenHours;
  const token = await issueToken(deps, user, 'confirm', hours);
  const link = linkTo(origin, '/0/session/confirm', { token });
  await deps.mailer.send({
    kind: 'confirm',
    to: user.login,
    subject: 'Confirm your e-mail address',
    text: `Open this link to confirm the e-mail address of your account:\n\n${link}\n\nIt works once, for ${Math.round(hours / 24)} days.\n`,
    link,
  });
}

export async function sendRecovery(deps: AccountDeps, origin: LinkOrigin, user: User): Promise<void> {
  const hours = deps.config.accounts.recoverTokenHours;
  const token = await issueToken(deps, user, 'recover', hours);
  const link = linkTo(origin, '/0/session/recover', { login: user.login, token });
  await deps.mailer.send({
    kind: 'recover',
    to: user.login,
    subject: 'Set a new password',
    text: `Open this link to set a new password for your account:\n\n${link}\n\nIt works once, within ${hours} hour(s). If you did not ask for it, ignore this mail.\n`,
    link,
  });
}
