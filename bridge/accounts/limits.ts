/**
 * The attempt limits of the account routes (docs/api.md, Rate limits): one limiter per kind of attempt and key,
 * built from `rateLimits`, and the helpers the routes count their attempts with. Login, signup, resend and
 * recovery are limited per address and per login; hashing is bounded by its queue (`guarded`).
 */
import type { FastifyRequest } from 'fastify';
import type { BridgeConfig } from '../config.js';
import { ApiError } from '../errors.js';
import { LoginField } from '../sessions/schemas.js';
import { HasherBusyError } from './password.js';
import { RateLimiter } from './ratelimit.js';

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
  loginByAddress: RateLimiter;
  /** Wrong guesses at one login from one address: the brute-force limit (docs/api.md, Rate limits). */
  loginByLoginAndAddress: RateLimiter;
  /** All attempts at one login from anywhere: a much higher limit, against guessing from many addresses. */
  loginByLogin: RateLimiter;
  signupByAddress: RateLimiter;
  resendByAddress: RateLimiter;
  resendByLogin: RateLimiter;
  recoverByAddress: RateLimiter;
  recoverByLogin: RateLimiter;
}

/** The limiters of one app, on its clock. */
export function createLimits(rl: BridgeConfig['rateLimits'], now: () => number): Limits {
  const times = (l: { limit: number; windowMs: number }, factor: number) =>
    new RateLimiter({ limit: l.limit * factor, windowMs: l.windowMs, now });
  return {
    loginByAddress: times(rl.login, PER_ADDRESS_FACTOR),
    loginByLoginAndAddress: new RateLimiter({ ...rl.login, now }),
    loginByLogin: times(rl.login, LOGIN_GLOBAL_FACTOR),
    signupByAddress: new RateLimiter({ ...rl.signup, now }),
    resendByAddress: times(rl.resend, PER_ADDRESS_FACTOR),
    resendByLogin: new RateLimiter({ ...rl.resend, now }),
    recoverByAddress: times(rl.recover, PER_ADDRESS_FACTOR),
    recoverByLogin: new RateLimiter({ ...rl.recover, now }),
  };
}

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
