/**
 * The attempt limits of the account routes (docs/api.md, Rate limits): one limiter per kind of attempt and key,
 * built from `rateLimits`, and the helpers the routes count their attempts with. Login, signup, resend and
 * recovery are limited per address and per login, access tokens per address; hashing is bounded by its queue
 * (`guarded`).
 */
import type { FastifyRequest } from 'fastify';
import type { Pool } from 'pg';
import type { BridgeConfig } from '../config.js';
import { ApiError } from '../errors.js';
import { LoginField } from '../sessions/schemas.js';
import { HasherBusyError } from './password.js';
import { type AttemptLimiter, RateLimiter, memoryLimiter } from './ratelimit.js';
import { SharedRateLimiter } from './shared-ratelimit.js';

/**
 * The limit on attempts at one login from all addresses together, as a multiple of `rateLimits.login.limit`
 * (which counts per login and address): a guesser at one address cannot lock the login for everyone else, while
 * guessing from many addresses at once still stops (docs/api.md, Rate limits).
 */
export const LOGIN_GLOBAL_FACTOR = 10;

/**
 * The per-address limits of login, resend and recovery, as a multiple of the config key's figure: one address may
 * not try one password on many accounts quickly (docs/api.md, Rate limits).
 */
const PER_ADDRESS_FACTOR = 5;

export interface Limits {
  loginByAddress: AttemptLimiter;
  /** Wrong guesses at one login from one address: the brute-force limit (docs/api.md, Rate limits). */
  loginByLoginAndAddress: AttemptLimiter;
  /** All attempts at one login from anywhere: a much higher limit, against guessing from many addresses. */
  loginByLogin: AttemptLimiter;
  signupByAddress: AttemptLimiter;
  resendByAddress: AttemptLimiter;
  resendByLogin: AttemptLimiter;
  recoverByAddress: AttemptLimiter;
  recoverByLogin: AttemptLimiter;
  /**
   * Access tokens presented to `POST /0/session/` or as a live channel's bearer token, per address: guessing one is
   * held back (decisions 30, 31).
   */
  accessTokenByAddress: AttemptLimiter;
}

/**
 * The limiters of one app, on its clock: in this process's memory, or, with `shared`, in the PostgreSQL database
 * that every bridge uses, so that the limits hold across bridges (docs/api.md, Rate limits). The limiters' names
 * are their rows' names in the shared table.
 */
export function createLimits(rl: BridgeConfig['rateLimits'], now: () => number, shared?: { pool: Pool }): Limits {
  const make = (name: keyof Limits, l: { limit: number; windowMs: number }, factor = 1): AttemptLimiter => {
    const opts = { limit: l.limit * factor, windowMs: l.windowMs, now };
    return shared ? new SharedRateLimiter({ ...opts, pool: shared.pool, name }) : memoryLimiter(new RateLimiter(opts));
  };
  return {
    loginByAddress: make('loginByAddress', rl.login, PER_ADDRESS_FACTOR),
    loginByLoginAndAddress: make('loginByLoginAndAddress', rl.login),
    loginByLogin: make('loginByLogin', rl.login, LOGIN_GLOBAL_FACTOR),
    signupByAddress: make('signupByAddress', rl.signup),
    resendByAddress: make('resendByAddress', rl.resend, PER_ADDRESS_FACTOR),
    resendByLogin: make('resendByLogin', rl.resend),
    recoverByAddress: make('recoverByAddress', rl.recover, PER_ADDRESS_FACTOR),
    recoverByLogin: make('recoverByLogin', rl.recover),
    accessTokenByAddress: make('accessTokenByAddress', rl.accessToken),
  };
}

/** Decision 12: a valid e-mail address of at most `max` characters; logins compare case-insensitively. */
export function normaliseLogin(login: string | undefined, max: number): string | undefined {
  const r = LoginField(max).safeParse(login);
  return r.success ? r.data : undefined;
}

/** Counts an attempt against each limiter in turn; throws 429 at the first one exhausted. */
export async function limit(pairs: Array<[AttemptLimiter, string]>): Promise<void> {
  for (const [limiter, key] of pairs) {
    const r = await limiter.take(key);
    if (!r.ok) throw new ApiError('too-many-requests', r.retryAfterMs);
  }
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
